"""Model FLOPs per trained token and MFU (model FLOPs utilisation).

Counted as matmul FLOPs x 3 (forward + backward), with the MLM head at the gathered positions
only (its share is small because training never evaluates the vocabulary everywhere):
  per token per layer: 2 * (4 d^2 + 2 d f)  (projections + FFN)  + 2 * 2 * T * d  (scores, values)
  head per prediction: 2 * (d^2 + d V), times the prediction share (mask_prob, 15%).
Peak bf16 numbers are the vendors' dense figures. On a CPU (or a chip not listed) there is no
peak: the trainer then logs only `model_tflops_per_sec` and the benchmark prints MFU n/a.
"""
from __future__ import annotations

import jax

from xlm_jax.models.config import ModelConfig

PEAK_BF16_FLOPS = {  # per device
    "h100": 989e12, "h200": 989e12, "a100": 312e12,
    "tpu v4": 275e12, "tpu v5 lite": 197e12, "tpu v5e": 197e12, "tpu v5p": 459e12,
    "tpu v6 lite": 918e12,
}


def train_flops_per_token(cfg: ModelConfig, seq_len: int, prediction_share: float = 0.15) -> float:
    d, f, L, V = cfg.hidden_size, cfg.mlp_dim, cfg.num_layers, cfg.vocab_size
    layer = 2 * (4 * d * d + 2 * d * f) + 2 * 2 * seq_len * d
    head = prediction_share * 2 * (d * d + d * V)
    return 3.0 * (L * layer + head)


def peak_flops_per_device(device: jax.Device | None = None) -> float | None:
    device = device or jax.devices()[0]
    kind = device.device_kind.lower()
    for name, peak in PEAK_BF16_FLOPS.items():
        if name in kind:
            return peak
    return None


def mfu(model_flops_per_sec: float, num_devices: int | None = None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None where the device's peak is unknown (CPUs)."""
    peak = peak_flops_per_device()
    if peak is None:
        return None
    return model_flops_per_sec / (peak * (num_devices or jax.device_count()))
