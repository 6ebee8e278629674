"""TrainState, the pure train step, sharded initialisation and restore.

The train step is one pure function handed to `jax.jit` with in/out shardings and a donated
state. It calls the objectives of the mixture — one batch per objective per step — and never
looks inside them. Each objective's loss is made of terms (`objectives.base`): the step takes
every term's unit count from the prepared *global* batch, then splits the (already corrupted)
batch into microbatches and sums, with `lax.scan`, the gradients of the microbatches' term
sums over those global counts, so 4 x B/4 equals one step of B. Term sums and metrics
((total, count) pairs) add up over the microbatches the same way and are reported once.
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

from xlm_jax.models import attention_backends, layer_stack
from xlm_jax.models.config import VOCAB_PARAMS
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import (ENCODER, ROW_IDS, Batch, LossOutput, Metric, Objective,
                                     WeightedObjective, init_params, objective_loss, report,
                                     safe_ratio)
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
        # The forward pass that flax's `init` traces only shapes the parameters: traced on
        # the XLA attention path it is dead code XLA removes, where fused kernels (custom
        # calls) would be compiled for nothing (on an H100, XLM-E's init took 87 s to compile
        # with its Pallas kernels in it).
        with attention_backends.reference_math():
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


def with_row_ids(prepared: Batch) -> Batch:
    """`prepared` with ROW_IDS: each row's index in this step's global batch, so that
    dropout masks are drawn per row (`models.common.keep_mask`) and a microbatch draws the
    masks its rows get in the whole batch."""
    rows = jax.tree_util.tree_leaves(prepared)[0].shape[0]
    return {**prepared, ROW_IDS: jnp.arange(rows, dtype=jnp.int32)}


LOSS_NORMALIZATIONS = ("per_objective", "pooled")


def check_term_weights(objective: Objective) -> None:
    """A ValueError naming the objective and the term unless `term_weights` is a non-empty
    mapping of term names to finite weights >= 0."""
    weights = objective.term_weights
    if not isinstance(weights, Mapping) or not weights:
        raise ValueError(f"objective {objective.name!r}: term_weights={weights!r} must map "
                         "each loss term to its weight")
    for term, w in weights.items():
        if not (isinstance(w, (int, float)) and np.isfinite(w) and w >= 0):
            raise ValueError(f"objective {objective.name!r}: term_weights[{term!r}]={w!r} "
                             "must be a finite number >= 0")


def _float32(out: LossOutput) -> LossOutput:
    """`out` with float32 arrays for every term sum and metric (a count may be a Python
    number), so that they add over microbatches."""
    f = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    return out.replace(losses={t: f(v) for t, v in out.losses.items()},
                       metrics={k: Metric(f(m.total), f(m.count)) for k, m in out.metrics.items()})


def _prefixed(name: str, values: Mapping[str, Array]) -> dict[str, Array]:
    return {f"{name}/{k}": v for k, v in values.items()}


def loss_composition(objectives: Sequence[WeightedObjective], normalization: str) -> str:
    """The step's `loss` in the names of the reported metrics, printed once at the start of
    a run: "mmlm/loss + tlm/loss", "mrtd/mlm_loss + 50 x mrtd/rtd_loss" (a term's factor is
    w_o * lambda_t); with "pooled" each objective is weighted by its share of the step's units
    (`mixture_factors`): "share(mmlm) x mmlm/loss + ...; share(o) = o's units / all units"."""
    def scaled(factor: float, name: str) -> str:
        return name if factor == 1 else f"{factor:g} x {name}"

    def terms(o: WeightedObjective, weight: float) -> list[str]:
        weights = dict(o.objective.term_weights)
        if len(weights) == 1:
            return [scaled(weight, f"{o.name}/loss")]  # <name>/loss is L_o, its weight in it
        return [scaled(weight * w, f"{o.name}/{t}_loss") for t, w in weights.items() if w]

    if normalization != "pooled":
        return " + ".join(t for o in objectives for t in terms(o, o.weight))
    parts = []
    for o in objectives:
        inner = terms(o, 1.0)
        body = inner[0] if len(inner) == 1 else f"({' + '.join(inner)})"
        parts.append(f"share({o.name}) x {scaled(o.weight, body)}")
    return " + ".join(parts) + "; share(o) = o's units / all objectives' units (pooled)"


def mixture_factors(objectives: Sequence[WeightedObjective],
                    counts: Mapping[str, Mapping[str, Array]], normalization: str
                    ) -> dict[str, Array]:
    """The factor of each objective's loss L_o (`objectives.base.objective_loss`) in the step's
    loss. "per_objective": w_o. "pooled": w_o * N_o / sum_o' N_o', with N_o the units of all
    terms of o (its reported `count`); for a one-term objective, w_o N_o L_o is w_o times its
    loss sum, so the step's loss is unilm's sum_o w_o * loss sum of o / all units."""
    if normalization == "per_objective":
        return {o.name: jnp.float32(o.weight) for o in objectives}
    units = {o.name: sum(jnp.asarray(c, jnp.float32) for _, c in sorted(counts[o.name].items()))
             for o in objectives}
    pool = sum(units.values())
    return {o.name: o.weight * safe_ratio(units[o.name], pool) for o in objectives}


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
    The step's loss is sum_o f_o * L_o with L_o = sum_t lambda_t * sum_t / N_t, the objective's
    terms' means weighted by its `term_weights` (N_t: the term's units in the global batch,
    from `counts`), and f_o from `normalization` (`mixture_factors`): "per_objective"
    (default; the papers' L = sum_o w_o * L_o) or "pooled" (unilm's InfoXLM code: sum_o w_o *
    loss sum of o, divided by the units of all objectives together, e.g. sentences + masked
    tokens). Pooled weighs each objective's L_o by its share of the units and leaves the
    combination of its own terms (a paper's L_gen + lambda L_rtd, L(src) + L(tgt)) as it is
    (our choice: unilm's objectives have one term each, for which both readings agree).
    Reported, per objective that ran: `<name>/loss` (L_o, before f_o), with more than one term
    `<name>/<term>_loss` (each term's mean), `<name>/count` (the units of all its terms) and
    every metric as total / count over the whole batch; plus the step's `loss`, `grad_norm`
    and `learning_rate`.
    """
    if normalization not in LOSS_NORMALIZATIONS:
        raise ValueError(f"unknown loss normalization {normalization!r}; valid: "
                         f"{', '.join(LOSS_NORMALIZATIONS)}")
    names = [o.name for o in objectives]
    for o in objectives:
        check_term_weights(o.objective)

    def train_step(state: TrainState, batches: Mapping[str, Batch], rng: Array):
        step_rng = jax.random.fold_in(rng, state.step)
        unknown = sorted(set(batches) - set(names))
        if unknown:
            raise ValueError(f"batches for unknown objectives {unknown}; the mixture has "
                             f"{names}")
        indexed = [(i, o) for i, o in enumerate(objectives) if o.name in batches]
        ran = [o for _, o in indexed]
        prepared, counts, loss_rngs = {}, {}, {}
        for i, o in indexed:
            prep_rng, loss_rngs[o.name] = jax.random.split(jax.random.fold_in(step_rng, i))
            prepared[o.name] = with_row_ids(o.objective.prepare(batches[o.name], prep_rng))
            # the global batch's units, before the microbatch split
            counts[o.name] = o.objective.counts(prepared[o.name])
        factors = mixture_factors(ran, counts, normalization)

        def micro_loss(params: Any, micro: Mapping[str, Batch]):
            # Every microbatch gets the step's loss key: the loss's randomness is dropout, drawn
            # per row from ROW_IDS (the rows' global indices), so microbatch i draws the masks
            # its rows get in the whole batch (per-row sampling keys come from `prepare`).
            # Linear in the term sums, over global counts: the microbatches' losses add up.
            total = 0.0
            sums, inputs = {}, {}
            for o in ran:
                out = _float32(o.objective.loss(params, micro[o.name], loss_rngs[o.name],
                                                state.obj_state[o.name]))
                total = total + factors[o.name] * objective_loss(o.objective, out.losses,
                                                                 counts[o.name])
                sums[o.name] = (out.losses, out.metrics)
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
            losses, obj_metrics = sums[o.name]
            metrics.update(_prefixed(o.name, report(o.objective, losses, obj_metrics,
                                                    counts[o.name])))
        if schedule is not None:
            metrics["learning_rate"] = schedule(state.step)
        new_state = TrainState(step=state.step + 1, params=params, opt_state=opt_state,
                               obj_state=obj_state)
        return new_state, metrics

    return train_step


@flax.struct.dataclass
class EvalSums:
    """One objective's additive eval quantities on a batch: each term's summed loss and its
    units, each metric's (total, count). Sums over batches add leaf by leaf; `eval_report`
    turns them into means, so an eval over several batches weighs every unit alike (a mean
    of per-batch means would weigh a batch with few masked tokens like a full one)."""

    losses: dict[str, Array]
    counts: dict[str, Array]
    metrics: dict[str, Metric]


def make_eval_step(objectives: Sequence[WeightedObjective]
                   ) -> Callable[..., dict[str, EvalSums]]:
    """`{objective: EvalSums}` on a batch, dropout off, the same corruption as training;
    objectives without a batch are left out."""
    for o in objectives:
        check_term_weights(o.objective)

    def eval_step(state: TrainState, batches: Mapping[str, Batch], rng: Array):
        sums = {}
        for i, o in enumerate(objectives):
            if o.name not in batches:  # objectives without an eval task are skipped
                continue
            prep_rng, loss_rng = jax.random.split(jax.random.fold_in(rng, i))
            prepared = o.objective.prepare(batches[o.name], prep_rng)
            out = o.objective.loss(state.params, prepared, loss_rng, state.obj_state[o.name],
                                   deterministic=True)
            sums[o.name] = EvalSums(dict(out.losses), dict(o.objective.counts(prepared)),
                                    dict(out.metrics))
        return sums

    return eval_step


def eval_report(objectives: Sequence[WeightedObjective],
                sums: Mapping[str, EvalSums]) -> dict[str, float]:
    """The train step's names and meanings (`{objective}/loss`, `/count`, `/<term>_loss`,
    metrics; no mixture `loss`) from `EvalSums` added over any number of batches."""
    out: dict[str, float] = {}
    for o in objectives:
        if o.name in sums:
            s = sums[o.name]
            values = report(o.objective, s.losses, s.metrics, s.counts)
            out.update({k: float(v) for k, v in _prefixed(o.name, values).items()})
    return out


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
