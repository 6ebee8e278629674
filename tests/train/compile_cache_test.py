"""`train.compile_cache`: which persistent compilation cache a run uses ('auto' and the rest,
without a GPU: the platform is injected), an unwritable cache directory (a WARNING, and the run
trains without a cache), and the trainer's "step compiled" line over two runs that share a cache
(the second loads the step)."""
import io
import logging
import os

import jax
import pytest
from jax.experimental.compilation_cache import compilation_cache as jax_cache

from tests.testlib import tiny_run
from xlm_jax.train import compile_cache as cc


@pytest.fixture
def restore_jax_cache():
    """Puts jax's cache settings back as the test suite set them (tests/conftest.py), and
    forgets what `configure` set: the tests here move them in this process."""
    names = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
             "jax_enable_compilation_cache")
    saved = {name: getattr(jax.config, name) for name in names}
    yield
    for name, value in saved.items():
        jax.config.update(name, value)
    jax_cache.reset_cache()
    cc._set_by_us.clear()


# ---- 'auto' and the other settings (pure: `resolve`)

def test_an_environment_cache_wins_over_auto_on_any_platform():
    env = {cc.DIR_ENV: "/env/cache"}
    for platform in ("cpu", "gpu", "tpu"):  # jax read the variable into its config at import
        assert cc.resolve("auto", platform, env, configured="/env/cache") == cc.CacheChoice(
            "/env/cache", cc.DIR_ENV)
    # set after jax was imported (not in its config yet): still the environment's
    assert cc.resolve("auto", "gpu", env).path == "/env/cache"
    # a directory this process configured in code wins, and says so
    choice = cc.resolve("auto", "gpu", env, configured="/code/cache")
    assert choice.path == "/code/cache" and "set in this process" in choice.source


def test_auto_is_off_on_a_cpu_and_on_under_the_user_cache_dir_on_an_accelerator(monkeypatch):
    choice = cc.resolve("auto", "cpu", env={})
    assert choice.path is None and choice.source.startswith("off: the default on cpu")
    assert cc.resolve("auto", "gpu", env={"XDG_CACHE_HOME": "/xdg"}) == cc.CacheChoice(
        "/xdg/xlm_jax/jax_cache", "the default on gpu")
    monkeypatch.setenv("HOME", "/home/someone")  # no XDG_CACHE_HOME: ~/.cache
    assert cc.resolve("auto", "tpu", env={}).path == "/home/someone/.cache/xlm_jax/jax_cache"
    # jax_enable_compilation_cache=False (JAX_ENABLE_COMPILATION_CACHE) is respected by 'auto'
    assert cc.resolve("auto", "tpu", env={}, enabled=False).path is None


def test_an_explicit_path_is_used_on_any_platform_and_empty_turns_the_cache_off():
    env = {cc.DIR_ENV: "/env/cache"}
    for path in ("/my/cache", "gs://bucket/jax_cache"):
        for platform in ("cpu", "gpu"):
            assert cc.resolve(path, platform, env, configured="/env/cache") == cc.CacheChoice(
                path, "loop.train.compilation_cache_dir")
    for off in (None, ""):
        assert cc.resolve(off, "gpu", env, configured="/env/cache").path is None


# ---- applying it (`configure`), in this process

def test_configure_sets_jax_and_auto_forgets_an_earlier_runs_path(tmp_path, restore_jax_cache):
    path = str(tmp_path / "cache")
    choice, line = cc.configure(path, "cpu", env={})
    assert choice.path == path and jax.config.jax_compilation_cache_dir == path
    assert os.path.isdir(path)  # created by the write check
    assert line.startswith(f"compilation cache: {path} (loop.train.compilation_cache_dir; ")
    # a later 'auto' run in this process: the environment's cache again, or none
    choice, _ = cc.configure("auto", "cpu", env={cc.DIR_ENV: "/env/cache"})
    assert choice == cc.CacheChoice("/env/cache", cc.DIR_ENV)
    assert jax.config.jax_compilation_cache_dir == "/env/cache"
    cc.configure(path, "cpu", env={})
    choice, line = cc.configure("auto", "cpu", env={})
    assert choice.path is None and jax.config.jax_compilation_cache_dir is None
    assert line.startswith("compilation cache: off: the default on cpu")


def test_the_default_dir_with_several_processes_says_to_share_one(tmp_path, restore_jax_cache):
    jax.config.update("jax_compilation_cache_dir", None)  # not the test suite's
    env = {"XDG_CACHE_HOME": str(tmp_path)}
    _, line = cc.configure("auto", "tpu", env=env, process_count=4)
    assert line.startswith(f"compilation cache: {tmp_path}/xlm_jax/jax_cache (the default on tpu")
    assert line.endswith("the other 3 processes compile at every start: give a directory all "
                         "hosts share (gs://...)")
    assert "share" not in cc.configure("auto", "tpu", env=env, process_count=1)[1]
    assert "share" not in cc.configure(str(tmp_path), "tpu", env=env, process_count=4)[1]


def test_configure_expands_a_local_path_as_a_shell_would(tmp_path, monkeypatch,
                                                         restore_jax_cache):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert cc.configure("~/c", "cpu", env={})[0].path == str(tmp_path / "c")
    assert cc.configure("rel", "cpu", env={})[0].path == str(tmp_path / "rel")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "rel")


def test_min_compile_time_is_ours_unless_the_environment_or_code_chose(tmp_path, monkeypatch,
                                                                        restore_jax_cache):
    monkeypatch.setattr(cc, "MIN_COMPILE_SECS", 2.5)  # tell ours from jax's default (1 s)
    key = "jax_persistent_cache_min_compile_time_secs"
    jax.config.update(key, 1.0)  # jax's default, as in a process that set nothing
    cc.configure(str(tmp_path), "cpu", env={cc.MIN_TIME_ENV: "1"})
    assert getattr(jax.config, key) == 1.0  # the environment's
    _, line = cc.configure(str(tmp_path), "cpu", env={})
    assert getattr(jax.config, key) == 2.5 and line.endswith("compiles of >= 2.5 s are written)")
    jax.config.update(key, 0.0)  # set in code before the run
    cc.configure(str(tmp_path), "cpu", env={})
    assert getattr(jax.config, key) == 0.0


def test_an_unwritable_cache_dir_is_one_warning_and_no_cache(tmp_path, caplog,
                                                             restore_jax_cache):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    bad = str(blocker / "cache")
    with caplog.at_level(logging.WARNING, logger=cc.__name__):
        choice, line = cc.configure(bad, "gpu", env={})
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, caplog.text
    assert bad in warnings[0].getMessage() and "not writable" in warnings[0].getMessage()
    assert choice.path is None and jax.config.jax_compilation_cache_dir is None
    assert line == f"compilation cache: off: {bad} is not writable"
    assert cc.unwritable(str(tmp_path / "fine")) is None
    assert cc.unwritable("gs://bucket/cache") is None  # not probed


def test_compile_timed_reports_a_compile_without_cache_and_then_none(restore_jax_cache):
    cc.configure(None, "cpu", env={})
    f = jax.jit(lambda x: x * 3 + 1)
    x = jax.numpy.arange(5.0)
    first = cc.compile_timed(f, x, cache_dir=None)
    assert first.compiled and not first.cache_hit and not first.written
    assert 0 < first.backend_seconds <= first.seconds
    assert first.describe() == "no persistent compilation cache"
    again = cc.compile_timed(f, x, cache_dir=None)  # the jit kept the executable
    assert not again.compiled and again.describe() == "already compiled in this process"
    assert float(f(x)[1]) == 4.0


# ---- the trainer

def _step_line(out: str) -> str:
    lines = [ln for ln in out.splitlines() if ln.startswith("step compiled in ")]
    assert len(lines) == 1, out
    return lines[0]


def test_a_second_run_loads_the_step_from_the_cache_the_first_wrote(tmp_path, monkeypatch,
                                                                    restore_jax_cache):
    monkeypatch.setenv(cc.MIN_TIME_ENV, "0")  # every compile is written: not a speed test
    cache = str(tmp_path / "cache")
    reports, outs = [], []
    for run in ("first", "second"):
        out = io.StringIO()
        reports.append(tiny_run.train_tiny(tmp_path / run, 1, out=out, objectives=tiny_run.
                                           mlm_objectives(pair=False),
                                           compilation_cache_dir=cache).step_compile)
        outs.append(out.getvalue())
    first, second = reports
    print(f"trainer step compile: first run {first.timing()}, second {second.timing()}")
    assert f"compilation cache: {cache} (loop.train.compilation_cache_dir; " in outs[0]
    assert first.written and not first.cache_hit and first.cache_dir == cache
    assert second.cache_hit and not second.written
    assert "persistent compilation cache hit" in _step_line(outs[1])
    assert "written to the persistent compilation cache" in _step_line(outs[0])
    assert any(name.startswith("jit_train_step-") for name in os.listdir(cache))


def test_a_run_with_an_unwritable_cache_dir_trains_without_one(tmp_path, caplog,
                                                               restore_jax_cache):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    bad = str(blocker / "cache")
    out = io.StringIO()
    with caplog.at_level(logging.WARNING):
        result = tiny_run.train_tiny(tmp_path / "run", 2, out=out,
                                     objectives=tiny_run.mlm_objectives(pair=False),
                                     compilation_cache_dir=bad)
    assert result.final_step == 2 and len(result.losses) == 2
    mine = [r for r in caplog.records if r.name == cc.__name__]
    assert len(mine) == 1 and mine[0].levelno == logging.WARNING, caplog.text
    assert f"compilation cache: off: {bad} is not writable" in out.getvalue()
    assert result.step_compile.cache_dir is None and not result.step_compile.cache_hit
