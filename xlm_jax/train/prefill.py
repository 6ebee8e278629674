"""The fill before the first optimizer step: objectives whose state must be ready at step 1.

An objective asks for it with `Objective.prefill_batches(batch_size)` > 0 (InfoXLM's XLCo, whose
queue of negatives unilm fills before training: `infoxlm/src-infoxlm/infoxlm/tasks/infoxlm.py`,
`prepare_train` -> `fill_queue`). Once per run, before step 1, the trainer draws that many
batches from the objective's own stream, `prepare`s each as the train step would (with
`ROW_IDS`, so dropout masks are per row and independent of the mesh) and hands it to
`Objective.prefill` with the initial parameters: one jitted, forward-only function over the
sharded train state, donated like the step's.

The batches it takes are consumed: the stream continues after them, so the input position of
the objective after `n` steps is `runs_before(n) + batches`. `ResumeInfo.prefill` records the
count with every checkpoint (step 0 of `save_initial` included), which tells a resume two
things: where a stream without a saved position starts (`setup.make_streams`), and that the
fill is done. Only a run that starts at step 0 with nothing recorded fills: a fresh run, one
from `init_from` (it fills from the loaded encoder: the state is rebuilt from it first), or a
restored step-0 checkpoint written before the record existed.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax

from xlm_jax.train import mixture
from xlm_jax.train import partitioning
from xlm_jax.train import setup
from xlm_jax.train import step as step_lib
from xlm_jax.train.resume import ResumeInfo

# salt of the fill's keys: batch j of objective i draws from fold_in(fold_in(PRNGKey(seed),
# SALT), j), then as the step does (fold_in i, split into prepare and loss keys); the train
# steps draw from PRNGKey(seed + 1), so the fill's keys are none of theirs
SALT = 0x46494C4C  # "FILL"


@dataclasses.dataclass(frozen=True)
class FillPlan:
    """How many batches each objective's fill takes (objectives without one are absent)."""

    batches: Mapping[str, int]

    def describe(self) -> str:
        """For the run log, e.g. 'xlco: 16 batches'."""
        return "; ".join(f"{name}: {n} batch{'es' if n != 1 else ''}"
                         for name, n in self.batches.items())


def plan(objs: Sequence[step_lib.WeightedObjective], shapes: Mapping[str, mixture.Shape]
         ) -> FillPlan:
    """Each objective's `prefill_batches` at its own global batch size; checked at setup, so a
    queue that does not take whole batches fails before anything is compiled."""
    batches = {}
    for o in objs:
        n = o.objective.prefill_batches(shapes[o.name].batch_size)
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"objective {o.name!r}: prefill_batches returned {n!r}; expected "
                             "an integer >= 0")
        if n:
            batches[o.name] = n
    return FillPlan(batches)


def make_fill_step(objs: Sequence[step_lib.WeightedObjective], name: str
                   ) -> Callable[[step_lib.TrainState, Mapping[str, Any], jax.Array],
                                 step_lib.TrainState]:
    """The pure `fill(state, batch, key) -> state` of objective `name`: its batch prepared with
    the key's prepare half, its `prefill` given the loss half; only its `obj_state` changes.
    The keys are split as in `step.make_train_step` (objective index folded in first)."""
    index = [o.name for o in objs].index(name)
    objective = objs[index].objective

    def fill(state: step_lib.TrainState, batch: Mapping[str, Any], key: jax.Array
             ) -> step_lib.TrainState:
        prep_rng, loss_rng = jax.random.split(jax.random.fold_in(key, index))
        prepared = step_lib.with_row_ids(objective.prepare(dict(batch), prep_rng))
        new = objective.prefill(state.params, state.obj_state[name], prepared, loss_rng)
        new = jax.lax.stop_gradient(new)
        return state.replace(obj_state={**state.obj_state, name: new})

    return fill


def batch_key(seed: int, j: int) -> jax.Array:
    """The key of the fill's batch `j` (before the objective's index is folded in)."""
    return jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(seed), SALT), j)


def run(fill_plan: FillPlan, objs: Sequence[step_lib.WeightedObjective],
        state: step_lib.TrainState, streams: Mapping[str, Any], resume: ResumeInfo,
        shardings: Any, mesh: jax.sharding.Mesh, seed: int
        ) -> tuple[step_lib.TrainState, ResumeInfo]:
    """The state after the fill and the `ResumeInfo` that records it, or both as they are
    when the run has filled already (a resume, see the module docstring). Draws the planned
    batches from `streams` (which then continue after them). Call inside
    `partitioning.activate(mesh, rules)`."""
    if resume.step > 0 or resume.prefill is not None:
        return state, dataclasses.replace(resume, prefill=dict(resume.prefill or {}))
    if fill_plan.batches:
        print(f"filling before step 1 (forward passes, no gradient): {fill_plan.describe()}",
              flush=True)
    for name, n in fill_plan.batches.items():
        fill = jax.jit(make_fill_step(objs, name),
                       in_shardings=(shardings, None, partitioning.replicated(mesh)),
                       out_shardings=shardings, donate_argnums=(0,))
        for j in range(n):
            state = fill(state, setup.global_batch(next(streams[name]), mesh),
                         batch_key(seed, j))
    return state, dataclasses.replace(resume, prefill=dict(fill_plan.batches))
