"""The objective interface the trainer calls; it knows nothing about any one paper.

An objective turns one batch of its data stream into a loss. It is split in two so that
gradient accumulation is exact:
- `prepare(batch, rng)` corrupts the *global* batch on device (masking, sampling) before it is
  split into microbatches, so 4 x B/4 sees exactly the corruption that one step of B sees;
- `loss(params, prepared, rng, state)` returns a `LossOutput` with a *sum* over its units
  (predictions, sentences) and the unit count; the trainer divides by the global count.
Objectives with state (InfoXLM's momentum encoder and queue) keep it in `init_state` /
`after_update`, which the trainer shards and checkpoints with the rest of the train state.
"""
from __future__ import annotations

import abc
from typing import Any

import flax
import jax

Array = jax.Array
Batch = dict[str, Array]


@flax.struct.dataclass
class LossOutput:
    """loss_sum: summed loss; denominator: units in this (micro)batch; metrics: named sums
    (reported divided by the global denominator, e.g. `correct` -> accuracy)."""

    loss_sum: Array
    denominator: Array
    metrics: dict[str, Array]


class Objective(abc.ABC):
    """Base class: subclasses set `name` and `stream` and implement `prepare` and `loss`."""

    name: str = "objective"
    stream: str = "mono"  # which kind of batch feeds it: "mono" | "pair" | ...

    @abc.abstractmethod
    def prepare(self, batch: Batch, rng: Array) -> Batch:
        """Device-side corruption of the whole global batch; no parameters involved."""

    @abc.abstractmethod
    def denominator(self, prepared: Batch) -> Array:
        """Number of loss units (e.g. masked predictions) in a prepared batch."""

    @abc.abstractmethod
    def loss(self, params: Any, prepared: Batch, rng: Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        """Summed loss of a prepared (micro)batch."""

    def init_state(self, params: Any) -> Any:
        """Objective state (EMA encoders, queues); none by default."""
        return {}

    def after_update(self, params: Any, state: Any) -> Any:
        """Called with the updated parameters after each optimizer step (e.g. EMA)."""
        return state
