"""Input-pipeline throughput: examples/s and non-pad tokens/s of a task's batch iterator.

  python -m xlm_jax.data.pipeline_bench --pipeline demo_mono --batch_size 32 \
      --sequence_length 128 --batches 50

(also reachable as `python -m xlm_jax.bench --pipeline TASK`). It times
`pipeline.make_batch_iterator` after `--warmup` batches (pipeline construction, TF start-up
and the first file reads are excluded). For VECO / mixup tasks an example is two rows and
both rows' tokens count.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import time
from typing import Optional, Sequence

import numpy as np

from xlm_jax.data.features import PAD_ID
from xlm_jax.data.pipeline import make_batch_iterator

__all__ = ["PipelineBenchResult", "count_tokens", "run", "main"]


@dataclasses.dataclass(frozen=True)
class PipelineBenchResult:
    """Throughput of `batches` timed batches (after warm-up)."""

    task: str
    batch_size: int
    sequence_length: int
    batches: int
    seconds: float
    examples_per_s: float
    tokens_per_s: float  # non-pad tokens
    pad_fraction: float


def count_tokens(batch: dict[str, np.ndarray]) -> tuple[int, int]:
    """(non-pad tokens, all positions) over every `*input_ids` row of a batch."""
    real = total = 0
    for key, ids in batch.items():
        if key.endswith("input_ids"):
            real += int(np.sum(ids != PAD_ID))
            total += ids.size
    return real, total


def run(task: str, batch_size: int = 32, sequence_length: int = 128, batches: int = 50,
        warmup: int = 5, seed: int = 0) -> PipelineBenchResult:
    """Times `batches` batches of `task` after `warmup` untimed ones."""
    if batches < 1 or warmup < 0:
        raise ValueError(f"need --batches >= 1 and --warmup >= 0, got {batches}, {warmup}")
    it = make_batch_iterator(task, batch_size, sequence_length, seed=seed)
    for _ in range(warmup):
        next(it)
    real = total = 0
    start = time.perf_counter()
    for _ in range(batches):
        r, t = count_tokens(next(it))
        real += r
        total += t
    seconds = time.perf_counter() - start
    return PipelineBenchResult(task, batch_size, sequence_length, batches, seconds,
                               batches * batch_size / seconds, real / seconds,
                               1.0 - real / total)


def main(argv: Optional[Sequence[str]] = None) -> PipelineBenchResult:
    parser = argparse.ArgumentParser(prog="python -m xlm_jax.data.pipeline_bench",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", required=True, help="registered task or mixture")
    parser.add_argument("--module", default="tasks.demo",
                        help="module that registers the task (default tasks.demo)")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--sequence_length", type=int, default=128)
    parser.add_argument("--batches", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        importlib.import_module(args.module)
    except ImportError as e:
        raise SystemExit(f"pipeline_bench: cannot import --module {args.module!r} ({e}); run "
                         "from the repository root") from e
    res = run(args.pipeline, args.batch_size, args.sequence_length, args.batches, args.warmup,
              args.seed)
    print(f"pipeline {res.task}: batch {res.batch_size} x {res.sequence_length}, "
          f"{res.batches} batches in {res.seconds:.2f} s after {args.warmup} warm-up: "
          f"{res.examples_per_s:.1f} examples/s, {res.tokens_per_s:.0f} tokens/s (non-pad), "
          f"pad fraction {res.pad_fraction:.3f}")
    return res


if __name__ == "__main__":
    main()
