"""How much per-element bucket work the gated-bias Pallas kernels do per tile, before and after
they visit only a tile's own buckets (xlm_jax.models.fused_attention_kernels).

Counts, for one [T, T] attention map cut into square tiles, how many tiles are "far" (every
key at least max_distance after or before every query: one saturated bucket, no per-element
bucket computed), and how many bucket visits (a select over the tile for the lookup, a select
and a sum for the table gradient) each tile makes: every bucket of the (padded) table before,
the tile's [min, max] bucket span after. Positions are 0..T-1 (no packing), as in the run
files' rows. This counts work; it does not time it (only a GPU can).

    python docs/experiments/bucket_visits.py [--seq_len 512] [--block 64] [--buckets 32] \
        [--max_distance 128]
"""
from __future__ import annotations

import argparse

import numpy as np

from xlm_jax.models.position import relative_position_bucket


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq_len", type=int, default=512)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--buckets", type=int, default=32)
    parser.add_argument("--max_distance", type=int, default=128)
    args = parser.parse_args()
    t, blk = args.seq_len, args.block
    pos = np.arange(t)
    bucket = np.asarray(relative_position_bucket(pos[None, :] - pos[:, None], args.buckets,
                                                 args.max_distance))
    n = t // blk
    visits, far = [], 0
    for i in range(n):
        for j in range(n):
            q, k = pos[i * blk:(i + 1) * blk], pos[j * blk:(j + 1) * blk]
            tile = bucket[i * blk:(i + 1) * blk, j * blk:(j + 1) * blk]
            far += bool(k.min() - q.max() >= args.max_distance
                        or k.max() - q.min() <= -args.max_distance)
            visits.append(int(tile.max() - tile.min() + 1))
    padded = 1 << (args.buckets - 1).bit_length()
    print(f"T={t}, {blk}x{blk} tiles ({n * n}), {args.buckets} buckets (table padded to "
          f"{padded}), max distance {args.max_distance}")
    print(f"far tiles (one bucket, none computed per element): {far} of {n * n}")
    print(f"bucket visits per tile: before {padded}, after {np.mean(visits):.2f} on average "
          f"({padded / np.mean(visits):.2f}x fewer); histogram {np.bincount(visits).tolist()}")


if __name__ == "__main__":
    main()
