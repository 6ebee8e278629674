"""Tests for xlm_jax.models.fused_attention: the Pallas kernel with the relative bias inside.

The oracle is the XLA path as the library defines it: ``reference_attention`` with the bias
materialised by ``RelativePositionTable`` and ``gated_relative_bias`` (gradients: ``jax.vjp``
of that). On CPU the kernels run interpreted. Shapes are small (T=40, blocks of 16, so T is
padded to 48 inside the kernel wrapper) to keep the file fast.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import attention, fused_attention, masks, position

B, T, H, DH = 2, 40, 2, 8
BLOCK = 16
NUM_BUCKETS, MAX_DISTANCE = 12, 20  # 12 is padded to 16 in the kernel; distances saturate
TOL = dict(rtol=1e-5, atol=1e-5)


@dataclasses.dataclass(frozen=True)
class Case:
    """One attention problem: mask kind, bias kind ("gated", "raw" table only, "none")."""

    mask: str
    bias: str = "gated"
    tq: int = T
    tk: int = T
    heads: int = H


CASES = {
    "gated_padding": Case("padding"),
    "gated_packing": Case("packing"),
    "gated_no_mask_aligned": Case("none", tq=32, tk=32),
    "raw_cross_key_mask": Case("keys", bias="raw", tq=24, tk=40),
    "plain_padding": Case("padding", bias="none"),
    "gated_head_mask": Case("random_heads"),
    # 4 x 4 tiles: the corner tiles lie MAX_DISTANCE or more apart (one saturated bucket,
    # the kernels' far-tile branch), the others span one to all buckets
    "gated_far_tiles": Case("padding", tq=64, tk=64),
}


def _inputs(case: Case, seed: int = 0, dtype=jnp.float32):
    """Random q, k, v, table, gate params, positions, mask and output cotangent for ``case``."""
    rng = np.random.default_rng(seed)
    h = case.heads
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
    q, k, v = f(B, case.tq, h, DH), f(B, case.tk, h, DH), f(B, case.tk, h, DH)
    table = f(NUM_BUCKETS, h)
    gates = (f(h, DH) * 0.5, f(h, DH) * 0.5, f(h))
    pos_q = np.tile(np.arange(case.tq), (B, 1))
    pos_k = np.tile(np.arange(case.tk), (B, 1))
    valid = np.arange(case.tq)[None] < np.array([[case.tq - 9], [case.tq]])
    if case.mask == "padding":
        mask = masks.padding_mask(valid)
    elif case.mask == "packing":
        seg = np.concatenate([np.ones((B, 15)), np.full((B, 20), 2), np.zeros((B, 5))], 1)
        seg[1, 25:] = 3  # row 1: a third example, no padding
        seg = seg.astype(np.int32)
        pos_q = pos_k = np.stack([_restarting_positions(s) for s in seg])
        mask = masks.segment_mask(seg)
    elif case.mask == "keys":  # [B, 1, 1, Tk]: a key-padding mask without a query axis
        mask = jnp.asarray(np.arange(case.tk)[None] < np.array([[30], [case.tk]]))[:, None, None]
    elif case.mask == "random_heads":  # [B, H, Tq, Tk] with whole rows masked
        m = rng.random((B, h, case.tq, case.tk)) < 0.6
        m[0, 1, 3, :] = False
        m[1, :, 20:23, :] = False
        mask = jnp.asarray(m)
    else:
        mask = None
    if case.bias == "raw":
        pos_q = pos_q + 5  # cross-attention: queries and keys at different offsets
    cot = f(B, case.tq, h, DH)
    cast = lambda x: x.astype(dtype)
    return dict(
        qkv=(cast(q), cast(k), cast(v)),
        params=(table, *gates),
        pos=(jnp.asarray(pos_q, jnp.int32), jnp.asarray(pos_k, jnp.int32)),
        mask=mask,
        cot=cast(cot),
    )


def _restarting_positions(seg: np.ndarray) -> np.ndarray:
    """0-based positions restarting at every new segment id."""
    out = np.zeros_like(seg)
    for i in range(1, len(seg)):
        out[i] = out[i - 1] + 1 if seg[i] == seg[i - 1] else 0
    return out


def _reference(case: Case, pos, mask, q, k, v, table, u, gv, w):
    """The XLA oracle: table module -> gate -> materialised bias -> reference_attention."""
    bias = None
    if case.bias != "none":
        module = position.RelativePositionTable(
            num_heads=case.heads, num_buckets=NUM_BUCKETS, max_distance=MAX_DISTANCE
        )
        bias = module.apply({"params": {"rel_embedding": table}}, *pos)
        if case.bias == "gated":
            bias = position.gated_relative_bias(q, bias, u, gv, w)
    return attention.reference_attention(q, k, v, bias=bias, mask=mask)


def _pallas(case: Case, pos, mask, q, k, v, table, u, gv, w):
    """The kernel, with the gate factor computed outside it as plain JAX."""
    relative = None
    if case.bias != "none":
        factor = position.gate_factor(q, u, gv, w) if case.bias == "gated" else None
        relative = position.RelativeBias(
            table, pos[0], pos[1], factor, num_buckets=NUM_BUCKETS, max_distance=MAX_DISTANCE
        )
    return fused_attention.flash_attention(
        q, k, v, mask=mask, relative=relative, block_q=BLOCK, block_k=BLOCK
    )


def _forward_and_grads(fn, case: Case, data):
    """(output, grads w.r.t. q, k, v, table, u, v_gate, w) of ``<out, cotangent>``."""

    @jax.jit
    def run(qkv, params, pos, mask, cot):
        out, vjp = jax.vjp(lambda *a: fn(case, pos, mask, *a), *qkv, *params)
        return out, vjp(cot)

    return run(data["qkv"], data["params"], data["pos"], data["mask"], data["cot"])


@functools.lru_cache(maxsize=None)
def _results(name: str):
    """Both paths on one case, computed once and shared by the forward and gradient tests."""
    case = CASES[name]
    data = _inputs(case, seed=len(name))
    return (
        data,
        _forward_and_grads(_reference, case, data),
        _forward_and_grads(_pallas, case, data),
    )


def _dead_rows(mask, tq: int, heads: int) -> np.ndarray:
    """[B, H, Tq] True where the query row has no visible key."""
    m = np.asarray(mask)
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    return ~np.broadcast_to(m.any(-1), (B, heads, tq))


@pytest.mark.parametrize("name", list(CASES))
def test_forward_matches_reference(name):
    data, (ref_out, _), (got, _) = _results(name)
    case = CASES[name]
    assert got.shape == (B, case.tq, case.heads, DH) and got.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got), np.asarray(ref_out), **TOL)
    assert float(jnp.max(jnp.abs(ref_out))) > 0.1  # not a trivially zero comparison


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_match_reference(name):
    data, (_, ref_grads), (_, got_grads) = _results(name)
    labels = ["q", "k", "v", "table", "gate_u", "gate_v", "gate_w"]
    with_bias = CASES[name].bias != "none"
    gated = CASES[name].bias == "gated"
    for label, r, g in zip(labels, ref_grads, got_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(r), err_msg=label, **TOL)
        # The parameters the case uses must receive a real gradient (else the check is empty).
        used = label in ("q", "k", "v") or (label == "table" and with_bias) or gated
        assert (float(jnp.max(jnp.abs(r))) > 1e-3) == used, label


@pytest.mark.parametrize("name", ["gated_padding", "gated_head_mask"])
def test_fully_masked_rows_give_zero_output_and_gradient(name):
    data, (ref_out, ref_grads), (got, got_grads) = _results(name)
    case = CASES[name]
    dead = _dead_rows(data["mask"], case.tq, case.heads)
    assert dead.any()
    b, h, i = np.nonzero(dead)
    assert np.all(np.asarray(data["cot"])[b, i, h] != 0)  # a gradient is pushed into them
    np.testing.assert_array_equal(np.asarray(got)[b, i, h], 0.0)
    dq = np.asarray(got_grads[0])
    np.testing.assert_array_equal(dq[b, i, h], 0.0)
    assert np.all(np.isfinite(dq)) and np.any(dq != 0)


def _shapes_in_jaxpr(jaxpr) -> set[tuple[int, ...]]:
    """Every array shape in a jaxpr and its sub-jaxprs (pallas kernels, loops, custom rules)."""
    shapes = set()
    for var in list(jaxpr.invars) + list(jaxpr.outvars) + list(jaxpr.constvars):
        shapes.add(tuple(getattr(var.aval, "shape", ())))
    for eqn in jaxpr.eqns:
        for var in list(eqn.invars) + list(eqn.outvars):
            shapes.add(tuple(getattr(var.aval, "shape", ())))
        for param in eqn.params.values():
            for p in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(p, "jaxpr", p)
                if hasattr(inner, "eqns"):
                    shapes |= _shapes_in_jaxpr(inner)
    return shapes


def _hlo_shapes(text: str) -> set[tuple[int, ...]]:
    """Static shapes of every ``tensor<AxBx...xT>`` in StableHLO text."""
    found = set()
    for dims in re.findall(r"tensor<((?:\d+x)+)[a-z]", text):
        found.add(tuple(int(d) for d in dims.rstrip("x").split("x")))
    return found


def test_no_b_h_tq_tk_array_in_forward_or_backward():
    # H=3 and T=40 (48 padded) make [B, H, Tq, Tk] unambiguous: no other array is that large.
    case = Case("padding", heads=3)
    data = _inputs(case, seed=7)
    big = B * case.heads * case.tq * case.tk

    def largest(fn):
        def loss(qkv, params):
            return jnp.sum(fn(case, data["pos"], data["mask"], *qkv, *params) * data["cot"])

        grad = jax.grad(loss, argnums=(0, 1))
        args = (data["qkv"], data["params"])
        jaxpr_shapes = _shapes_in_jaxpr(jax.make_jaxpr(grad)(*args).jaxpr)
        hlo_shapes = _hlo_shapes(jax.jit(grad).lower(*args).as_text())
        sizes = [int(np.prod(s)) for s in jaxpr_shapes | hlo_shapes]
        return max(sizes), jaxpr_shapes | hlo_shapes

    ref_max, ref_shapes = largest(_reference)
    assert (B, case.heads, case.tq, case.tk) in ref_shapes and ref_max >= big
    got_max, got_shapes = largest(_pallas)
    assert got_max < big, sorted(s for s in got_shapes if np.prod(s) >= big)


def test_entry_point_materialises_the_description_for_other_backends():
    # The "pallas" backend through the entry point is checked in the layer test below.
    data, (ref_out, _), _ = _results("gated_packing")
    (q, k, v), (table, u, gv, w) = data["qkv"], data["params"]
    relative = position.RelativeBias(
        table, *data["pos"], position.gate_factor(q, u, gv, w), NUM_BUCKETS, MAX_DISTANCE
    )
    for backend in ("xla", "auto"):  # "auto" is the XLA path on CPU
        got = attention.dot_product_attention(
            q, k, v, mask=data["mask"], relative=relative, backend=backend
        )
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref_out), **TOL)
    # cuDNN takes no bias: asked for by name, it says so instead of materialising
    with pytest.raises(attention.AttentionBackendError, match="'cudnn'"):
        attention.dot_product_attention(q, k, v, mask=data["mask"], relative=relative,
                                        backend="cudnn")


@pytest.mark.parametrize("name", ["gated_padding", "plain_padding", "raw_cross_key_mask"])
def test_dropout_in_the_kernel_equals_the_xla_path_on_the_same_bits(name):
    """Attention dropout inside the kernel (forward and both backward kernels) against the XLA
    path, which draws the same `attention_dropout` bits as a whole [B, H, Tq, Tk] mask; the
    row ids make the bits a row's own (a microbatch gets the rows' bits)."""
    case = CASES[name]
    data = _inputs(case, seed=11)
    q, k, v = data["qkv"]
    rel = None
    if case.bias != "none":
        table = data["params"][0]
        rel = position.RelativeBias(table, data["pos"][0], data["pos"][1], None,
                                    NUM_BUCKETS, MAX_DISTANCE)
    kw = dict(dropout_rate=0.3, dropout_rng=jax.random.PRNGKey(4), deterministic=False,
              dropout_row_ids=jnp.array([7, 2]), mask=data["mask"], relative=rel)
    run = lambda backend: lambda q, k, v: attention.dot_product_attention(
        q, k, v, backend=backend, **kw)
    got, pull_got = jax.vjp(run("pallas"), q, k, v)
    want, pull_want = jax.vjp(run("xla"), q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), **TOL)
    for g, w in zip(pull_got(data["cot"]), pull_want(data["cot"])):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), **TOL)
    # dropout did act: the deterministic output differs
    plain = attention.dot_product_attention(q, k, v, backend="xla", mask=data["mask"],
                                            relative=rel)
    assert not np.allclose(np.asarray(plain), np.asarray(want), atol=1e-3)


def test_pallas_asked_for_with_an_additive_bias_is_a_one_line_error():
    q = jnp.zeros((B, 8, H, DH))
    with pytest.raises(attention.AttentionBackendError,
                       match=r"layer enc/3: backend 'pallas' cannot run.*additive bias"):
        attention.dot_product_attention(q, q, q, bias=jnp.zeros((B, H, 8, 8)), backend="pallas",
                                        layer="enc/3")


def test_bf16_smoke_matches_reference_loosely():
    case = CASES["gated_padding"]
    data = _inputs(case, seed=5, dtype=jnp.bfloat16)
    args = (case, data["pos"], data["mask"], *data["qkv"], *data["params"])
    got = jax.jit(_pallas, static_argnums=0)(*args)
    expected = _reference(*args)
    assert got.dtype == jnp.bfloat16
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(expected, np.float32), rtol=2e-2, atol=2e-2
    )


def test_constants_and_bad_arguments():
    assert fused_attention.MASK_VALUE == attention._MASK_VALUE  # noqa: SLF001
    q = jnp.zeros((1, 16, 1, DH))
    with pytest.raises(ValueError, match="block_q must be a power of two >= 16, got 24"):
        fused_attention.flash_attention(q, q, q, block_q=24)
    bad = position.RelativeBias(jnp.zeros((NUM_BUCKETS, 2)), jnp.zeros((1, 16), jnp.int32),
                                jnp.zeros((1, 16), jnp.int32), None, NUM_BUCKETS, MAX_DISTANCE)
    with pytest.raises(ValueError, match="table must have shape"):
        attention.dot_product_attention(q, q, q, backend="pallas", relative=bad)


def test_attention_layer_takes_the_description_on_the_pallas_backend():
    """MultiHeadAttention given a RelativeBias on "pallas" equals it given d on "xla"."""
    from xlm_jax.models import config as config_lib
    from xlm_jax.models import transformer

    cfg = config_lib.get_config(
        "tiny", hidden_size=H * DH, num_heads=H, num_layers=1, mlp_dim=32,
        position_type="relative", relative_buckets=NUM_BUCKETS,
        relative_max_distance=MAX_DISTANCE,
    )
    data = _inputs(CASES["gated_packing"], seed=13)
    pos, mask = data["pos"][0], data["mask"]
    x = jnp.asarray(np.random.default_rng(14).normal(size=(B, T, H * DH)), jnp.float32)
    table = position.RelativePositionTable(
        num_heads=H, num_buckets=NUM_BUCKETS, max_distance=MAX_DISTANCE
    )
    table_vars = {"params": {"rel_embedding": data["params"][0]}}
    d = table.apply(table_vars, pos, pos)
    described = table.apply(table_vars, pos, pos, describe=True)
    assert isinstance(described, position.RelativeBias)
    layer = transformer.MultiHeadAttention(cfg, gated_bias=True)
    params = layer.init(jax.random.PRNGKey(0), x, x, mask, d, True)
    expected = layer.apply(params, x, x, mask, d, True)
    pallas_layer = transformer.MultiHeadAttention(
        dataclasses.replace(cfg, attention_backend="pallas"), gated_bias=True
    )
    got = jax.jit(lambda p, r: pallas_layer.apply(p, x, x, mask, r, True))(params, described)
    np.testing.assert_allclose(np.asarray(got), np.asarray(expected), **TOL)


@pytest.mark.parametrize("scan_layers", [False, True])
def test_encoder_with_gated_bias_on_pallas_equals_xla(scan_layers):
    """A whole XLM-E-style encoder (gated bias on a shared table, absolute table too, padding)
    on the "pallas" backend: hidden states and parameter gradients equal the XLA backend's,
    and its jaxpr holds no [B, H, T, T] array (the XLA model's does)."""
    from flax import linen as nn

    from xlm_jax.models.config import get_config
    from xlm_jax.models.transformer import Transformer

    b, t, h = 2, 20, 2
    cfg = get_config("tiny", num_layers=2, hidden_size=32, num_heads=h, mlp_dim=64,
                     vocab_size=64, position_type="both", dropout_rate=0.0,
                     attention_dropout_rate=0.0, scan_layers=scan_layers)
    ids = np.array(jax.random.randint(jax.random.PRNGKey(0), (b, t), 4, 60))
    ids[1, 13:] = cfg.pad_id
    ids = jnp.asarray(ids)
    xla = Transformer(cfg, with_mlm_head=False)
    fused = Transformer(cfg.replace(attention_backend="pallas"), with_mlm_head=False)
    params = nn.meta.unbox(jax.jit(xla.init)(jax.random.PRNGKey(1), ids)["params"])

    def loss(model, p):
        out = model.apply({"params": p}, ids).last_hidden_state
        return jnp.sum(out * jnp.cos(jnp.arange(out.size).reshape(out.shape)))

    # jitted: run eagerly, every primitive of both backward passes compiled on its own
    want, want_g = jax.jit(jax.value_and_grad(functools.partial(loss, xla)))(params)
    got, got_g = jax.jit(jax.value_and_grad(functools.partial(loss, fused)))(params)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    # one scale for all leaves: the key bias's true gradient is 0 (softmax is shift-invariant
    # per query), so its two round-off values (~1e-10) share no digits
    scale = max(float(np.abs(w).max()) for w in jax.tree_util.tree_leaves(want_g))
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got_g),
                            jax.tree_util.tree_leaves(want_g)):
        np.testing.assert_allclose(g, w, rtol=0, atol=1e-5 * scale,
                                   err_msg=jax.tree_util.keystr(path))
    gate = "gate_u"
    assert any(gate in jax.tree_util.keystr(p) and np.abs(g).max() > 0
               for p, g in jax.tree_util.tree_leaves_with_path(got_g))
    full = f"[{b},{h},{t},{t}]"
    assert full in str(jax.make_jaxpr(jax.grad(functools.partial(loss, xla)))(params))
    assert full not in str(jax.make_jaxpr(jax.grad(functools.partial(loss, fused)))(params))
