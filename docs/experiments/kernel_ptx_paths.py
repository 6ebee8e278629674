"""The gated-bias kernels' loops counted one tile kind at a time (`accelerator.kernel_ptx`).

A gated-bias kernel chooses per tile between the far path (one saturated bucket: one table
entry) and the near path (a bias per score) with a `lax.cond`, and the compiled loop holds
both; where its two sides each branch back to a label of their own, `kernel_ptx` reports
them as two overlapping loops whose counts mix the sides. This script compiles the kernels
with the choice made once for every tile (`jax.lax.cond` replaced, in this process only, by
a call of the named side) so that each loop has one path, then runs `kernel_ptx --bias
gated`. What it counts is the code of that path; the kernels' results are not checked here
(the forced side is wrong for the other tiles).

    PYTHONPATH=.venv/cuda_compile python docs/experiments/kernel_ptx_paths.py near|far \\
        [kernel_ptx flags, e.g. --json OUT]
"""
from __future__ import annotations

import os
import sys


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("near", "far"):
        print("usage: kernel_ptx_paths.py near|far [kernel_ptx flags]", file=sys.stderr)
        return 2
    side = argv[0]
    os.environ["JAX_PLATFORMS"] = "cpu"  # before jax starts, as kernel_ptx sets it
    import jax

    def forced(pred, far, near, *operands):
        del pred
        return (near if side == "near" else far)(*operands)

    jax.lax.cond = forced
    from xlm_jax.accelerator import kernel_ptx
    return kernel_ptx.main(["--bias", "gated", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
