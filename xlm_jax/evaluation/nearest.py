"""Exact k nearest neighbours by cosine, both directions in one pass over blocks of the
similarity matrix: BUCC mining at XTREME's test size (~400k sentences a side) without an
[N, M] matrix.

LASER (`source/mine_bitexts.py`) and XTREME (`third_party/utils_retrieve.py`) search with
FAISS's exact inner-product index on float32 unit vectors; this is the same exact search in
jax, so it runs on whatever jax runs on (the CPU, a GPU, a TPU) and xlm_jax needs no FAISS.
The cosines of a block, `x[a:b] @ y[c:d].T` (float32, `Precision.HIGHEST`: no TF32 or bf16
passes on accelerators), update two running top-k lists: each x row's k best among y and each
y row's k best among x. Equal cosines keep the lower row index first (`lax.top_k` keeps the
lower position first, and earlier blocks hold lower indices), so the lists are those of a
stable sort of the whole matrix's rows and columns.

Cost: N x M x D multiply-adds, once for both directions. Memory on the device: both sides'
vectors ((N + M) x D x 4 bytes), one block of cosines (block^2 x 4 bytes: 64 MB at the
default 4096) and the two lists ((N + M) x k x 8 bytes). Measured figures are in
docs/architecture.md ("BUCC at XTREME's size").
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any

import numpy as np

DEFAULT_BLOCK = 4096  # rows of each side per block: a 64 MB float32 block (our choice)


@dataclasses.dataclass(frozen=True)
class Neighbours:
    """Each query row's nearest rows of the other side, best first: `sims` [n, k] float32
    cosines in decreasing order, `index` [n, k] int32 rows of the other side (on equal cosines
    the lower row first)."""

    sims: np.ndarray
    index: np.ndarray


def unit_rows(x: Any, name: str = "x", chunk: int = 65536) -> np.ndarray:
    """`x` as float32 rows of length 1 (normalised in float64, `chunk` rows at a time: 400k
    rows of 768 float32 never become a 2.5 GB float64 copy); a one-line ValueError for
    anything but a non-empty [N, D] array of finite numbers."""
    x = np.asarray(x)
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name}: need a non-empty [N, D] array of vectors, got shape {x.shape}")
    out = np.empty(x.shape, np.float32)
    for a in range(0, len(x), chunk):
        rows = x[a:a + chunk].astype(np.float64)
        if not np.isfinite(rows).all():
            bad = int((~np.isfinite(x.astype(np.float64, copy=False))).any(axis=1).sum())
            raise ValueError(f"{name}: {bad} row(s) hold NaN or infinity")
        norms = np.maximum(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12)
        out[a:a + chunk] = rows / norms
    return out


@functools.lru_cache(maxsize=None)
def _block_fn():
    """The jitted block update (built on first use: importing this module needs no jax)."""
    import jax
    import jax.numpy as jnp

    def merge(sims, index, new_sims, new_index, k):
        # The running list first: on equal cosines top_k keeps its (lower) indices first.
        s = jnp.concatenate([sims, new_sims], axis=1)
        i = jnp.concatenate([index, new_index], axis=1)
        best, at = jax.lax.top_k(s, k)
        return best, jnp.take_along_axis(i, at, axis=1)

    @functools.partial(jax.jit, static_argnames=("kx", "ky"))
    def update(xb, yb, x_sims, x_index, y_sims, y_index, x_offset, y_offset, *, kx, ky):
        sims = jnp.matmul(xb, yb.T, precision=jax.lax.Precision.HIGHEST)  # [bx, by]
        row_s, row_i = jax.lax.top_k(sims, min(kx, sims.shape[1]))
        col_s, col_i = jax.lax.top_k(sims.T, min(ky, sims.shape[0]))
        x_sims, x_index = merge(x_sims, x_index, row_s, row_i + y_offset, kx)
        y_sims, y_index = merge(y_sims, y_index, col_s, col_i + x_offset, ky)
        return x_sims, x_index, y_sims, y_index

    return update


def mutual_nearest(x: Any, y: Any, k: int, block: int = DEFAULT_BLOCK
                   ) -> tuple[Neighbours, Neighbours]:
    """(each row of `x`'s min(k, M) nearest rows of `y`, each row of `y`'s min(k, N) nearest
    rows of `x`) by cosine, exact, computed `block` rows of each side at a time. `x` [N, D] and
    `y` [M, D] need not be unit rows (they are normalised here)."""
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"k={k!r} must be an integer >= 1")
    if isinstance(block, bool) or not isinstance(block, (int, np.integer)) or block < 1:
        raise ValueError(f"block={block!r} must be an integer >= 1")
    ux, uy = unit_rows(x, "x"), unit_rows(y, "y")
    if ux.shape[1] != uy.shape[1]:
        raise ValueError(f"x has {ux.shape[1]}-dimensional rows, y {uy.shape[1]}-dimensional")
    import jax.numpy as jnp

    update = _block_fn()
    (n, _), (m, _) = ux.shape, uy.shape
    kx, ky = min(int(k), m), min(int(k), n)
    x_starts, y_starts = range(0, n, block), range(0, m, block)
    y_blocks = [jnp.asarray(uy[c:c + block]) for c in y_starts]
    y_state = [(jnp.full((len(yb), ky), -jnp.inf, jnp.float32),
                jnp.zeros((len(yb), ky), jnp.int32)) for yb in y_blocks]
    x_out = []
    for a in x_starts:
        xb = jnp.asarray(ux[a:a + block])
        xs, xi = jnp.full((len(xb), kx), -jnp.inf, jnp.float32), jnp.zeros((len(xb), kx), jnp.int32)
        for j, (c, yb) in enumerate(zip(y_starts, y_blocks)):
            xs, xi, ys, yi = update(xb, yb, xs, xi, *y_state[j], np.int32(a), np.int32(c),
                                    kx=kx, ky=ky)
            y_state[j] = (ys, yi)
        x_out.append((np.asarray(xs), np.asarray(xi)))
    x_nn = Neighbours(np.concatenate([s for s, _ in x_out]), np.concatenate([i for _, i in x_out]))
    y_nn = Neighbours(np.concatenate([np.asarray(s) for s, _ in y_state]),
                      np.concatenate([np.asarray(i) for _, i in y_state]))
    return x_nn, y_nn
