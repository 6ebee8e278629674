"""TrainState, the pure train step, sharded initialisation and restore.

The train step is one pure function handed to `jax.jit` with in/out shardings and a donated
state. It calls the objectives of the mixture — one batch per objective per step — and never
looks inside them. Gradient accumulation splits the (already corrupted, see
`objectives.base`) global batch into microbatches and sums gradients with `lax.scan`, dividing
by the global unit counts, so 4 x B/4 equals one step of B.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from xlm_jax.models import layer_stack
from xlm_jax.models.config import VOCAB_PARAMS
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import ENCODER, ROW_IDS, Batch, WeightedObjective, init_params
from xlm_jax.train import optim as optim_lib
from xlm_jax.train import partitioning

Array = jax.Array


@flax.struct.dataclass
class TrainState:
    """Everything a step changes; sharded by the logical rules and checkpointed whole.

    `params` is `{"encoder": <Transformer params>, "objectives": {module: <params>}}` (see
    `xlm_jax.objectives.base`); `obj_state` maps objective name -> its state.
    """

    step: Array
    params: Any
    opt_state: Any
    obj_state: dict[str, Any]


def init_objective_state(objectives: Sequence[WeightedObjective], params: Any
                         ) -> dict[str, Any]:
    """`{name: objective.init_state(params)}`. Given boxed parameters (as in `make_init_fn`),
    an EMA copy keeps their logical axes and is sharded like them."""
    return {o.name: o.objective.init_state(params) for o in objectives}


def make_init_fn(model: Transformer, objectives: Sequence[WeightedObjective],
                 optimizer: optax.GradientTransformation, seq_len: int
                 ) -> Callable[[Array], TrainState]:
    """Returns `init(rng) -> TrainState` whose params are boxed with logical axis names."""

    def init(rng: Array) -> TrainState:
        params = init_params(model, objectives, seq_len, rng)
        opt_state = optimizer.init(params)
        obj_state = init_objective_state(objectives, params)  # boxed params
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt_state,
                          obj_state=obj_state)

    return init


def state_shardings(init_fn: Callable[[Array], TrainState], mesh: jax.sharding.Mesh,
                    rules: partitioning.Rules, boxed: Any = None) -> tuple[Any, Any]:
    """(abstract unboxed state, its NamedShardings) from the logical annotations; `boxed` is
    `jax.eval_shape(init_fn, key)` when the caller has traced it already."""
    if boxed is None:
        boxed = jax.eval_shape(init_fn, jax.random.PRNGKey(0))
    shardings = partitioning.logical_shardings(boxed, mesh, rules)
    partitioning.check_divisible(boxed, shardings)
    abstract = nn.meta.unbox(boxed)
    return abstract, shardings


def _split_micro(tree: Any, accum: int) -> Any:
    def split(x: Array) -> Array:
        if x.shape[0] % accum:
            raise ValueError(f"batch of {x.shape[0]} rows is not divisible into {accum} "
                             "microbatches (train.accum_steps)")
        return x.reshape((accum, x.shape[0] // accum) + x.shape[1:])
    return jax.tree_util.tree_map(split, tree)


def _with_row_ids(prepared: Batch) -> Batch:
    """`prepared` with ROW_IDS: each row's index in this step's global batch, so that
    dropout masks are drawn per row (`models.common.keep_mask`) and a microbatch draws the
    masks its rows get in the whole batch."""
    rows = jax.tree_util.tree_leaves(prepared)[0].shape[0]
    return {**prepared, ROW_IDS: jnp.arange(rows, dtype=jnp.int32)}


LOSS_NORMALIZATIONS = ("per_objective", "pooled")


def make_train_step(objectives: Sequence[WeightedObjective],
                    optimizer: optax.GradientTransformation,
                    schedule: optax.Schedule | None = None,
                    accum_steps: int = 1,
                    normalization: str = "per_objective"
                    ) -> Callable[..., tuple[TrainState, dict[str, Array]]]:
    """The pure step: `train_step(state, batches, rng) -> (state, metrics)`.

    `batches` maps objective name -> its batch; `rng` is the run's base key (the step's key
    is folded in from `state.step`, so a resumed run draws the same randomness). Only the
    objectives with a batch run (`train.mixture`: alternating phases); the others' state is
    carried over unchanged and they report no metrics. An objective's randomness depends on
    its index in the mixture, not on which others run with it.
    `normalization`: "per_objective" (default; the papers' L = sum_o w_o * mean loss of o) or
    "pooled" (unilm's InfoXLM code: sum_o w_o * loss sum of o, divided by the units of all
    objectives together, e.g. sentences + masked tokens). Reported per-objective metrics are
    per-unit means either way.
    """
    if normalization not in LOSS_NORMALIZATIONS:
        raise ValueError(f"unknown loss normalization {normalization!r}; valid: "
                         f"{', '.join(LOSS_NORMALIZATIONS)}")
    names = [o.name for o in objectives]

    def train_step(state: TrainState, batches: Mapping[str, Batch], rng: Array):
        step_rng = jax.random.fold_in(rng, state.step)
        unknown = sorted(set(batches) - set(names))
        if unknown:
            raise ValueError(f"batches for unknown objectives {unknown}; the mixture has "
                             f"{names}")
        indexed = [(i, o) for i, o in enumerate(objectives) if o.name in batches]
        ran = [o for _, o in indexed]
        prepared, denoms, loss_rngs = {}, {}, {}
        for i, o in indexed:
            prep_rng, loss_rngs[o.name] = jax.random.split(jax.random.fold_in(step_rng, i))
            prepared[o.name] = _with_row_ids(o.objective.prepare(batches[o.name], prep_rng))
            denoms[o.name] = jnp.maximum(o.objective.denominator(prepared[o.name]), 1.0)
        if normalization == "pooled":
            pooled = sum(denoms.values())
            scale = {o.name: pooled for o in ran}
        else:
            scale = denoms

        def micro_loss(params: Any, micro: Mapping[str, Batch]):
            # Every microbatch gets the step's loss key: the loss's randomness is dropout, drawn
            # per row from ROW_IDS (the rows' global indices), so microbatch i draws the masks
            # its rows get in the whole batch (per-row sampling keys come from `prepare`).
            total = 0.0
            sums, inputs = {}, {}
            for o in ran:
                out = o.objective.loss(params, micro[o.name], loss_rngs[o.name],
                                       state.obj_state[o.name])
                total = total + o.weight * out.loss_sum / scale[o.name]
                sums[o.name] = out.metrics
                inputs[o.name] = jax.lax.stop_gradient(out.state_inputs)
            return total, (sums, inputs)

        grad_fn = jax.value_and_grad(micro_loss, has_aux=True)
        if accum_steps == 1:
            (loss, (sums, inputs)), grads = grad_fn(state.params, prepared)
        else:
            micro = _split_micro(prepared, accum_steps)

            def body(carry, xs):
                g_acc, l_acc, s_acc = carry
                (l, (s, ins)), g = grad_fn(state.params, xs)
                add = lambda a, b: jax.tree_util.tree_map(jnp.add, a, b)  # noqa: E731
                return (add(g_acc, g), l_acc + l, add(s_acc, s)), ins

            zeros_g = jax.tree_util.tree_map(jnp.zeros_like, state.params)
            zeros_s = jax.eval_shape(lambda: grad_fn(state.params, jax.tree_util.tree_map(
                lambda x: x[0], micro))[0][1][0])
            zeros_s = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), zeros_s)
            (grads, loss, sums), stacked = jax.lax.scan(
                body, (zeros_g, jnp.zeros((), jnp.float32), zeros_s), micro)
            # [accum, rows/accum, ...] -> [rows, ...]: microbatch i holds rows i*m..(i+1)*m-1
            inputs = jax.tree_util.tree_map(
                lambda x: x.reshape((-1,) + x.shape[2:]), stacked)

        grad_norm = optim_lib.global_norm(grads)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        obj_state = dict(state.obj_state)
        for o in ran:
            obj_state[o.name] = o.objective.after_update(params, state.obj_state[o.name],
                                                         inputs[o.name])
        metrics: dict[str, Array] = {"loss": loss, "grad_norm": grad_norm}
        for o in ran:
            metrics.update(_reported(o, sums[o.name], denoms[o.name]))
        if schedule is not None:
            metrics["learning_rate"] = schedule(state.step)
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                               obj_state=obj_state)
        return new_state, metrics

    return train_step


def _reported(o: WeightedObjective, sums: Mapping[str, Array], denom: Array
              ) -> dict[str, Array]:
    """`name/key` metrics of one objective: its sums divided by its global unit count (keys
    starting with "_" only feed `derived_metrics`), its derived metrics, and the count."""
    out = {f"{o.name}/{k}": v / denom for k, v in sums.items() if not k.startswith("_")}
    out.update({f"{o.name}/{k}": v for k, v in o.objective.derived_metrics(sums).items()})
    out[f"{o.name}/count"] = denom
    return out


def make_eval_step(objectives: Sequence[WeightedObjective]) -> Callable[..., dict[str, Array]]:
    """Loss/accuracy of each objective on a batch, dropout off (same corruption as training)."""

    def eval_step(state: TrainState, batches: Mapping[str, Batch], rng: Array):
        metrics = {}
        for i, o in enumerate(objectives):
            if o.name not in batches:  # objectives without an eval task are skipped
                continue
            prep_rng, loss_rng = jax.random.split(jax.random.fold_in(rng, i))
            prepared = o.objective.prepare(batches[o.name], prep_rng)
            out = o.objective.loss(state.params, prepared, loss_rng, state.obj_state[o.name],
                                   deterministic=True)
            metrics.update(_reported(o, out.metrics, jnp.maximum(out.denominator, 1.0)))
        return metrics

    return eval_step


def load_pretrained_params(params: Any, pretrained: Any, source: str,
                           vocab_size: int | None = None) -> Any:
    """Copies every parameter of `pretrained` (encoder parameters) into the encoder subtree of
    the train-state `params` (same paths, same shapes); objective modules keep their init.

    Parameters the pretrained model lacks (new heads, language embeddings) keep their
    initialisation; a shape mismatch is a one-line error naming the parameter. With
    `vocab_size` (the model's unpadded vocabulary), vocabulary tables may differ in padding
    rows only: their first `vocab_size` rows are copied and the padding rows keep their init.

    Either layer layout loads into either (`xlm_jax.models.layer_stack`): `pretrained` is
    converted to the model's. As in the per-layer layout, where the layers the model has and
    the pretrained model lacks keep their init (and the others are not read), a stack of
    another depth gives its first min(N, N') layers.
    """
    pretrained = layer_stack.to_layout(
        pretrained, bool(layer_stack.is_stacked(params[ENCODER])))
    flat_pre = {jax.tree_util.keystr(p): v for p, v in
                jax.tree_util.tree_flatten_with_path(pretrained)[0]}
    vocab_keys = {"".join(f"[{k!r}]" for k in path.split("/")) for path in VOCAB_PARAMS}
    stack_prefix = jax.tree_util.keystr((jax.tree_util.DictKey(layer_stack.STACK),))

    def rows_into(value: Any, new: Any, n: int) -> Any:
        # The rows from the host: the loaded table may be committed to one device while
        # `value` is sharded over the run's mesh, and jax refuses to combine the two.
        return jnp.asarray(value).at[:n].set(np.asarray(new[:n], value.dtype))

    def pick(path, value):
        key = jax.tree_util.keystr(path)
        if key not in flat_pre:
            return value
        new = flat_pre[key]
        if (vocab_size and key in vocab_keys and new.shape[1:] == value.shape[1:]
                and min(new.shape[0], value.shape[0]) >= vocab_size):
            return rows_into(value, new, vocab_size)
        if (key.startswith(stack_prefix) and new.shape[1:] == value.shape[1:]
                and new.shape[0] != value.shape[0]):  # a stack of another depth
            return rows_into(value, new, min(new.shape[0], value.shape[0]))
        if tuple(new.shape) != tuple(value.shape):
            raise ValueError(f"{source}: parameter {key} has shape {tuple(new.shape)} but the "
                             f"model expects {tuple(value.shape)}")
        return jnp.asarray(new, value.dtype)

    return {**params, ENCODER: jax.tree_util.tree_map_with_path(pick, params[ENCODER])}
