"""A gin macro nothing uses is an error (a misspelt `--gin.` override used to be ignored and
the run trained with the file's value), in every CLI that takes gin; errors name the user's
setting in one line, without gin's call-site suffix, and --debug keeps the traceback."""
import os
import subprocess
import sys
import time

import gin
import pytest

from tests.testlib.cli_run import ROOT
from tests.testlib.cli_run import env as _env
from tests.testlib.cli_run import run as _run
from xlm_jax.train import gin_utils

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

TYPO = "--gin.TRIAN_STEPS=3"


def _parse(files, bindings, **kw):
    gin.clear_config()
    try:
        return gin_utils.parse(files, bindings, check_required=False, **kw)
    finally:
        gin.clear_config()


def test_the_misspelt_macro_run_is_refused_in_seconds_and_writes_nothing(tmp_path):
    """Must-show: the issue's command exits non-zero, names the typo and the macro meant, and
    the model directory is never created."""
    model_dir = tmp_path / "run"
    t0 = time.time()
    r = _run(["--gin_file=demo/mmlm_tlm.gin", f"--model_dir={model_dir}", TYPO], timeout=120)
    seconds = time.time() - t0
    assert r.returncode == 1, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr
    assert "TRIAN_STEPS" in lines[0] and "did you mean TRAIN_STEPS?" in lines[0]
    assert "done:" not in r.stdout and not model_dir.exists()
    assert seconds < 60, seconds  # imports only: nothing built, compiled or trained


# (module, its own flags): every CLI that takes gin, each with a file whose TRAIN_STEPS (or,
# fine-tuning, run.finetune.train_steps) the typo meant.
GIN_CLIS = [
    ("xlm_jax.finetune", ["--gin_file=finetune/demo_pawsx.gin", "--init_from=/nonexistent"],
     "--gin.run.finetune.train_steps"),
    ("xlm_jax.accelerator.bench", ["--gin_file=demo/mmlm_tlm.gin", "--steps=1"], "TRAIN_STEPS"),
    ("xlm_jax.accelerator.pod_memory", ["--gin_file=demo/mmlm_tlm.gin", "--devices=2"],
     "TRAIN_STEPS"),
    ("xlm_jax.translate", ["--gin_file=demo/veco_translate.gin"], "TRAIN_STEPS"),
    ("xlm_jax.demo", ["--gin_file=demo/mmlm_tlm.gin"], "TRAIN_STEPS"),
    ("xlm_jax.accelerator.lower", ["--gin_file=demo/mmlm_tlm.gin", "--platform=cuda"],
     "TRAIN_STEPS"),
]


def test_every_gin_cli_refuses_the_misspelt_macro(tmp_path):
    procs = []
    for module, flags, meant in GIN_CLIS:
        out = tmp_path / module
        cmd = [sys.executable, "-m", module, *flags, TYPO]
        if module in ("xlm_jax.finetune", "xlm_jax.translate", "xlm_jax.demo"):
            cmd.append(f"--model_dir={out}")
        procs.append((module, meant, out, subprocess.Popen(
            cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)))
    for module, meant, out, proc in procs:
        _, err = proc.communicate(timeout=300)
        last = err.strip().splitlines()[-1]
        assert proc.returncode != 0, (module, err[-2000:])
        assert last.startswith("error: ") and "gin macro TRIAN_STEPS (--gin.TRIAN_STEPS=3)" in last
        assert f"did you mean {meant}?" in last, (module, last)
        assert "Traceback" not in err, module
        assert not out.exists(), module


def test_a_file_macro_nothing_uses_is_named_with_its_file(tmp_path):
    (tmp_path / "run.gin").write_text("include 'demo/mmlm_tlm.gin'\nSEQ_LNE = 32\n")
    with pytest.raises(gin_utils.GinConfigError,
                       match=r"gin macro SEQ_LNE \(set in .*run.gin\) .* did you mean SEQ_LEN\?"):
        _parse([str(tmp_path / "run.gin")], [])


def test_macros_used_by_other_macros_or_inside_values_count_as_used(tmp_path):
    (tmp_path / "run.gin").write_text(
        "include 'demo/mmlm_tlm.gin'\n"
        "STEPS_A = 5\nSTEPS_B = %STEPS_A\nTRAIN_STEPS = %STEPS_B\n"  # a chain of references
        "RATE = 0.2\nloop.model_config.overrides = {'vocab_size': 8002, 'dropout_rate': %RATE}\n")
    _parse([str(tmp_path / "run.gin")], ["STEPS_A = 7"])  # no error


def test_placeholders_may_go_unused_but_a_users_binding_of_the_same_name_may_not():
    # mmlm_tlm.gin reads no XLCO_TASK: the tools' placeholder is fine ...
    _parse(["demo/mmlm_tlm.gin"], list(gin_utils.SYNTHETIC_RUN_MACROS))
    # ... the user's own is not, nor is an extra placeholder given as a user binding.
    with pytest.raises(gin_utils.GinConfigError, match=r"XLCO_TASK \(--gin.XLCO_TASK='x'\)"):
        _parse(["demo/mmlm_tlm.gin"], [*gin_utils.SYNTHETIC_RUN_MACROS, "XLCO_TASK = 'x'"])
    with pytest.raises(gin_utils.GinConfigError, match="BI_SEQ_LEN"):
        _parse(["demo/mmlm_tlm.gin"], ["BI_SEQ_LEN = None"])
    _parse(["demo/mmlm_tlm.gin"], ["BI_SEQ_LEN = None"], placeholders=["BI_SEQ_LEN = None"])


def test_every_shipped_gin_file_uses_every_macro_it_sets():
    """What the CLIs parse: each shipped file with the tools' placeholders."""
    import glob

    root = os.path.join(ROOT, "gin_configs")
    files = sorted(os.path.relpath(p, root) for p in glob.glob(f"{root}/**/*.gin", recursive=True))
    assert len(files) > 40
    for f in files:
        _parse([f], list(gin_utils.SYNTHETIC_RUN_MACROS))


def test_errors_name_the_users_macro_without_gins_call_site(tmp_path):
    r = _run(["--gin_file=demo/mmlm_tlm.gin", f"--model_dir={tmp_path / 'a'}",
              "--gin.TRAIN_STEPS=-1"], timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "error: ValueError: TRAIN_STEPS=-1 (OptimizerConfig.total_steps) is invalid: must be "
        "an integer >= 1"]


def test_an_unimportable_task_module_is_one_line_and_debug_shows_the_traceback(tmp_path):
    args = ["--gin_file=demo/mmlm_tlm.gin", f"--model_dir={tmp_path / 'a'}",
            "--gin.loop.train.task_modules=['my_taks']"]
    r = _run(args, timeout=120)
    assert r.returncode == 1
    assert r.stderr.strip().splitlines()[-1] == (
        "error: ImportError: loop.train.task_modules=my_taks: cannot import 'my_taks' (No "
        "module named 'my_taks'; a task module must be importable from the working directory "
        "or PYTHONPATH)")
    assert "Traceback" not in r.stderr and "In call to configurable" not in r.stderr
    for extra, environ in ((["--debug"], {}), ([], {"XLM_JAX_DEBUG": "1"})):
        r = _run(args + extra, timeout=120, **environ)
        assert r.returncode != 0 and "Traceback (most recent call last)" in r.stderr
        assert "ImportError: loop.train.task_modules=my_taks: cannot import" in r.stderr


def test_parsing_again_adds_no_search_path_twice():
    """A process that parses many times (the league plans every recipe) searches each
    directory once; gin's list of search paths grew by one copy per parse."""
    _parse(["demo/mmlm_tlm.gin"], list(gin_utils.SYNTHETIC_RUN_MACROS))
    searched = list(gin.config._LOCATION_PREFIXES)
    _parse(["demo/mmlm_tlm.gin"], list(gin_utils.SYNTHETIC_RUN_MACROS))
    assert gin.config._LOCATION_PREFIXES == searched
    assert len(set(searched)) == len(searched)


def test_a_file_macro_stays_valid_when_a_binding_overrides_the_parameter_using_it():
    """bench --seq_len binds loop.train.seq_len over the file's %SEQ_LEN: not an error; a
    user's own SEQ_LEN that then reaches nothing is."""
    _parse(["demo/mmlm_tlm.gin"], ["loop.train.seq_len = 16"])
    with pytest.raises(gin_utils.GinConfigError, match=r"SEQ_LEN \(--gin.SEQ_LEN=32\)"):
        _parse(["demo/mmlm_tlm.gin"], ["loop.train.seq_len = 16", "SEQ_LEN = 32"])
