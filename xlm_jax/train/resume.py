"""`ResumeInfo`: what a checkpoint records beside the train state so that a run continues
where it stopped — the checkpoint's JSON `extra` item, typed.

One record, written by the checkpoint action at every save and read once, at the restore:
  step           the steps done (the restored run's first step index)
  process_count  how many processes saved it
  input_shards   how many input shards the seqio streams were read as (`train.streams`):
                 each shard's position is saved on its own, so the positions serve any run
                 reading the same number of shards, on any process count dividing it; absent
                 in a record from before input shards existed, whose processes each read one
                 shard (V = process_count; their files are named by process)
  data_state     per objective whose seqio stream saved its position: what the stream was
                 built from (`data_state.SavedStream` as JSON); empty with data_resume
                 'replay'/'reseed', or when no stream could save itself
  prefill        per objective whose state was filled before step 1 (`train.prefill`): how
                 many batches of its stream the fill took; None (absent from the JSON) in a
                 record from before the fill existed, or of a run that has not yet filled
Checkpoints written before this record existed also hold `data_position`, `data_resume` and
`tasks`; nothing ever read them, and `from_json` ignores them (and any other key).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True)
class ResumeInfo:
    """The JSON record of a checkpoint; see the module docstring."""

    step: int
    process_count: int = 1
    data_state: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)
    prefill: Mapping[str, int] | None = None
    input_shards: int | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"step": self.step, "process_count": self.process_count,
               "data_state": {k: dict(v) for k, v in self.data_state.items()}}
        if self.prefill is not None:
            out["prefill"] = {k: int(v) for k, v in self.prefill.items()}
        if self.input_shards is not None:
            out["input_shards"] = int(self.input_shards)
        return out

    @classmethod
    def from_json(cls, extra: Mapping[str, Any], current_process_count: int) -> "ResumeInfo":
        """The record of a checkpoint's `extra`; a checkpoint without a process count (none
        written by this library lacks one) counts as saved by `current_process_count`."""
        if "step" not in extra:
            raise ValueError(f"checkpoint record {sorted(extra)!r} has no 'step'")
        return cls(step=int(extra["step"]),
                   process_count=int(extra.get("process_count", current_process_count)),
                   data_state=dict(extra.get("data_state") or {}),
                   prefill=(None if extra.get("prefill") is None
                            else {k: int(v) for k, v in extra["prefill"].items()}),
                   input_shards=(None if extra.get("input_shards") is None
                                 else int(extra["input_shards"])))

    @property
    def saved_shards(self) -> int:
        """The input shards the saved positions are of (a record from before input shards
        existed: one per process)."""
        return self.input_shards or self.process_count

    def positions_usable(self, input_shards: int) -> bool:
        """Whether the saved input positions serve a run reading `input_shards` shards."""
        return self.saved_shards == input_shards

    def prefilled(self, name: str) -> int:
        """The batches of objective `name`'s stream that the fill before step 1 took (0 when
        none, or when the record predates the fill)."""
        return int((self.prefill or {}).get(name, 0))
