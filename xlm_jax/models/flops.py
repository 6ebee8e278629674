"""Matmul FLOP counts of the encoder's passes: what one token costs in one pass.

The formulas every objective's `flops_per_example` adds up (so they sit below the objectives,
and the objectives need nothing of the trainer); the trainer's throughput, MFU and device
peaks are `xlm_jax.train.step_flops`, which re-exports these. Counted as matmul FLOPs, forward only
(the objectives multiply by 3 for a differentiated pass, forward + backward, and by 1 for one
under stop_gradient), with the MLM head at the gathered prediction slots only:
  per token per layer: 2 * (4 d^2 + 2 d f)  (projections + FFN)  + 2 * 2 * T * d  (scores, values)
  head per prediction slot: 2 * (d^2 + d V).
`tests/train/flops_test.py` checks every objective's count against the dot products in the
jaxpr of its gradient.
"""
from __future__ import annotations

from xlm_jax.models.config import ModelConfig


def train_flops_per_token(cfg: ModelConfig, seq_len: int, prediction_share: float = 0.15) -> float:
    """One MLM pass per token, forward + backward, the head at `prediction_share` of tokens."""
    return 3.0 * (encoder_flops(cfg, seq_len) + prediction_share * head_flops(cfg))


def encoder_flops(cfg: ModelConfig, seq_len: int, memory_len: int = 0,
                  layers: int | None = None) -> float:
    """Forward matmul FLOPs per token of one pass through `layers` (default all) layers of
    `cfg`'s stack at row length `seq_len`: the q/k/v/o projections and the FFN, the attention
    scores and values over `seq_len` keys, XLM-E's two gates (q.u, q.v) when the stack has the
    gated bias, and, with `memory_len` > 0, a cross-attention block over that many memory
    tokens (q/o on the token, k/v on the memory: `memory_len / seq_len` of a memory token's
    projections per token)."""
    d, f = cfg.hidden_size, cfg.mlp_dim
    layer = 2 * (4 * d * d + 2 * d * f) + 2 * 2 * seq_len * d
    if cfg.position_type in ("relative", "both"):
        layer += 2 * 2 * d
    if memory_len:
        layer += (2 * 2 * d * d + 2 * 2 * memory_len * d
                  + memory_projection_flops(cfg, seq_len, memory_len, layers=1))
    return (cfg.num_layers if layers is None else layers) * layer


def memory_projection_flops(cfg: ModelConfig, seq_len: int, memory_len: int,
                            layers: int | None = None) -> float:
    """The part of `encoder_flops(cfg, seq_len, memory_len)` that projects the memory to keys
    and values (per token): a pass whose memory is under stop_gradient differentiates it only
    with respect to the weights, 2 x instead of 3 x."""
    d = cfg.hidden_size
    return (cfg.num_layers if layers is None else layers) * 2 * 2 * d * d * memory_len / seq_len


def head_flops(cfg: ModelConfig) -> float:
    """Forward matmul FLOPs of the MLM head at one prediction: the d x d transform and the tied
    decoder over the (padded) vocabulary."""
    d = cfg.hidden_size
    return 2 * (d * d + d * cfg.padded_vocab_size)
