"""Input-pipeline figures: throughput, bytes read by this process, and the cost of a resume.

  python -m xlm_jax.data.pipeline_bench --pipeline demo_mono --batch_size 32 \\
      --sequence_length 128 --batches 50 [--prepared DIR] \\
      [--num_processes P --process_index p] [--epoch] [--resume_at S1,S2] [--json OUT]

(also reachable as `python -m xlm_jax.accelerator.bench --pipeline TASK`). It times
`pipeline.make_batch_iterator` after `--warmup` batches (pipeline construction, TF start-up
and the first file reads are excluded). `--prepared DIR` reads the tasks from what
`python -m xlm_jax.data.prepared.prepare` wrote there (`loop.train.prepared_data`); `--num_processes
P --process_index p` reads what process p of a P-process run reads (simulated in this one
process).

`bytes_read` is what this process read from files while it was timed: the `rchar` count of
`/proc/self/io` (every read and pread system call; None where the kernel does not give it),
so the raw and the prepared path are measured the same way, page cache or not.

`--epoch` reads instead this process's whole share of one epoch of every Task behind the
pipeline (the Tasks' preprocessed examples, in file order): its `bytes_read` is what one
process reads per epoch. `--resume_at 20,2000` times what a resume at each of those steps
costs the input pipeline: restoring the saved iterator position (build, `restore`, and 8
batches, less the time the uninterrupted iterator takes for those 8: the first batch after a
restore may come from the saved buffers before the source is read at all), and, unless
`--no_replay`, replaying (build at `start_step`, first batch), after checking both give the
batches an uninterrupted iterator gives there, and the size of the saved position (the files a
checkpoint holds for this process). For VECO / mixup tasks
an example is two rows and both rows' tokens count.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
import time
from typing import Optional, Sequence

import numpy as np

from xlm_jax import cli_help
from xlm_jax.data.features import PAD_ID
from xlm_jax.data.pipeline import STATE_SUFFIX, make_batch_iterator

__all__ = ["PipelineBenchResult", "EpochRead", "ResumeCost", "count_tokens", "bytes_read",
           "run", "read_epoch", "resume_cost", "main"]


def bytes_read() -> Optional[int]:
    """Bytes this process has read through system calls so far (Linux `rchar`), or None."""
    try:
        with open("/proc/self/io", encoding="ascii") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
    except (OSError, StopIteration, ValueError):
        return None


def _delta(before: Optional[int]) -> Optional[int]:
    after = bytes_read()
    return None if before is None or after is None else after - before


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
    bytes_read: Optional[int] = None  # by this process while timed
    num_processes: int = 1
    process_index: int = 0


def count_tokens(batch: dict[str, np.ndarray]) -> tuple[int, int]:
    """(non-pad tokens, all positions) over every `*input_ids` row of a batch."""
    real = total = 0
    for key, ids in batch.items():
        if key.endswith("input_ids"):
            real += int(np.sum(ids != PAD_ID))
            total += ids.size
    return real, total


def run(task: str, batch_size: int = 32, sequence_length: int = 128, batches: int = 50,
        warmup: int = 5, seed: int = 0, process_index: int = 0,
        num_processes: int = 1) -> PipelineBenchResult:
    """Times `batches` batches of `task` (as process `process_index` of `num_processes`
    reads them) after `warmup` untimed ones."""
    if batches < 1 or warmup < 0:
        raise ValueError(f"need --batches >= 1 and --warmup >= 0, got {batches}, {warmup}")
    it = make_batch_iterator(task, batch_size, sequence_length, seed=seed,
                             shard_index=process_index, num_shards=num_processes)
    for _ in range(warmup):
        next(it)
    real = total = 0
    before, start = bytes_read(), time.perf_counter()
    for _ in range(batches):
        r, t = count_tokens(next(it))
        real += r
        total += t
    seconds = time.perf_counter() - start
    return PipelineBenchResult(task, batch_size, sequence_length, batches, seconds,
                               batches * batch_size / seconds, real / seconds,
                               1.0 - real / total, _delta(before), num_processes, process_index)


@dataclasses.dataclass(frozen=True)
class EpochRead:
    """One process's share of one epoch of a pipeline's Tasks, read to the end."""

    task: str
    examples: int  # the Tasks' preprocessed examples (segments, pairs)
    tokens: int
    seconds: float
    examples_per_s: float
    bytes_read: Optional[int]
    num_processes: int = 1
    process_index: int = 0


def read_epoch(task: str, sequence_length: int = 128, process_index: int = 0,
               num_processes: int = 1, seed: int = 0) -> EpochRead:
    """Reads this process's share of one unshuffled epoch of every Task behind `task`."""
    import seqio  # pylint: disable=g-import-not-at-top

    from xlm_jax.data import converters, registry  # pylint: disable=g-import-not-at-top

    provider = registry.get_provider(task)
    lengths = converters.task_feature_lengths(registry.provider_kind(provider), sequence_length)
    shard = seqio.ShardInfo(process_index, num_processes) if num_processes > 1 else None
    datasets = [t.get_dataset(sequence_length=lengths, shuffle=False, seed=seed, num_epochs=1,
                              shard_info=shard) for t in getattr(provider, "tasks", [provider])]
    examples = tokens = 0
    before, start = bytes_read(), time.perf_counter()
    for ds in datasets:
        for ex in ds.as_numpy_iterator():
            examples += 1
            tokens += sum(int(np.size(v)) for k, v in ex.items() if k.endswith("input_ids"))
    seconds = time.perf_counter() - start
    return EpochRead(task, examples, tokens, seconds, examples / seconds, _delta(before),
                     num_processes, process_index)


@dataclasses.dataclass(frozen=True)
class ResumeCost:
    """What a stream resumed at `step` costs, each way.

    The first batch after a restore can come from the buffers tf.data saved with the position
    (shuffle buffers, prefetched batches) before the source is read at all, so a restore is
    timed over `settle` batches and compared with the same batches read straight on."""

    step: int
    save_seconds: float  # writing the position (once per checkpoint)
    restore_seconds: float  # build + restore + `settle` batches, minus reading them straight on
    first_batch_seconds: float  # build + restore + the first batch
    settle: int
    replay_seconds: Optional[float]  # build with start_step=step + first batch (None: skipped)
    state_bytes: int = 0  # the saved position's file (what a checkpoint holds per process)


def _timed(it, n: int) -> tuple[list[dict[str, np.ndarray]], float]:
    start = time.perf_counter()
    batches = [next(it) for _ in range(n)]
    return batches, time.perf_counter() - start


def resume_cost(task: str, batch_size: int, sequence_length: int, step: int, state_dir: str,
                seed: int = 0, process_index: int = 0, num_processes: int = 1,
                replay: bool = True, settle: int = 8) -> ResumeCost:
    """Times the resumes of `task` at `step` (a pipeline of the same task is built once
    first, so TF start-up and tracing are not counted) and checks that they give the batches
    the uninterrupted iterator gives from `step` on."""
    shard = {"shard_index": process_index, "num_shards": num_processes}
    straight = make_batch_iterator(task, batch_size, sequence_length, seed=seed, **shard)
    for _ in range(step):
        next(straight)
    start = time.perf_counter()
    path = straight.save(os.path.join(state_dir, f"{task}-{step}"))
    save_s = time.perf_counter() - start
    state_bytes = os.path.getsize(path + STATE_SUFFIX)
    expected, straight_s = _timed(straight, settle)
    straight.close()

    start = time.perf_counter()
    restored = make_batch_iterator(task, batch_size, sequence_length, seed=seed, **shard)
    restored.restore(path)
    got = [next(restored)]
    first_s = time.perf_counter() - start
    rest, rest_s = _timed(restored, settle - 1)
    got += rest
    restore_s = first_s + rest_s - straight_s
    restored.close()

    replay_s = None
    if replay:
        start = time.perf_counter()
        replayed = make_batch_iterator(task, batch_size, sequence_length, seed=seed,
                                       start_step=step, **shard)
        got.append(next(replayed))
        replay_s = time.perf_counter() - start
        replayed.close()
    for batch, want in zip(got, expected + expected[:1]):
        if any(not np.array_equal(batch[k], want[k]) for k in want):
            raise AssertionError(f"{task}: a resumed stream at step {step} differs")
    return ResumeCost(step, save_s, restore_s, first_s, settle, replay_s, state_bytes)


def main(argv: Optional[Sequence[str]] = None) -> PipelineBenchResult | EpochRead | list[ResumeCost]:
    parser = cli_help.Parser(prog="python -m xlm_jax.data.pipeline_bench",
                             description=__doc__.split("\n\n")[0])
    parser.add_argument("--pipeline", required=True, help="registered task or mixture")
    parser.add_argument("--module", default="xlm_jax_tasks.demo",
                        help="module that registers the task (default xlm_jax_tasks.demo)")
    parser.add_argument("--prepared", default=None,
                        help="read the tasks from this prepared directory (data.prepared.prepare)")
    parser.add_argument("--num_processes", type=int, default=1,
                        help="read as one process of this many (default 1)")
    parser.add_argument("--process_index", type=int, default=0, help="which process (0-based)")
    parser.add_argument("--batch_size", type=int, default=32, help="rows per batch")
    parser.add_argument("--sequence_length", type=int, default=128, help="row length")
    parser.add_argument("--batches", type=int, default=50, help="timed batches")
    parser.add_argument("--warmup", type=int, default=5, help="batches before the timing")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--epoch", action="store_true",
                        help="read this process's share of one epoch instead")
    parser.add_argument("--resume_at", default="",
                        help="comma-separated steps: time a resume at each instead")
    parser.add_argument("--no_replay", action="store_true",
                        help="--resume_at: time the restore only, not the replay")
    parser.add_argument("--json", default=None, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    if not 0 <= args.process_index < args.num_processes:
        parser.error(f"--process_index {args.process_index} is not in [0, --num_processes "
                     f"{args.num_processes})")
    cli_help.quiet_tensorflow()
    from xlm_jax.data import registry  # pylint: disable=g-import-not-at-top

    try:  # None: the raw files, whatever this process read before
        registry.import_tasks(args.module, args.prepared, [args.pipeline])
    except ImportError as e:
        raise SystemExit(f"pipeline_bench: cannot import --module {args.module!r} ({e}); run "
                         "from the repository root") from e
    _check_registered(args.pipeline, args.module)
    shard = {"process_index": args.process_index, "num_processes": args.num_processes}
    where = (f"pipeline {args.pipeline}" + (f" (prepared {args.prepared})" if args.prepared
                                            else "")
             + (f", process {args.process_index} of {args.num_processes}"
                if args.num_processes > 1 else ""))
    result: dict = {"task": args.pipeline, "prepared": args.prepared, **shard,
                    "batch_size": args.batch_size, "sequence_length": args.sequence_length}
    if args.epoch:
        res = read_epoch(args.pipeline, args.sequence_length, seed=args.seed, **shard)
        print(f"{where}: one epoch, {res.examples} examples ({res.tokens} tokens) in "
              f"{res.seconds:.2f} s: {res.examples_per_s:.1f} examples/s, "
              f"{_mb(res.bytes_read)} read", flush=True)
        out = res
        result.update(dataclasses.asdict(res))
    elif args.resume_at:
        make_batch_iterator(args.pipeline, args.batch_size, args.sequence_length,
                            seed=args.seed + 1).close()  # TF start-up and tracing, not timed
        out = []
        with tempfile.TemporaryDirectory() as state_dir:
            for step in (int(s) for s in args.resume_at.split(",")):
                cost = resume_cost(args.pipeline, args.batch_size, args.sequence_length, step,
                                   state_dir, args.seed, replay=not args.no_replay, **shard)
                out.append(cost)
                replay = ("" if cost.replay_seconds is None
                          else f", replay {cost.replay_seconds:.2f} s")
                print(f"{where}: batch {args.batch_size} x {args.sequence_length}, resume at "
                      f"step {step}: restore {cost.restore_seconds:.2f} s (first batch after "
                      f"{cost.first_batch_seconds:.2f} s; {cost.settle} batches against "
                      f"reading them straight on){replay} (saving the position took "
                      f"{cost.save_seconds:.2f} s, {cost.state_bytes / 1e3:.1f} KB)", flush=True)
        result["resume"] = [dataclasses.asdict(c) for c in out]
    else:
        out = run(args.pipeline, args.batch_size, args.sequence_length, args.batches,
                  args.warmup, args.seed, **shard)
        print(f"{where}: batch {out.batch_size} x {out.sequence_length}, "
              f"{out.batches} batches in {out.seconds:.2f} s after {args.warmup} warm-up: "
              f"{out.examples_per_s:.1f} examples/s, {out.tokens_per_s:.0f} tokens/s (non-pad), "
              f"pad fraction {out.pad_fraction:.3f}, {_mb(out.bytes_read)} read", flush=True)
        result.update(dataclasses.asdict(out))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
    return out


def _check_registered(name: str, module: str) -> None:
    """Exits with one line naming `name`, the module searched and the closest registered
    names when no Task or Mixture `name` is registered. Why: the lookup's ValueError reached
    the user as a 24-line traceback, and its list of 30 names never said which module had
    been imported, which is what to change."""
    import difflib  # pylint: disable=g-import-not-at-top

    import seqio  # pylint: disable=g-import-not-at-top

    known = sorted(set(seqio.MixtureRegistry.names()) | set(seqio.TaskRegistry.names()))
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=3)
    hint = f"did you mean {' or '.join(close)}? else " if close else ""
    raise SystemExit(f"error: pipeline_bench: no task or mixture {name!r} after importing "
                     f"--module {module} ({len(known)} are registered); {hint}pass the module "
                     "that registers it with --module")


def _mb(n: Optional[int]) -> str:
    return "unknown bytes" if n is None else f"{n / 1e6:.1f} MB"


if __name__ == "__main__":
    cli_help.exit_with(lambda: [main(), 0][-1])  # the figures are printed; status 0
