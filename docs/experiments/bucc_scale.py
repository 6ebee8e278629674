"""BUCC mining's time and memory at a given size (docs/architecture.md, "BUCC at XTREME's size").

    python docs/experiments/bucc_scale.py N D [--whole]

N random D-dimensional vectors (offset by 0.3, as sentence embeddings have positive mean
cosines) and a noisy copy of them as the other side; `bucc.mine` (k = 4, `max`) mines them and
the script prints the seconds, the candidates and how many are the planted pairs (row i with
row i). `--whole` mines on the whole [N, M] float64 matrix instead, as `bucc.py` did before
the blocked search (N^2 x 8 bytes twice: 10,000 a side is ~3.5 GB). Run it under
`/usr/bin/time -v` for the peak memory.
"""
import sys
import time

import numpy as np

from xlm_jax.evaluation import bucc


def whole_matrix(x: np.ndarray, y: np.ndarray, k: int = 4) -> list:
    """The `max` strategy on the whole matrix: every margin, each row's k nearest by a stable
    sort, the best margin among them, then pairs greedily by score."""
    sim, margin = bucc._unit_rows(x) @ bucc._unit_rows(y).T, bucc.margin_scores(x, y, k)

    def best(sim, margin):
        near = np.argsort(-sim, axis=1, kind="stable")[:, :k]
        scores = np.take_along_axis(margin, near, axis=1)
        pick = np.argmax(scores, axis=1)
        rows = np.arange(len(near))
        return near[rows, pick], scores[rows, pick]

    (fb, fs), (bb, bs) = best(sim, margin), best(sim.T, margin.T)
    cands = [(i, int(j), float(s)) for i, (j, s) in enumerate(zip(fb, fs))]
    cands += [(int(i), j, float(s)) for j, (i, s) in enumerate(zip(bb, bs))]
    pairs, sx, sy = [], set(), set()
    for i, j, s in sorted(cands, key=lambda p: -p[2]):
        if i not in sx and j not in sy:
            sx.add(i), sy.add(j), pairs.append((i, j, s))
    return pairs


def main(argv: list[str]) -> None:
    n, d = int(argv[0]), int(argv[1])
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, d)).astype(np.float32) + 0.3
    y = (x + 0.5 * rng.normal(size=(n, d))).astype(np.float32)
    start = time.perf_counter()
    pairs = whole_matrix(x, y) if "--whole" in argv else bucc.mine(x, y)
    seconds = time.perf_counter() - start
    planted = sum(1 for i, j, _ in pairs if i == j)
    print(f"{'whole matrix' if '--whole' in argv else 'blocked'} n={n} d={d}: {seconds:.1f} s, "
          f"{len(pairs)} candidates, {planted} planted pairs among them")


if __name__ == "__main__":
    main(sys.argv[1:])
