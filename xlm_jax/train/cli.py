"""`python -m xlm_jax.train --gin_file=F.gin [--gin.NAME=VALUE ...] --model_dir=DIR`.

flags -> jax.distributed -> gin -> `loop.train()`. Multi-process: under SLURM, Open MPI, on
multi-host TPU VMs and GKE the cluster is detected (jax's own detection; see
xlm_jax/train/distributed.py); other launchers pass --coordinator_address, --num_processes
and --process_id. CPU processes use gloo collectives.
"""
from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

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


def parse_gin(args: argparse.Namespace, placeholders: Sequence[str] | None = None) -> None:
    """Parses the flags' gin files and bindings: unknown bindings and macros nothing uses fail
    here, before anything heavy is built (`placeholders`: bindings allowed to go unused,
    `gin_utils.SYNTHETIC_RUN_MACROS` by default)."""
    from xlm_jax.train import gin_utils

    search = [d for d in args.gin_search_paths.split(",") if d]
    gin_utils.parse(args.gin_file, args.gin_bindings, search,
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


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_flags(_parser(), argv)
    if isinstance(args, int):
        return args
    outcome = []

    def run() -> int:
        from xlm_jax.train import loop

        with cli_help.tensorflow_quietly():  # TF is imported only by a gin file that needs it
            parse_gin(args)
        init_distributed(args)
        outcome.append(loop.train(args.model_dir))
        return 0

    if run_reporting(run, args):
        return 1
    result = outcome[0]
    if result.preempted:
        print(f"preempted: stopped at step {result.final_step} with a checkpoint in "
              f"{result.model_dir}; run the same command to resume")
    else:
        print(f"done: {result.final_step} steps in {result.model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
