"""Output heads and pooling: tied MLM head, per-token binary (RTD) head, projection, pooling.

The MLM head is evaluated on gathered positions by `Transformer.mlm_logits`; it never sees the
full [B, T, D] sequence during training, which saves the 250k-vocab matmul at unmasked tokens.
"""
from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from xlm_jax.models.common import ACTIVATION, ACTIVATION_VOCAB, constrain
from xlm_jax.models.common import gelu as _gelu
from xlm_jax.models.common import layer_norm as _layer_norm
from xlm_jax.models.common import normal_init as _init
from xlm_jax.models.common import zeros_init as _zeros
from xlm_jax.models.config import ModelConfig

Array = jax.Array
POOLING = ("cls", "mean")

PADDED_LOGIT = -1e9  # logit of the vocabulary-padding ids: softmax weight exactly 0 in float32


class MLMHead(nn.Module):
    """XLM-R LM head: dense -> exact GELU -> LayerNorm -> tied decoder (word embeddings) + bias.

    With `pad_vocab_to_multiple_of > 1` the logits are `padded_vocab_size` wide and the padding
    ids get PADDED_LOGIT, so losses, argmax and sampling never pick them and their rows of the
    embedding table receive no gradient from the head.
    """

    config: ModelConfig

    @nn.compact
    def __call__(self, x: Array, word_embeddings: nn.Embed) -> Array:
        cfg = self.config
        x = nn.Dense(cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                     kernel_init=_init(cfg, ("embed", "embed_proj")),
                     bias_init=_zeros(("embed_proj",)), name="dense")(x)
        # Pin the projection's output to the standard activation layout. Left to XLA's
        # propagation, with `embed_proj` on `tensor` the SPMD partitioner (jax 0.10.2, CPU)
        # produced wrong gradients (docs/experiments/spmd_grad_repro.py).
        x = constrain(x, ACTIVATION)
        x = _layer_norm(cfg, "LayerNorm")(_gelu(x))
        logits = word_embeddings.attend(x.astype(cfg.compute_dtype))
        bias = self.param("bias", _zeros(("vocab",)), (cfg.padded_vocab_size,), cfg.params_dtype)
        logits = logits.astype(jnp.float32) + jnp.asarray(bias, jnp.float32)
        if cfg.padded_vocab_size > cfg.vocab_size:
            ids = jnp.arange(cfg.padded_vocab_size)
            logits = jnp.where(ids < cfg.vocab_size, logits, PADDED_LOGIT)
        return constrain(logits, ACTIVATION_VOCAB)


class RTDHead(nn.Module):
    """ELECTRA discriminator head: dense -> GELU -> dense(1); returns per-token logits [B, T]."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        x = nn.Dense(cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                     kernel_init=_init(cfg, ("embed", "embed_proj")),
                     bias_init=_zeros(("embed_proj",)), name="dense")(x)
        x = constrain(x, ACTIVATION)  # as in MLMHead
        x = nn.Dense(1, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                     kernel_init=_init(cfg, ("embed_proj", "scalar")),
                     bias_init=_zeros(("scalar",)), name="out")(_gelu(x))
        return x[..., 0].astype(jnp.float32)


class ProjectionHead(nn.Module):
    """Linear d -> features projection (InfoXLM's XLCo head has no bias and no activation)."""

    config: ModelConfig
    features: int | None = None
    use_bias: bool = False

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        return nn.Dense(self.features or cfg.hidden_size, use_bias=self.use_bias,
                        dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                        kernel_init=_init(cfg, ("embed", "embed_proj")),
                        bias_init=_zeros(("embed_proj",)), name="dense")(x)


def pool(hidden: Array, valid: Array, kind: str = "mean") -> Array:
    """Sentence vectors [B, D] from [B, T, D]: `cls` = first token, `mean` = mean over `valid`."""
    if kind == "cls":
        return hidden[:, 0]
    if kind == "mean":
        w = valid.astype(hidden.dtype)[..., None]
        return (hidden * w).sum(axis=1) / jnp.maximum(w.sum(axis=1), 1.0)
    raise ValueError(f"unknown pooling {kind!r}; valid: {', '.join(POOLING)}")
