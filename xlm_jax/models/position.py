"""XLM-E gated relative position bias (paper §3.3), built on T5 bidirectional log buckets.

Pieces:
  * :func:`relative_position_bucket` — T5 / mesh-tensorflow bucketing of ``key_pos - query_pos``.
  * :class:`RelativePositionTable` — learned ``[num_buckets, num_heads]`` table giving the raw
    relative bias ``d`` as ``[B, H, Tq, Tk]`` from per-token positions (so packed rows with
    positions restarting per example work).
  * :func:`gated_relative_bias` / :class:`GatedRelativeBias` — the per-layer gate
    ``r = d + g_u·d + (1 − g_u)·w·g_r·d`` with ``g_u = σ(q_i·u_h)``, ``g_r = σ(q_i·v_h)``;
    :func:`gate_factor` is its per-query row factor ``1 + g_u + (1 − g_u)·w·g_r``.
  * :class:`RelativeBias` — the same bias *described* (table, positions, factor) instead of
    materialised, for the fused attention kernel (``xlm_jax.models.fused_attention``), which
    computes it block by block and never builds ``[B, H, Tq, Tk]``.

A stack either owns one table shared by all layers (as WavLM does) or one per layer; the gate
parameters are always per layer. The result is an additive bias for
:func:`xlm_jax.models.attention.dot_product_attention` (float32, added to float32 logits).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Dtype = Any


@functools.lru_cache(maxsize=None)
def log_bucket_starts(num_buckets: int, max_distance: int) -> tuple[int, ...]:
    """The distance at which each logarithmic bucket after the first begins, within a half.

    mesh-tensorflow's bucket of a distance ``n >= max_exact`` is ``max_exact +
    int(log(n / max_exact) / log(max_distance / max_exact) * (half - max_exact))``, at most
    ``half - 1``: non-decreasing in ``n``, so it equals ``max_exact`` plus the number of these
    starts at or below ``n``. Computed here once, in float64 as the reference computes it.
    """
    half = num_buckets // 2
    max_exact = half // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(f"log_bucket_starts: num_buckets={num_buckets} and max_distance="
                         f"{max_distance} leave no logarithmic buckets (need num_buckets >= 4 "
                         f"and max_distance > num_buckets // 4)")
    starts, n = [], max_exact
    for bucket in range(max_exact + 1, half):
        # the reference's expression, operation for operation (its rounding decides the
        # distances where the quotient is an exact integer)
        while max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact)
                              * (half - max_exact)) < bucket:
            n += 1
        starts.append(n)
    return tuple(starts)


def relative_position_bucket(
    relative_position: jax.Array, num_buckets: int = 32, max_distance: int = 128
) -> jax.Array:
    """T5 bidirectional bucket of each relative position (``key_pos - query_pos``).

    Half the buckets hold keys at or before the query, half keys after it. Within a half,
    distances below ``num_buckets // 4`` get one bucket each; larger distances are spaced
    logarithmically up to ``max_distance``, beyond which everything shares the last bucket.
    Matches mesh-tensorflow ``_relative_position_bucket(bidirectional=True)`` and HF T5.

    In integer arithmetic only: a logarithmic bucket is found by comparing the distance with
    the distances where the buckets begin (`log_bucket_starts`, mesh-tensorflow's float64
    formula evaluated once), not by a float ``log`` per entry. So every backend (XLA on any
    device, the Triton and Mosaic kernels) gets the same buckets, also at the distances where
    the formula is an exact integer (16, 32, 64 at 32 buckets and distance 128) and a float32
    ``log`` may round either way; and the kernels spend ~7 compares an entry instead of a
    ``log`` and a divide (``accelerator.kernel_ptx``).

    Args:
      relative_position: int array of ``key_pos - query_pos``, any shape.
      num_buckets: total buckets (even, >= 4).
      max_distance: distance from which all positions share the last bucket of their half.

    Returns:
      int32 array of the same shape with values in ``[0, num_buckets)``.
    """
    if num_buckets < 4 or num_buckets % 2:
        raise ValueError(
            f"relative_position_bucket: num_buckets must be even and >= 4, got {num_buckets}"
        )
    half = num_buckets // 2
    max_exact = half // 2
    if max_distance <= max_exact:
        raise ValueError(
            f"relative_position_bucket: max_distance={max_distance} must exceed "
            f"num_buckets // 4 = {max_exact}"
        )
    relative_position = jnp.asarray(relative_position).astype(jnp.int32)
    # Keys after the query (positive relative position) use the upper half.
    ret = (relative_position > 0).astype(jnp.int32) * half
    n = jnp.abs(relative_position)
    large = jnp.full(n.shape, max_exact, jnp.int32)
    for start in log_bucket_starts(num_buckets, max_distance):
        large = large + (n >= start).astype(jnp.int32)
    return ret + jnp.where(n < max_exact, n, large)


def relative_bias_values(
    table: jax.Array,
    positions_q: jax.Array,
    positions_k: jax.Array,
    num_buckets: int,
    max_distance: int,
) -> jax.Array:
    """Raw relative bias ``d[b, h, i, j] = table[bucket(pos_k[b, j] - pos_q[b, i]), h]``.

    Args:
      table: ``[num_buckets, H]`` per-bucket, per-head bias.
      positions_q: ``[B, Tq]`` int positions of the queries.
      positions_k: ``[B, Tk]`` int positions of the keys.
      num_buckets, max_distance: as for :func:`relative_position_bucket`.

    Returns:
      ``[B, H, Tq, Tk]`` in the table's dtype.
    """
    rel = positions_k[:, None, :] - positions_q[:, :, None]  # [B, Tq, Tk]
    buckets = relative_position_bucket(rel, num_buckets, max_distance)
    return bucket_lookup(jnp.asarray(table), buckets)


@jax.custom_vjp
def bucket_lookup(table: jax.Array, buckets: jax.Array) -> jax.Array:
    """``table[buckets]`` as ``[B, H, Tq, Tk]`` (table ``[NB, H]``, buckets ``[B, Tq, Tk]``),
    whose table gradient is a per-bucket sum, not a scatter-add.

    Autodiff of a gather transposes into a scatter-add: about B·Tq·Tk indices into NB rows,
    which a GPU runs as heavily contended atomics. Here the backward is
    ``Σ_{b,i,j} [buckets == n] · g[b, h, i, j]`` for every bucket n, one reduction whose
    compare-and-select XLA fuses into its input (no one-hot array is materialised).
    """
    return jnp.transpose(jnp.take(table, buckets, axis=0), (0, 3, 1, 2))


def _bucket_lookup_fwd(table, buckets):
    return bucket_lookup(table, buckets), (buckets, table)  # the table only for NB and dtype


def _bucket_lookup_bwd(res, g):
    buckets, table = res
    ids = jnp.arange(table.shape[0], dtype=buckets.dtype)
    hit = buckets[:, None, :, :, None] == ids  # [B, 1, Tq, Tk, NB], fused into the sum
    acc = jnp.promote_types(g.dtype, jnp.float32)
    dtable = jnp.sum(jnp.where(hit, g[..., None].astype(acc), 0), axis=(0, 2, 3))  # [H, NB]
    return dtable.T.astype(table.dtype), None


bucket_lookup.defvjp(_bucket_lookup_fwd, _bucket_lookup_bwd)


@dataclasses.dataclass(frozen=True)
class RelativeBias:
    """A relative position bias described, not materialised: ``r = table[bucket] · factor``.

    ``r[b, h, i, j] = table[bucket(positions_k[b, j] - positions_q[b, i]), h] · factor[b, h, i]``
    — the XLM-E gated bias when ``factor`` is :func:`gate_factor`, the raw table bias ``d`` when
    it is None. Fused attention computes it inside the kernel; every other consumer calls
    :meth:`materialise`. A pytree (``num_buckets`` and ``max_distance`` are static), so it can
    cross ``jit``/``remat`` boundaries.

    Attributes:
      table: ``[num_buckets, H]`` bucket table (the ``rel_embedding`` parameter's values).
      positions_q: ``[B, Tq]`` int query positions.
      positions_k: ``[B, Tk]`` int key positions.
      factor: ``[B, H, Tq]`` float per-query row factor, or None for 1.
      num_buckets: T5 buckets (half per direction).
      max_distance: distance from which positions share the last bucket.
    """

    table: jax.Array
    positions_q: jax.Array
    positions_k: jax.Array
    factor: jax.Array | None = None
    num_buckets: int = 32
    max_distance: int = 128

    def check(self, batch: int, num_heads: int, tq: int, tk: int) -> None:
        """Raises ValueError when the fields do not fit attention of ``[B, H, Tq, Tk]``."""
        expected = (
            ("table", self.table, (self.num_buckets, num_heads)),
            ("positions_q", self.positions_q, (batch, tq)),
            ("positions_k", self.positions_k, (batch, tk)),
            ("factor", self.factor, (batch, num_heads, tq)),
        )
        for name, x, shape in expected:
            if x is not None and tuple(jnp.shape(x)) != shape:
                raise ValueError(
                    f"RelativeBias: {name} must have shape {shape} for attention "
                    f"[B, H, Tq, Tk]={(batch, num_heads, tq, tk)}, got {tuple(jnp.shape(x))}"
                )

    def materialise(self) -> jax.Array:
        """The bias as a float32 (float64 if an input is) ``[B, H, Tq, Tk]`` array.

        The same arithmetic as :class:`RelativePositionTable` followed by
        :func:`gated_relative_bias`, so both routes give identical numbers.
        """
        d = relative_bias_values(
            self.table, self.positions_q, self.positions_k, self.num_buckets, self.max_distance
        )
        if self.factor is None:
            return d.astype(jnp.result_type(d.dtype, jnp.float32))
        acc = jnp.result_type(d.dtype, jnp.asarray(self.factor).dtype, jnp.float32)
        return d.astype(acc) * jnp.asarray(self.factor).astype(acc)[..., None]


jax.tree_util.register_dataclass(
    RelativeBias,
    data_fields=["table", "positions_q", "positions_k", "factor"],
    meta_fields=["num_buckets", "max_distance"],
)


def bucket_distances(num_buckets: int = 32, max_distance: int = 128) -> list[int]:
    """The smallest ``|key_pos - query_pos|`` that :func:`relative_position_bucket` maps to
    each bucket (0 for the query itself; a bucket no distance below ``max_distance`` reaches
    gets ``max_distance``)."""
    rel = np.arange(-max_distance, max_distance + 1)
    with jax.ensure_compile_time_eval():  # concrete values inside `init` under jit too
        buckets = np.asarray(relative_position_bucket(rel, num_buckets, max_distance))
    out = [max_distance] * num_buckets
    for r, b in zip(rel.tolist(), buckets.tolist()):
        out[b] = min(out[b], abs(r))
    return out


def locality_init(max_distance: int) -> Any:
    """Initialiser of a ``[num_buckets, H]`` bucket table: ``-2^-h x distance(b)``, a linear
    penalty on distance with one slope per head, halving from 1 (ALiBi's form, Press et al.
    2022; these slopes are our choice). The bias starts as a preference for near tokens,
    strongest in head 0, nearly flat in the last head; training moves it like any table."""

    def init(key: jax.Array, shape: tuple[int, int], dtype: Dtype = jnp.float32) -> jax.Array:
        del key  # deterministic
        num_buckets, num_heads = shape
        dist = jnp.asarray(bucket_distances(num_buckets, max_distance), jnp.float32)
        slopes = 2.0 ** -jnp.arange(num_heads, dtype=jnp.float32)
        return (-dist[:, None] * slopes[None, :]).astype(dtype)

    return init


class RelativePositionTable(nn.Module):
    """Learned per-head bias of each relative-position bucket: ``d[b, h, i, j]``.

    Attributes:
      num_heads: attention heads H.
      num_buckets: T5 buckets (half per direction).
      max_distance: distance from which positions share the last bucket.
      param_dtype: dtype of ``rel_embedding``.
      table_init: ``"normal"`` (N(0, 0.02)) or ``"locality"`` (:func:`locality_init`).
    """

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    param_dtype: Dtype = jnp.float32
    table_init: str = "normal"

    @nn.compact
    def __call__(
        self, positions_q: jax.Array, positions_k: jax.Array, describe: bool = False
    ) -> jax.Array | RelativeBias:
        """Raw relative bias ``[B, H, Tq, Tk]`` from positions ``[B, Tq]`` and ``[B, Tk]``.

        With ``describe=True`` returns the same bias as a :class:`RelativeBias` (table values
        and positions, no factor) for the fused attention kernel, which never materialises it.
        """
        positions_q = jnp.asarray(positions_q)
        positions_k = jnp.asarray(positions_k)
        if (
            positions_q.ndim != 2
            or positions_k.ndim != 2
            or positions_q.shape[0] != positions_k.shape[0]
        ):
            raise ValueError(
                f"RelativePositionTable: positions must be [B, Tq] and [B, Tk], got "
                f"{tuple(positions_q.shape)} and {tuple(positions_k.shape)}"
            )
        table = self.param(
            "rel_embedding",
            nn.with_logical_partitioning(
                locality_init(self.max_distance) if self.table_init == "locality"
                else nn.initializers.normal(0.02), ("relpos_buckets", "heads")),
            (self.num_buckets, self.num_heads),
            self.param_dtype,
        )
        if describe:
            return RelativeBias(
                table=jnp.asarray(table),
                positions_q=positions_q,
                positions_k=positions_k,
                num_buckets=self.num_buckets,
                max_distance=self.max_distance,
            )
        return relative_bias_values(
            table, positions_q, positions_k, self.num_buckets, self.max_distance
        )


def gate_factor(q: jax.Array, u: jax.Array, v: jax.Array, w: jax.Array) -> jax.Array:
    """XLM-E gate as a per-query row factor: ``1 + g_u + (1 − g_u)·w_h·g_r``, ``[B, H, Tq]``.

    ``r = d + g_u·d + (1 − g_u)·w·g_r·d = d · factor``; the gates depend on the query only, so
    the gated bias is the raw bias with each row scaled. Plain differentiable JAX (the fused
    attention kernel takes the factor as an input and returns its gradient). Computed in
    float32 at least (bf16 queries are upcast; float64 stays float64 for gradient checks).

    Args:
      q: ``[B, Tq, H, Dh]`` queries (the projected queries of this layer, before scaling).
      u: ``[H, Dh]`` update-gate vectors.
      v: ``[H, Dh]`` reset-gate vectors.
      w: ``[H]`` scalar per head.
    """
    acc = jnp.result_type(jnp.asarray(q).dtype, jnp.float32)
    q32 = jnp.asarray(q).astype(acc)
    num_heads, head_dim = q32.shape[2], q32.shape[3]
    for name, x, shape in (
        ("u", u, (num_heads, head_dim)),
        ("v", v, (num_heads, head_dim)),
        ("w", w, (num_heads,)),
    ):
        if tuple(jnp.shape(x)) != shape:
            raise ValueError(
                f"gated_relative_bias: {name} must have shape {shape} for q {tuple(q32.shape)}, "
                f"got {tuple(jnp.shape(x))}"
            )
    g_u = jax.nn.sigmoid(jnp.einsum("bqhd,hd->bhq", q32, jnp.asarray(u).astype(acc)))
    g_r = jax.nn.sigmoid(jnp.einsum("bqhd,hd->bhq", q32, jnp.asarray(v).astype(acc)))
    w32 = jnp.asarray(w).astype(acc)[None, :, None]
    return 1.0 + g_u + (1.0 - g_u) * w32 * g_r  # [B, H, Tq]


def gated_relative_bias(
    q: jax.Array, d: jax.Array, u: jax.Array, v: jax.Array, w: jax.Array
) -> jax.Array:
    """XLM-E gate on a relative bias: ``r = d + g_u·d + (1 − g_u)·w_h·g_r·d``.

    Per head h and query i: ``g_u = σ(q_i·u_h)``, ``g_r = σ(q_i·v_h)``; the gates depend on the
    query only, so they scale whole rows of ``d`` (:func:`gate_factor`). Computed in float32 at
    least (bf16 queries are upcast; float64 stays float64 for gradient checks).

    Args:
      q: ``[B, Tq, H, Dh]`` queries (the projected queries of this layer, before scaling).
      d: ``[B or 1, H, Tq, Tk]`` raw relative bias.
      u: ``[H, Dh]`` update-gate vectors.
      v: ``[H, Dh]`` reset-gate vectors.
      w: ``[H]`` scalar per head.

    Returns:
      ``[B, H, Tq, Tk]`` in float32 (float64 if any input is float64).
    """
    acc = jnp.result_type(jnp.asarray(q).dtype, jnp.asarray(d).dtype, jnp.float32)
    factor = gate_factor(jnp.asarray(q).astype(acc), u, v, w)  # [B, H, Tq]
    # r = d * (1 + g_u + (1 - g_u) * w * g_r): one multiply of the [B, H, Tq, Tk] tensor.
    return jnp.asarray(d).astype(acc) * factor[..., None]


class GatedRelativeBias(nn.Module):
    """Per-layer XLM-E gate parameters applied to a (possibly shared) relative bias ``d``.

    ``gate_u`` and ``gate_v`` are initialised normal(0.02) — like the other projections, so the
    gates start near σ(0) = 0.5 (r ≈ 1.75·d) while their gradients already differ per
    dimension; ``gate_w`` starts at ones.

    Attributes:
      num_heads: attention heads H.
      head_dim: per-head dimension Dh.
      param_dtype: dtype of the gate parameters.
    """

    num_heads: int
    head_dim: int
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, q: jax.Array, d: jax.Array | RelativeBias) -> jax.Array | RelativeBias:
        """Gated float32 bias [B, H, Tq, Tk] from q [B, Tq, H, Dh] and d [B|1, H, Tq, Tk].

        When ``d`` is a :class:`RelativeBias` (the raw bias described, for fused attention) the
        result is that description with ``factor`` set to :func:`gate_factor`: the same bias,
        never materialised.
        """
        init = nn.initializers.normal(0.02)
        u = self.param(
            "gate_u",
            nn.with_logical_partitioning(init, ("heads", "kv")),
            (self.num_heads, self.head_dim),
            self.param_dtype,
        )
        v = self.param(
            "gate_v",
            nn.with_logical_partitioning(init, ("heads", "kv")),
            (self.num_heads, self.head_dim),
            self.param_dtype,
        )
        w = self.param(
            "gate_w",
            nn.with_logical_partitioning(nn.initializers.ones, ("heads",)),
            (self.num_heads,),
            self.param_dtype,
        )
        u, v, w = jnp.asarray(u), jnp.asarray(v), jnp.asarray(w)
        if isinstance(d, RelativeBias):
            return dataclasses.replace(d, factor=gate_factor(q, u, v, w))
        return gated_relative_bias(q, d, u, v, w)
