"""The Pallas (Triton) kernels of :mod:`xlm_jax.models.fused_attention` and their settings.

Split from the wrapper so each file tells one story: this one the per-tile arithmetic (the
flash-attention forward with online softmax, the FA-2 backward's dk/dv and dq kernels, the
relative bias and its table/factor gradients per tile, attention dropout and TokenMask
visibility per tile); ``fused_attention`` the shapes, padding, BlockSpecs, ``pallas_call``s
and the custom VJP. See ``fused_attention``'s docstring for the semantics.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

try:
    from jax.experimental.pallas import triton as pl_triton
except ImportError:  # a jax that has dropped it (see TRITON_MISSING)
    pl_triton = None

from xlm_jax.models import attention_dropout
from xlm_jax.models.kernel_launch import (  # noqa: F401 - re-exported
    KERNELS, NUM_STAGES, NUM_WARPS, KernelLaunch, Launch)
from xlm_jax.models.position import relative_position_bucket
from xlm_jax.models.token_mask import TokenMask

# Finite stand-in for -inf on masked logits, shared with attention's XLA path: exp(-1e30 - max)
# underflows to exactly 0 in float32, yet (unlike -inf) a row made only of it never produces
# inf - inf = NaN.
MASK_VALUE: float = -1e30
_F32 = jnp.float32
# The kernels' softmax runs in base 2: a tile's logits are scaled by log2(e) with the 1/sqrt(Dh)
# scale (and the relative bias by it with its factor), so each probability is one `exp2` of
# a difference. Pallas lowers `exp` on a GPU to libdevice's `__nv_expf` (a range reduction
# around `ex2.approx`: ~9 instructions an element in the compiled loop) and `exp2` to the
# `ex2.approx` alone; FlashAttention's Triton kernels do the same. The log-sum-exp the
# forward kernel returns (the backward kernels' input) stays in natural units.
_LOG2E = 1.4426950408889634
_LN2 = 0.6931471805599453

# jax 0.11 deprecates Pallas' Triton backend ("will be removed in a future JAX version"), which
# these kernels lower through on GPU. A jax without it must still import the models and run
# them: the kernels then run interpreted only (CPU tests), and on a GPU the attention backend
# check gives this reason, so `auto` takes cuDNN or XLA and an explicit `pallas` is refused
# in one line (`attention_backends.select`). None: the backend is there.
TRITON_MISSING: str | None = None if pl_triton is not None else (
    f"jax {jax.__version__} has no Pallas Triton backend (jax.experimental.pallas.triton), "
    "which the GPU kernels lower through")


@dataclasses.dataclass(frozen=True)
class _Static:
    """Compile-time settings shared by the three kernels (hashable: a custom_vjp nondiff arg)."""

    scale: float
    num_buckets: int  # 0: no relative bias
    max_distance: int
    mask_b: bool  # the mask has a batch axis (else one mask for every row)
    mask_h: bool  # the mask has a head axis
    mask_q: bool  # the mask has a query axis (else one key row for every query)
    interpret: bool
    keep_threshold: int = 0  # attention dropout: keep where hash bits < this (0: no dropout)
    keep_prob: float = 1.0
    # a TokenMask's rule (its arrays None) and the names of its features ("seg", "pos",
    # "side"), whose [B, Tq] / [B, Tk] rows the kernels read; None: an array mask only
    token_rule: TokenMask | None = None
    token_names: tuple[str, ...] = ()
    launch: KernelLaunch = KernelLaunch()
    kernel: str = "forward"  # the running kernel, whose `launch` entry the properties read
    # the kernels read the array mask's tile; False where a TokenMask alone decides and no key
    # is padding (the mask is then all ones: reading it and testing it cost ~2 instructions
    # a score in the compiled loops, `accelerator.kernel_ptx`)
    array_mask: bool = True

    def for_kernel(self, kernel: str) -> _Static:
        """These settings for ``kernel`` (its tile, warps and stages from ``launch``)."""
        self.launch.of(kernel)
        return dataclasses.replace(self, kernel=kernel)

    @property
    def block_q(self) -> int:
        return self.launch.of(self.kernel).block_q

    @property
    def block_k(self) -> int:
        return self.launch.of(self.kernel).block_k

    @property
    def dropout(self) -> bool:
        return self.keep_threshold > 0

    def compiler_params(self) -> Any:
        """Triton's (`pl_triton.CompilerParams`), named explicitly: jax sends a pallas_call
        without compiler params to Mosaic GPU by default (`jax_pallas_use_mosaic_gpu`), which
        this kernel is not written for; None when interpreted."""
        if self.interpret:
            return None
        if TRITON_MISSING:  # `pallas_unavailable_reason` refuses this before any lowering
            raise RuntimeError(TRITON_MISSING)
        run = self.launch.of(self.kernel)
        return pl_triton.CompilerParams(num_warps=run.num_warps, num_stages=run.num_stages)


# ----------------------------------------------------------------------------- tile helpers



def _bucket_span(bucket: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The smallest and one past the largest bucket in a tile: the only buckets its table
    gradient needs to visit (the dq kernel's `_bucket_sums`).

    A tile's relative distances span at most ``bq + bk - 1`` values, and the T5 buckets
    saturate at ``max_distance``: a tile away from the diagonal holds one or two buckets, a
    diagonal tile most of them. Visiting only ``[lo, hi)`` instead of every bucket cuts the
    per-element selects to the buckets a tile holds: at T = 512 with 64-wide tiles, 32
    buckets and distance 128 (XLM-E's run files), 7.9 visits a tile on average instead of 32
    (``docs/experiments/bucket_visits.py``). Exact: a bucket outside ``[lo, hi)`` matches no
    element of the tile.
    """
    return jnp.min(bucket), jnp.max(bucket) + 1


def _bucket_sums(acc: jax.Array, bucket: jax.Array, g: jax.Array,
                 span: tuple[jax.Array, jax.Array]) -> jax.Array:
    """``acc[n] += Σ g[bucket == n]`` for every bucket n of the tile's ``span`` (the others
    get nothing from this tile): the table gradient of one tile."""
    ids = jax.lax.broadcasted_iota(jnp.int32, acc.shape, 0)

    def body(n, acc):
        total = jnp.sum(jnp.where(bucket == n, g, 0.0))
        return acc + jnp.where(ids == n, total, 0.0)

    return jax.lax.fori_loop(span[0], span[1], body, acc)


def _relative_tile(st: _Static, vecs, pos_q: jax.Array, pos_k: jax.Array, buckets: bool):
    """``(d, bucket, span)`` of one tile: the raw bias, the buckets and their span (None
    unless ``buckets``: only the dq kernel, for the table's gradient, needs them).

    ``vecs`` is ``(table_ref, dvec_ref)``: this head's table column and its bias for every
    distance clipped to ``[-max_distance, max_distance]`` (offset by ``max_distance``;
    `fused_attention._relative_args`). A tile whose every key lies at
    least ``max_distance`` after (or before) every query holds one bucket, the last of its
    half (the T5 buckets saturate there; at T = 512 with 64-wide tiles and distance 128, 30 of
    the 64 tiles): it reads that one table entry. The others gather each score's bias from
    the distance vector, one load a score from a few hundred entries, in place of a select per
    bucket of the tile; the dq kernel also computes the buckets, for the table's gradient
    (`accelerator.kernel_ptx`, docs/performance.md).
    """
    table_ref, dvec_ref = vecs
    shape = (pos_q.shape[0], pos_k.shape[0])
    after = jnp.min(pos_k) - jnp.max(pos_q) >= st.max_distance
    before = jnp.max(pos_k) - jnp.min(pos_q) <= -st.max_distance

    half = st.num_buckets // 2
    # the saturated bucket: the last of the upper half (keys after) or of the lower one
    n_far = half - 1 + half * after.astype(jnp.int32)

    def far(n):
        d = jnp.full(shape, table_ref[n], _F32)
        return (d, jnp.full(shape, n, jnp.int32), (n, n + 1)) if buckets else d

    def near(_):
        distance = pos_k[None, :] - pos_q[:, None]
        limit = st.max_distance
        d = dvec_ref[jnp.clip(distance, -limit, limit) + limit]
        if not buckets:
            return d
        bucket = relative_position_bucket(distance, st.num_buckets, st.max_distance)
        return d, bucket, _bucket_span(bucket)

    out = jax.lax.cond(after | before, far, near, n_far)
    return out if buckets else (out, None, None)


def _tile(st: _Static, q, k, mask_tile, rel):
    """Scaled, biased, masked float32 logits of one tile ``[bq, bk]``, in base 2 (times
    log2(e): ``exp2`` of them is the natural softmax's ``exp``).

    ``rel`` is None or ``(vecs, pos_q [bq], pos_k [bk], factor [bq])`` (``vecs``: see
    `_relative_tile`). Returns
    ``(s, d, bucket, span)`` with the raw bias ``d`` (natural units), the buckets and their
    ``_bucket_span`` (all None without a relative bias).
    """
    s = jnp.dot(q, k.T, preferred_element_type=_F32) * (st.scale * _LOG2E)
    d = bucket = span = None
    if rel is not None:
        vecs, pos_q, pos_k, factor = rel
        d, bucket, span = _relative_tile(st, vecs, pos_q, pos_k, st.kernel == "dq")
        s = s + d * (factor * _LOG2E)[:, None]
    s = jnp.where(mask_tile != 0, s, MASK_VALUE)
    return s, d, bucket, span


def _keep(st: _Static, key_rows, q_start, k_start, bq: int, bk: int) -> jax.Array:
    """The tile's attention-dropout keep bits ``[bq, bk]`` (``attention_dropout``'s hash of
    the row/head key and the tile's global query and key indices)."""
    qi = q_start + jax.lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
    kj = k_start + jax.lax.broadcasted_iota(jnp.int32, (1, bk), 1)
    return attention_dropout.keep_tile(key_rows[:, None], qi, kj, st.keep_threshold)


def _split(refs, st: _Static, n_in: int):
    """(leading inputs, relative-bias refs or None, dropout-key ref or None, outputs) from a
    kernel's flat ref list."""
    n_rel = 5 if st.num_buckets else 0
    rel = tuple(refs[n_in : n_in + n_rel]) if n_rel else None
    at = n_in + n_rel
    drop = refs[at] if st.dropout else None
    at += int(st.dropout)
    n_tok = 2 * len(st.token_names)
    tok = refs[at : at + n_tok] if n_tok else None
    return refs[:n_in], rel, (drop, tok), refs[at + n_tok :]


def _visible(st: _Static, mask_tile, tok, q_rows, k_rows, q_start, k_start, bq: int, bk: int):
    """A tile's visibility: the array mask's tile (``mask_tile()`` reads it; not read where
    ``st.array_mask`` is False) AND the TokenMask's rule over the tile's token features
    (`q_rows`/`k_rows` index the query/key feature refs)."""
    visible = mask_tile() != 0 if st.array_mask else None
    if tok is None:
        return visible
    feats_q = {n: tok[2 * i][q_rows][:, None] for i, n in enumerate(st.token_names)}
    feats_k = {n: tok[2 * i + 1][k_rows][None, :] for i, n in enumerate(st.token_names)}
    qi = q_start + jax.lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
    kj = k_start + jax.lax.broadcasted_iota(jnp.int32, (1, bk), 1)
    rule = st.token_rule.tile(feats_q, feats_k, qi, kj)
    return rule if visible is None else visible & rule


# --------------------------------------------------------------------------------- kernels


def _forward_kernel(*refs, st: _Static):
    """Grid (b, h, query block): online softmax over the key blocks."""
    (q_ref, k_ref, v_ref, mask_ref), rel, (drop_ref, tok), (o_ref, lse_ref) = _split(
        refs, st, 4)
    q = q_ref[...]
    bq, bk = q.shape[0], st.block_k
    q_start = pl.program_id(2) * bq
    key_rows = drop_ref[...] if st.dropout else None
    if rel is not None:
        table_ref, pq_ref, pk_ref, f_ref, dvec_ref = rel
        vecs = (table_ref, dvec_ref)
        pos_q, factor = pq_ref[...], f_ref[...]

    def body(j, carry):
        m, l, acc = carry
        ks = pl.ds(j * bk, bk)
        mask_tile = _visible(st, lambda: mask_ref[:, ks], tok, slice(None), ks, q_start, j * bk,
                             bq, bk)
        tile_rel = None if rel is None else (vecs, pos_q, pk_ref[ks], factor)
        s, _, _, _ = _tile(st, q, k_ref[ks, :], mask_tile, tile_rel)
        m_new = jnp.maximum(m, jnp.max(s, axis=1))
        alpha = jnp.exp2(m - m_new)
        p = jnp.exp2(s - m_new[:, None])
        v = v_ref[ks, :]
        l = l * alpha + jnp.sum(p, axis=1)  # the softmax denominator counts dropped entries
        if st.dropout:  # the kept entries' 1 / keep_prob is applied to the row at the end
            keep = _keep(st, key_rows, q_start, j * bk, bq, bk)
            p = jnp.where(keep, p, 0.0)
        acc = acc * alpha[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=_F32)
        return m_new, l, acc

    init = (
        jnp.full((bq,), -jnp.inf, _F32),
        jnp.zeros((bq,), _F32),
        jnp.zeros((bq, v_ref.shape[-1]), _F32),
    )
    m, l, acc = jax.lax.fori_loop(0, k_ref.shape[0] // bk, body, init)
    # A row saw a visible key iff its running max rose above the masked logits' MASK_VALUE
    # (a visible logit is a finite score, far above -1e30; a row of masked logits only keeps
    # m = MASK_VALUE): no per-tile reduction of the mask is needed to tell.
    seen = m > 0.5 * MASK_VALUE
    # Rows with no visible key: output 0 and lse = +inf (so recomputed probabilities are 0).
    safe_l = jnp.where(seen, l, 1.0)
    o_ref[...] = jnp.where(seen[:, None], acc / (safe_l * st.keep_prob)[:, None],
                           0.0).astype(o_ref.dtype)
    lse_ref[...] = jnp.where(seen, (m + jnp.log2(safe_l)) * _LN2, jnp.inf)


def _dkv_kernel(*refs, st: _Static):
    """Grid (b, h, key block): dk and dv, looping over the query blocks."""
    ins, rel, (drop_ref, tok), (dk_ref, dv_ref) = _split(refs, st, 7)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, mask_ref = ins
    k, v = k_ref[...], v_ref[...]
    bq = st.block_q
    k_start = pl.program_id(2) * k.shape[0]
    if rel is not None:
        table_ref, pq_ref, pk_ref, f_ref, dvec_ref = rel
        vecs = (table_ref, dvec_ref)
        pos_k = pk_ref[...]

    def body(i, carry):
        dk, dv = carry
        qs = pl.ds(i * bq, bq)
        q, do = q_ref[qs, :], do_ref[qs, :]
        mask_tile = _visible(st, lambda: mask_ref[qs, :] if st.mask_q else mask_ref[...], tok,
                             qs, slice(None), i * bq, k_start, bq, k.shape[0])
        tile_rel = None if rel is None else (vecs, pq_ref[qs], pos_k, f_ref[qs])
        s, _, _, _ = _tile(st, q, k, mask_tile, tile_rel)
        p = jnp.exp2(s - (lse_ref[qs] * _LOG2E)[:, None])
        dp = jnp.dot(do, v.T, preferred_element_type=_F32)
        p_kept = p
        if st.dropout:  # O = (P∘Z)V: dV = (P∘Z)ᵀdO, dP = Z∘(dO·Vᵀ), Z = keep / keep_prob
            keep = _keep(st, drop_ref[qs], i * bq, k_start, bq, k.shape[0])
            p_kept = jnp.where(keep, p, 0.0)  # its 1 / keep_prob is applied to dv at the end
            dp = jnp.where(keep, dp * (1.0 / st.keep_prob), 0.0)
        dv = dv + jnp.dot(p_kept.astype(do.dtype).T, do, preferred_element_type=_F32)
        ds = p * (dp - delta_ref[qs][:, None])
        dk = dk + jnp.dot(ds.astype(q.dtype).T, q, preferred_element_type=_F32)
        return dk, dv

    init = (jnp.zeros(k.shape, _F32), jnp.zeros(v.shape, _F32))
    dk, dv = jax.lax.fori_loop(0, q_ref.shape[0] // bq, body, init)
    dk_ref[...] = (dk * st.scale).astype(dk_ref.dtype)
    dv_ref[...] = (dv * (1.0 / st.keep_prob)).astype(dv_ref.dtype)


def _dq_kernel(*refs, st: _Static):
    """Grid (b, h, query block): dq, d(factor) and this block's partial d(table)."""
    ins, rel, (drop_ref, tok), outs = _split(refs, st, 7)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, mask_ref = ins
    q, do = q_ref[...], do_ref[...]
    lse, delta = lse_ref[...], delta_ref[...]
    lse2 = lse * _LOG2E
    bk = st.block_k
    q_start = pl.program_id(2) * q.shape[0]
    key_rows = drop_ref[...] if st.dropout else None
    if rel is not None:
        table_ref, pq_ref, pk_ref, f_ref, dvec_ref = rel
        vecs = (table_ref, dvec_ref)
        pos_q, factor = pq_ref[...], f_ref[...]
        dq_ref, df_ref, dt_ref = outs
    else:
        (dq_ref,) = outs

    def body(j, carry):
        dq, df, dt = carry
        ks = pl.ds(j * bk, bk)
        k, v = k_ref[ks, :], v_ref[ks, :]
        tile_rel = None if rel is None else (vecs, pos_q, pk_ref[ks], factor)
        mask_tile = _visible(st, lambda: mask_ref[:, ks], tok, slice(None), ks, q_start,
                             j * bk, q.shape[0], bk)
        s, d, bucket, span = _tile(st, q, k, mask_tile, tile_rel)
        p = jnp.exp2(s - lse2[:, None])
        dp = jnp.dot(do, v.T, preferred_element_type=_F32)
        if st.dropout:
            keep = _keep(st, key_rows, q_start, j * bk, q.shape[0], bk)
            dp = jnp.where(keep, dp * (1.0 / st.keep_prob), 0.0)
        ds = p * (dp - delta[:, None])
        dq = dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=_F32)
        if rel is not None:
            df = df + jnp.sum(ds * d, axis=1)
            dt = _bucket_sums(dt, bucket, ds * factor[:, None], span)
        return dq, df, dt

    n_table = table_ref.shape[0] if rel is not None else 1
    init = (jnp.zeros(q.shape, _F32), jnp.zeros(lse.shape, _F32), jnp.zeros((n_table,), _F32))
    dq, df, dt = jax.lax.fori_loop(0, k_ref.shape[0] // bk, body, init)
    dq_ref[...] = (dq * st.scale).astype(dq_ref.dtype)
    if rel is not None:
        df_ref[...] = df
        dt_ref[...] = dt
