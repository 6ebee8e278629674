"""What a chip can do, for the cost model: peak rates from the vendors, and the efficiencies
measured on a device (each with where it was measured).

A rate with a source is the vendor's figure; a figure marked "our choice" has no source; a
calibration names the measurement it comes from (docs/performance.md, "GPU", has the
commands). The cost model divides an op's FLOPs and bytes by these rates; `Efficiency`
scales them down to what was measured for each kind of kernel, so the prediction is a
calibrated roofline rather than the datasheet's ceiling (which `roofline_ms` still reports).
"""
from __future__ import annotations

import dataclasses

# Sources
_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM: 989 TFLOP/s dense bf16, 3.35 TB/s HBM3)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM: 989 TFLOP/s dense bf16, 4.8 TB/s HBM3e)"
_B200 = "NVIDIA HGX B200 datasheet (per GPU: 2.25 PFLOP/s dense bf16, 8 TB/s HBM3e)"
_HOPPER_WP = ("NVIDIA H100 architecture whitepaper: 132 SMs x 128 FP32 lanes and 16 "
              "special-function results per SM per clock, 1.98 GHz boost")
_TPU = "Google Cloud TPU system architecture docs (per chip bf16 peak and HBM bandwidth)"


@dataclasses.dataclass(frozen=True)
class Efficiency:
    """Fractions of a peak rate that kinds of kernel reach, and the fixed costs, measured.

    matmul: of the bf16 peak, by cuBLAS / XLA's dots at a base model's shapes.
    memory: of the HBM bandwidth, by XLA's element-wise and reduction fusions.
    attention: of the bf16 peak, by the Pallas flash-attention kernels, per kernel
      ("forward", "dkv", "dq") at 128-row query tiles; `attention_small_tile_speedup` is the
      measured ratio for the 64-row tiles the GPU kernels now use.
    atomic_updates_per_s: scatter-add updates per second when the adds are not native
      atomics (bf16 on a GPU: a compare-and-swap loop per element).
    launch_s: the gap a kernel costs beyond its own run time (launch and tail).
    source: where the figures were measured.
    """

    matmul: float = 1.0
    memory: float = 1.0
    attention: tuple[tuple[str, float], ...] = ()
    attention_small_tile_speedup: float = 1.0
    atomic_updates_per_s: float | None = None
    launch_s: float = 0.0
    source: str = "none (the datasheet's ceilings)"

    def attention_of(self, kernel: str) -> float:
        for name, eff in self.attention:
            if name == kernel:
                return eff
        return self.matmul


@dataclasses.dataclass(frozen=True)
class Chip:
    """One device's peak rates and measured efficiencies."""

    name: str
    platform: str  # "gpu" or "tpu"
    bf16_flops: float  # dense matrix-unit FLOP/s
    hbm_bytes_per_s: float
    vector_ops_per_s: float  # simple element-wise results per second (all lanes)
    special_ops_per_s: float  # exp/log/erf/rsqrt/divide results per second
    link_bytes_per_s: float  # one direction, per chip, to its neighbours (collectives)
    source: str
    efficiency: Efficiency = Efficiency()


# Calibrated on one H100 SXM (jax 0.11.2, CUDA 13) from the trace and optimised HLO of
# `bench --gin_file=runs/xlmr_base_mmlm.gin --steps 5 --batch_size 32 --seq_len 512` at
# commit 1905b5d (docs/performance.md, "GPU"): per kind, the cost model's roofline time of
# the ops in that HLO over their measured kernel time. The Pallas tile speedup is the ratio of
# the attention forward + backward measured with 128 x 128 tiles (2.49 ms) and 64 x 64 tiles
# (1.00 ms) at [32, 512, 12, 64] bf16, dropout 0.1, in the same session
# (docs/experiments/gpu_probe.py). The H200 (the same GH100 chip, faster memory) has its
# own calibration below.
_HOPPER_EFFICIENCY = Efficiency(
    matmul=0.755,
    memory=0.79,
    attention=(("forward", 0.0156), ("dkv", 0.0335), ("dq", 0.0549)),
    attention_small_tile_speedup=2.49,
    atomic_updates_per_s=0.449e9,
    launch_s=0.17e-6,
    source="H100 SXM, jax 0.11.2, xlmr_base 32 x 512 at 1905b5d (trace + optimised HLO)",
)

# Calibrated on one H200 SXM (jax 0.11.2, CUDA 13) from the trace and optimised HLO of the
# same step at commit 17c6179 (`accelerator.check`, docs/performance.md "Measured after the
# changes"): per kind, the roofline time of the ops in that HLO over their measured kernel
# time. Its Pallas kernels ran 64 x 64 tiles: the fractions below are those measured divided
# by the H100's tile speedup, so that 64-row tiles predict what was measured (forward 4.14,
# dkv 3.06, dq 2.39 ms for 12 layers); the H200's faster memory is reached at a lower
# fraction than the H100's (0.62 against 0.79: 17.7 ms of memory-bound kernels).
_H200_EFFICIENCY = Efficiency(
    matmul=0.768,
    memory=0.624,
    attention=(("forward", 0.0755 / 2.49), ("dkv", 0.2044 / 2.49), ("dq", 0.1962 / 2.49)),
    attention_small_tile_speedup=2.49,
    atomic_updates_per_s=0.449e9,
    launch_s=0.17e-6,
    source="H200 SXM, jax 0.11.2, xlmr_base 32 x 512 at 17c6179 (trace + optimised HLO)",
)

_SM_RATE = 132 * 1.98e9  # SMs x boost clock, H100/H200 [WP]

CHIPS: dict[str, Chip] = {
    "h100": Chip("NVIDIA H100 SXM", "gpu", 989e12, 3.35e12, _SM_RATE * 128, _SM_RATE * 16,
                 450e9, f"{_H100}; {_HOPPER_WP}; NVLink 900 GB/s both directions",
                 _HOPPER_EFFICIENCY),
    "h200": Chip("NVIDIA H200 SXM", "gpu", 989e12, 4.8e12, _SM_RATE * 128, _SM_RATE * 16,
                 450e9, f"{_H200}; {_HOPPER_WP}; NVLink 900 GB/s both directions",
                 _H200_EFFICIENCY),
    "b200": Chip("NVIDIA B200", "gpu", 2.25e15, 8e12, 148 * 1.9e9 * 128, 148 * 1.9e9 * 16,
                 900e9, f"{_B200}; SM count and clock: our assumption (148 SMs, 1.9 GHz); "
                 "not calibrated (Hopper's fractions are not assumed)"),
    # TPU vector rates are our choice (no public per-chip figure): 1/8 of the bf16 peak, so
    # that element-wise work is bandwidth-bound as it is in practice; not calibrated.
    "v4": Chip("TPU v4", "tpu", 275e12, 1.2e12, 275e12 / 8, 275e12 / 32, 45e9 * 6,
               f"{_TPU}: v4 275 TFLOP/s, 1.2 TB/s, ICI 6 links x 45 GB/s"),
    "v5e": Chip("TPU v5e", "tpu", 197e12, 0.819e12, 197e12 / 8, 197e12 / 32, 200e9,
                f"{_TPU}: v5e 197 TFLOP/s, 819 GB/s, ICI 1600 Gbps"),
    "v5p": Chip("TPU v5p", "tpu", 459e12, 2.765e12, 459e12 / 8, 459e12 / 32, 600e9,
                f"{_TPU}: v5p 459 TFLOP/s, 2765 GB/s, ICI 4800 Gbps"),
    "v6e": Chip("TPU v6e", "tpu", 918e12, 1.64e12, 918e12 / 8, 918e12 / 32, 448e9,
                f"{_TPU}: v6e 918 TFLOP/s, 1640 GB/s, ICI 3584 Gbps"),
}


def chip_for(chip_name: str) -> Chip:
    """The table's entry for a target's chip ("h200", "v5p", ...); KeyError naming the known
    chips otherwise."""
    try:
        return CHIPS[chip_name]
    except KeyError:
        raise KeyError(f"no cost figures for chip {chip_name!r}; known: "
                       f"{', '.join(sorted(CHIPS))}") from None
