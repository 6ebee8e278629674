"""`python -m xlm_jax.train --gin_file=F.gin [--gin.NAME=VALUE ...] --model_dir=DIR
[--init_from=MODEL]`.

flags -> jax.distributed -> gin -> `loop.train()`. Multi-process: under SLURM, Open MPI, on
multi-host TPU VMs and GKE the cluster is detected (jax's own detection; see
xlm_jax/train/distributed.py); other launchers pass --coordinator_address, --num_processes
and --process_id. CPU processes use gloo collectives. A run that fails before it trained a
step removes the --model_dir it created (a directory that was there before is left alone).
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence

from xlm_jax import cli_help
from xlm_jax.cli_help import (  # noqa: F401  (re-exported: callers import them from here)
    CLI_ERRORS, DEBUG_ENV, HelpFormatter, debug_wanted)

# One flags style for every CLI of the library: argparse, `--name=value` or `--name value`,
# repeatable flags appended, `--gin.NAME=VALUE` rewritten to a binding before parsing.
HELP_FLAGS = ("-h", "--help", "-help", "--helpshort", "--helpfull")


def gin_parser(prog: str, description: str, binding_example: str) -> argparse.ArgumentParser:
    """An argparse parser with the gin flags every gin-configured CLI takes."""
    p = cli_help.Parser(
        prog=prog, description=description, allow_abbrev=False,
        epilog="--gin.NAME=VALUE is short for --gin_bindings='NAME = VALUE'.",
        formatter_class=HelpFormatter)
    p.add_argument("--gin_file", action="append", default=[],
                   help="gin file (repeatable), searched in --gin_search_paths, the working "
                        "directory and gin_configs/ (the repository's or the installed copy)")
    p.add_argument("--gin_bindings", action="append", default=[],
                   help=f"extra gin binding (repeatable), e.g. '{binding_example}'")
    p.add_argument("--gin_search_paths", default="",
                   help="comma-separated extra directories to look for gin files in")
    p.add_argument("--debug", action="store_true",
                   help=f"on an error, show the traceback instead of one line (also "
                        f"{DEBUG_ENV}=1)")
    return p


def run_reporting(fn: Callable[[], int], args: argparse.Namespace | None = None,
                  code: int = 1) -> int:
    """`cli_help.run_reporting` with the gin CLIs' `error_line` (macros named as the user
    wrote them): `fn()`'s exit status, a `CLI_ERRORS` exception printed as one line."""
    return cli_help.run_reporting(fn, args, code, describe=error_line)


def parse_flags(parser: argparse.ArgumentParser, argv: Sequence[str] | None
                ) -> argparse.Namespace | int:
    """The parsed flags (`--gin.NAME=VALUE` rewritten to bindings first), or the exit code
    when there is nothing to run: 0 after --help, 2 after a bad flag (`cli_help.Parser`
    printed the one-line error)."""
    from xlm_jax.train import gin_utils

    argv = gin_utils.rewrite_gin_args(list(sys.argv if argv is None else argv))[1:]
    if any(a in HELP_FLAGS for a in argv):
        parser.print_help()
        return 0
    try:
        return parser.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)


def parse_gin(args: argparse.Namespace, placeholders: Sequence[str] | None = None,
              extra_bindings: Sequence[str] = ()) -> None:
    """Parses the flags' gin files and bindings, then `extra_bindings` (what a CLI flag
    binds): unknown bindings and macros nothing uses fail here, before anything heavy is
    built (`placeholders`: bindings allowed to go unused, `gin_utils.SYNTHETIC_RUN_MACROS`
    by default)."""
    from xlm_jax.train import gin_utils

    search = [d for d in args.gin_search_paths.split(",") if d]
    gin_utils.parse(args.gin_file, [*args.gin_bindings, *extra_bindings], search,
                    placeholders=gin_utils.SYNTHETIC_RUN_MACROS if placeholders is None
                    else placeholders)


def error_line(e: BaseException) -> str:
    """`cli_help.error_line` with a setting the user gave through a gin macro named by that
    macro (`TRAIN_STEPS=-1 (OptimizerConfig.total_steps)`, not the parameter alone)."""
    from xlm_jax.train import gin_utils

    return cli_help.error_line(e, rename=gin_utils.user_names)


def _parser() -> argparse.ArgumentParser:
    p = gin_parser("python -m xlm_jax.train", __doc__, "TRAIN_STEPS = 100")
    p.add_argument("--model_dir", required=True,
                   help="where checkpoints, metrics and configs go (local or gs://)")
    p.add_argument("--init_from", default=None, metavar="MODEL",
                   help="start from this pre-trained model's encoder weights: an xlm_jax "
                        "model_dir (a trainer run's latest checkpoint, or an exported model) "
                        "or an HF XLM-R directory, as finetune's --init_from; binds "
                        "loop.train.init_from (and a run file's INIT_FROM). A --model_dir that "
                        "already holds a checkpoint resumes from it instead")
    p.add_argument("--coordinator_address", default=None,
                   help="HOST:PORT of process 0 (multi-process launchers jax does not detect)")
    p.add_argument("--num_processes", type=int, default=None,
                   help="number of processes (multi-process only)")
    p.add_argument("--process_id", type=int, default=None,
                   help="this process's index (multi-process only)")
    p.add_argument("--initialization_timeout", type=float, default=300,
                   help="seconds a process waits to reach the jax.distributed coordinator, and "
                        "then for all processes to join (multi-process only)")
    return p


def init_distributed(args: argparse.Namespace) -> None:
    """Explicit coordinator flags, else jax's cluster detection (SLURM, Open MPI, TPU VM, GKE)
    when the environment says more than one process, else single-process; see
    xlm_jax/train/distributed.py. The wait is --initialization_timeout."""
    from xlm_jax.train import distributed

    distributed.initialize(args.coordinator_address, args.num_processes, args.process_id,
                           timeout_s=args.initialization_timeout)


# A binding of the starting weights besides --init_from: the run files' macro, or the parameter.
_SETS_INIT_FROM = re.compile(r"\s*(INIT_FROM|(\S+/)?[\w.]*\btrain\.init_from)\s*=")


def init_from_bindings(args: argparse.Namespace, parser: argparse.ArgumentParser
                       ) -> list[str]:
    """The bindings --init_from stands for: `loop.train.init_from` and the run files' macro
    `INIT_FROM` (required by the files that start from XLM-R; a placeholder elsewhere), the
    path made absolute when local, as the operative config then records it. A local path
    that is no directory, or a binding of either name beside the flag, is a usage error."""
    from xlm_jax import model_dir as md
    from xlm_jax.train import gin_utils

    if not args.init_from:
        return []
    path = args.init_from
    if not md.is_remote(path):
        if not os.path.isdir(path):
            parser.error(f"--init_from={path}: not a directory")
        path = os.path.abspath(path)
    given = [b for b in args.gin_bindings if _SETS_INIT_FROM.match(b)]
    if given:
        parser.error(f"--init_from and {gin_utils.binding_flag(given[0])} both set the starting "
                     "weights; give one")
    return [f"INIT_FROM = {path!r}", f"loop.train.init_from = {path!r}"]


def _top_created(path: str) -> str | None:
    """The outermost directory of `path` (itself or a parent) that does not exist yet: what a
    run writing `path` creates; None when `path` exists or is remote (gs://)."""
    from xlm_jax import model_dir as md

    if md.is_remote(path) or os.path.exists(path):
        return None
    top = os.path.abspath(path)
    while not os.path.exists(os.path.dirname(top)):
        top = os.path.dirname(top)
    return top


def remove_if_unstarted(created: str | None, model_dir: str) -> bool:
    """Removes `model_dir`, and the parents up to `created` (`_top_created(model_dir)` before
    the run) that are then empty, when the run created it and left nothing to resume or read
    there: no finished checkpoint and no logged step (metrics.jsonl missing or empty). Why: a
    run that failed in its setup (a missing task, a bad path) left an empty `checkpoints/`,
    so the next command found a directory that looked like a run; a run that trained steps
    keeps its logs for the post-mortem. Returns whether it removed `model_dir`."""
    from xlm_jax import model_dir as md

    if created is None or not os.path.isdir(model_dir):
        return False
    metrics = os.path.join(model_dir, "metrics.jsonl")
    if md.checkpoint_steps(model_dir) or (os.path.exists(metrics)
                                          and os.path.getsize(metrics) > 0):
        return False
    shutil.rmtree(model_dir, ignore_errors=True)
    parent, top = os.path.abspath(model_dir), os.path.abspath(created)
    while parent != top and parent.startswith(top + os.sep):
        parent = os.path.dirname(parent)
        try:
            os.rmdir(parent)  # only when empty: another run may be writing beside ours
        except OSError:
            break
    return not os.path.exists(model_dir)


@contextlib.contextmanager
def configurable_warnings_held(args: argparse.Namespace | None = None
                               ) -> Iterator[Callable[[], None]]:
    """Holds back the warnings whose source is gin's configurable wrapper (gin/config.py)
    until the run writes its first line to stdout or ends, each then printed as one line
    `warning: MESSAGE`; yields a function that drops them (call it when the run failed with
    a one-line error). Which: a warning a configurable raises while gin constructs it, whose
    `stacklevel` lands in gin: today `optim.OptimizerConfig`'s "warmup_steps > total_steps"
    (a smoke run of a run file). Python printed it with gin's internal source line before
    every later error of the run, so an error was not the only line; its message still
    shows on a run that trains. gin itself warns through neither `warnings` nor at parse or
    bind time (0.5.0), so nothing else is held. Other warnings print as Python prints them;
    with --debug or XLM_JAX_DEBUG nothing is held."""
    if debug_wanted(args):
        yield lambda: None
        return
    import gin

    gin_dir = os.path.dirname(os.path.abspath(gin.__file__)) + os.sep
    held: list[str] = []
    holding = [True]
    show, stdout = warnings.showwarning, sys.stdout

    def release() -> None:
        if holding[0]:
            holding[0] = False
            if sys.stdout is proxy:
                sys.stdout = stdout
            for line in held:
                print(line, file=sys.stderr, flush=True)
            held.clear()

    def show_held(message, category, filename, lineno, file=None, line=None) -> None:
        if not os.path.abspath(filename).startswith(gin_dir):
            show(message, category, filename, lineno, file, line)
            return
        text = " | ".join(part.strip() for part in str(message).splitlines() if part.strip())
        if holding[0]:
            held.append(f"warning: {text}")
        else:
            print(f"warning: {text}", file=sys.stderr if file is None else file, flush=True)

    class _ReleaseOnWrite:
        """stdout that first releases the held warnings: the run got past its setup."""

        def write(self, text: str) -> int:
            release()
            return stdout.write(text)

        def __getattr__(self, name: str):
            return getattr(stdout, name)

    proxy = _ReleaseOnWrite()
    warnings.showwarning, sys.stdout = show_held, proxy
    try:
        yield held.clear
    finally:
        release()
        warnings.showwarning = show


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parse_flags(parser, argv)
    if isinstance(args, int):
        return args
    try:
        init_from = init_from_bindings(args, parser)
    except SystemExit as e:  # the parser's one-line usage error
        return int(e.code or 0)
    outcome = []

    def run() -> int:
        from xlm_jax.train import gin_utils, loop

        with cli_help.tensorflow_quietly():  # TF is imported only by a gin file that needs it
            parse_gin(args, [*gin_utils.SYNTHETIC_RUN_MACROS, *init_from[:1]], init_from)
        init_distributed(args)
        outcome.append(loop.train(args.model_dir))
        return 0

    created, code = _top_created(args.model_dir), None
    try:
        with configurable_warnings_held(args) as drop:
            code = run_reporting(run, args)
            if code:
                drop()
    finally:
        if code != 0:  # failed: a one-line error, a traceback or an interrupt
            remove_if_unstarted(created, args.model_dir)
    if code:
        return 1
    result = outcome[0]
    if result.preempted:
        print(f"preempted: stopped at step {result.final_step} with a checkpoint in "
              f"{result.model_dir}; run the same command to resume")
    else:  # the last line a user reads says whether a health check fired (listed above it)
        fired = result.health.fired if result.health is not None else ()
        alarm = f"; {len(fired)} health check(s) fired (the line above)" if fired else ""
        print(f"done: {result.final_step} steps in {result.model_dir}{alarm}")
    return 0


if __name__ == "__main__":
    cli_help.exit_with(main)
