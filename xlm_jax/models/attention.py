"""One attention entry point for every layer of the library, with a reference (XLA) path.

Layout (binding for the whole library):
  q: ``[B, Tq, H, Dh]``; k, v: ``[B, Tk, H, Dh]``; output ``[B, Tq, H, Dh]``.
  mask: bool ``[B, 1 or H, Tq, Tk]`` (True = may attend), anything broadcastable to it.
  bias: additive, broadcastable to ``[B, H, Tq, Tk]`` (e.g. the gated relative position bias).
  relative: the gated relative position bias *described* (:class:`RelativeBias`: bucket table,
    positions, gate factor). Every backend accepts it: "pallas" computes it inside its kernel,
    the others materialise it (``RelativeBias.materialise``) and add it to ``bias``.

Backends (:mod:`xlm_jax.models.attention_backends` selects and runs them):
  * ``"xla"``: :func:`reference_attention`, plain einsums + float32 softmax. It is the oracle
    every other backend is tested against.
  * ``"cudnn"``: cuDNN flash attention (GPU; no bias, no dropout).
  * ``"pallas"``: the flash-attention kernels that compute the relative bias and attention
    dropout inside (Triton on GPU, Mosaic on TPU, interpreted on CPU).
  * ``"auto"``: the best of these the platform has, its choice logged at WARNING once.
  A backend asked for by name that cannot serve a call raises ``AttentionBackendError``.

Fully masked query rows (padding queries, segment id 0) output exactly zeros on every backend,
and gradients stay finite: masked logits are replaced (``jnp.where``) by a large *finite*
negative number and the probabilities of rows with no visible key are zeroed afterwards.
"""

from __future__ import annotations

import logging
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xlm_jax.models import attention_backends as backends
from xlm_jax.models import attention_dropout, fused_attention
from xlm_jax.models.position import RelativeBias
from xlm_jax.models.token_mask import TokenMask

logger = logging.getLogger(__name__)

VALID_BACKENDS: tuple[str, ...] = backends.VALID_BACKENDS
AttentionBackendError = backends.AttentionBackendError
cudnn_unavailable_reason = backends.cudnn_unavailable_reason
lowering_for = backends.lowering_for
target_platform = backends.target_platform

# Finite stand-in for -inf on masked logits, one value for every backend (fused_attention's).
_MASK_VALUE: float = fused_attention.MASK_VALUE


def _check_inputs(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, mask: Any) -> None:
    """Raises ValueError (naming the argument and its shape) on inputs that break the layout."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(
                f"attention: {name} must be 4-D [B, T, H, Dh], got shape {tuple(x.shape)}"
            )
    if k.shape[:3] != v.shape[:3]:
        raise ValueError(
            f"attention: k and v must agree on [B, Tk, H], got k {tuple(k.shape)} "
            f"and v {tuple(v.shape)}"
        )
    if q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2] or q.shape[3] != k.shape[3]:
        raise ValueError(
            f"attention: q {tuple(q.shape)} and k {tuple(k.shape)} must agree on batch, "
            "heads and head_dim"
        )
    b, tq, h, _ = q.shape
    tk = k.shape[1]
    target = (b, h, tq, tk)
    for name, x in (("mask", mask), ("bias", bias)):
        if x is None:
            continue
        shape = tuple(x.shape) if isinstance(x, TokenMask) else tuple(jnp.shape(x))
        if len(shape) > 4:
            raise ValueError(
                f"attention: {name} must be broadcastable to [B, H, Tq, Tk]={target}, "
                f"got shape {shape}"
            )
        try:
            jnp.broadcast_shapes(shape, target)
        except ValueError:
            raise ValueError(
                f"attention: {name} shape {shape} is not broadcastable to "
                f"[B, H, Tq, Tk]={target}"
            ) from None
        if jnp.broadcast_shapes(shape, target) != target:
            raise ValueError(
                f"attention: {name} shape {shape} would enlarge [B, H, Tq, Tk]={target}"
            )
    if mask is not None and not isinstance(mask, TokenMask) and jnp.result_type(mask) != jnp.bool_:
        raise ValueError(
            f"attention: mask must be boolean (True = may attend), got dtype "
            f"{jnp.result_type(mask)}; pass additive masks as bias"
        )


def _visible_rows(mask: jax.Array) -> jax.Array:
    """[B, 1|H, Tq, 1] bool: True where the query row has at least one visible key."""
    return jnp.any(mask, axis=-1, keepdims=True)


def reference_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
    precision: jax.lax.PrecisionLike = None,
    dropout_row_ids: jax.Array | None = None,
) -> jax.Array:
    """Softmax(q·kᵀ/√Dh + bias, masked) · v with einsums; the oracle for all backends.

    The logits and the softmax are float32 whatever the input dtype (bf16 logits lose the
    ordering of close scores; float64 inputs stay float64). The probabilities are cast to v's
    dtype for the value matmul, accumulated in float32, and the output is cast back to q's
    dtype. Query rows whose mask has no True entry output exactly zeros and pass zero gradient.

    Args:
      q: ``[B, Tq, H, Dh]`` queries.
      k: ``[B, Tk, H, Dh]`` keys.
      v: ``[B, Tk, H, Dv]`` values.
      bias: optional additive logits bias, broadcastable to ``[B, H, Tq, Tk]``.
      mask: optional bool visibility, broadcastable to ``[B, H, Tq, Tk]`` (True = may attend).
      dropout_rate: dropout on the attention probabilities (used only if not deterministic).
      dropout_rng: PRNG key for dropout; required when dropout is active.
      deterministic: True disables dropout (evaluation).
      precision: optional matmul precision for the two einsums.
      dropout_row_ids: optional ``[B]`` ints: row b's dropout bits are keyed by
        ``dropout_row_ids[b]`` (default: its index), the hash of ``attention_dropout`` that the
        fused kernels compute too.

    Returns:
      ``[B, Tq, H, Dv]`` in q's dtype.
    """
    _check_inputs(q, k, v, bias, mask)
    head_dim = q.shape[-1]
    scale = 1.0 / np.sqrt(head_dim)
    # float32 at least (float64 inputs stay float64, which the x64 gradient tests rely on).
    acc = jnp.result_type(q.dtype, k.dtype, jnp.float32)
    logits = jnp.einsum("bqhd,bkhd->bhqk", q, k, precision=precision, preferred_element_type=acc)
    logits = logits.astype(acc) * jnp.asarray(scale, acc)
    if bias is not None:
        logits = logits + jnp.asarray(bias).astype(acc)
    if mask is not None:
        mask = jnp.asarray(mask)
        logits = jnp.where(mask, logits, jnp.asarray(_MASK_VALUE, acc))
    probs = jax.nn.softmax(logits, axis=-1)
    if mask is not None:
        # A fully masked row softmaxes to a uniform average; zero it so padding outputs 0.
        probs = jnp.where(_visible_rows(mask), probs, jnp.zeros((), acc))
    if dropout_rate > 0.0 and not deterministic:
        if dropout_rng is None:
            raise ValueError(
                f"attention: dropout_rate={dropout_rate} with deterministic=False needs a "
                "dropout_rng"
            )
        keep_prob = 1.0 - dropout_rate
        b, h, tq, tk = probs.shape
        keep = attention_dropout.keep_mask(dropout_rng, keep_prob, b, h, tq, tk, dropout_row_ids)
        probs = jnp.where(keep, probs / jnp.asarray(keep_prob, acc), jnp.zeros((), acc))
    out = jnp.einsum(
        "bhqk,bkhd->bqhd",
        probs.astype(v.dtype),
        v,
        precision=precision,
        preferred_element_type=jnp.result_type(v.dtype, jnp.float32),
    )
    return out.astype(q.dtype)


def dot_product_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    bias: jax.Array | None = None,
    mask: jax.Array | None = None,
    backend: str = "xla",
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    deterministic: bool = True,
    dropout_row_ids: jax.Array | None = None,
    relative: RelativeBias | None = None,
    layer: str = "attention",
    launch: str = "",
) -> jax.Array:
    """Scaled dot-product attention, ``[B, Tq, H, Dh]`` in q's dtype; the library's one entry.

    ``backend`` is one of :data:`VALID_BACKENDS` (``attention_backends`` says what each runs
    and how ``auto`` chooses). ``xla`` runs :func:`reference_attention`; ``cudnn`` and
    ``pallas`` run fused kernels, per shard under a mesh, and raise
    :class:`AttentionBackendError` (naming `layer`, the backend and the reason) when they
    cannot serve the call: there is no silent fallback.

    ``mask`` may be a :class:`TokenMask` (the mask described by per-token ids): "pallas"
    evaluates it per tile, the XLA path materialises it. ``relative`` (a
    :class:`RelativeBias`) is the relative position bias described rather than materialised: "pallas" computes it inside its kernel; the XLA path materialises it and
    adds it to ``bias``, so every backend accepts the same call. Attention dropout draws the
    bits of :mod:`xlm_jax.models.attention_dropout` on every backend that supports it.

    ``launch`` (``ModelConfig.attention_launch``'s text, ``models/kernel_launch.py``) sets
    the GPU Triton kernels' tiles, warps and stages; every other path ignores it.

    Raises:
      ValueError: unknown backend, or q/k/v/mask/bias/relative shapes that break the layout.
      AttentionBackendError: an explicitly requested backend that cannot serve this call.
    """
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"attention: dropout_rate must be in [0, 1), got {dropout_rate}")
    effective_rate = 0.0 if deterministic else dropout_rate
    if effective_rate > 0.0 and dropout_rng is None:
        raise ValueError(f"attention: dropout_rate={dropout_rate} with deterministic=False "
                         "needs a dropout_rng")
    _check_inputs(q, k, v, bias, mask)
    if relative is not None:
        relative.check(q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    chosen = backends.select(backend, q, k, v, bias=bias, mask=mask, relative=relative,
                             dropout_rate=effective_rate, layer=layer)
    if chosen != "xla":
        return backends.run_fused(chosen, q, k, v, mask=mask, relative=relative,
                                  dropout_rate=effective_rate, dropout_rng=dropout_rng,
                                  dropout_row_ids=dropout_row_ids, layer=layer,
                                  launch=launch)
    if relative is not None:
        materialised = relative.materialise()
        bias = materialised if bias is None else bias + materialised
    if isinstance(mask, TokenMask):
        mask = mask.materialise()
    return reference_attention(
        q,
        k,
        v,
        bias=bias,
        mask=mask,
        dropout_rate=dropout_rate,
        dropout_rng=dropout_rng,
        deterministic=deterministic,
        dropout_row_ids=dropout_row_ids,
    )
