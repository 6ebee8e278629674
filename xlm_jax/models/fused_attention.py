"""Flash attention in Pallas with XLM-E's gated relative position bias computed in the kernel.

The ``"pallas"`` backend of :func:`xlm_jax.models.attention.dot_product_attention`. The XLA
path adds a materialised float32 ``[B, H, Tq, Tk]`` bias (``gated_relative_bias``); here the
bias arrives *described* (:class:`~xlm_jax.models.position.RelativeBias`: the
``[num_buckets, H]`` table, per-token positions and the per-query gate factor ``[B, H, Tq]``)
and each (query block, key block) tile recomputes it: each score's bias gathered from this
head's bias per relative distance clipped to ``[-max_distance, max_distance]`` (built from the
table with :func:`~xlm_jax.models.position.relative_position_bucket` before the call; a tile
whose keys all lie ``max_distance`` or more after or before its queries holds one saturated
bucket and reads one table entry), times the factor rows. The forward is flash-attention (online
softmax, float32 accumulators, the logsumexp saved); the backward (``jax.custom_vjp``) is
flash-attention-2 recomputation from the logsumexp in two kernels: one over key blocks (dk,
dv), one over query blocks (dq, the factor's gradient ``Σ_j dS_ij·d_ij`` and per-block partial
sums of the table's gradient ``Σ_{bucket(i,j)=n} dS_ij·factor_i``, reduced outside). No
``[B, H, Tq, Tk]`` array exists in forward or backward; the mask enters block by block with
its own (usually head-less) shape. The gate factor itself is plain JAX (``gate_factor``), so
autodiff carries its gradient to q and the gate parameters.

Semantics are those of ``reference_attention``: logits scaled by 1/sqrt(Dh) in float32,
masked logits replaced by the same finite ``-1e30``, fully masked query rows output exactly
zeros and pass zero gradient (their logsumexp is stored as +inf, so recomputed probabilities
are 0), probabilities cast to v's dtype for the value matmul, output in q's dtype. Attention dropout
runs in the kernel with the bits of :mod:`xlm_jax.models.attention_dropout` (a hash of seed,
row id, head, query and key index), the same bits the XLA path draws, so the two agree with
dropout on; the softmax denominator counts dropped entries (dropout follows normalisation).

Shapes: any T works; the wrapper pads T up to a block multiple (padded keys are masked,
padded query rows dropped), pads Dh to a power of two >= 16 with zeros (exact: zero columns
change no dot product) and the table to a power-of-two bucket count.

Lowering: on CPU the kernels run with ``interpret=True`` (that is how the tests run them).
On GPU they lower through Triton, named explicitly (``pl_triton.CompilerParams``): 2-D
blocks, ``jnp.dot`` with float32 accumulation, power-of-two block sizes >= 16, int8 masks
or per-token mask features (``TokenMask``), scalar table loads. The CUDA lowering is checked
from a CPU (``python -m xlm_jax.accelerator.lower``, ``tests/accelerator/lower_test.py``); no GPU
has compiled or run it yet (float32 dots there would use the lowering's default precision, TF32 on
recent GPUs, as XLA's default does; the interpreted CPU run is exact float32). Interpreted kernels
are slow: on CPU the backend is for testing, not for training. The kernels themselves live
in ``fused_attention_kernels``; this module holds the shapes, BlockSpecs and custom VJP, and
the input preparation the TPU twin (``fused_attention_tpu``) shares: the input checks, the
array mask, the relative bias's inputs and the dropout keys, before either kernel's layout.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from xlm_jax.models import attention_dropout
from xlm_jax.models.fused_attention_kernels import (  # noqa: F401 - re-exported
    KERNELS, MASK_VALUE, NUM_STAGES, NUM_WARPS, TRITON_MISSING, KernelLaunch, Launch, _dkv_kernel,
    _dq_kernel, _forward_kernel, _Static)
from xlm_jax.models.position import RelativeBias, relative_position_bucket
from xlm_jax.models.token_mask import TokenMask

# Tiles: 64 x 64 on a GPU for every kernel (measured fastest of those tried with one setting
# for all three, with fused_attention_kernels' NUM_WARPS and NUM_STAGES: see there); 128 x 128
# when interpreted on a CPU (our choice: fewer grid steps to interpret, and the tile size the
# CPU tests were written against).
GPU_BLOCK: int = 64
DEFAULT_BLOCK: int = 128
GPU_LAUNCH: KernelLaunch = KernelLaunch.uniform(Launch(GPU_BLOCK, GPU_BLOCK))
INTERPRET_LAUNCH: KernelLaunch = KernelLaunch.uniform(Launch(DEFAULT_BLOCK, DEFAULT_BLOCK))
_MIN_BLOCK = 16  # smallest tile Triton's dot accepts
_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
_F32 = jnp.float32


def pallas_unavailable_reason(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    bias: jax.Array | None,
    dropout_rate: float,
    *,
    platform: str | None = None,
) -> str | None:
    """Why the Pallas kernel cannot take these inputs, or None when it can.

    It runs on GPU (Triton; not with a jax that has dropped Pallas' Triton backend:
    ``TRITON_MISSING``) and, interpreted, on CPU; takes float32/bf16/fp16 q/k/v of one
    dtype with equal query and value head dims, and no additive bias (the relative bias goes
    in described, as a ``RelativeBias``). Attention dropout runs in the kernel
    (``dropout_rate`` is accepted for the signature's sake).
    """
    del dropout_rate
    platform = jax.default_backend() if platform is None else platform
    if platform not in ("cpu", "gpu", "cuda", "rocm"):
        return f"platform is {platform}, this pallas kernel targets GPU (and CPU interpreted)"
    if platform != "cpu" and TRITON_MISSING:
        return TRITON_MISSING
    return _common_unavailable_reason(q, k, v, bias, _DTYPES, "pallas kernel",
                                      "computes in float32")


def _common_unavailable_reason(q: jax.Array, k: jax.Array, v: jax.Array, bias: jax.Array | None,
                               dtypes: tuple, kernel: str, takes: str) -> str | None:
    """The input checks of both flash kernels (this one and ``fused_attention_tpu``'s), after
    their own platform check: one q/k/v dtype, among ``dtypes``; equal query and value head
    dims; no additive bias. ``kernel`` names the kernel in the reasons, ``takes`` says what
    it does with dtypes ("the {kernel} {takes}")."""
    found = {jnp.dtype(q.dtype), jnp.dtype(k.dtype), jnp.dtype(v.dtype)}
    if len(found) != 1:
        return f"q/k/v dtypes differ: {sorted(str(d) for d in found)}"
    if jnp.dtype(q.dtype) not in dtypes:
        return f"dtype is {jnp.dtype(q.dtype)}, the {kernel} {takes}"
    if v.shape[-1] != q.shape[-1]:
        return f"value head_dim {v.shape[-1]} differs from query head_dim {q.shape[-1]}"
    if bias is not None:
        return f"an additive bias is given, the {kernel} takes only a RelativeBias"
    return None


# ------------------------------------------------------------------------ pallas_call glue


def _specs(st: _Static, tq: int, tk: int, dh: int, table, *, key_major: bool):
    """BlockSpecs (q-like, kv-like, per-query rows, mask, [table, pos_q, pos_k, factor]).

    Grid (b, h, n): n is a query block (``key_major=False``: the forward and dq kernels, which
    see all keys) or a key block (``key_major=True``: the dkv kernel, which sees all queries).
    """
    nbp = table.shape[1] if st.num_buckets else 0
    bq, bk = (tq, st.block_k) if key_major else (st.block_q, tk)
    qmap = (lambda b, h, n: (b, 0, h, 0)) if key_major else (lambda b, h, n: (b, n, h, 0))
    kmap = (lambda b, h, n: (b, n, h, 0)) if key_major else (lambda b, h, n: (b, 0, h, 0))
    rowq = (lambda b, h, n: (b, h, 0)) if key_major else (lambda b, h, n: (b, h, n))

    def mask_map(b, h, n):
        qi = 0 if key_major or not st.mask_q else n
        return (b if st.mask_b else 0, h if st.mask_h else 0, qi, n if key_major else 0)

    q_spec = pl.BlockSpec((None, bq, None, dh), qmap)
    kv_spec = pl.BlockSpec((None, bk, None, dh), kmap)
    rows_spec = pl.BlockSpec((None, None, bq), rowq)
    mask_spec = pl.BlockSpec((None, None, bq if st.mask_q else 1, bk), mask_map)
    rel_specs = []
    q_row, k_row = _token_row_specs(st, tq, tk, key_major)
    if st.num_buckets:
        width = _distance_width(st)
        rel_specs = [pl.BlockSpec((None, nbp), lambda b, h, n: (h, 0)), q_row, k_row, rows_spec,
                     pl.BlockSpec((None, width), lambda b, h, n: (h, 0))]
    return q_spec, kv_spec, rows_spec, mask_spec, rel_specs


def _distance_width(st: _Static) -> int:
    """Entries of the distance vector: every distance in ``[-max_distance, max_distance]``,
    padded to a power of two (a Triton block's length)."""
    return pl.next_power_of_2(2 * st.max_distance + 1)


def _relative_args(st: _Static, table, pos_q, pos_k, factor) -> tuple:
    """The relative bias's kernel inputs: ``(table, pos_q, pos_k, factor, dvec)``, the last
    the bias ``[H, W]`` of every distance clipped to ``[-max_distance, max_distance]`` (entry
    ``distance + max_distance``; beyond it the T5 buckets have saturated), which the kernels
    gather per score (`_relative_tile`). Built here from the table, in XLA; the table's
    gradient is still the dq kernel's, per bucket."""
    if not st.num_buckets:
        return ()
    distance = jnp.arange(_distance_width(st), dtype=jnp.int32) - st.max_distance
    bucket = relative_position_bucket(distance, st.num_buckets, st.max_distance)
    return table, pos_q, pos_k, factor, jnp.take(table, bucket, axis=1)


def _token_row_specs(st: _Static, tq: int, tk: int, key_major: bool):
    """BlockSpecs of per-token ``[B, Tq]`` and ``[B, Tk]`` rows (positions, mask features):
    the tile's block on the grid's own axis, the whole row on the other."""
    bq, bk = (tq, st.block_k) if key_major else (st.block_q, tk)
    q_row = pl.BlockSpec((None, bq), (lambda b, h, n: (b, 0)) if key_major else
                         (lambda b, h, n: (b, n)))
    k_row = pl.BlockSpec((None, bk), (lambda b, h, n: (b, n)) if key_major else
                         (lambda b, h, n: (b, 0)))
    return q_row, k_row


def _call(st: _Static, kernel, grid, in_specs, out_specs, out_shape, name, *args):
    """One ``pallas_call`` of ``kernel`` with the settings every kernel here shares."""
    return pl.pallas_call(
        functools.partial(kernel, st=st),
        grid=grid,
        in_specs=in_specs,
        out_specs=out_specs,
        out_shape=out_shape,
        interpret=st.interpret,
        compiler_params=st.compiler_params(),
        name=name,
    )(*args)


def _extras(st: _Static, rel_args, rel_specs, drop_key, rows_spec, tokens, key_major: bool,
            tq: int, tk: int):
    """The optional trailing inputs (relative bias, dropout key rows, TokenMask feature rows)
    and their specs."""
    args, specs = list(rel_args), list(rel_specs)
    if st.dropout:
        args.append(drop_key)
        specs.append(rows_spec)
    q_row, k_row = _token_row_specs(st, tq, tk, key_major)
    for name in st.token_names:
        args += [tokens[f"{name}_q"], tokens[f"{name}_k"]]
        specs += [q_row, k_row]
    return args, specs


def _forward(st: _Static, q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens):
    """Output ``[B, Tq, H, Dh]`` and logsumexp ``[B, H, Tq]`` (+inf on fully masked rows)."""
    st = st.for_kernel("forward")
    b_, tq, h_, _ = q.shape
    specs = _specs(st, tq, k.shape[1], q.shape[3], table, key_major=False)
    q_spec, kv_spec, rows_spec, mask_spec, rel_specs = specs
    rel_args = _relative_args(st, table, pos_q, pos_k, factor)
    extra, extra_specs = _extras(st, rel_args, rel_specs, drop_key, rows_spec, tokens, False,
                                 tq, k.shape[1])
    return _call(st, _forward_kernel, (b_, h_, tq // st.block_q),
                 [q_spec, kv_spec, kv_spec, mask_spec, *extra_specs], [q_spec, rows_spec],
                 [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b_, h_, tq), _F32)],
                 "relbias_flash_forward", q, k, v, mask, *extra)


def _backward(st: _Static, q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens, o, lse,
              do):
    """(dq, dk, dv, d(table) ``[H, NBp]`` or None, d(factor) ``[B, H, Tq]`` or None)."""
    # FA-2's D_i = Σ_d dO_id·O_id = Σ_j P_ij·dP_ij: [B, H, Tq], plain JAX.
    delta = jnp.einsum("bqhd,bqhd->bhq", o.astype(_F32), do.astype(_F32))
    args = (q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens, lse, delta, do)
    dk, dv = _dkv(st, *args)
    dq, dtable, dfactor = _dq(st, *args)
    return dq, dk, dv, dtable, dfactor


def _dkv(st: _Static, q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens, lse, delta,
         do):
    """(dk, dv): the dk/dv kernel, grid over key tiles."""
    st = st.for_kernel("dkv")
    b_, tq, h_, dh = q.shape
    tk = k.shape[1]
    rel_args = _relative_args(st, table, pos_q, pos_k, factor)
    q_spec, kv_spec, rows_spec, mask_spec, rel_specs = _specs(st, tq, tk, dh, table,
                                                              key_major=True)
    extra, extra_specs = _extras(st, rel_args, rel_specs, drop_key, rows_spec, tokens, True,
                                 tq, tk)
    dk, dv = _call(st, _dkv_kernel, (b_, h_, tk // st.block_k),
                   [q_spec, kv_spec, kv_spec, q_spec, rows_spec, rows_spec, mask_spec,
                    *extra_specs], [kv_spec, kv_spec],
                   [jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
                   "relbias_flash_dkv", q, k, v, do, lse, delta, mask, *extra)
    return dk, dv


def _dq(st: _Static, q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens, lse, delta,
        do):
    """(dq, d(table) ``[H, NBp]`` or None, d(factor) or None): the dq kernel, grid over query
    tiles (each also sums its tile's share of the table gradient)."""
    st = st.for_kernel("dq")
    b_, tq, h_, dh = q.shape
    tk = k.shape[1]
    rel_args = _relative_args(st, table, pos_q, pos_k, factor)
    q_spec, kv_spec, rows_spec, mask_spec, rel_specs = _specs(st, tq, tk, dh, table,
                                                              key_major=False)
    extra, extra_specs = _extras(st, rel_args, rel_specs, drop_key, rows_spec, tokens, False,
                                 tq, tk)
    nq = tq // st.block_q
    out_specs = [q_spec]
    out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype)]
    if st.num_buckets:
        nbp = table.shape[1]
        parts_spec = pl.BlockSpec((None, None, None, nbp), lambda b, h, n: (b, h, n, 0))
        out_specs += [rows_spec, parts_spec]
        out_shape += [
            jax.ShapeDtypeStruct((b_, h_, tq), _F32),
            jax.ShapeDtypeStruct((b_, h_, nq, nbp), _F32),
        ]
    outs = _call(st, _dq_kernel, (b_, h_, nq),
                 [q_spec, kv_spec, kv_spec, q_spec, rows_spec, rows_spec, mask_spec, *extra_specs],
                 out_specs, out_shape, "relbias_flash_dq", q, k, v, do, lse, delta, mask, *extra)
    if not st.num_buckets:
        return outs[0], None, None
    dq, dfactor, dtable_parts = outs
    return dq, jnp.sum(dtable_parts, axis=(0, 2)), dfactor


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(st: _Static, q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens):
    return _forward(st, q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens)[0]


def _flash_fwd(st: _Static, q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens):
    o, lse = _forward(st, q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens)
    return o, (q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens, o, lse)


def _flash_bwd(st: _Static, res, do):
    q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens, o, lse = res
    dq, dk, dv, dtable, dfactor = _backward(
        st, q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens, o, lse, do
    )
    # The masks, the positions and the dropout keys get no gradient.
    no_tokens = None if tokens is None else {n: None for n in tokens}
    return dq, dk, dv, None, dtable, None, None, dfactor, None, no_tokens


_flash.defvjp(_flash_fwd, _flash_bwd)


# ----------------------------------------------------------------------------- the wrapper


def _padded_token_features(mask: TokenMask, tq_p: int, tk_p: int) -> dict[str, jax.Array]:
    """A TokenMask's int32 features padded to the kernel's lengths so that padded queries
    and keys are never visible: segment and side 0 (padding), key positions after every
    query's (the causal rule then hides them when no segment or side says so)."""
    out = {}
    for name, x in mask.features().items():
        size = tq_p if name.endswith("_q") else tk_p
        value = 2**30 if name == "pos_k" else 0
        x = jnp.asarray(x).astype(jnp.int32)
        widths = ((0, 0), (0, size - x.shape[1]))
        out[name] = jnp.pad(x, widths, constant_values=value) if size > x.shape[1] else x
    return out


def _block_size(requested: int, length: int, name: str) -> int:
    """``requested`` clipped to the (power-of-two) length: a power of two >= 16."""
    if requested < _MIN_BLOCK or requested & (requested - 1):
        raise ValueError(f"flash_attention: {name} must be a power of two >= 16, got {requested}")
    return min(requested, max(_MIN_BLOCK, pl.next_power_of_2(length)))


def _launch(launch: KernelLaunch | None, block_q: int | None, block_k: int | None,
            interpret: bool, tq: int, tk: int) -> KernelLaunch:
    """The kernels' launches: ``launch`` (default by ``interpret``), ``block_q``/``block_k``
    over every kernel's tile when given, each tile checked and clipped to its length."""
    if launch is None:
        launch = INTERPRET_LAUNCH if interpret else GPU_LAUNCH
    for name in KERNELS:
        run = launch.of(name)
        tiles = {}
        for axis, given, length in (("block_q", block_q, tq), ("block_k", block_k, tk)):
            label = axis if given is not None else f"launch.{name}.{axis}"
            tiles[axis] = _block_size(getattr(run, axis) if given is None else given, length,
                                      label)
        launch = launch.replace(name, dataclasses.replace(run, **tiles))
    return launch


def _pad_axis(x: jax.Array, axis: int, size: int) -> jax.Array:
    """Zero (False) padding of ``axis`` up to ``size``."""
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return jnp.pad(x, widths)


def _array_mask(mask, tk: int, tq_p: int, tk_p: int, dtype) -> jax.Array:
    """An array mask (None: all visible), broadcastable to ``[B, H, Tq, Tk]``, as ``dtype``
    ``[B|1, H|1, Tq_p|1, Tk_p]``: its own batch, head and query axes (length 1 where it has
    none), keys broadcast to Tk, padded keys and queries never visible. Both flash kernels'
    (int8 here, int32 on TPU)."""
    if mask is None:
        mask = jnp.ones((1, 1, 1, tk), jnp.bool_)
    mask = jnp.asarray(mask)
    mask = mask.reshape((1,) * (4 - mask.ndim) + mask.shape)
    mask = jnp.broadcast_to(mask, mask.shape[:3] + (tk,)).astype(dtype)
    mask = _pad_axis(mask, 3, tk_p)  # padded keys are never visible
    if mask.shape[2] > 1:
        mask = _pad_axis(mask, 2, tq_p)  # padded queries see nothing (their rows are dropped)
    return mask


def _relative_inputs(relative: RelativeBias, b_: int, h_: int, tq: int, tk: int, tq_p: int,
                     tk_p: int) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """A checked RelativeBias as both flash kernels' inputs, before their layouts: the float32
    table transposed to ``[H, NB]``, int32 positions ``[B, Tq_p]`` and ``[B, Tk_p]`` and the
    float32 factor ``[B, H, Tq_p]`` (ones when None), zero-padded to the padded lengths."""
    relative.check(b_, h_, tq, tk)
    table = jnp.asarray(relative.table).astype(_F32).T  # [H, NB]
    pos_q = _pad_axis(jnp.asarray(relative.positions_q).astype(jnp.int32), 1, tq_p)
    pos_k = _pad_axis(jnp.asarray(relative.positions_k).astype(jnp.int32), 1, tk_p)
    factor = relative.factor
    if factor is None:
        factor = jnp.ones((b_, h_, tq), _F32)
    factor = _pad_axis(jnp.asarray(factor).astype(_F32), 2, tq_p)
    return table, pos_q, pos_k, factor


def _dropout_inputs(rate: float, b_: int, h_: int, rng, row_ids, keys,
                    check: str | None = None) -> tuple[jax.Array | None, int, float]:
    """Both flash kernels' attention dropout: (the ``[B, H]`` int32 (row, head) keys of the
    dropout hash, or None when there is no dropout, keep threshold, keep probability). The
    keys are ``keys`` when given, else ``attention_dropout.row_head_key`` of ``rng``'s seeds,
    the row ids (default arange) and the heads. ``check``: the caller's name, to check the
    shapes of ``keys`` and ``row_ids`` first (ValueErrors naming it)."""
    if not (rate > 0.0 and (rng is not None or keys is not None)):
        return None, 0, 1.0
    keep_prob = 1.0 - rate
    keep_threshold = attention_dropout.threshold(keep_prob)
    if keys is not None:
        keys = jnp.asarray(keys)
        if check is not None and keys.shape != (b_, h_):
            raise ValueError(f"{check}: dropout_keys must have shape ({b_}, {h_}), "
                             f"got {tuple(keys.shape)}")
        return keys.astype(jnp.int32), keep_threshold, keep_prob
    if check is not None and row_ids is not None and jnp.shape(row_ids) != (b_,):
        raise ValueError(f"{check}: dropout_row_ids must have shape ({b_},), "
                         f"got {tuple(jnp.shape(row_ids))}")
    return attention_dropout.head_keys(rng, b_, h_, row_ids), keep_threshold, keep_prob


def flash_attention(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    *,
    mask: jax.Array | TokenMask | None = None,
    relative: RelativeBias | None = None,
    dropout_rate: float = 0.0,
    dropout_rng: jax.Array | None = None,
    dropout_row_ids: jax.Array | None = None,
    dropout_keys: jax.Array | None = None,
    block_q: int | None = None,
    block_k: int | None = None,
    launch: KernelLaunch | None = None,
    interpret: bool | None = None,
) -> jax.Array:
    """Softmax(q·kᵀ/√Dh + r, masked)·v with the relative bias r computed inside the kernel.

    Equals ``reference_attention(q, k, v, bias=relative.materialise(), mask=mask)`` (``bias``
    None when ``relative`` is None), forward and gradients, without a ``[B, H, Tq, Tk]`` array.
    Gradients flow to q, k, v, ``relative.table`` and ``relative.factor``.

    Args:
      q: ``[B, Tq, H, Dh]`` queries; k, v: ``[B, Tk, H, Dh]`` (one float dtype for all three).
      mask: optional bool, broadcastable to ``[B, H, Tq, Tk]`` (True = may attend); it is
        passed block by block in its own shape (not broadcast over heads or batch). Or a
        :class:`TokenMask`, whose rule the kernels evaluate per tile from its ``[B, T]``
        features (no ``[.., Tq, Tk]`` array at all).
      relative: optional relative-bias description (``factor`` None means 1).
      dropout_rate: attention dropout (0: none); applied when ``dropout_rng`` is given, with
        the bits of ``attention_dropout.keep_mask(dropout_rng, 1 - rate, B, H, Tq, Tk,
        dropout_row_ids)``, drawn inside the kernel tile by tile.
      dropout_rng: PRNG key of the dropout; dropout_row_ids: ``[B]`` row ids (default arange).
      dropout_keys: ``[B, H]`` int32 ``attention_dropout.row_head_key`` values, instead of
        `dropout_rng` and `dropout_row_ids` (what a caller that shards rows or heads passes:
        the keys of the global rows and heads).
      block_q, block_k: tile sizes of all three kernels, powers of two >= 16, clipped to
        the padded lengths; they override ``launch``'s tiles.
      launch: each kernel's tile, warps and stages; default `GPU_LAUNCH` compiled,
        `INTERPRET_LAUNCH` interpreted. Any launch gives the same results up to float
        rounding (the sum order of the online softmax and of the gradients' tile sums).
      interpret: run the kernels interpreted; default: on CPU.

    Returns:
      ``[B, Tq, H, Dh]`` in q's dtype.
    """
    inputs = prepare(q, k, v, mask=mask, relative=relative, dropout_rate=dropout_rate,
                     dropout_rng=dropout_rng, dropout_row_ids=dropout_row_ids,
                     dropout_keys=dropout_keys, block_q=block_q, block_k=block_k,
                     launch=launch, interpret=interpret)
    out = _flash(inputs.st, *inputs.arrays)
    return out[:, :inputs.tq, :, :inputs.dh]


@dataclasses.dataclass(frozen=True)
class FlashInputs:
    """One call's kernel inputs as `flash_attention` hands them to its kernels (padded to
    the tiles, the mask as int8, the bias's table, positions and factor, the dropout keys,
    a TokenMask's features) with their static settings, and the unpadded lengths: what
    `run_kernel` (and `accelerator.kernel_sweep`) runs one kernel on."""

    st: _Static
    arrays: tuple  # q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens
    tq: int
    dh: int


def prepare(q: jax.Array, k: jax.Array, v: jax.Array, *,
            mask: jax.Array | TokenMask | None = None, relative: RelativeBias | None = None,
            dropout_rate: float = 0.0, dropout_rng: jax.Array | None = None,
            dropout_row_ids: jax.Array | None = None, dropout_keys: jax.Array | None = None,
            block_q: int | None = None, block_k: int | None = None,
            launch: KernelLaunch | None = None, interpret: bool | None = None) -> FlashInputs:
    """The kernels' inputs for `flash_attention`'s arguments (see there)."""
    b_, tq, h_, dh = q.shape
    tk = k.shape[1]
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    launch = _launch(launch, block_q, block_k, bool(interpret), tq, tk)
    bq = max(launch.of(n).block_q for n in KERNELS)  # powers of two: each divides the largest
    bk = max(launch.of(n).block_k for n in KERNELS)
    tq_p, tk_p = bq * pl.cdiv(tq, bq), bk * pl.cdiv(tk, bk)
    dh_p = max(_MIN_BLOCK, pl.next_power_of_2(dh))

    tokens, token_rule, token_names = None, None, ()
    if isinstance(mask, TokenMask):  # evaluated per tile from its [B, T] features
        tokens = _padded_token_features(mask, tq_p, tk_p)
        token_names, token_rule, mask = mask.names(), mask.rule(), None
    # all ones with a TokenMask, but for padded keys: the kernels skip it when none are
    array_mask = not (token_names and tk == tk_p)
    mask = _array_mask(mask, tk, tq_p, tk_p, jnp.int8)

    q = _pad_axis(_pad_axis(q, 1, tq_p), 3, dh_p)
    k = _pad_axis(_pad_axis(k, 1, tk_p), 3, dh_p)
    v = _pad_axis(_pad_axis(v, 1, tk_p), 3, dh_p)

    table = pos_q = pos_k = factor = None
    num_buckets = max_distance = 0
    if relative is not None:
        table, pos_q, pos_k, factor = _relative_inputs(relative, b_, h_, tq, tk, tq_p, tk_p)
        num_buckets, max_distance = relative.num_buckets, relative.max_distance
        table = _pad_axis(table, 1, pl.next_power_of_2(num_buckets))  # [H, NBp]

    drop_key, keep_threshold, keep_prob = _dropout_inputs(
        dropout_rate, b_, h_, dropout_rng, dropout_row_ids, dropout_keys)
    if drop_key is not None:
        drop_key = jnp.broadcast_to(drop_key[:, :, None], (b_, h_, tq_p))  # per query row, as lse

    st = _Static(
        scale=1.0 / math.sqrt(dh),
        num_buckets=num_buckets,
        max_distance=max_distance,
        mask_b=mask.shape[0] > 1,
        mask_h=mask.shape[1] > 1,
        mask_q=mask.shape[2] > 1,
        interpret=bool(interpret),
        keep_threshold=keep_threshold,
        keep_prob=keep_prob,
        token_rule=token_rule,
        token_names=token_names,
        launch=launch,
        array_mask=array_mask,
    )
    return FlashInputs(st, (q, k, v, mask, table, pos_q, pos_k, factor, drop_key, tokens),
                       tq, dh)


def run_kernel(inputs: FlashInputs, kernel: str, launch: Launch, *, o: jax.Array | None = None,
               lse: jax.Array | None = None, do: jax.Array | None = None) -> tuple:
    """Runs one of the three kernels on prepared ``inputs`` with ``launch``: "forward" ->
    (o, lse); "dkv" -> (dk, dv); "dq" -> (dq, d(table) or None, d(factor) or None). The
    backward kernels take the forward's padded ``o`` and ``lse`` and the padded output
    cotangent ``do``. For timing and checking each kernel apart; ``launch``'s tiles must
    divide the padded lengths ``inputs`` was prepared for."""
    q, k = inputs.arrays[0], inputs.arrays[1]
    for axis, length in (("block_q", q.shape[1]), ("block_k", k.shape[1])):
        tile = getattr(launch, axis)
        if tile < _MIN_BLOCK or tile & (tile - 1) or length % tile:
            raise ValueError(f"run_kernel: {kernel} {axis}={tile} does not tile the prepared "
                             f"length {length} (a power of two >= 16 that divides it)")
    st = dataclasses.replace(inputs.st, launch=inputs.st.launch.replace(kernel, launch))
    if kernel == "forward":
        return _forward(st, *inputs.arrays)
    if o is None or lse is None or do is None:
        raise ValueError(f"run_kernel: the {kernel} kernel needs the forward's o and lse and "
                         "the cotangent do")
    delta = jnp.einsum("bqhd,bqhd->bhq", o.astype(_F32), do.astype(_F32))
    return (_dkv if kernel == "dkv" else _dq)(st, *inputs.arrays, lse, delta, do)
