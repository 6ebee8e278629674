"""XLM-E gated relative position bias (paper §3.3), built on T5 bidirectional log buckets.

Pieces:
  * :func:`relative_position_bucket` — T5 / mesh-tensorflow bucketing of ``key_pos - query_pos``.
  * :class:`RelativePositionTable` — learned ``[num_buckets, num_heads]`` table giving the raw
    relative bias ``d`` as ``[B, H, Tq, Tk]`` from per-token positions (so packed rows with
    positions restarting per example work).
  * :func:`gated_relative_bias` / :class:`GatedRelativeBias` — the per-layer gate
    ``r = d + g_u·d + (1 − g_u)·w·g_r·d`` with ``g_u = σ(q_i·u_h)``, ``g_r = σ(q_i·v_h)``.

A stack either owns one table shared by all layers (as WavLM does) or one per layer; the gate
parameters are always per layer. The result is an additive bias for
:func:`xlm_jax.models.attention.dot_product_attention` (float32, added to float32 logits).
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Dtype = Any


def relative_position_bucket(
    relative_position: jax.Array, num_buckets: int = 32, max_distance: int = 128
) -> jax.Array:
    """T5 bidirectional bucket of each relative position (``key_pos - query_pos``).

    Half the buckets hold keys at or before the query, half keys after it. Within a half,
    distances below ``num_buckets // 4`` get one bucket each; larger distances are spaced
    logarithmically up to ``max_distance``, beyond which everything shares the last bucket.
    Matches mesh-tensorflow ``_relative_position_bucket(bidirectional=True)`` and HF T5.

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
    is_small = n < max_exact
    # max(n, 1) keeps log finite where the small branch is taken anyway.
    n_f = jnp.maximum(n, 1).astype(jnp.float32)
    val_if_large = max_exact + (
        jnp.log(n_f / max_exact) / math.log(max_distance / max_exact) * (half - max_exact)
    ).astype(jnp.int32)
    val_if_large = jnp.minimum(val_if_large, half - 1)
    return ret + jnp.where(is_small, n, val_if_large)


class RelativePositionTable(nn.Module):
    """Learned per-head bias of each relative-position bucket: ``d[b, h, i, j]``.

    Attributes:
      num_heads: attention heads H.
      num_buckets: T5 buckets (half per direction).
      max_distance: distance from which positions share the last bucket.
      param_dtype: dtype of ``rel_embedding``.
    """

    num_heads: int
    num_buckets: int = 32
    max_distance: int = 128
    param_dtype: Dtype = jnp.float32

    @nn.compact
    def __call__(self, positions_q: jax.Array, positions_k: jax.Array) -> jax.Array:
        """Raw relative bias ``[B, H, Tq, Tk]`` from positions ``[B, Tq]`` and ``[B, Tk]``."""
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
            nn.with_logical_partitioning(nn.initializers.normal(0.02), ("relpos_buckets", "heads")),
            (self.num_buckets, self.num_heads),
            self.param_dtype,
        )
        rel = positions_k[:, None, :] - positions_q[:, :, None]  # [B, Tq, Tk]
        buckets = relative_position_bucket(rel, self.num_buckets, self.max_distance)
        d = jnp.take(jnp.asarray(table), buckets, axis=0)  # [B, Tq, Tk, H]
        return jnp.transpose(d, (0, 3, 1, 2))


def gated_relative_bias(
    q: jax.Array, d: jax.Array, u: jax.Array, v: jax.Array, w: jax.Array
) -> jax.Array:
    """XLM-E gate on a relative bias: ``r = d + g_u·d + (1 − g_u)·w_h·g_r·d``.

    Per head h and query i: ``g_u = σ(q_i·u_h)``, ``g_r = σ(q_i·v_h)``; the gates depend on the
    query only, so they scale whole rows of ``d``. Computed in float32 at least (bf16 queries are
    upcast; float64 stays float64 for gradient checks).

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
    d32 = jnp.asarray(d).astype(acc)
    g_u = jax.nn.sigmoid(jnp.einsum("bqhd,hd->bhq", q32, jnp.asarray(u).astype(acc)))
    g_r = jax.nn.sigmoid(jnp.einsum("bqhd,hd->bhq", q32, jnp.asarray(v).astype(acc)))
    w32 = jnp.asarray(w).astype(acc)[None, :, None]
    # r = d * (1 + g_u + (1 - g_u) * w * g_r): one multiply of the [B, H, Tq, Tk] tensor.
    factor = 1.0 + g_u + (1.0 - g_u) * w32 * g_r  # [B, H, Tq]
    return d32 * factor[..., None]


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
    def __call__(self, q: jax.Array, d: jax.Array) -> jax.Array:
        """Gated float32 bias [B, H, Tq, Tk] from q [B, Tq, H, Dh] and d [B|1, H, Tq, Tk]."""
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
        return gated_relative_bias(q, d, jnp.asarray(u), jnp.asarray(v), jnp.asarray(w))
