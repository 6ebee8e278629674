"""The Mosaic kernel bodies of :mod:`xlm_jax.models.fused_attention_tpu` and their tile helpers.

Three kernels, each run by ``fused_attention_tpu`` on a grid ``(B, H, outer block, inner
block)`` with VMEM scratch accumulators: the forward (online softmax, logsumexp saved), and
flash-attention-2's backward as one kernel per key block (dk, dv) and one per query block (dq,
the gate factor's gradient, partial sums of the bucket table's gradient). Layouts, semantics
and the reasons behind them are in that module's docstring; this one holds what runs inside a
tile.

A tile's visibility comes from one of two mask forms (:func:`visible`): an int32 array mask's
block, or a :class:`~xlm_jax.models.token_mask.TokenMask` rule evaluated from the tile's
per-token features (query features as ``[bq, 1]`` columns, key features as ``[1, bk]`` rows)
and its global query and key indices, so no ``[.., Tq, Tk]`` array exists anywhere.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from xlm_jax.models import attention_dropout
from xlm_jax.models.fused_attention import MASK_VALUE
from xlm_jax.models.position import relative_position_bucket
from xlm_jax.models.token_mask import TokenMask

_F32 = jnp.float32
_NT = (((1,), (1,)), ((), ()))  # dot_general dims of a @ b.T

Interpret = bool | pltpu.InterpretParams | None


@dataclasses.dataclass(frozen=True)
class Static:
    """Compile-time settings shared by the three kernels (hashable: a custom_vjp nondiff arg)."""

    scale: float
    block_q: int
    block_k: int
    num_buckets: int  # 0: no relative bias
    max_distance: int
    mask_b: bool  # the array mask has a batch axis (else one mask for every row)
    mask_h: bool  # the array mask has a head axis
    mask_q: bool  # the array mask has a query axis (else one key row for every query)
    keep_threshold: int  # 0: no dropout, else attention_dropout.threshold(keep_prob)
    keep_prob: float
    interpret: Interpret
    # A TokenMask's rule (its arrays None) and the names ("seg", "pos", "side") of the
    # features whose query columns and key rows the kernels read, in that order; None: the
    # mask is an int32 array. valid_k: the unpadded key length (keys at or past it are hidden).
    token_rule: TokenMask | None = None
    token_names: tuple[str, ...] = ()
    valid_k: int = 0

    @property
    def n_mask(self) -> int:
        """How many mask refs a kernel gets: the array, or a (query, key) pair per feature."""
        return 1 if self.token_rule is None else 2 * len(self.token_names)


# ----------------------------------------------------------------------------- tile helpers


def _bucket_span(bucket: jax.Array) -> tuple[jax.Array, jax.Array]:
    """The smallest and one past the largest bucket in a tile: the only buckets its lookup
    and its table gradient visit (as the GPU kernels' ``_bucket_span``). At T = 512 with the
    default 128 x 128 tiles, 32 buckets and distance 128 (XLM-E's run files) a map's 16 tiles
    visit 14.0 buckets on average instead of 32 (``docs/experiments/bucket_visits.py --block
    128``: the 6 tiles 128 or more off the diagonal hold one saturated bucket, the 6 next to
    it 15, the 4 on it 32). Exact: a bucket outside ``[lo, hi)`` matches no element of the
    tile. Mosaic takes the two reductions as the loop's bounds (compiled for v5e and v5p with
    libtpu's compile-only devices; not timed: no TPU here)."""
    return jnp.min(bucket), jnp.max(bucket) + 1


def _lookup(table_ref, bucket: jax.Array, base: jax.Array,
            span: tuple[jax.Array, jax.Array]) -> jax.Array:
    """``table[base + bucket]`` from the SMEM table: a select per bucket of the tile's
    ``span`` (no vector gather)."""

    def body(n, d):
        return jnp.where(bucket == n, table_ref[base + n], d)

    return jax.lax.fori_loop(span[0], span[1], body, jnp.zeros(bucket.shape, _F32))


def _bucket_sums(acc: jax.Array, bucket: jax.Array, g: jax.Array,
                 span: tuple[jax.Array, jax.Array]) -> jax.Array:
    """``acc[0, n] += Σ g[bucket == n]`` for every bucket n of the tile's ``span`` (acc
    ``[1, NBp]``; the others get nothing from this tile)."""
    lanes = jax.lax.broadcasted_iota(jnp.int32, acc.shape, 1)

    def body(n, acc):
        picked = jnp.where(bucket == n, g, 0.0)
        total = jnp.sum(jnp.sum(picked, axis=0, keepdims=True), axis=1, keepdims=True)
        return acc + jnp.where(lanes == n, total, 0.0)

    return jax.lax.fori_loop(span[0], span[1], body, acc)


def _indices(q_block, k_block, shape):
    """The tile's global query indices ``[bq, 1]`` and key indices ``[1, bk]``."""
    q_index = q_block * shape[0] + jax.lax.broadcasted_iota(jnp.int32, (shape[0], 1), 0)
    k_index = k_block * shape[1] + jax.lax.broadcasted_iota(jnp.int32, (1, shape[1]), 1)
    return q_index, k_index


def visible(st: Static, mask_refs, q_block, k_block, shape) -> jax.Array:
    """The tile's bool visibility: the array mask's block (``[bq|1, bk]``), or the TokenMask
    rule over the tile's features and indices (``[bq, bk]``).

    The features and indices are broadcast to the tile as int32 before the rule's compares
    (our choice: Mosaic then sees int32 compares of equal shapes and no broadcast of a bool
    vector). Keys at or past ``valid_k`` are hidden by index as well as by their padding
    values (our choice: it holds whatever the side table says about side 0).
    """
    if st.token_rule is None:
        return mask_refs[0][...] != 0
    full = lambda x: jnp.broadcast_to(x, shape)
    feats_q = {n: full(mask_refs[2 * a][...]) for a, n in enumerate(st.token_names)}
    feats_k = {n: full(mask_refs[2 * a + 1][...]) for a, n in enumerate(st.token_names)}
    q_index, k_index = (full(x) for x in _indices(q_block, k_block, shape))
    ok = st.token_rule.tile(feats_q, feats_k, q_index, k_index)
    if st.valid_k % st.block_k:
        ok = ok & (k_index < st.valid_k)
    return ok


def _tile(st: Static, q, k, ok, rel, head):
    """Scaled, biased, masked float32 logits of one tile ``[bq, bk]``.

    ``ok`` is the tile's visibility; ``rel`` None or ``(table_ref, pos_q [bq, 1], pos_k
    [1, bk], factor [bq, 1])``. Returns ``(s, d, bucket, span)`` with the raw bias ``d``, the
    buckets and their ``_bucket_span`` (all None without a relative bias).
    """
    s = jax.lax.dot_general(q, k, _NT, preferred_element_type=_F32) * st.scale
    d = bucket = span = None
    if rel is not None:
        table_ref, pos_q, pos_k, factor = rel
        bucket = relative_position_bucket(pos_k - pos_q, st.num_buckets, st.max_distance)
        span = _bucket_span(bucket)
        d = _lookup(table_ref, bucket, head * st.num_buckets, span)
        s = s + d * factor
    return jnp.where(ok, s, MASK_VALUE), d, bucket, span


def _keep(st: Static, drop, q_block, k_block, shape):
    """This tile's dropout keep decisions ``[bq, bk]`` (``attention_dropout``'s hash), from
    the (row, head) key ``[1, 1]`` and the tile's global query and key indices."""
    (key_ref,) = drop
    q_index, k_index = _indices(q_block, k_block, shape)
    return attention_dropout.keep_tile(key_ref[...], q_index, k_index, st.keep_threshold)


def _split(refs, st: Static, n_in: int, n_out: int):
    """(inputs, mask refs, rel refs or None, dropout refs or None, outputs, scratch)."""
    n_rel = 4 if st.num_buckets else 0
    n_drop = 1 if st.keep_threshold else 0
    ins, rest = refs[:n_in], refs[n_in:]
    mask, rest = tuple(rest[: st.n_mask]), rest[st.n_mask :]
    rel = tuple(rest[:n_rel]) if n_rel else None
    drop = tuple(rest[n_rel : n_rel + n_drop]) if n_drop else None
    rest = rest[n_rel + n_drop :]
    return ins, mask, rel, drop, rest[:n_out], rest[n_out:]


def _rel_tile(rel):
    """The tile's (table_ref, pos_q, pos_k, factor) loaded from the rel refs, or None."""
    if rel is None:
        return None
    table_ref, pq_ref, pk_ref, f_ref = rel
    return table_ref, pq_ref[...], pk_ref[...], f_ref[...]


# --------------------------------------------------------------------------------- kernels


def forward_kernel(*refs, st: Static):
    """Grid (b, h, query block i, key block j): online softmax over j."""
    ins, mask, rel, drop, (o_ref, lse_ref), scratch = _split(refs, st, 3, 2)
    (q_ref, k_ref, v_ref), (m_sc, l_sc, acc_sc, seen_sc) = ins, scratch
    h, i, j = pl.program_id(1), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        m_sc[...] = jnp.full(m_sc.shape, -jnp.inf, _F32)
        l_sc[...] = jnp.zeros(l_sc.shape, _F32)
        acc_sc[...] = jnp.zeros(acc_sc.shape, _F32)
        seen_sc[...] = jnp.zeros(seen_sc.shape, _F32)

    q, k = q_ref[...], k_ref[...]
    ok = visible(st, mask, i, j, (q.shape[0], k.shape[0]))
    s, _, _, _ = _tile(st, q, k, ok, _rel_tile(rel), h)
    m_prev = m_sc[...]
    m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
    alpha = jnp.exp(m_prev - m_new)
    p = jnp.exp(s - m_new)
    l_sc[...] = l_sc[...] * alpha + jnp.sum(p, axis=1, keepdims=True)
    if drop is not None:
        p = jnp.where(_keep(st, drop, i, j, s.shape), p * (1.0 / st.keep_prob), 0.0)
    v = v_ref[...]
    pv = jnp.dot(p.astype(v.dtype), v, preferred_element_type=_F32)
    acc_sc[...] = acc_sc[...] * alpha + pv
    m_sc[...] = m_new
    seen = jnp.max(jnp.where(ok, 1.0, 0.0), axis=1, keepdims=True)  # [bq|1, 1]
    seen_sc[...] = jnp.maximum(seen_sc[...], seen)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        # Rows with no visible key: output 0 and lse = +inf (recomputed probabilities are 0).
        seen = seen_sc[...] > 0
        safe_l = jnp.where(seen, l_sc[...], 1.0)
        o_ref[...] = jnp.where(seen, acc_sc[...] / safe_l, 0.0).astype(o_ref.dtype)
        lse_ref[...] = jnp.where(seen, m_sc[...] + jnp.log(safe_l), jnp.inf)


def _probs_and_ds(st: Static, s, lse, do, v, delta, drop, i, j):
    """(probabilities for dv (dropped, scaled), dS) of one tile, from the saved logsumexp."""
    p = jnp.exp(s - lse)
    dp = jax.lax.dot_general(do, v, _NT, preferred_element_type=_F32)
    p_v = p
    if drop is not None:
        keep = _keep(st, drop, i, j, s.shape)
        p_v = jnp.where(keep, p * (1.0 / st.keep_prob), 0.0)
        dp = jnp.where(keep, dp * (1.0 / st.keep_prob), 0.0)
    return p_v, p * (dp - delta)


def dkv_kernel(*refs, st: Static):
    """Grid (b, h, key block j, query block i): dk and dv, accumulated over i."""
    ins, mask, rel, drop, (dk_ref, dv_ref), (dk_sc, dv_sc) = _split(refs, st, 6, 2)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = ins
    h, j, i = pl.program_id(1), pl.program_id(2), pl.program_id(3)

    @pl.when(i == 0)
    def _init():
        dk_sc[...] = jnp.zeros(dk_sc.shape, _F32)
        dv_sc[...] = jnp.zeros(dv_sc.shape, _F32)

    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    ok = visible(st, mask, i, j, (q.shape[0], k.shape[0]))
    s, _, _, _ = _tile(st, q, k, ok, _rel_tile(rel), h)
    p_v, ds = _probs_and_ds(st, s, lse_ref[...], do, v, delta_ref[...], drop, i, j)
    dv_sc[...] += jnp.dot(p_v.T.astype(do.dtype), do, preferred_element_type=_F32)
    dk_sc[...] += jnp.dot(ds.T.astype(q.dtype), q, preferred_element_type=_F32)

    @pl.when(i == pl.num_programs(3) - 1)
    def _finish():
        dk_ref[...] = (dk_sc[...] * st.scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def dq_kernel(*refs, st: Static):
    """Grid (b, h, query block i, key block j): dq, d(factor), partial d(table) over j."""
    n_out = 3 if st.num_buckets else 1
    ins, mask, rel, drop, outs, scratch = _split(refs, st, 6, n_out)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = ins
    h, i, j = pl.program_id(1), pl.program_id(2), pl.program_id(3)

    @pl.when(j == 0)
    def _init():
        for ref in scratch:
            ref[...] = jnp.zeros(ref.shape, _F32)

    q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
    tile_rel = _rel_tile(rel)
    ok = visible(st, mask, i, j, (q.shape[0], k.shape[0]))
    s, d, bucket, span = _tile(st, q, k, ok, tile_rel, h)
    _, ds = _probs_and_ds(st, s, lse_ref[...], do, v, delta_ref[...], drop, i, j)
    scratch[0][...] += jnp.dot(ds.astype(k.dtype), k, preferred_element_type=_F32)
    if tile_rel is not None:
        df_sc, dt_sc = scratch[1:]
        df_sc[...] += jnp.sum(ds * d, axis=1, keepdims=True)
        dt_sc[...] = _bucket_sums(dt_sc[...], bucket, ds * tile_rel[3], span)

    @pl.when(j == pl.num_programs(3) - 1)
    def _finish():
        outs[0][...] = (scratch[0][...] * st.scale).astype(outs[0].dtype)
        for ref, sc in zip(outs[1:], scratch[1:]):
            ref[...] = sc[...]
