"""`python -m xlm_jax.train --gin_file=F.gin [--gin.NAME=VALUE ...] --model_dir=DIR`.

flags -> jax.distributed -> gin -> `loop.train()`. Multi-process: pass --coordinator_address,
--num_processes and --process_id (CPU processes use gloo collectives); on TPU VMs and under
SLURM `jax.distributed.initialize()` detects the cluster by itself.
"""
from __future__ import annotations

import os
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


def init_distributed(coordinator: str | None, num_processes: int | None,
                     process_id: int | None) -> None:
    """Explicit coordinator flags, or auto-detection on TPU VMs / SLURM, or single-process."""
    import jax

    if coordinator:
        if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                                   process_id=process_id)
    elif int(os.environ.get("SLURM_NTASKS", "1")) > 1 or os.environ.get("TPU_WORKER_HOSTNAMES"):
        jax.distributed.initialize()


def main(argv: Sequence[str] | None = None) -> int:
    from xlm_jax.train import gin_utils

    argv = gin_utils.rewrite_gin_args(list(sys.argv if argv is None else argv))
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
    print(f"done: {result.final_step} steps in {result.model_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
