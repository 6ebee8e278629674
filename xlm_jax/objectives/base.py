"""The objective interface the trainer calls; it knows nothing about any one paper.

An objective turns one batch of its data stream into a loss. It is split in two so that
gradient accumulation is exact:
- `prepare(batch, rng)` corrupts the *global* batch on device (masking, sampling) before it is
  split into microbatches, so 4 x B/4 sees exactly the corruption that one step of B sees;
- `loss(params, prepared, rng, state)` returns a `LossOutput` with a *sum* over its units
  (predictions, sentences) and the unit count; the trainer divides by the global count.
Objectives with state (InfoXLM's momentum encoder and queue) keep it in `init_state` /
`after_update`, which the trainer shards and checkpoints with the rest of the train state:
- `init_state(params)` gets the *boxed* parameters (`nn.Partitioned`, logical axis names), so a
  copy made with `jax.tree_util.tree_map` (an EMA encoder) is sharded exactly like the
  parameters; new arrays (a queue) may be boxed with their own logical names;
- `loss` may hand per-row arrays to the update through `LossOutput.state_inputs` (the keys a
  queue takes in); the trainer concatenates them over microbatches in global row order and
  passes them to `after_update(params, state, inputs)` after the optimizer step.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any

import flax
import jax

Array = jax.Array
Batch = dict[str, Array]


@flax.struct.dataclass
class LossOutput:
    """loss_sum: summed loss; denominator: units in this (micro)batch; metrics: named sums
    (reported divided by the global denominator, e.g. `correct` -> accuracy); state_inputs:
    per-row arrays [rows, ...] for `Objective.after_update` (none by default)."""

    loss_sum: Array
    denominator: Array
    metrics: dict[str, Array]
    state_inputs: dict[str, Array] = dataclasses.field(default_factory=dict)


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
        """Objective state (EMA encoders, queues) from the boxed initial parameters (see the
        module docstring); none by default. Called again with the loaded parameters when a run
        starts from a pretrained checkpoint, so an EMA copy starts from those."""
        return {}

    def after_update(self, params: Any, state: Any, inputs: dict[str, Array]) -> Any:
        """Called after each optimizer step with the updated parameters and this step's
        `LossOutput.state_inputs` (global batch rows, in order); e.g. EMA and enqueue."""
        return state
