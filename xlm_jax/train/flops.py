"""Model FLOPs per trained token and MFU (model FLOPs utilisation).

The per-pass counts (`encoder_flops`, `head_flops`, `memory_projection_flops`,
`train_flops_per_token`) are `xlm_jax.models.flops`'s, re-exported here: matmul FLOPs, x 3 for
a pass that is differentiated (forward + backward) and x 1 for one under stop_gradient, with
the MLM head at the gathered prediction slots only (its share is small because training never
evaluates the vocabulary everywhere):
  per token per layer: 2 * (4 d^2 + 2 d f)  (projections + FFN)  + 2 * 2 * T * d  (scores, values)
  head per prediction slot: 2 * (d^2 + d V).
Each objective counts its own passes (`Objective.flops_per_example`: XLM-E's generator and
discriminator, XLCo's key encoder, ERNIE-M's two CAMLM passes and BTMLM's decoding pass,
VECO's four passes with cross-attention); `mixture_flops_per_token` weighs them over the
mixture; `tests/train/flops_test.py` checks every count against the dot products in the jaxpr
of the objective's gradient.
Peak bf16 numbers are the vendors' dense figures (`PEAK_BF16_FLOPS`, each with its source). On
a CPU there is no peak: the trainer then logs only `model_tflops_per_sec` and the benchmark
prints MFU n/a; on an accelerator not listed the same, after one WARNING naming its kind.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import jax

from xlm_jax.data.features import PREFIXES
from xlm_jax.models.flops import (  # noqa: F401  (re-exported: the trainer's API)
    encoder_flops, head_flops, memory_projection_flops, train_flops_per_token)

logger = logging.getLogger(__name__)

# Peak dense bf16 matmul FLOP/s per chip (one jax device), by `jax.devices()[0].device_kind`: a
# pattern matches the WHOLE kind, case-insensitively, and the first match wins (so the H100 PCIe
# and NVL entries come before the H100 SXM's). The kinds, per platform:
# - TPUs report the runtime's chip name, which is not the product name for three chips:
#   "TPU v5 lite" is v5e, "TPU v5" is v5p, "TPU v6 lite" is v6e (Trillium); a runtime may also
#   say "TPU v5e", "TPU v5p", "TPU v6e" (released code: jax/_src/pallas/mosaic/tpu_info.py,
#   chip_version_from_device_kind, accepts both spellings; jax/_src/test_util.py tells v5p by
#   the kind ending in "v5"). "TPU v4 lite" (v4i, an inference chip) is not a v4: no entry.
# - NVIDIA GPUs report the CUDA device name: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe",
#   "NVIDIA H100 NVL", "NVIDIA H200", "NVIDIA B200", "NVIDIA A100-SXM4-80GB" (released code:
#   jax's own Mosaic GPU tests use device_kind "NVIDIA H100 80GB HBM3"). An H200 NVL (835
#   TFLOP/s dense) that reports plain "NVIDIA H200" gets the SXM's peak: its MFU reads 15% low.
#   A GH200's or GB200's kind matches no entry ("\b" keeps "h200" and "b200" from matching
#   inside "gh200" and "gb200").
PEAK_BF16_FLOPS: tuple[tuple[str, float, str], ...] = (  # (kind pattern, FLOP/s, source)
    (r"tpu v4", 275e12, "Google Cloud TPU v4 docs: 275 TFLOP/s bf16 per chip"),
    (r"tpu v5( lite|e)", 197e12, "Google Cloud TPU v5e docs: 197 TFLOP/s bf16 per chip"),
    (r"tpu v5p?", 459e12, "Google Cloud TPU v5p docs: 459 TFLOP/s bf16 per chip"),
    (r"tpu v6( lite|e)", 918e12,
     "Google Cloud TPU v6e (Trillium) docs: 918 TFLOP/s bf16 per chip"),
    (r"nvidia a100\b.*", 312e12,
     "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense (624 with sparsity), SXM and PCIe alike"),
    (r"nvidia h100 pcie\b.*", 756e12,
     "NVIDIA H100 datasheet: H100 PCIe 1,513 TFLOP/s bf16 with sparsity, half of it dense"),
    (r"nvidia h100 nvl\b.*", 835e12,
     "NVIDIA H100 datasheet: H100 NVL 1,671 TFLOP/s bf16 with sparsity, half of it dense"),
    (r"nvidia h100\b.*", 989e12, "NVIDIA H100 datasheet: H100 SXM 989 TFLOP/s dense bf16"),
    (r"nvidia h200\b.*", 989e12, "NVIDIA H200 datasheet: H200 SXM 989 TFLOP/s dense bf16"),
    (r"nvidia b200\b.*", 2.25e15,
     "NVIDIA HGX B200 spec: 2.25 PFLOP/s dense bf16 per GPU (36 PFLOP/s with sparsity for 8)"),
)

# Device kinds already warned about as having no peak (warned once per process).
_WARNED_KINDS: set[str] = set()


def mixture_flops_per_token(objectives: Sequence[Any], seq_len: int,
                            shapes: Sequence[Any] | None = None) -> float:
    """Model FLOPs per row-token of the mixture: the objectives' FLOPs over one cycle of the
    mixture (`train.mixture`) over the row positions they compute in it (padded positions
    count, as the step computes them). Without `shapes` every objective draws the same
    number of rows of `seq_len` tokens at every step; `shapes[i]` (a `mixture.Shape`) gives
    objective i's rows, length and period."""
    flops = positions = 0.0
    for i, o in enumerate(objectives):
        rows, length, runs = 1, seq_len, 1.0
        if shapes is not None:
            s = shapes[i]
            rows, length, runs = s.batch_size, s.seq_len, 1.0 / s.every
        flops += runs * rows * o.flops_per_example(length)
        positions += runs * rows * len(PREFIXES[o.kind]) * length
    return flops / positions


def peak_flops_per_device(device: jax.Device | None = None) -> float | None:
    """The device's peak dense bf16 FLOP/s from `PEAK_BF16_FLOPS`, or None: always on a CPU, and
    on an accelerator whose kind no entry matches, after a WARNING (once per kind) naming it."""
    device = device or jax.devices()[0]
    kind = device.device_kind
    for pattern, peak, _ in PEAK_BF16_FLOPS:
        if re.fullmatch(pattern, kind.strip(), flags=re.IGNORECASE):
            return peak
    if device.platform != "cpu" and kind not in _WARNED_KINDS:
        _WARNED_KINDS.add(kind)
        logger.warning("no peak bf16 FLOP/s known for device kind %r (platform %s): MFU is not "
                       "reported; add the chip to xlm_jax.train.flops.PEAK_BF16_FLOPS",
                       kind, device.platform)
    return None


def mfu(model_flops_per_sec: float, num_devices: int | None = None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None where the device's peak is unknown (CPUs)."""
    peak = peak_flops_per_device()
    if peak is None:
        return None
    return model_flops_per_sec / (peak * (num_devices or jax.device_count()))
