"""One attention entry point for every layer of the library, with a reference (XLA) path.

Layout (binding for the whole library):
  q: ``[B, Tq, H, Dh]``; k, v: ``[B, Tk, H, Dh]``; output ``[B, Tq, H, Dh]``.
  mask: bool ``[B, 1 or H, Tq, Tk]`` (True = may attend), anything broadcastable to it.
  bias: additive, broadcastable to ``[B, H, Tq, Tk]`` (e.g. the gated relative position bias).
  relative: the gated relative position bias *described* (:class:`RelativeBias`: bucket table,
    positions, gate factor). Every backend accepts it: "pallas" computes it inside its kernel,
    the others materialise it (``RelativeBias.materialise``) and add it to ``bias``.

Backends:
  * ``"xla"``: :func:`reference_attention`, plain einsums + float32 softmax. It is the oracle
    every other backend is tested against.
  * ``"cudnn"``: ``jax.nn.dot_product_attention(implementation="cudnn")`` (fused flash
    attention) when the inputs allow it (see :func:`cudnn_unavailable_reason`); otherwise the
    call falls back to the XLA path and logs the reason once per distinct reason.
  * ``"pallas"``: :func:`xlm_jax.models.fused_attention.flash_attention`, a Pallas flash
    attention kernel that computes the relative bias inside the kernel (no ``[B, H, Tq, Tk]``
    array; interpreted on CPU). It falls back to the XLA path, logging once, in the cases
    :func:`~xlm_jax.models.fused_attention.pallas_unavailable_reason` names (dropout active,
    an additive ``bias``, float64, another platform).

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

from xlm_jax.models import common, fused_attention
from xlm_jax.models.position import RelativeBias

logger = logging.getLogger(__name__)

VALID_BACKENDS: tuple[str, ...] = ("xla", "cudnn", "pallas")

# Finite stand-in for -inf on masked logits, one value for every backend (fused_attention's).
_MASK_VALUE: float = fused_attention.MASK_VALUE

# Reasons for which a cudnn -> xla fallback was already logged (log each once per process).
_LOGGED_FALLBACK_REASONS: set[str] = set()

_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_CUDNN_MAX_HEAD_DIM = 128


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
        shape = tuple(jnp.shape(x))
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
    if mask is not None and jnp.result_type(mask) != jnp.bool_:
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
      dropout_row_ids: optional ``[B]`` ints: row b's dropout mask is drawn from
        ``fold_in(dropout_rng, dropout_row_ids[b])`` (``common.keep_mask``).

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
        keep = common.keep_mask(dropout_rng, keep_prob, probs.shape, dropout_row_ids)
        probs = jnp.where(keep, probs / jnp.asarray(keep_prob, acc), jnp.zeros((), acc))
    out = jnp.einsum(
        "bhqk,bkhd->bqhd",
        probs.astype(v.dtype),
        v,
        precision=precision,
        preferred_element_type=jnp.result_type(v.dtype, jnp.float32),
    )
    return out.astype(q.dtype)


def cudnn_unavailable_reason(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array | None,
    mask: jax.Array | None,
    dropout_rate: float,
    *,
    platform: str | None = None,
) -> str | None:
    """Why cuDNN flash attention cannot take these inputs, or None when it can.

    Conditions follow ``jax.nn.dot_product_attention(implementation="cudnn")``: GPU platform,
    bf16/fp16 q/k/v of one dtype, head_dim <= 128 and a multiple of 8, no dropout (ours is
    applied to explicit probabilities), no additive bias (cuDNN's bias gradient only exists for a
    batch-1 full-head bias, and our relative bias is per example), and, since jax lowers a
    boolean mask to a bias, even Tq and Tk when a mask is given (cuDNN's training kernels with
    bias need even lengths).

    Args:
      q, k, v, bias, mask: as for :func:`dot_product_attention`.
      dropout_rate: the *effective* dropout rate (0 when deterministic).
      platform: override of ``jax.default_backend()`` (for tests).
    """
    platform = jax.default_backend() if platform is None else platform
    if platform not in ("gpu", "cuda"):
        return f"platform is {platform}"
    dtypes = {jnp.dtype(q.dtype), jnp.dtype(k.dtype), jnp.dtype(v.dtype)}
    if len(dtypes) != 1:
        return f"q/k/v dtypes differ: {sorted(str(d) for d in dtypes)}"
    dtype = jnp.dtype(q.dtype)
    if dtype not in _CUDNN_DTYPES:
        return f"dtype is {dtype}, cudnn needs bfloat16 or float16"
    head_dim = q.shape[-1]
    if v.shape[-1] != head_dim:
        return f"value head_dim {v.shape[-1]} differs from query head_dim {head_dim}"
    if head_dim > _CUDNN_MAX_HEAD_DIM or head_dim % 8 != 0:
        return f"head_dim is {head_dim}, cudnn needs <= {_CUDNN_MAX_HEAD_DIM} and a multiple of 8"
    if dropout_rate > 0.0:
        return f"dropout_rate is {dropout_rate}, cudnn path runs without dropout"
    if bias is not None:
        return "an additive bias is given, cudnn path takes no bias"
    if mask is not None and (q.shape[1] % 2 or k.shape[1] % 2):
        return f"a mask is given with odd lengths Tq={q.shape[1]}, Tk={k.shape[1]}"
    return None


def _log_fallback_once(reason: str, backend: str = "cudnn") -> None:
    """Logs a cudnn/pallas -> xla fallback the first time this exact reason is seen."""
    if reason not in _LOGGED_FALLBACK_REASONS:
        _LOGGED_FALLBACK_REASONS.add(reason)
        logger.info("attention backend %r falls back to 'xla': %s", backend, reason)


def _cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | None) -> jax.Array:
    """cuDNN flash attention; zeroes fully masked rows so it matches the reference path."""
    b, tq, h, _ = q.shape
    tk = k.shape[1]
    full_mask = None
    if mask is not None:
        mask = jnp.asarray(mask)
        mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
        # cuDNN wants the mask's T and S dims explicit; heads may stay 1.
        full_mask = jnp.broadcast_to(mask, (b, mask.shape[1], tq, tk))
    out = jax.nn.dot_product_attention(q, k, v, mask=full_mask, implementation="cudnn")
    if full_mask is not None:
        visible = _visible_rows(full_mask)  # [B, 1|H, Tq, 1]
        visible = jnp.transpose(visible, (0, 2, 1, 3))  # [B, Tq, 1|H, 1]
        out = jnp.where(visible, out, jnp.zeros((), out.dtype))
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
) -> jax.Array:
    """Scaled dot-product attention, ``[B, Tq, H, Dh]`` in q's dtype; the library's one entry.

    ``backend="xla"`` runs :func:`reference_attention`. ``backend="cudnn"`` runs cuDNN flash
    attention when :func:`cudnn_unavailable_reason` returns None and otherwise the XLA path
    (logging the reason once), so a config can ask for cudnn everywhere and still run on CPU/TPU
    or with the gated relative bias. ``backend="pallas"`` runs the Pallas kernel of
    :mod:`xlm_jax.models.fused_attention` unless
    :func:`~xlm_jax.models.fused_attention.pallas_unavailable_reason` names a reason (then the
    XLA path, logging it once).

    ``relative`` (a :class:`RelativeBias`) is the relative position bias described rather than
    materialised: "pallas" computes it inside the kernel; every other path (including a
    fallback) materialises it and adds it to ``bias``, so all backends accept the same call.

    Raises:
      ValueError: unknown backend, or q/k/v/mask/bias/relative shapes that break the layout.
    """
    if backend not in VALID_BACKENDS:
        raise ValueError(
            f"attention: unknown backend {backend!r}; valid backends are {list(VALID_BACKENDS)}"
        )
    if not 0.0 <= dropout_rate < 1.0:
        raise ValueError(f"attention: dropout_rate must be in [0, 1), got {dropout_rate}")
    effective_rate = 0.0 if deterministic else dropout_rate
    _check_inputs(q, k, v, bias, mask)
    if relative is not None:
        relative.check(q.shape[0], q.shape[2], q.shape[1], k.shape[1])
    if backend == "pallas":
        reason = fused_attention.pallas_unavailable_reason(q, k, v, bias, effective_rate)
        if reason is None:
            return fused_attention.flash_attention(q, k, v, mask=mask, relative=relative)
        _log_fallback_once(reason, backend)
    if relative is not None:
        materialised = relative.materialise()
        bias = materialised if bias is None else bias + materialised
    if backend == "cudnn":
        reason = cudnn_unavailable_reason(q, k, v, bias, mask, effective_rate)
        if reason is None:
            return _cudnn_attention(q, k, v, mask)
        _log_fallback_once(reason)
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
