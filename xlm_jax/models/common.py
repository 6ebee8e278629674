"""Small building blocks shared by the encoder and the heads: initialisers carrying logical
axis names, activation sharding constraints, the XLM-R LayerNorm, and the exact GELU."""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax

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
