"""Input-pipeline throughput: examples/s and non-pad tokens/s of a task's batch iterator.

  python -m xlm_jax.data.pipeline_bench --pipeline demo_mono --batch_size 32 \
      --sequence_length 128 --batches 50

(also reachable as `python -m xlm_jax.bench --pipeline TASK`). It times
`pipeline.make_batch_iterator` after `--warmup` batches (pipeline construction, TF start-up
and the first file reads are excluded).

`--resume_at 20,2000` times instead what a resume at each of those steps costs the input
pipeline: restoring the saved iterator position (build, `restore`, first batch) against
replaying (build at `start_step`, first batch), after checking both give the batch an
uninterrupted iterator gives there. For VECO / mixup tasks an example is two rows and
both rows' tokens count.
"""

from __future__ import annotations

import dataclasses
import importlib
import time
from typing import Optional, Sequence

import numpy as np

from xlm_jax import cli_help
from xlm_jax.data.features import PAD_ID
from xlm_jax.data.pipeline import make_batch_iterator

__all__ = ["PipelineBenchResult", "ResumeCost", "count_tokens", "resume_cost", "run", "main"]


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


@dataclasses.dataclass(frozen=True)
class ResumeCost:
    """Seconds to the first batch of a stream resumed at `step`, each way."""

    step: int
    save_seconds: float  # writing the position (once per checkpoint)
    restore_seconds: float  # build + restore + first batch
    replay_seconds: float  # build with start_step=step + first batch


def resume_cost(task: str, batch_size: int, sequence_length: int, step: int, state_dir: str,
                seed: int = 0) -> ResumeCost:
    """Times both resumes of `task` at `step` (a pipeline of the same task is built once
    first, so TF start-up and tracing are not counted) and checks both give the batch the
    uninterrupted iterator gives at `step`."""
    import os  # pylint: disable=g-import-not-at-top

    straight = make_batch_iterator(task, batch_size, sequence_length, seed=seed)
    for _ in range(step):
        next(straight)
    start = time.perf_counter()
    path = straight.save(os.path.join(state_dir, f"{task}-{step}"))
    save_s = time.perf_counter() - start
    expected = next(straight)

    start = time.perf_counter()
    restored = make_batch_iterator(task, batch_size, sequence_length, seed=seed)
    restored.restore(path)
    got_restored = next(restored)
    restore_s = time.perf_counter() - start

    start = time.perf_counter()
    replayed = make_batch_iterator(task, batch_size, sequence_length, seed=seed,
                                   start_step=step)
    got_replayed = next(replayed)
    replay_s = time.perf_counter() - start
    for got in (got_restored, got_replayed):
        if any(not np.array_equal(got[k], expected[k]) for k in expected):
            raise AssertionError(f"{task}: a resumed stream at step {step} differs")
    return ResumeCost(step, save_s, restore_s, replay_s)


def main(argv: Optional[Sequence[str]] = None) -> PipelineBenchResult | list[ResumeCost]:
    parser = cli_help.Parser(prog="python -m xlm_jax.data.pipeline_bench",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", required=True, help="registered task or mixture")
    parser.add_argument("--module", default="xlm_jax_tasks.demo",
                        help="module that registers the task (default xlm_jax_tasks.demo)")
    parser.add_argument("--batch_size", type=int, default=32, help="rows per batch")
    parser.add_argument("--sequence_length", type=int, default=128, help="row length")
    parser.add_argument("--batches", type=int, default=50, help="timed batches")
    parser.add_argument("--warmup", type=int, default=5, help="batches before the timing")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--resume_at", default="",
                        help="comma-separated steps: time a resume at each instead")
    args = parser.parse_args(argv)
    cli_help.quiet_tensorflow()
    try:
        importlib.import_module(args.module)
    except ImportError as e:
        raise SystemExit(f"pipeline_bench: cannot import --module {args.module!r} ({e}); run "
                         "from the repository root") from e
    if args.resume_at:
        import tempfile  # pylint: disable=g-import-not-at-top

        make_batch_iterator(args.pipeline, args.batch_size, args.sequence_length,
                            seed=args.seed + 1)  # TF start-up and tracing, not timed
        costs = []
        with tempfile.TemporaryDirectory() as state_dir:
            for step in (int(s) for s in args.resume_at.split(",")):
                cost = resume_cost(args.pipeline, args.batch_size, args.sequence_length, step,
                                   state_dir, args.seed)
                costs.append(cost)
                print(f"pipeline {args.pipeline}: batch {args.batch_size} x "
                      f"{args.sequence_length}, resume at step {step}: restore "
                      f"{cost.restore_seconds:.2f} s, replay {cost.replay_seconds:.2f} s "
                      f"(saving the position took {cost.save_seconds:.2f} s)", flush=True)
        return costs
    res = run(args.pipeline, args.batch_size, args.sequence_length, args.batches, args.warmup,
              args.seed)
    print(f"pipeline {res.task}: batch {res.batch_size} x {res.sequence_length}, "
          f"{res.batches} batches in {res.seconds:.2f} s after {args.warmup} warm-up: "
          f"{res.examples_per_s:.1f} examples/s, {res.tokens_per_s:.0f} tokens/s (non-pad), "
          f"pad fraction {res.pad_fraction:.3f}")
    return res


if __name__ == "__main__":
    main()
