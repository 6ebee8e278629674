"""The input streams' positions, saved beside each checkpoint and restored on resume.

With `loop.train(data_resume="checkpoint")` (the default), every save writes each seqio
stream's tf.data iterator state, per process, to
`MODEL_DIR/data_state/STEP/OBJECTIVE.process_PPP-of-NNN` (TensorFlow checkpoint files), and
records in the checkpoint's `ResumeInfo` what is needed to use it again: the seed the stream
was built with, its task and batch shape. A resume rebuilds the stream with that seed and
restores the position, in a time that does not depend on the step (t5x saves its datasets
the same way). Synthetic streams are a function of the step and need no state.

A stream falls back to replaying its batches (`data.resume_plan(..., "replay")`, exact but
as slow as the pipeline) when the checkpoint has no state for it: a checkpoint from a
`replay`/`reseed` run or from before this file existed, a source tf.data cannot save (a
`from_generator` source registered by a user; a note says so at the first save), or a
different process count (each process saved its own shard's position).

A state saved for another task or batch shape is refused with a ValueError naming the
objective, before anything is trained or written. TensorFlow is not imported here: the
streams save themselves (`xlm_jax.data.pipeline.BatchIterator`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any, TextIO

from etils import epath

from xlm_jax import model_dir as md
from xlm_jax.train.resume import ResumeInfo

STATE_DIR = md.DATA_STATE_DIR


def prefix(model_dir: str, step: int, name: str, process_index: int,
           process_count: int) -> str:
    """Where process `process_index` saves objective `name`'s stream at `step`."""
    return str(md.resolve(model_dir) / STATE_DIR / str(step)
               / f"{name}.process_{process_index:03d}-of-{process_count:03d}")


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
         step: int, process_index: int, process_count: int, unsaveable: set[str],
         out: TextIO) -> dict[str, dict[str, Any]]:
    """Saves every stream that can save itself; returns the checkpoint's `data_state` entry.

    `unsaveable` collects the streams found unsaveable (asked once, noted once)."""
    from xlm_jax.data.pipeline import IteratorNotSaveable  # TF-free module at import

    saved = {}
    for name, stream in streams.items():
        if not hasattr(stream, "save") or name in unsaveable:
            continue
        try:
            stream.save(prefix(model_dir, step, name, process_index, process_count))
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
                 process_index: int, process_count: int) -> str | None:
    """The prefix to restore objective `name`'s stream from, or None (replay instead).

    Raises ValueError when the checkpoint saved this objective's position for another task
    or batch shape: that position means nothing to the run's pipeline."""
    step = resume.step
    entry = resume.data_state.get(name)
    if entry is None or not resume.saved_positions_usable(process_count):
        return None
    saved = SavedStream(**entry)
    for field in ("task", "batch_size", "seq_len"):
        if getattr(saved, field) != getattr(current, field):
            raise ValueError(
                f"objective '{name}': the checkpoint at step {step} in {model_dir} saved the "
                f"input position of {field}={getattr(saved, field)!r}, but this run has "
                f"{field}={getattr(current, field)!r}; resume with the run's own settings, or "
                f"set loop.train.data_resume = 'reseed' to start the new data afresh")
    path = prefix(model_dir, step, name, process_index, process_count)
    if not epath.Path(path + ".index").exists():
        return None
    return path
