"""Optimiser for pre-training and fine-tuning: AdamW, LR schedules, clipping, LLRD.

What: `make_optimizer(cfg)` returns one optax `GradientTransformation` =
global-norm clipping -> AdamW (decoupled weight decay, masked so that biases and
LayerNorm parameters are not decayed) -> optional layer-wise learning-rate decay.

Why this shape: it is the recipe the XLM-E and InfoXLM papers give (Adam with
beta2=0.98, eps=1e-6, weight decay 0.01, linear warmup then linear decay; gradient clipping
at 2.0 in XLM-E, Table 10, and 1.0 in InfoXLM, Table 10: the run files set `clip_norm`),
and LLRD is the usual fine-tuning trick for these encoders. Parameter names follow
the model's tree (`embeddings/...`, `layers_{i}/...`, `mlm_head/...`); params may be
boxed in `flax.linen.Partitioned` (logical-axis metadata), and every function here
accepts boxed and unboxed trees alike. A stacked encoder (`ModelConfig.scan_layers`: one
`layers/...` subtree whose leaves have a leading layer axis) gets LLRD per slice of that axis,
exactly the per-layer factors of `layers_i`. In a train state (`{"encoder", "objectives"}`) LLRD
applies to the encoder subtree only; an objective's modules (a generator has `layers_i`
of its own) get `module_lr_multipliers[module]` (default 1) instead.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from collections.abc import Mapping
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.core import meta

from xlm_jax.models import layer_stack

PyTree = Any

_SCHEDULES = ("linear", "cosine", "constant")
_LAYER_RE = re.compile(r"^(?:layers|rel_pos)_(\d+)$")
_NORM_RE = re.compile(r"norm", re.IGNORECASE)


@dataclasses.dataclass(frozen=True)
class OptimizerConfig:
    """AdamW + schedule settings; validated on creation (ValueError names field & value)."""

    # Peak learning rate, reached at the end of warmup.
    learning_rate: float = 1e-4
    # Shape after warmup: "linear" decay, "cosine" decay (both to end_lr_factor *
    # learning_rate at total_steps), or "constant" (stays at learning_rate).
    schedule: str = "linear"
    # Steps of linear warmup from 0 to learning_rate (0 = start at the peak).
    warmup_steps: int = 0
    # Step at which the decay reaches its end value; the LR stays there afterwards.
    total_steps: int = 1000
    # End LR as a fraction of learning_rate (0.0 = decay to zero).
    end_lr_factor: float = 0.0
    # Adam first-moment decay.
    b1: float = 0.9
    # Adam second-moment decay (0.98 in the XLM-E and InfoXLM papers' Table 10).
    b2: float = 0.98
    # Adam epsilon, added outside the square root (optax / PyTorch convention).
    eps: float = 1e-6
    # Decoupled weight decay coefficient (AdamW); not applied to biases and norms.
    weight_decay: float = 0.01
    # Clip gradients to this global L2 norm before Adam; None = no clipping. The default is
    # InfoXLM's (paper Table 10); XLM-E clips at 2.0 (paper Table 10).
    clip_norm: float | None = 1.0
    # Layer-wise LR decay d in (0, 1]: a leaf at layer index l gets its update scaled
    # by d ** (num_layers + 1 - l) (embeddings l=0, layers_i l=i+1, heads l=num_layers+1).
    # None = off. Typical fine-tuning value: 0.9 (base) / 0.95 (large).
    layerwise_lr_decay: float | None = None
    # Number of encoder layers; required (> 0) when layerwise_lr_decay is set.
    num_layers: int = 0
    # Learning-rate multiplier of objective-owned modules by module name (e.g.
    # {'generator': 1.0}); modules not listed get 1. Unknown names are an error at start-up.
    module_lr_multipliers: Mapping[str, float] = dataclasses.field(default_factory=dict)
    # A first phase that trains only the parameters whose '/'-joined path matches this regular
    # expression (re.search), for `train_only_steps` updates; then everything trains. VECO
    # continued from XLM-R trains its new cross-attention blocks first ('cross_attention').
    # The optimizer state has the same structure in both phases (checkpoints resume across
    # the switch). None = off.
    train_only: str | None = None
    train_only_steps: int = 0

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ValueError:
            return ValueError(
                f"OptimizerConfig.{field}={getattr(self, field)!r} is invalid: {why}")

        if not (isinstance(self.learning_rate, (int, float)) and
                math.isfinite(self.learning_rate) and self.learning_rate > 0):
            raise bad("learning_rate", "must be a finite number > 0")
        if self.schedule not in _SCHEDULES:
            raise bad("schedule", f"must be one of {', '.join(_SCHEDULES)}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise bad("warmup_steps", "must be an integer >= 0")
        if not isinstance(self.total_steps, int) or self.total_steps < 1:
            raise bad("total_steps", "must be an integer >= 1")
        if self.schedule != "constant" and self.warmup_steps > self.total_steps:
            # A warning, not an error: a smoke run (`--gin.TRAIN_STEPS=2` of a run file) is
            # expected to work; the schedule ramps up and ends before the peak.
            warnings.warn(
                f"OptimizerConfig.warmup_steps={self.warmup_steps} > total_steps="
                f"{self.total_steps}: the run ends during warmup, below the peak learning "
                f"rate {self.learning_rate:g}", UserWarning, stacklevel=3)
        if not 0.0 <= self.end_lr_factor <= 1.0:
            raise bad("end_lr_factor", "must be in [0, 1]")
        if not 0.0 <= self.b1 < 1.0:
            raise bad("b1", "must be in [0, 1)")
        if not 0.0 <= self.b2 < 1.0:
            raise bad("b2", "must be in [0, 1)")
        if not self.eps > 0:
            raise bad("eps", "must be > 0")
        if not self.weight_decay >= 0:
            raise bad("weight_decay", "must be >= 0")
        if self.clip_norm is not None and not self.clip_norm > 0:
            raise bad("clip_norm", "must be > 0 or None")
        if self.layerwise_lr_decay is not None:
            if not 0.0 < self.layerwise_lr_decay <= 1.0:
                raise bad("layerwise_lr_decay", "must be in (0, 1] or None")
        if not isinstance(self.num_layers, int) or self.num_layers < 0:
            raise bad("num_layers", "must be an integer >= 0")
        if self.layerwise_lr_decay is not None and self.num_layers < 1:
            raise bad("num_layers", "must be >= 1 when layerwise_lr_decay is set")
        if self.train_only is not None:
            try:
                re.compile(self.train_only)
            except re.error as e:
                raise bad("train_only", f"is not a regular expression ({e})") from None
        if not isinstance(self.train_only_steps, int) or self.train_only_steps < 0:
            raise bad("train_only_steps", "must be an integer >= 0")
        if (self.train_only is None) != (self.train_only_steps == 0):
            raise bad("train_only_steps", "must be > 0 exactly when train_only is set "
                                          f"(train_only={self.train_only!r})")
        for module, factor in dict(self.module_lr_multipliers).items():
            if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor > 0):
                raise ValueError(f"OptimizerConfig.module_lr_multipliers[{module!r}]="
                                 f"{factor!r} is invalid: must be a finite number > 0")


def make_schedule(cfg: OptimizerConfig) -> optax.Schedule:
    """The learning rate as a function of the optimizer step (0-based update count).

    Linear warmup from 0 to `learning_rate` over `warmup_steps`, then linear or cosine
    decay to `end_lr_factor * learning_rate` at `total_steps` (flat afterwards), or
    constant. Closed form for "linear" at step s >= warmup:
    lr * (1 - (1 - end) * (s - warmup) / (total - warmup)).
    """
    peak = float(cfg.learning_rate)
    end = peak * cfg.end_lr_factor
    # warmup_steps > total_steps (a short smoke run, warned about by OptimizerConfig):
    # no decay phase, the warmup ramp is cut by the end of the run.
    decay_steps = max(cfg.total_steps - cfg.warmup_steps, 0)
    if cfg.schedule == "constant" or decay_steps == 0:
        after: optax.Schedule = optax.constant_schedule(
            peak if cfg.schedule == "constant" else end)
    elif cfg.schedule == "linear":
        after = optax.linear_schedule(peak, end, decay_steps)
    else:  # cosine
        after = optax.cosine_decay_schedule(peak, decay_steps, alpha=cfg.end_lr_factor)
    if cfg.warmup_steps == 0:
        return after
    warmup = optax.linear_schedule(0.0, peak, cfg.warmup_steps)
    return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def _is_box(x: Any) -> bool:
    return isinstance(x, meta.AxisMetadata)


def _key_name(key: Any) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)


def param_path_names(path: tuple[Any, ...]) -> tuple[str, ...]:
    """A jax key path -> tuple of plain names, e.g. ('layers_0', 'mlp', 'output', 'kernel')."""
    return tuple(_key_name(k) for k in path)


def map_named_params(fn: Callable[[tuple[str, ...], Any], Any], tree: PyTree) -> PyTree:
    """tree_map with the leaf's name path; `Partitioned` boxes keep their metadata.

    `fn(names, value)` sees the unboxed value; its result is re-boxed when the input
    leaf was boxed, so the output has exactly the input's pytree structure.
    """

    def visit(path, leaf):
        names = param_path_names(path)
        if _is_box(leaf):
            return leaf.replace_boxed(fn(names, leaf.unbox()))
        return fn(names, leaf)

    return jax.tree_util.tree_map_with_path(visit, tree, is_leaf=_is_box)


def _no_decay(names: tuple[str, ...]) -> bool:
    return bool(names) and (names[-1] == "bias" or any(_NORM_RE.search(n) for n in names))


def weight_decay_mask(params: PyTree) -> PyTree:
    """Same-structure pytree of bools: True where AdamW weight decay applies.

    False for every leaf named "bias" and everything under a module whose name matches
    /norm/i (LayerNorm, attention_norm, mlp_norm, final_norm, ...): decaying a norm's
    scale towards 0 or a bias has no regularising meaning (BERT/RoBERTa convention).
    """
    return map_named_params(lambda names, _: not _no_decay(names), params)


def layer_index(path: tuple[str, ...], num_layers: int) -> int | np.ndarray:
    """Depth of a parameter for layer-wise LR decay.

    embeddings and the shared rel_pos table -> 0, layers_i (and rel_pos_i, the per-layer
    relative table that layer i uses) -> i + 1, everything else (heads, final_norm,
    projections) -> num_layers + 1. The first recognised path component decides, so a
    leading collection name such as 'params' or a wrapper module is skipped. A parameter of
    the stacked layers (`layers/...`, leading axis = layer) -> the array [1, ..., num_layers],
    one depth per slice.
    """
    for name in path:
        if name in ("embeddings", "rel_pos"):  # shared tables feed every layer
            return 0
        if name == layer_stack.STACK:
            return np.arange(1, num_layers + 1)
        m = _LAYER_RE.match(name)
        if m:
            i = int(m.group(1))
            if i >= num_layers:
                raise ValueError(
                    f"parameter '{'/'.join(path)}' is in layer {i} but num_layers={num_layers}")
            return i + 1
    return num_layers + 1


def layerwise_lr_factors(params: PyTree, num_layers: int, decay: float) -> PyTree:
    """Same-structure tree of python floats: decay ** (num_layers + 1 - layer_index) in the
    encoder, 1 in objective modules (a [num_layers] array at a stacked layer parameter)."""
    cfg = OptimizerConfig(layerwise_lr_decay=decay, num_layers=num_layers)
    return map_named_params(lambda names, _: lr_factor(names, cfg), params)


OBJECTIVES_KEY = "objectives"  # train-state params: {"encoder": ..., "objectives": {module: ...}}


def lr_factor(names: tuple[str, ...], cfg: OptimizerConfig) -> float | np.ndarray:
    """The learning-rate factor of one parameter: `module_lr_multipliers[module]` (default 1)
    inside `objectives/<module>/...`, else the layer-wise decay factor (1 without LLRD); for a
    stacked layer parameter the [num_layers] factors of its slices."""
    if OBJECTIVES_KEY in names[:-1]:
        module = names[names.index(OBJECTIVES_KEY) + 1]
        return float(dict(cfg.module_lr_multipliers).get(module, 1.0))
    if cfg.layerwise_lr_decay is None:
        return 1.0
    factor = cfg.layerwise_lr_decay ** (cfg.num_layers + 1 - layer_index(names, cfg.num_layers))
    return np.asarray(factor, np.float64) if np.ndim(factor) else float(factor)


def _scale(names: tuple[str, ...], update: Any, cfg: OptimizerConfig) -> Any:
    """`update * lr_factor(names)`, the per-slice factors of a stacked layer parameter
    broadcast along its leading (layer) axis."""
    factor = lr_factor(names, cfg)
    if not np.ndim(factor):
        return update * factor
    if update.ndim < 1 or update.shape[0] != factor.shape[0]:
        raise ValueError(f"parameter '{'/'.join(names)}' of shape {tuple(update.shape)} is a "
                         f"stacked layer parameter but its leading axis is not "
                         f"num_layers={cfg.num_layers} (OptimizerConfig.num_layers must be the "
                         "model's)")
    factor = factor.reshape((-1,) + (1,) * (update.ndim - 1))
    return update * jnp.asarray(factor, update.dtype)


def check_module_multipliers(cfg: OptimizerConfig, modules: Mapping[str, Any]) -> None:
    """`module_lr_multipliers` names only modules the run's objectives declare."""
    unknown = sorted(set(dict(cfg.module_lr_multipliers)) - set(modules))
    if unknown:
        raise ValueError(f"OptimizerConfig.module_lr_multipliers names module(s) {unknown} "
                         f"that no objective declares; modules: {sorted(modules) or 'none'}")


class ScaleByLayerState(NamedTuple):
    """Empty state of `scale_by_layer` (the factors are static, derived from names)."""


def scale_by_layer(num_layers: int, decay: float) -> optax.GradientTransformation:
    """Multiply each update by decay ** (num_layers + 1 - layer_index(path)) (encoder
    subtree; objective modules are left to `scale_by_lr_factor`)."""
    return scale_by_lr_factor(OptimizerConfig(layerwise_lr_decay=decay, num_layers=num_layers))


def scale_by_lr_factor(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """Multiply each update by `lr_factor(path, cfg)`.

    Applied after AdamW, so it scales the whole step (Adam part and weight decay),
    which is the same as a per-layer (per-module) learning rate.
    """

    def init_fn(params):
        del params
        return ScaleByLayerState()

    def update_fn(updates, state, params=None):
        del params
        scaled = map_named_params(lambda names, u: _scale(names, u, cfg), updates)
        return scaled, state

    return optax.GradientTransformation(init_fn, update_fn)


class TrainOnlyState(NamedTuple):
    """Updates seen so far by `train_only_first`."""

    count: jax.Array


def train_only_first(pattern: str, steps: int) -> optax.GradientTransformation:
    """Zero every update whose parameter path does not match `pattern` during the first
    `steps` updates, then pass everything. Used twice in `make_optimizer`: on the gradients
    (so Adam's moments of the frozen parameters stay at zero and clipping sees only the
    trained ones) and on the final updates (so weight decay does not move them either). After
    the switch the frozen parameters' Adam moments start from zero while Adam's step count is
    already `steps`: their first updates are smaller than a fresh Adam's (a built-in ramp)."""
    regex = re.compile(pattern)

    def init_fn(params):
        del params
        return TrainOnlyState(count=jnp.zeros((), jnp.int32))

    def update_fn(updates, state, params=None):
        del params
        frozen = state.count < steps

        def gate(names, u):
            if regex.search("/".join(names)):
                return u
            return jnp.where(frozen, jnp.zeros_like(u), u)

        return map_named_params(gate, updates), TrainOnlyState(count=state.count + 1)

    return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(cfg: OptimizerConfig) -> optax.GradientTransformation:
    """[train_only gate ->] clip_by_global_norm -> adamw(schedule, masked decay)
    [-> layer-wise LR decay] [-> train_only gate]."""
    parts = []
    gate = (train_only_first(cfg.train_only, cfg.train_only_steps)
            if cfg.train_only is not None else None)
    if gate is not None:
        parts.append(gate)
    if cfg.clip_norm is not None:
        parts.append(optax.clip_by_global_norm(cfg.clip_norm))
    parts.append(optax.adamw(
        learning_rate=make_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
        weight_decay=cfg.weight_decay, mask=weight_decay_mask))
    llrd = cfg.layerwise_lr_decay is not None and cfg.layerwise_lr_decay != 1.0
    if llrd or any(f != 1.0 for f in dict(cfg.module_lr_multipliers).values()):
        parts.append(scale_by_lr_factor(cfg))
    if gate is not None:
        parts.append(gate)
    return optax.chain(*parts)


def global_norm(tree: PyTree) -> jax.Array:
    """L2 norm over all leaves (boxed or not), accumulated in float32."""
    leaves = jax.tree_util.tree_leaves(meta.unbox(tree))
    if not leaves:
        return jnp.zeros((), jnp.float32)
    return jnp.sqrt(sum(jnp.sum(jnp.square(jnp.asarray(x, jnp.float32))) for x in leaves))
