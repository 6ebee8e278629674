"""`python -m xlm_jax.train --gin_file=F.gin [--gin.NAME=VALUE ...] --model_dir=DIR`.

flags -> jax.distributed -> gin -> `loop.train()`. Multi-process: under SLURM, Open MPI, on
multi-host TPU VMs and GKE the cluster is detected (jax's own detection; see
xlm_jax/train/distributed.py); other launchers pass --coordinator_address, --num_processes
and --process_id. CPU processes use gloo collectives.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from absl import flags

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "gin files (repeatable), searched in --gin_search_paths, "
                          "the working directory and gin_configs/")
flags.DEFINE_multi_string("gin_bindings", [], "extra gin bindings, e.g. 'TRAIN_STEPS = 100'")
flags.DEFINE_list("gin_search_paths", [], "extra directories to look for gin files in")
flags.DEFINE_string("model_dir", None, "where checkpoints, metrics and configs go")
flags.DEFINE_string("coordinator_address", None, "HOST:PORT of process 0 (multi-process only)")
flags.DEFINE_integer("num_processes", None, "number of processes (multi-process only)")
flags.DEFINE_integer("process_id", None, "this process's index (multi-process only)")
flags.DEFINE_float("initialization_timeout", 300, "seconds a process waits to reach the "
                   "jax.distributed coordinator, and then for all processes to join (multi-process "
                   "only)")


def init_distributed(coordinator: str | None, num_processes: int | None,
                     process_id: int | None) -> None:
    """Explicit coordinator flags, else jax's cluster detection (SLURM, Open MPI, TPU VM, GKE)
    when the environment says more than one process, else single-process; see
    xlm_jax/train/distributed.py. The wait is --initialization_timeout."""
    from xlm_jax.train import distributed

    distributed.initialize(coordinator, num_processes, process_id,
                           timeout_s=FLAGS["initialization_timeout"].value)


def _help_asked(args: Sequence[str]) -> str | None:
    """'--help' or '--helpfull' when one of them is among the arguments, else None."""
    for arg in args:
        if arg in ("--help", "-h", "-help", "--helpshort"):
            return "--help"
        if arg == "--helpfull":
            return "--helpfull"
    return None


def _print_help(full: bool) -> None:
    """Usage (this module's docstring), then the trainer's flags (every flag with `full`)."""
    print(__doc__.strip() + "\n")
    print("--gin.NAME=VALUE is short for --gin_bindings='NAME = VALUE'.\n")
    print(FLAGS.get_help() if full else FLAGS.module_help(__name__))
    if not full:
        print("\nTry --helpfull to get a list of all flags.")


def main(argv: Sequence[str] | None = None) -> int:
    from xlm_jax.train import gin_utils

    argv = gin_utils.rewrite_gin_args(list(sys.argv if argv is None else argv))
    asked = _help_asked(argv[1:])
    if asked:
        _print_help(full=asked == "--helpfull")
        return 0
    try:
        FLAGS(argv)
    except flags.Error as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not FLAGS.model_dir:
        print("error: --model_dir is required", file=sys.stderr)
        return 2
    try:
        # Parse gin before anything heavy: unknown bindings fail here, not after compiling.
        from xlm_jax.train import loop

        gin_utils.parse(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths)
        init_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
        result = loop.train(FLAGS.model_dir)
    except (ValueError, OSError, FloatingPointError, KeyError, TypeError) as e:
        lines = [line.strip() for line in str(e).splitlines() if line.strip()]
        print(f"error: {type(e).__name__}: {' | '.join(lines)}", file=sys.stderr)
        return 1
    if result.preempted:
        print(f"preempted: stopped at step {result.final_step} with a checkpoint in "
              f"{result.model_dir}; run the same command to resume")
    else:
        print(f"done: {result.final_step} steps in {result.model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
