"""The leak check (tests/testlib/leak_check.py, process_state.py): a planted leak fails the test
that made it, naming what it left, and nothing after it; changes undone in time, and what a
module does when first imported, are not leaks; each kind of state it compares is seen."""
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap

import pytest

from tests.testlib import process_state

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PLANTED = '''
import importlib
import os

import gin


class Planted:
    def __init__(self, x=1):
        self.x = x


def test_registers_a_configurable():
    gin.external_configurable(Planted, module="planted")


def test_sets_an_environment_variable():
    os.environ["XLM_JAX_PLANTED_LEAK"] = "1"


def test_undoes_what_it_changes(monkeypatch, tmp_path):
    monkeypatch.setenv("XLM_JAX_PLANTED_LEAK", "2")
    monkeypatch.chdir(tmp_path)
    gin.bind_parameter("gin.macro.value", 3)
    gin.clear_config()


def test_sees_neither_leak_from_before():
    assert "XLM_JAX_PLANTED_LEAK" not in os.environ
    assert "planted.Planted" not in gin.config._REGISTRY


def test_a_first_import_may_change_the_process():
    import planted_module  # registers a configurable and counts its imports in os.environ

    assert os.environ["XLM_JAX_PLANTED_IMPORTS"] == "1"


def test_a_reload_may_not():
    import planted_counter

    importlib.reload(planted_counter)


def test_leaves_a_module_it_wrote_imported(tmp_path, monkeypatch):
    (tmp_path / "planted_tasks.py").write_text("X = 1\\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # sys.path is put back; the module stays
    import planted_tasks  # noqa: F401


def test_forgets_the_module_it_wrote(tmp_path):
    from tests.testlib import temp_modules

    (tmp_path / "planted_tasks.py").write_text("X = 2\\n")
    with temp_modules.importable(str(tmp_path)):
        import planted_tasks

        assert planted_tasks.X == 2  # its own, not the one the test before wrote
'''

# A module that counts how often it was executed, in os.environ[NAME].
COUNT_IMPORTS = '''
import os

os.environ["{0}"] = str(int(os.environ.get("{0}", 0)) + 1)
'''
PLANTED_MODULE = COUNT_IMPORTS.format("XLM_JAX_PLANTED_IMPORTS") + '''
import gin


@gin.configurable
def planted_function(x=1):
    return x
'''


def test_planted_leaks_fail_the_tests_that_left_them_and_only_those(tmp_path):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["tests.testlib.leak_check"]\n')
    (tmp_path / "pytest.ini").write_text("[pytest]\npython_files = *_planted.py\n")
    (tmp_path / "leaks_planted.py").write_text(textwrap.dedent(PLANTED))
    # the "library" modules lie outside pytest's temporary directories, as an installed
    # library does (a module under them is a test's own: its first import is no excuse)
    lib = tempfile.mkdtemp(prefix="xlm_jax_planted_lib_")
    try:
        with open(os.path.join(lib, "planted_module.py"), "w") as f:
            f.write(PLANTED_MODULE)
        with open(os.path.join(lib, "planted_counter.py"), "w") as f:
            f.write(COUNT_IMPORTS.format("XLM_JAX_PLANTED_RUNS"))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTEST_", "XLM_JAX_PLANTED"))}
        env["PYTHONPATH"] = os.pathsep.join([ROOT, lib])
        proc = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:xdist", "-p", "no:cacheprovider",
             "leaks_planted.py"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    finally:
        shutil.rmtree(lib, ignore_errors=True)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "8 passed, 4 errors" in out, out
    errors = sorted(line.split(" - ")[0] for line in out.splitlines()
                    if line.startswith("ERROR "))
    assert errors == ["ERROR leaks_planted.py::test_a_reload_may_not",
                      "ERROR leaks_planted.py::test_leaves_a_module_it_wrote_imported",
                      "ERROR leaks_planted.py::test_registers_a_configurable",
                      "ERROR leaks_planted.py::test_sets_an_environment_variable"], out
    assert ("leaks_planted.py::test_leaves_a_module_it_wrote_imported left the process changed"
            in out and "modules imported from a temporary directory: planted_tasks: added "
            "<module from " in out), out
    # each names what it left behind
    assert ("leaks_planted.py::test_registers_a_configurable left the process changed" in out
            and "gin registry: planted.Planted: added (leaks_planted.Planted)" in out
            and "gin inverse registry: leaks_planted.Planted: added -> planted.Planted" in out
            ), out
    assert "environment: XLM_JAX_PLANTED_LEAK: added '1'" in out, out
    # planted_counter's first import set it to '1' (allowed), the reload to '2'
    assert ("leaks_planted.py::test_a_reload_may_not left the process changed" in out
            and "environment: XLM_JAX_PLANTED_RUNS: '1' -> '2'" in out), out


def _leaks_of(change, undo) -> list[str]:
    """What a watch reports for `change()`, which `undo()` takes back before this test ends."""
    watch = process_state.open_watch()
    try:
        change()
    finally:
        process_state.close_watch(watch)
        _, leaks = watch.leaks()
        undo()
    return process_state.describe(leaks)


def test_the_working_directory_and_sys_path_are_compared(tmp_path):
    cwd = os.getcwd()
    assert _leaks_of(lambda: os.chdir(tmp_path), lambda: os.chdir(cwd)) == [
        f"process: working directory: {cwd!r} -> {str(tmp_path)!r}"]
    path = list(sys.path)
    leaks = _leaks_of(lambda: sys.path.insert(0, str(tmp_path)), lambda: sys.path.__setitem__(
        slice(None), path))
    assert len(leaks) == 1 and leaks[0].startswith("process: sys.path: ("), leaks


def test_objects_left_frozen_out_of_the_collector_are_compared():
    """The step loop freezes its heap (`xlm_jax.train.host_gc`); a loop that does not unfreeze
    it when it leaves (CPython 3.12's count of its own immortal objects once made it so) would
    leave every later test's objects uncollected."""
    import gc

    assert _leaks_of(gc.freeze, gc.unfreeze) == [
        f"process: {process_state.FROZEN}: False -> True"]


def test_a_logger_handler_and_level_are_compared():
    logger, handler = logging.getLogger("xlm_jax.leak_check_test"), logging.NullHandler()

    def undo():
        logger.removeHandler(handler)
        logger.setLevel(logging.NOTSET)

    leaks = _leaks_of(lambda: (logger.addHandler(handler), logger.setLevel(logging.INFO)), undo)
    assert leaks == ["logging: logger xlm_jax.leak_check_test: added "
                     f"({logging.INFO}, ({handler!r},), True, False)"]


def test_the_prepared_data_choice_is_compared(tmp_path):
    from xlm_jax.data.prepared import choice

    scope = choice.reading(str(tmp_path))
    assert choice._READING[0] is None
    assert _leaks_of(scope.__enter__, lambda: scope.__exit__(None, None, None)) == [
        f"prepared data: _READING: None -> {str(tmp_path)!r}"]


def test_a_jax_flag_is_compared():
    import jax

    before = jax.config.jax_debug_nans
    leaks = _leaks_of(lambda: jax.config.update("jax_debug_nans", not before),
                      lambda: jax.config.update("jax_debug_nans", before))
    assert leaks == [f"jax config: jax_debug_nans: {before} -> {not before}"]


def test_a_seqio_registration_is_compared():
    seqio = pytest.importorskip("seqio")
    marker = object()
    registry = seqio.TaskRegistry._REGISTRY
    leaks = _leaks_of(lambda: registry.__setitem__("leak_check_test_task", marker),
                      lambda: registry.pop("leak_check_test_task"))
    assert leaks == [f"seqio registries: task 'leak_check_test_task': added {marker!r}"]


def test_put_back_undoes_an_environment_variable_and_a_gin_binding(gin_isolated):
    import gin

    watch = process_state.open_watch()
    os.environ["XLM_JAX_LEAK_CHECK_TEST"] = "1"
    gin.bind_parameter("gin.macro.value", 3)
    process_state.close_watch(watch)
    _, leaks = watch.leaks()
    assert process_state.put_back(leaks) == []
    assert "XLM_JAX_LEAK_CHECK_TEST" not in os.environ
    assert process_state.compare(watch.before, process_state.snapshot()) == {}
