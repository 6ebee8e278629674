"""Model FLOPs per trained token and MFU (model FLOPs utilisation).

The per-pass counts (`encoder_flops`, `head_flops`, `memory_projection_flops`,
`train_flops_per_token`) are `xlm_jax.models.flops`'s, re-exported here: matmul FLOPs, x 3 for
a pass that is differentiated (forward + backward) and x 1 for one under stop_gradient, with
the MLM head at the gathered prediction slots only (its share is small because training never
evaluates the vocabulary everywhere):
  per token per layer: 2 * (4 d^2 + 2 d f)  (projections + FFN)  + 2 * 2 * T * d  (scores, values)
  head per prediction slot: 2 * (d^2 + d V).
Each built-in objective counts its own passes analytically (`Objective.flops_per_example`:
XLM-E's generator and discriminator, XLCo's key encoder, ERNIE-M's CAMLM pass (two with
`passes='two'`) and BTMLM's decoding pass, VECO's four passes with cross-attention);
`tests/train/flops_test.py`
checks every count against the dot products in the jaxpr of the objective's gradient. An
objective without an analytic count (a new one: the default returns None) is counted from
that jaxpr itself (`jaxpr_flops_per_example`), so its MFU is right without a formula or a
test entry. `mixture_flops_per_token` weighs the objectives over the mixture.
Peak bf16 numbers are the vendors' dense figures (`PEAK_BF16_FLOPS`, each with its source). On
a CPU there is no peak: the trainer then logs only `model_tflops_per_sec` and the benchmark
prints MFU n/a; on an accelerator not listed the same, after one WARNING naming its kind.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

import flax.linen as nn
import jax
import numpy as np

from xlm_jax.data.features import example_kind
from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models import attention_backends
from xlm_jax.objectives.base import WeightedObjective, init_params, objective_loss
from xlm_jax.train import streams as streams_lib
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


def dot_flops(jaxpr: Any) -> float:
    """The FLOPs of every `dot_general` in `jaxpr` (2 x output size x contracted size), through
    nested jaxprs: a scan's body counts `length` times, a cond its costliest branch, a while
    loop's body once (its trip count is not in the jaxpr)."""
    total = 0.0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (lhs_contract, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            total += (2.0 * float(np.prod(eqn.outvars[0].aval.shape))
                      * float(np.prod([lhs[i] for i in lhs_contract])))
        if eqn.primitive.name == "cond":
            total += max(dot_flops(b.jaxpr) for b in eqn.params["branches"])
            continue
        times = float(eqn.params.get("length", 1)) if eqn.primitive.name == "scan" else 1.0
        for value in eqn.params.values():
            for sub in value if isinstance(value, (list, tuple)) else [value]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    total += times * dot_flops(inner)
    return total


def jaxpr_flops_per_example(objective: Any, seq_len: int, rows: int = 2) -> float:
    """Model matmul FLOPs of one example, read from the jaxpr of the gradient of the
    objective's loss (`objective_loss`: its terms' sums over their counts, weighted by
    `term_weights`, as the trainer takes it) on `rows` synthetic examples of its kind (traced
    on abstract parameters: nothing is allocated or computed), with every attention call on
    the XLA path so that its dot products are seen. Dropout off; the objective's own state
    from its `init_state`."""
    model = objective.model  # every objective keeps its encoder as `model`
    cfg = model.config
    wrapped = [WeightedObjective(objective)]
    params = jax.eval_shape(
        lambda r: nn.meta.unbox(init_params(model, wrapped, seq_len, r)), jax.random.PRNGKey(0))
    state = jax.eval_shape(lambda p: nn.meta.unbox(objective.init_state(p)), params)
    batch = {k: jax.numpy.asarray(v) for k, v in synthetic_batch(
        rows, seq_len, cfg.vocab_size, objective.kind, seed=0,
        num_languages=streams_lib.synthetic_language_count(cfg.num_languages)).items()}
    prepared = objective.prepare(batch, jax.random.PRNGKey(1))
    counts = objective.counts(prepared)

    def loss(p: Any, st: Any) -> Any:
        out = objective.loss(p, prepared, jax.random.PRNGKey(2), st, deterministic=True)
        return objective_loss(objective, out.losses, counts)

    with attention_backends.reference_math():
        jaxpr = jax.make_jaxpr(jax.grad(loss))(params, state).jaxpr
    return dot_flops(jaxpr) / rows


def objective_flops_per_example(objective: Any, seq_len: int) -> float:
    """The objective's analytic count (`flops_per_example`), or the jaxpr's when it has none."""
    analytic = objective.flops_per_example(seq_len)
    return float(analytic) if analytic is not None else jaxpr_flops_per_example(objective,
                                                                                 seq_len)


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
        flops += runs * rows * objective_flops_per_example(o, length)
        positions += runs * rows * len(example_kind(o.kind).prefixes) * length
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
                       "reported; add the chip to xlm_jax.train.step_flops.PEAK_BF16_FLOPS",
                       kind, device.platform)
    return None


def mfu(model_flops_per_sec: float, num_devices: int | None = None) -> float | None:
    """Model FLOPs utilisation in [0, 1], or None where the device's peak is unknown (CPUs)."""
    peak = peak_flops_per_device()
    if peak is None:
        return None
    return model_flops_per_sec / (peak * (num_devices or jax.device_count()))
