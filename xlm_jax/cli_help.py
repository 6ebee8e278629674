"""What every CLI of the library shares: the help layout, the one-line usage and runtime
errors, a quiet TensorFlow import. A module of its own, importing nothing of the library (nor
anything heavy), so that any CLI, the data and evaluation ones included, can use it without
importing the trainer. The gin CLIs' `xlm_jax.train.cli` adds gin's macro names to the error
line (`error_line`'s `rename`). The commands that moved keep their old names for one release
(`MOVED`)."""
from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import logging
import os
import re
import runpy
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Every CLI's help: the module docstring as written, each flag's default shown (not
    when there is none to show, None or False, nor when the help text already says it)."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default in (None, False) or "default" in text:
            return action.help
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """Every CLI's parser: `HelpFormatter` by default, and a usage error printed as ONE line,
    `PROG: error: MESSAGE (--help lists every flag)`, exit status 2 — argparse's own error()
    prints the whole usage block first, which pushes the message off a narrow terminal and
    puts a second, unrelated line into a pod log. Subcommand parsers inherit the class."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (--help lists every flag)\n")


# The exceptions a CLI reports as one line (`error_line`) instead of a traceback; ImportError
# is a task module that does not import (`loop.train.task_modules`).
CLI_ERRORS = (ValueError, OSError, FloatingPointError, KeyError, TypeError, ImportError)
# Set (to anything but "" or "0") to get the traceback instead of the one line, in every CLI;
# the gin CLIs also take --debug.
DEBUG_ENV = "XLM_JAX_DEBUG"
# gin appends where a configurable was called to a message; it names gin's function object,
# not anything the user wrote.
_GIN_CALL_SITE = re.compile(r"^\s*In call to configurable ")


def debug_wanted(args: argparse.Namespace | None = None) -> bool:
    """--debug on the command line or `XLM_JAX_DEBUG` set: errors keep their traceback."""
    return bool(getattr(args, "debug", False)) or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def error_line(e: BaseException, rename: Callable[[str], str] | None = None) -> str:
    """`error: Type: message` on one line (the message's lines joined by ' | '), without gin's
    "In call to configurable ..." lines; `rename` rewrites the joined message (the gin CLIs
    name a setting by the macro the user gave it, `xlm_jax.train.cli.error_line`). An error
    unwrapped from the input pipeline (`pipeline_error`) is named by its own type."""
    lines = [line.strip() for line in str(e).splitlines()
             if line.strip() and not _GIN_CALL_SITE.match(line)]
    message = " | ".join(lines)
    kind = getattr(e, "kind", None) or type(e).__name__
    return f"error: {kind}: {rename(message) if rename else message}"


class InputPipelineError(ValueError):
    """An exception raised inside the input pipeline (a Python function a tf.data map runs),
    which TensorFlow re-raised as its own error with the Python traceback in the message:
    `kind` and the message are the original exception's."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


# The last line of a Python traceback that TensorFlow put into its error message.
_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w+(?:Error|Exception|Exit)): (.+)$")


def pipeline_error(e: BaseException) -> InputPipelineError | None:
    """The original exception of a TensorFlow error raised from the input pipeline
    (`tf.errors.OpError` whose message holds a Python traceback), else None."""
    if not type(e).__module__.startswith("tensorflow"):
        return None
    found = [m for m in map(_RAISED.match, str(e).splitlines()) if m]
    return InputPipelineError(found[-1][1], found[-1][2].strip()) if found else None


def run_reporting(fn: Callable[[], int], args: argparse.Namespace | None = None,
                  code: int = 1, describe: Callable[[BaseException], str] = error_line) -> int:
    """`fn()`'s exit status; a `CLI_ERRORS` exception, or one raised inside the input pipeline
    (`pipeline_error`), is printed as one line (`describe`, by default `error_line`) and gives
    `code`, unless `debug_wanted(args)`, when it propagates with its traceback."""
    try:
        return fn()
    except CLI_ERRORS as e:
        if debug_wanted(args):
            raise
        print(describe(e), file=sys.stderr)
        return code
    except Exception as e:  # noqa: BLE001 - only TensorFlow's wrapping of a pipeline error
        inner = pipeline_error(e)
        if inner is None or debug_wanted(args):
            raise
        print(describe(inner), file=sys.stderr)
        return code


def exit_with(main: Callable[[], int | None]) -> None:
    """Runs a CLI's `main()` and ends the process with its status, as `sys.exit(main())`
    would, except after a failure in a process that has imported TensorFlow: then the streams
    and logging are flushed and the process ends at once (`os._exit`), skipping the
    interpreter's shutdown. Why (issue 54): a tf.data iterator destroyed at shutdown waits for
    the map calls still in flight, which wait for Python, which is shutting down: a prepared
    shard's read error hung `bench --pipeline` until killed (on a pod, a hung host holds the
    whole slice). Everything a failed run must keep (checkpoints, metrics, TensorBoard) is
    written and closed by the run's own `finally` blocks before `main` returns. An exception
    escaping `main` is printed as Python would (one line for an input-pipeline error), status
    1."""
    try:
        code = main()
    except SystemExit as e:
        code = e.code
    except Exception as e:  # noqa: BLE001 - printed as Python would, then the same exit
        inner = pipeline_error(e)
        if "tensorflow" not in sys.modules:
            raise
        if inner is not None and not debug_wanted():
            print(error_line(inner), file=sys.stderr)
        else:
            import traceback  # pylint: disable=g-import-not-at-top

            traceback.print_exc()
        code = 1
    if code in (0, None) or "tensorflow" not in sys.modules:
        sys.exit(code)
    if not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    logging.shutdown()
    os._exit(code)


# TensorFlow's start-up lines on a machine without a GPU, none of which a user can act on: since
# TF logs through absl, they are written before absl is initialised and TF_CPP_MIN_LOG_LEVEL does
# not hide them (measured with TF 2.21: `TF_CPP_MIN_LOG_LEVEL=2 python -c "import tensorflow"`
# still prints all three kinds).
_TF_NOISE = re.compile(
    r"All log messages before absl::InitializeLog|cudart_stub\.cc|Could not find cuda drivers|"
    r"oneDNN custom operations are on|Unable to register cu(DNN|FFT|BLAS) factory|"
    r"computation_placer\.cc|This TensorFlow binary is optimized|To enable the following "
    r"instructions|rebuild TensorFlow with the appropriate compiler flags|"
    r"TF-TRT Warning|cuInit|failed call to cuInit")


def quiet_tensorflow() -> None:
    """Imports TensorFlow (when installed and not yet imported) quietly. TF serves only the
    input pipeline in this library, and on a CPU machine everything it logs on its own is
    noise a user cannot act on: its import lines (`_TF_NOISE`, dropped from stderr; every
    other line TF or Python wrote meanwhile is written back in order), CUDA's failed cuInit
    when TF first looks for GPUs (done here, and TF is kept off the GPUs, which belong to JAX,
    as t5x does), and one "did not fully read the dataset being cached" WARNING per small task
    when training stops mid-epoch (seqio caches small tasks in memory). TF's C++ log level is
    set to errors only while TF and tensorflow_text are imported, which is when they read it,
    and restored afterwards for XLA, which reads the same variable (TF_CPP_MIN_LOG_LEVEL) on
    its own. A CLI that uses the input pipeline calls this first; `XLM_JAX_DEBUG=1` keeps
    every line. Machines without TensorFlow skip it."""
    if importlib.util.find_spec("tensorflow") is None:
        return
    with tensorflow_quietly():
        import tensorflow  # noqa: F401  pylint: disable=g-import-not-at-top


@contextlib.contextmanager
def tensorflow_quietly() -> Iterator[None]:
    """Runs the body with `quiet_tensorflow`'s filter on stderr: if the body imports
    TensorFlow (a gin file importing a seqio task module does), TF's import lines are dropped,
    tensorflow_text is imported under the same filter and TF is kept off the GPUs; a body that
    does not import TF (a run on synthetic streams) costs nothing and leaves TF unimported,
    which saves its import time. Every other line written meanwhile is written back in order,
    also when the body raises. A no-op once TF is imported or with `XLM_JAX_DEBUG=1`."""
    if "tensorflow" in sys.modules or debug_wanted():
        yield
        return
    sys.stderr.flush()
    saved_fd = os.dup(2)
    saved_level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    with tempfile.TemporaryFile(mode="w+b") as captured:
        os.dup2(captured.fileno(), 2)
        os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
        try:
            yield
            tf = sys.modules.get("tensorflow")
            if tf is not None:
                # tensorflow_text (seqio imports it) loads kernels that read the level again
                if importlib.util.find_spec("tensorflow_text") is not None:
                    import tensorflow_text  # noqa: F401  pylint: disable=g-import-not-at-top
                tf.config.list_physical_devices("GPU")
                try:
                    tf.config.set_visible_devices([], "GPU")
                except RuntimeError:  # TF's runtime already started: nothing to hide any more
                    pass
        finally:
            if saved_level is None:
                os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
            else:
                os.environ["TF_CPP_MIN_LOG_LEVEL"] = saved_level
            sys.stderr.flush()
            os.dup2(saved_fd, 2)
            os.close(saved_fd)
            captured.seek(0)
            kept = [line for line in captured.read().decode("utf-8", "replace").splitlines(True)
                    if not _TF_NOISE.search(line)]
            sys.stderr.write("".join(kept))
            sys.stderr.flush()


# ----------------------------------------------------------------------------- moved commands

# The commands the package root's restructuring moved (0.1 -> 0.2, docs/architecture.md), old
# module -> new. The old name is a thin module (`xlm_jax/bench.py`, ...) that runs the new one
# with the same arguments, and forwards attribute access to it, with one WARNING that names the
# new command. Our choice: the old names are removed in the release after 0.2.
MOVED: dict[str, str] = {
    "xlm_jax.bench": "xlm_jax.accelerator.bench",
    "xlm_jax.smoke": "xlm_jax.accelerator.smoke",
    "xlm_jax.lower": "xlm_jax.accelerator.lower",
    "xlm_jax.pod_memory": "xlm_jax.accelerator.pod_memory",
    "xlm_jax.compile": "xlm_jax.accelerator.compile",
    "xlm_jax.compile.run_table": "xlm_jax.accelerator.compile.run_table",
    # 0.2 -> 0.3: preparing and reading prepared data became one subpackage (issue 54), each
    # removed in the release after 0.3 (`REMOVED_AFTER`).
    **{f"xlm_jax.data.{old}": f"xlm_jax.data.prepared.{new}" for old, new in (
        ("prepare", "prepare"), ("prepare_worker", "prepare_worker"),
        ("prepare_console", "prepare_console"), ("prepare_lock", "prepare_lock"),
        ("verify", "verify"), ("corpus_units", "corpus_units"),
        ("prepared_files", "shard_files"), ("shard_index", "shard_index"),
        ("remote_reads", "remote_reads"), ("index_shuffle", "index_shuffle"))},
}
# The old names that are modules only, no command (each of the others runs its new command).
MOVED_MODULES: frozenset[str] = frozenset(
    old for old in MOVED if old.startswith("xlm_jax.data.")
) - {"xlm_jax.data.prepare", "xlm_jax.data.verify"}
# The release after which an old name goes (0.2's moves: the release after 0.2).
REMOVED_AFTER: dict[str, str] = {old: "0.3" for old in MOVED if old.startswith("xlm_jax.data.")}
_MOVED_LOG = logging.getLogger("xlm_jax.moved")
_warned: set[str] = set()


def warn_moved(old: str, command: bool = True) -> None:
    """The one WARNING (per process and name) that `old` moved, naming the new command (or,
    `command=False`, the new module an import reached). It has its own stderr handler, so it
    shows before the command configures any logging and does not configure logging for it."""
    if old in _warned:
        return
    _warned.add(old)
    form = "`python -m {}`" if command else "`{}`"
    _moved_log().warning("%s has moved to %s; the old name is removed in the release after %s",
                         form.format(old), form.format(MOVED[old]),
                         REMOVED_AFTER.get(old, "0.2"))


def warn_deprecated(old: str, instead: str) -> None:
    """The one WARNING (per process and name) that the function `old` is deprecated, naming
    what replaces it; removed in the release after 0.3 (kept for one release)."""
    if old in _warned:
        return
    _warned.add(old)
    _moved_log().warning("`%s` is deprecated: use %s; the old name is removed in the release "
                         "after 0.3", old, instead)


def _moved_log() -> logging.Logger:
    """The moved names' logger, with a stderr handler of its own, so that its WARNING shows
    before a command configures logging, and does not configure logging for it."""
    if not _MOVED_LOG.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(levelname)s: %(message)s"))
        _MOVED_LOG.addHandler(handler)
        _MOVED_LOG.propagate = False
    return _MOVED_LOG


def run_moved(old: str) -> None:
    """`python -m OLD ...`: the WARNING, then the new command run as `__main__` with the same
    arguments (its own exit status, its own --help)."""
    warn_moved(old)
    runpy.run_module(MOVED[old], run_name="__main__", alter_sys=True)


def moved_getattr(old: str) -> Callable[[str], Any]:
    """The old module's `__getattr__` (PEP 562): `from xlm_jax.bench import main` still works,
    with the WARNING, and gets the new module's object."""
    def __getattr__(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        warn_moved(old, command=False)
        return getattr(importlib.import_module(MOVED[old]), name)

    return __getattr__
