"""The input streams' positions, saved beside each checkpoint and restored on resume.

With `loop.train(data_resume="checkpoint")` (the default), every save writes the tf.data
iterator state of each input shard of each seqio stream (`data.pipeline.ShardedBatches`; a
process saves the shards it reads) to
`MODEL_DIR/data_state/STEP/OBJECTIVE.shard_VVV-of-NNN.tfdata.zz` (tf.data's serialized state,
zlib-compressed; the TensorFlow checkpoint files of earlier versions still restore), and records in the checkpoint's `ResumeInfo` the shard count
and what is needed to use the positions again: the seed the stream was built with, its task
and batch shape. A resume rebuilds the stream with that seed and restores the position, in
a time that does not depend on the step (t5x saves its datasets the same way), on any
process count that divides the shard count. Prepared data saves its position symbolically (a
few integers per dataset op, no buffered examples; `data.pipeline`). Synthetic streams are a
function of the step and need no state.

A stream falls back to replaying its batches (`data.resume_plan(..., "replay")`, exact but
as slow as the pipeline) when the checkpoint has no state for it: a checkpoint from a
`replay`/`reseed` run or from before this file existed, a source tf.data cannot save (a
`from_generator` source registered by a user; a note says so at the first save), or another
input shard count. Checkpoints from before input shards name their files
`OBJECTIVE.process_PPP-of-NNN`: one shard per process, read as such.

A state saved for another task or batch shape is refused with a ValueError naming the
objective, before anything is trained or written. TensorFlow is not imported here: the
streams save themselves (`xlm_jax.data.pipeline.BatchIterator`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TextIO

from xlm_jax import model_dir as md
from xlm_jax.train.resume import ResumeInfo

STATE_DIR = md.DATA_STATE_DIR


def prefix(model_dir: str, step: int, name: str, shard: int, shards: int,
           by_process: bool = False) -> str:
    """Where input shard `shard` of `shards` of objective `name`'s stream is saved at `step`
    (`by_process`: the name a checkpoint from before input shards used, when each process
    read one shard: `NAME.process_PPP-of-NNN`)."""
    kind = "process" if by_process else "shard"
    return str(md.resolve(model_dir) / STATE_DIR / str(step)
               / f"{name}.{kind}_{shard:03d}-of-{shards:03d}")


@dataclasses.dataclass(frozen=True)
class SavedStream:
    """What a checkpoint records of one stream whose position it saved."""

    seed: int
    task: str
    batch_size: int
    seq_len: int

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def save(streams: Mapping[str, Any], built: Mapping[str, SavedStream], model_dir: str,
         step: int, unsaveable: set[str], out: TextIO) -> dict[str, dict[str, Any]]:
    """Saves every stream that can save itself (each of this process's input shards,
    `data.pipeline.ShardedBatches`); returns the checkpoint's `data_state` entry.

    `unsaveable` collects the streams found unsaveable (asked once, noted once)."""
    from xlm_jax.data.pipeline import IteratorNotSaveable  # TF-free module at import

    saved = {}
    for name, stream in streams.items():
        if not hasattr(stream, "save") or name in unsaveable:
            continue
        try:
            stream.save(lambda v, s=stream, n=name: prefix(model_dir, step, n, v, s.count))
        except IteratorNotSaveable as e:
            unsaveable.add(name)
            print(f"note: the input position of objective '{name}' cannot be saved ({e}); "
                  "a resume will replay its batches", file=out, flush=True)
            continue
        saved[name] = built[name].to_json()
    return saved


def prune(model_dir: str, keep: Iterable[int]) -> None:
    """Deletes the saved positions of steps not in `keep` (the checkpoints orbax keeps and
    the one being written); one process does it."""
    root = md.resolve(model_dir) / STATE_DIR
    if not root.exists():
        return
    keep = {str(s) for s in keep}
    for child in root.iterdir():
        if child.name not in keep:
            child.rmtree()


def saved_stream(resume: ResumeInfo, name: str, current: SavedStream, model_dir: str,
                 shards: Sequence[int], input_shards: int) -> Callable[[int], str] | None:
    """Where each of `shards` (this process's input shards of `input_shards`) of objective
    `name`'s stream is restored from, as a function of the shard, or None (no saved position
    for them: replay or reseed instead).

    Raises ValueError when the checkpoint saved this objective's position for another task
    or batch shape: that position means nothing to the run's pipeline."""
    step = resume.step
    entry = resume.data_state.get(name)
    if entry is None or not resume.positions_usable(input_shards):
        return None
    saved = SavedStream(**entry)
    for field in ("task", "batch_size", "seq_len"):
        if getattr(saved, field) != getattr(current, field):
            raise ValueError(
                f"objective '{name}': the checkpoint at step {step} in {model_dir} saved the "
                f"input position of {field}={getattr(saved, field)!r}, but this run has "
                f"{field}={getattr(current, field)!r}; resume with the run's own settings, or "
                f"set loop.train.data_resume = 'reseed' to start the new data afresh")
    by_process = resume.input_shards is None

    def prefix_of(shard: int) -> str:
        return prefix(model_dir, step, name, shard, input_shards, by_process)

    from xlm_jax.data.pipeline import position_saved  # TF-free module at import

    if not all(position_saved(prefix_of(v)) for v in shards):
        return None
    return prefix_of
