"""Small building blocks shared by the encoder and the heads: initialisers carrying logical
axis names, activation sharding constraints, the XLM-R LayerNorm, the exact GELU, and
dropout whose masks can be drawn per row."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from xlm_jax.models.config import ModelConfig


# Logical names of the activations that layers pin with `constrain` (mapped onto the mesh by
# `xlm_jax.train.partitioning.standard_logical_axis_rules`).
ACTIVATION = ("activation_batch", "activation_length", "activation_embed")
ACTIVATION_MLP = ("activation_batch", "activation_length", "activation_mlp")
ACTIVATION_HEADS = ("activation_batch", "activation_length", "activation_heads", "activation_kv")
ACTIVATION_VOCAB = ("activation_batch", "activation_length", "activation_vocab")


def constrain(x: jax.Array, names: tuple[str, ...]) -> jax.Array:
    """Activation sharding constraint by logical names.

    A no-op outside a mesh + rules context; inside `xlm_jax.train.partitioning.activate` it
    pins the layout, which the SPMD partitioner needs after sharded matmuls (see
    docs/experiments/spmd_grad_repro.py).
    """
    return nn.with_logical_constraint(x, names)


def gelu(x: jax.Array) -> jax.Array:
    """Exact erf GELU, as XLM-R/BERT use (flax's default `nn.gelu` is the tanh approximation)."""
    return nn.gelu(x, approximate=False)


def _gelu_of_sum(y: jax.Array, bias: jax.Array) -> jax.Array:
    return gelu(y + bias)


@jax.custom_vjp
def bias_gelu(y: jax.Array, bias: jax.Array) -> jax.Array:
    """`gelu(y + bias)`, the FFN's first projection and activation, whose backward pass
    recomputes the activation from `y` (the matmul's output) and `bias` instead of keeping
    what autodiff keeps.

    Values and gradients are autodiff's own (the backward pass is `jax.vjp` of the same
    function): only what is stored between the passes changes. Autodiff of the unfused form
    keeps two [tokens, mlp_dim] intermediates of the activation for the backward pass, besides
    the output the next matmul reads; the backward fusion then reads them and the matmul's
    output again (measured in the compiled GPU step: 3 tensors written and 4 read, where 1 and
    2 suffice). The base FFN's intermediate is 16,384 x 3,072 bf16, 100 MB a layer: 400 MB
    less memory traffic per layer and step (docs/performance.md, "Keeping less between the
    passes").
    """
    return _gelu_of_sum(y, bias)


def _bias_gelu_fwd(y: jax.Array, bias: jax.Array
                   ) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    return _gelu_of_sum(y, bias), (y, bias)


def _bias_gelu_bwd(res: tuple[jax.Array, jax.Array], g: jax.Array
                   ) -> tuple[jax.Array, jax.Array]:
    # The barrier keeps XLA from merging the recomputation with the forward pass's identical
    # expressions (common-subexpression elimination), which would store them again: what
    # `jax.checkpoint(prevent_cse=True)` does for the same reason.
    return jax.vjp(_gelu_of_sum, *jax.lax.optimization_barrier(res))[1](g)


bias_gelu.defvjp(_bias_gelu_fwd, _bias_gelu_bwd)


def normal_init(cfg: ModelConfig, names: tuple[str, ...]) -> Any:
    """N(0, initializer_range) with logical axis names."""
    return nn.with_logical_partitioning(nn.initializers.normal(cfg.initializer_range), names)


def zeros_init(names: tuple[str, ...]) -> Any:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def layer_norm(cfg: ModelConfig, name: str) -> nn.LayerNorm:
    """LayerNorm over the model dimension with XLM-R's epsilon."""
    return nn.LayerNorm(
        epsilon=cfg.layer_norm_eps, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("embed",)),
        bias_init=zeros_init(("embed",)), name=name)


def keep_mask(rng: jax.Array, keep_prob: float, shape: tuple[int, ...],
              row_ids: jax.Array | None = None) -> jax.Array:
    """Bernoulli(`keep_prob`) booleans of `shape`.

    Without `row_ids` one draw of the whole shape from `rng` (what `nn.Dropout` draws). With
    `row_ids` ([shape[0]] ints) row b is drawn from `fold_in(rng, row_ids[b])`, so a row's mask
    depends on its id and not on the other rows of the array: the trainer passes each row's
    index in the step's global batch, and gradient accumulation then draws for a microbatch
    exactly the masks its rows get in the whole batch.
    """
    if row_ids is None:
        return jax.random.bernoulli(rng, keep_prob, shape)
    if row_ids.shape != shape[:1]:
        raise ValueError(f"row_ids of shape {row_ids.shape} for an array of shape {shape}: "
                         "one id per row (leading axis) is needed")
    keys = jax.vmap(jax.random.fold_in, (None, 0))(rng, row_ids)
    return jax.vmap(lambda k: jax.random.bernoulli(k, keep_prob, shape[1:]))(keys)


class Dropout(nn.Module):
    """`nn.Dropout` (same rng stream, same bits without `row_ids`) with optional per-row
    masks (`keep_mask`)."""

    rate: float

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool,
                 row_ids: jax.Array | None = None) -> jax.Array:
        if deterministic or self.rate == 0.0:
            return x
        if self.rate == 1.0:
            return jnp.zeros_like(x)
        keep_prob = 1.0 - self.rate
        keep = keep_mask(self.make_rng("dropout"), keep_prob, x.shape, row_ids)
        return jax.lax.select(keep, x / keep_prob, jnp.zeros_like(x))
