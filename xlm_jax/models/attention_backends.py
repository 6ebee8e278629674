"""Which attention backend serves a call, on which platform, and the fused ones run per shard.

Backends (``ModelConfig.attention_backend``):
  * ``"xla"``: the reference einsum path (``attention.reference_attention``), everywhere.
  * ``"cudnn"``: cuDNN flash attention through ``jax.nn.dot_product_attention``; GPU only,
    bf16/fp16, no additive or relative bias, no attention dropout.
  * ``"pallas"``: our flash-attention kernels with the relative bias and attention dropout
    inside: Triton on GPU (``fused_attention``), Mosaic on TPU (``fused_attention_tpu``), the
    GPU kernel interpreted on CPU (for tests: slow).
  * ``"auto"``: the best backend this platform has for the call (GPU: ``pallas`` when the call
    has a relative bias or dropout, else ``cudnn`` when it can take the call, else ``pallas``;
    TPU: ``pallas``; CPU: ``xla``), its choice logged at WARNING once per distinct choice.

An explicitly requested backend that cannot serve a call is an error
(:class:`AttentionBackendError`, one line naming the layer, the backend and the reason), never a
silent fallback: a pod user would otherwise lose a run to a slow or memory-hungry path.

The platform is the one the program is lowered for: ``jax.default_backend()`` unless
:func:`lowering_for` says otherwise (``python -m xlm_jax.accelerator.lower`` lowers for
``cuda``/``tpu`` from a CPU and sets it, so the kernels chosen are the target's).

Sharding: a ``pallas_call`` or cuDNN custom call is opaque to the SPMD partitioner, which would
hand it the global batch on every device. Under a mesh (``jax.set_mesh``, as the trainer's
``partitioning.activate`` sets it) the fused backends therefore run inside ``jax.shard_map``
over the batch axes and the heads axis that the logical-axis rules give
``activation_batch`` and ``activation_heads``: each device computes its own rows and heads.
"""
from __future__ import annotations

import contextlib
import contextvars
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from xlm_jax.models import attention_dropout, fused_attention, kernel_launch
from xlm_jax.models.position import RelativeBias
from xlm_jax.models.token_mask import TokenMask

logger = logging.getLogger("xlm_jax.models.attention")

VALID_BACKENDS: tuple[str, ...] = ("xla", "cudnn", "pallas", "auto")
_PLATFORM_ALIASES = {"cuda": "gpu", "rocm": "gpu"}
_PLATFORMS = ("cpu", "gpu", "tpu")
_CUDNN_DTYPES = (jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_CUDNN_MAX_HEAD_DIM = 128

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("attention_platform",
                                                                     default=None)
# Set by `reference_math()`: every call takes the XLA path.
_REFERENCE: contextvars.ContextVar[bool] = contextvars.ContextVar("xlm_jax_attention_reference",
                                                                  default=False)
# Messages already logged at WARNING (each once per process).
_WARNED: set[str] = set()


class AttentionBackendError(ValueError):
    """An explicitly requested attention backend cannot serve a call (one-line message)."""


def target_platform() -> str:
    """The platform attention is lowered for: "cpu", "gpu" or "tpu"."""
    platform = _TARGET.get() or jax.default_backend()
    return _PLATFORM_ALIASES.get(platform, platform)


@contextlib.contextmanager
def lowering_for(platform: str) -> Iterator[None]:
    """Choose kernels for `platform` ("cpu", "cuda"/"gpu", "tpu") while tracing, whatever
    device this process has (pair it with ``.lower(lowering_platforms=(platform,))``; for a
    GPU without one here, the Triton kernels are lowered for `ASSUMED_GPU` and cuDNN's
    attention for `ASSUMED_CUDNN_VERSION`)."""
    name = _PLATFORM_ALIASES.get(platform, platform)
    if name not in _PLATFORMS:
        raise ValueError(f"unknown platform {platform!r}; valid: cpu, cuda, gpu, rocm, tpu")
    token = _TARGET.set(name)
    try:
        with contextlib.ExitStack() as assumed:
            if name == "gpu":  # what a GPU here would answer, where there is none
                assumed.enter_context(assume_gpu())
                assumed.enter_context(assume_cudnn())
            yield
    finally:
        _TARGET.reset(token)


# The GPU whose architecture the Triton kernels are lowered for when this process has none:
# compute capability 9.0 (H100), what jax 0.10 itself assumes there ("the minimum CC supported
# by Triton" in its Pallas lowering) and the targets' architecture (`accelerator/compile/
# gpu_specs`: H100, H200). Our choice for jax >= 0.11, which asks for an abstract device instead.
ASSUMED_GPU = "NVIDIA H100"


@contextlib.contextmanager
def assume_gpu() -> Iterator[None]:
    """Lets jax >= 0.11 lower a Pallas Triton kernel on a machine without a GPU, as jax 0.10
    does. jax 0.11 reads the target GPU's architecture from the abstract mesh's device and
    otherwise raises "No supported GPU devices found"; a sharded step cannot take such a mesh
    (its inputs' shardings are on this machine's CPU mesh: "Mesh for all inputs should be
    equal"). So, while the block runs, an architecture query that finds no GPU is answered
    with `ASSUMED_GPU`'s; one that finds a GPU (or a compile-only one) is unchanged. A no-op on
    jax 0.10, which has no such query. Lowering only: nothing runs on the assumed GPU."""
    try:
        from jax._src.pallas.triton import gpu_info
    except ImportError:  # jax 0.10: falls back to compute capability 9.0 itself
        yield
        return
    original = gpu_info.get_gpu_info

    def get_gpu_info() -> Any:
        try:
            return original()
        except ValueError:  # no GPU here: the architecture we lower for
            return gpu_info.get_gpu_info_from_version(gpu_info.GpuVersion(ASSUMED_GPU))

    gpu_info.get_gpu_info = get_gpu_info
    try:
        yield
    finally:
        gpu_info.get_gpu_info = original


# cuDNN version assumed when lowering cuDNN attention without a GPU (jax asks the installed
# cuDNN for its version while tracing): 9.10, our choice, a release current jax wheels ship
# with; `accelerator.lower` and `accelerator.compile` state it in their summaries.
ASSUMED_CUDNN_VERSION = 91000


@contextlib.contextmanager
def assume_cudnn() -> Iterator[None]:
    """On a machine without cuDNN, lets jax trace cuDNN attention for a CUDA lowering by
    answering its version query with ASSUMED_CUDNN_VERSION (lowering only: nothing runs).
    The query fails without a CUDA jaxlib (no `cuda_versions`) and, with the CUDA plugin
    but no cuDNN library (compile-only GPUs: `xlm_jax.accelerator.compile`), with "cuDNN not
    found"."""
    from jax._src.cudnn import fused_attention_stablehlo as cudnn_fa

    original = cudnn_fa.check_cudnn_version

    def version() -> int:
        try:
            return original()
        except RuntimeError:  # no cuDNN here: the version we lower for
            return ASSUMED_CUDNN_VERSION

    cudnn_fa.check_cudnn_version = version
    try:
        yield
    finally:
        cudnn_fa.check_cudnn_version = original


@contextlib.contextmanager
def reference_math() -> Iterator[None]:
    """While tracing, every attention call takes the XLA path whatever backend it asks for:
    a FLOP count read from a jaxpr sees the attention's dot products there, which the fused
    kernels hide inside custom calls (`xlm_jax.train.step_flops.jaxpr_flops_per_example`)."""
    token = _REFERENCE.set(True)
    try:
        yield
    finally:
        _REFERENCE.reset(token)


def warn_once(message: str) -> None:
    """Logs `message` at WARNING the first time it is seen in this process."""
    if message not in _WARNED:
        _WARNED.add(message)
        logger.warning(message)


def logged() -> list[str]:
    """The WARNING messages logged so far (``auto``'s choices, interpreted kernels)."""
    return sorted(_WARNED)


def cudnn_unavailable_reason(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any, mask: Any,
                             dropout_rate: float, *, platform: str | None = None) -> str | None:
    """Why cuDNN flash attention cannot take these inputs, or None when it can.

    Conditions follow ``jax.nn.dot_product_attention(implementation="cudnn")``: GPU platform,
    bf16/fp16 q/k/v of one dtype, head_dim <= 128 and a multiple of 8, no dropout (cuDNN's
    dropout bits are not the library's), no additive bias (cuDNN's bias gradient only exists
    for a batch-1 full-head bias, and the relative bias is per example), and, since jax lowers
    a boolean mask to a bias, even Tq and Tk when a mask is given.
    """
    platform = target_platform() if platform is None else _PLATFORM_ALIASES.get(platform,
                                                                                 platform)
    if platform != "gpu":
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


def pallas_unavailable_reason(q: jax.Array, k: jax.Array, v: jax.Array, bias: Any,
                              platform: str) -> str | None:
    """Why the platform's Pallas kernel cannot take these inputs, or None when it can."""
    if platform == "tpu":
        try:
            from xlm_jax.models import fused_attention_tpu
        except ImportError:
            return "no Mosaic TPU kernel is installed"
        return fused_attention_tpu.tpu_unavailable_reason(q, k, v, bias, platform="tpu")
    return fused_attention.pallas_unavailable_reason(q, k, v, bias, 0.0, platform=platform)


def select(requested: str, q: jax.Array, k: jax.Array, v: jax.Array, *, bias: Any, mask: Any,
           relative: RelativeBias | None, dropout_rate: float, layer: str) -> str:
    """The backend that serves this call: "xla", "cudnn" or "pallas".

    `dropout_rate` is the effective rate (0 when deterministic); `bias` is the additive bias
    without the relative one. Raises AttentionBackendError when `requested` is "cudnn" or
    "pallas" and cannot serve the call.
    """
    if requested not in VALID_BACKENDS:
        raise ValueError(f"attention: unknown backend {requested!r}; valid backends are "
                         f"{list(VALID_BACKENDS)}")
    if requested == "xla" or _REFERENCE.get():
        return "xla"
    platform = target_platform()
    full_bias = bias if bias is not None else relative
    pallas_reason = pallas_unavailable_reason(q, k, v, bias, platform)
    cudnn_reason = cudnn_unavailable_reason(q, k, v, full_bias, mask, dropout_rate,
                                            platform=platform)
    if requested == "auto":
        choice, why = _auto(platform, relative is not None or dropout_rate > 0.0,
                            pallas_reason, cudnn_reason)
        warn_once(f"attention_backend='auto' on {platform}: {choice} ({why})")
        return choice
    reason = pallas_reason if requested == "pallas" else cudnn_reason
    if reason is not None:
        raise AttentionBackendError(
            f"attention layer {layer}: backend {requested!r} cannot run this call on "
            f"{platform}: {reason} (attention_backend='xla' or 'auto' choose for you)")
    if requested == "pallas" and platform == "cpu":
        warn_once("attention_backend='pallas' on cpu runs the kernels interpreted: right for "
                  "tests, far too slow for training")
    return requested


def _auto(platform: str, needs_kernel: bool, pallas_reason: str | None,
          cudnn_reason: str | None) -> tuple[str, str]:
    """`auto`'s choice and why (our choice of preferences, module docstring)."""
    if platform == "cpu":
        return "xla", "fused kernels only run interpreted on cpu"
    if platform == "gpu" and not needs_kernel and cudnn_reason is None:
        return "cudnn", "no relative bias or dropout: cuDNN flash attention"
    if pallas_reason is None:
        return "pallas", f"the flash-attention kernel for {platform}"
    return "xla", f"pallas unavailable: {pallas_reason}; cudnn unavailable: {cudnn_reason}"


# ---------------------------------------------------------------------- fused, per shard


def _mesh_axes() -> tuple[Any, Any, Any]:
    """(mesh, batch mesh axes, heads mesh axes) for the fused call, or (None, None, None)
    when no multi-device mesh is set."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh is None or mesh.empty or math.prod(mesh.shape.values()) == 1:
        return None, None, None
    batch, heads = nn.logical_to_mesh_axes(("activation_batch", "activation_heads"))
    return mesh, batch, heads


def _size(mesh: Any, axes: Any) -> int:
    if axes is None:
        return 1
    axes = (axes,) if isinstance(axes, str) else axes
    return math.prod(mesh.shape[a] for a in axes)


def run_fused(backend: str, q: jax.Array, k: jax.Array, v: jax.Array, *, mask: Any,
              relative: RelativeBias | None, dropout_rate: float, dropout_rng: Any,
              dropout_row_ids: Any, layer: str, launch: str = "") -> jax.Array:
    """`backend` ("cudnn" or "pallas") on the target platform, per shard under a mesh;
    `launch`: the GPU Triton kernels' (`kernel_launch` text, "" their default)."""
    b, tq, h, _ = q.shape
    mask4 = None
    tokens = mask if isinstance(mask, TokenMask) else None
    if tokens is not None and backend == "cudnn" and not _lengths_only(tokens):
        tokens, mask = None, mask.materialise()
    if mask is not None and tokens is None:
        mask4 = jnp.asarray(mask)
        mask4 = mask4.reshape((1,) * (4 - mask4.ndim) + mask4.shape)
    args: dict[str, Any] = {"q": q, "k": k, "v": v}
    if mask4 is not None:
        args["mask"] = mask4
    if tokens is not None:
        args["tokens"] = tokens.features()
    if relative is not None:
        args.update(table=relative.table, pos_q=relative.positions_q,
                    pos_k=relative.positions_k)
        if relative.factor is not None:
            args["factor"] = relative.factor
    if dropout_rate > 0.0:
        # [B, H] keys from the global row ids and head indices, computed before sharding so
        # that a shard draws exactly the bits its rows and heads get in the whole batch
        args["drop_keys"] = attention_dropout.head_keys(dropout_rng, b, h, dropout_row_ids)
    platform = target_platform()

    def body(a: dict[str, Any]) -> jax.Array:
        rel = None
        if "table" in a:
            rel = RelativeBias(a["table"], a["pos_q"], a["pos_k"], a.get("factor"),
                               relative.num_buckets, relative.max_distance)
        shard_mask = a.get("mask")
        if "tokens" in a:
            shard_mask = tokens.with_features(a["tokens"])
        return _kernel(backend, platform, a["q"], a["k"], a["v"], shard_mask, rel,
                       dropout_rate, a.get("drop_keys"), launch)

    mesh, batch, heads = _mesh_axes()
    if mesh is None:
        return body(args)
    if b % _size(mesh, batch) or h % _size(mesh, heads):
        raise ValueError(
            f"attention layer {layer}: backend {backend!r} shards batch {b} over {batch} "
            f"({_size(mesh, batch)} ways) and heads {h} over {heads} ({_size(mesh, heads)} ways):"
            " the sizes must divide")
    specs = {"q": P(batch, None, heads, None), "k": P(batch, None, heads, None),
             "v": P(batch, None, heads, None), "table": P(None, heads),
             "pos_q": P(batch, None), "pos_k": P(batch, None), "factor": P(batch, heads, None),
             "drop_keys": P(batch, heads)}
    if mask4 is not None:
        specs["mask"] = P(batch if mask4.shape[0] > 1 else None,
                          heads if mask4.shape[1] > 1 else None, None, None)
    if tokens is not None:
        specs["tokens"] = {n: P(batch, None) for n in args["tokens"]}
    in_specs = ({name: specs[name] for name in args},)
    return jax.shard_map(body, mesh=mesh, in_specs=in_specs,
                         out_specs=P(batch, None, heads, None), check_vma=False)(args)


def _kernel(backend: str, platform: str, q, k, v, mask, relative, dropout_rate, drop_keys,
            launch: str = "") -> jax.Array:
    """One shard's fused attention (the kernel of `platform`; `launch` reaches the GPU's)."""
    if backend == "cudnn":
        return cudnn_attention(q, k, v, mask)
    kw: dict[str, Any] = dict(mask=mask, relative=relative, dropout_rate=dropout_rate,
                              dropout_keys=drop_keys)
    fn: Callable[..., jax.Array] = fused_attention.flash_attention
    if platform == "tpu":
        from xlm_jax.models import fused_attention_tpu

        fn = fused_attention_tpu.flash_attention_tpu
    elif platform == "gpu" and launch:
        kw["launch"] = kernel_launch.parse(launch, fused_attention.GPU_LAUNCH)
    return fn(q, k, v, interpret=platform == "cpu", **kw)


def _lengths_only(mask: TokenMask) -> bool:
    """A mask of segments alone (padding or packing), which cuDNN can take as lengths when
    each row holds one segment followed by padding."""
    return mask.pos_q is None and mask.side_q is None and mask.seg_q is not None


def _prefix_lengths(seg: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per row: the count of non-padding tokens, and whether the row is one segment followed
    by padding (what sequence lengths can express)."""
    n = jnp.sum(seg != 0, axis=1).astype(jnp.int32)
    prefix = jnp.arange(seg.shape[1])[None, :] < n[:, None]
    ok = jnp.all(jnp.where(prefix, seg == seg[:, :1], seg == 0), axis=1)
    return n, ok


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array,
                    mask: jax.Array | TokenMask | None) -> jax.Array:
    """cuDNN flash attention; zeroes fully masked rows so it matches the reference path.

    A segments-only TokenMask goes in as sequence lengths (no mask array, so jax adds no
    ``[B, 1, Tq, Tk]`` bias and cuDNN computes no bias gradient). That is exact for rows of
    one segment followed by padding; a packed row (several segments) cannot be expressed by
    lengths, and its output is NaN — loud: the trainer stops on a NaN loss — rather than
    silently attending across examples (pack rows only with the pallas or xla backends).
    """
    b, tq, _, _ = q.shape
    if isinstance(mask, TokenMask):
        q_len, q_ok = _prefix_lengths(mask.seg_q)
        k_len, k_ok = _prefix_lengths(mask.seg_k)
        out = jax.nn.dot_product_attention(q, k, v, query_seq_lengths=q_len,
                                           key_value_seq_lengths=k_len, implementation="cudnn")
        real = jnp.arange(tq)[None, :] < q_len[:, None]  # padding queries output 0
        out = jnp.where(real[:, :, None, None], out, jnp.zeros((), out.dtype))
        ok = (q_ok & k_ok & (mask.seg_q[:, 0] == mask.seg_k[:, 0]))[:, None, None, None]
        return jnp.where(ok, out, jnp.full((), jnp.nan, out.dtype)).astype(q.dtype)
    tk = k.shape[1]
    full_mask = None
    if mask is not None:
        # cuDNN wants the mask's T and S dims explicit; heads may stay 1.
        full_mask = jnp.broadcast_to(mask, (b, mask.shape[1], tq, tk))
    out = jax.nn.dot_product_attention(q, k, v, mask=full_mask, implementation="cudnn")
    if full_mask is not None:
        visible = jnp.any(full_mask, axis=-1, keepdims=True)  # [B, 1|H, Tq, 1]
        out = jnp.where(jnp.transpose(visible, (0, 2, 1, 3)), out, jnp.zeros((), out.dtype))
    return out.astype(q.dtype)
