"""Launch settings of the GPU flash-attention kernels (`fused_attention`): each kernel's tile,
Triton warps and pipeline stages, and their text form for a model config or a command line.

Pure Python (no jax): `ModelConfig.attention_launch` validates its text here, and the kernels'
module imports the dataclasses.

Text form (`KernelLaunch.parse`): ``BQxBKwWARPSsSTAGES`` for all three kernels
(``"64x64w4s3"``), or ``kernel=BQxBKwWARPSsSTAGES`` pairs for some of them, the others keeping
the default (``"forward=128x64w8s3,dq=64x32w4s3"``); ``""`` is the default launch.
"""
from __future__ import annotations

import dataclasses
import re

# Triton launch settings, measured (docs/performance.md, "GPU"): forward + backward at
# [32, 512, 12, 64] bf16 with attention dropout 0.1 on an H100 (jax 0.11.2) took 1.00 ms with
# 64 x 64 tiles, 4 warps and 3 pipeline stages, the fastest of the seven settings tried with
# one setting for all three kernels; the first settings, 128 x 128 tiles with 4 warps and 2
# stages (the defaults of jax's own Pallas GPU flash attention), took 2.49 ms. Each kernel
# takes its own `Launch` (`KernelLaunch`): `accelerator.kernel_sweep` times them apart.
NUM_WARPS: int = 4
NUM_STAGES: int = 3
KERNELS: tuple[str, ...] = ("forward", "dkv", "dq")


@dataclasses.dataclass(frozen=True)
class Launch:
    """One kernel's launch: its tile (``block_q`` query rows by ``block_k`` keys, powers of
    two >= 16) and Triton's warps and software-pipeline stages (ignored when interpreted)."""

    block_q: int = 64
    block_k: int = 64
    num_warps: int = NUM_WARPS
    num_stages: int = NUM_STAGES

    def label(self) -> str:
        return f"{self.block_q}x{self.block_k}w{self.num_warps}s{self.num_stages}"


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """The three kernels' launches: the forward pass, the backward's dk/dv (grid over key
    tiles, a loop over query tiles) and its dq (grid over query tiles, a loop over keys).
    FA-2's kernels favour different tiles (a dq or forward program holds its query tile, a
    dk/dv program its key tile), so each has its own."""

    forward: Launch = Launch()
    dkv: Launch = Launch()
    dq: Launch = Launch()

    @classmethod
    def uniform(cls, launch: Launch) -> KernelLaunch:
        return cls(launch, launch, launch)

    def of(self, kernel: str) -> Launch:
        if kernel not in KERNELS:
            raise ValueError(f"unknown kernel {kernel!r}: one of {', '.join(KERNELS)}")
        return getattr(self, kernel)

    def replace(self, kernel: str, launch: Launch) -> KernelLaunch:
        self.of(kernel)
        return dataclasses.replace(self, **{kernel: launch})


_LAUNCH_RE = re.compile(r"^(\d+)x(\d+)w(\d+)s(\d+)$")


def launch_fields(text: str) -> tuple[int, int, int, int]:
    """``"128x64w4s3"`` -> ``(128, 64, 4, 3)``: block_q, block_k, warps, stages."""
    m = _LAUNCH_RE.match(text.strip())
    if not m:
        raise ValueError(f"{text!r} is not BQxBKwWARPSsSTAGES (e.g. 128x64w4s3)")
    bq, bk, warps, stages = (int(g) for g in m.groups())
    for name, tile in (("block_q", bq), ("block_k", bk)):
        if tile < 16 or tile & (tile - 1):
            raise ValueError(f"{text!r}: {name} {tile} is not a power of two >= 16")
    if warps < 1 or warps & (warps - 1) or stages < 1:
        raise ValueError(f"{text!r}: warps must be a power of two and stages >= 1")
    return bq, bk, warps, stages


def parse(text: str, default: KernelLaunch | None = None) -> KernelLaunch | None:
    """The launch a text names (module docstring), over ``default``'s for kernels it does not
    name; None for ``""`` (the caller's default). ValueError (one line) on anything else."""
    text = text.strip()
    if not text:
        return None
    if "=" not in text:
        return KernelLaunch.uniform(Launch(*launch_fields(text)))
    out = default or KernelLaunch()
    for part in text.split(","):
        kernel, _, value = part.partition("=")
        kernel = kernel.strip()
        if kernel not in KERNELS:
            raise ValueError(f"{part.strip()!r}: unknown kernel {kernel!r} (one of "
                             f"{', '.join(KERNELS)})")
        out = out.replace(kernel, Launch(*launch_fields(value)))
    return out


def text(launch: KernelLaunch) -> str:
    """The text form `parse` reads back: ``forward=...,dkv=...,dq=...``."""
    return ",".join(f"{k}={launch.of(k).label()}" for k in KERNELS)
