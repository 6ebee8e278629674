"""`TokenMask`: the attention mask described by per-token ids.

Its array (`materialise`) must be the `masks` builders' entry for entry, its per-tile rule
(`tile`, what the fused kernels evaluate) must be that array, and the Triton kernel given a
TokenMask must equal the XLA path given the array (forward, gradients, with the relative
bias and dropout), for every rule the objectives use.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import attention, attention_backends, fused_attention, masks, position
from xlm_jax.models.token_mask import TokenMask

B, T, H, DH = 2, 40, 2, 8
SEG = np.concatenate([np.ones((B, 15)), np.full((B, 20), 2), np.zeros((B, 5))], 1).astype(
    np.int32)
SEG[1, 25:] = 3
POS = np.stack([np.concatenate([np.arange(15), np.arange(20), np.zeros(5)]),
                np.concatenate([np.arange(15), np.arange(10), np.arange(15)])]).astype(np.int32)
SIDE = np.where(np.arange(T)[None] < 18, 1, 2).repeat(B, 0).astype(np.int32)
SIDE[0, 35:] = 0


def _rules():
    seg = TokenMask.segments(SEG)
    return {
        "padding": (TokenMask.padding(SEG > 0), masks.padding_mask(SEG > 0)),
        "segments": (seg, masks.segment_mask(SEG)),
        "causal": (seg.causal(POS), masks.mask_from_features(
            {"segment_ids": SEG, "positions": POS}, "causal")),
        "camlm_pass": (seg.side_rule(SIDE, masks.CAMLM_PASS_ALLOWED[2], True),
                       masks.combine(masks.segment_mask(SEG), masks.camlm_pass_mask(SIDE, 2))),
        "camlm_features": (TokenMask.from_features({"pair_side": SIDE}, "camlm"),
                           masks.mask_from_features({"pair_side": SIDE}, "camlm")),
        "btmlm": (TokenMask.from_features({"segment_ids": SEG, "pair_side": SIDE},
                                          "btmlm_stage1"),
                  masks.mask_from_features({"segment_ids": SEG, "pair_side": SIDE},
                                           "btmlm_stage1")),
        "cross": (TokenMask.padding(SEG[:, :24] > 0, SEG > 0),
                  masks.padding_mask(SEG[:, :24] > 0, SEG > 0)),
    }


@pytest.mark.parametrize("name", list(_rules()))
def test_materialise_and_tile_are_the_builders_array(name):
    tm, want = _rules()[name]
    want = np.asarray(want)
    np.testing.assert_array_equal(np.asarray(tm.materialise()), want)
    assert tm.shape == want.shape
    f = tm.features()
    q = {n[:-2]: v[:, :, None] for n, v in f.items() if n.endswith("_q")}
    k = {n[:-2]: v[:, None, :] for n, v in f.items() if n.endswith("_k")}
    tq, tk = want.shape[2:]
    got = tm.tile(q, k, jnp.arange(tq)[:, None], jnp.arange(tk)[None, :])
    np.testing.assert_array_equal(np.broadcast_to(np.asarray(got), want[:, 0].shape), want[:, 0])
    # a pytree: through jit and back unchanged
    again = jax.jit(lambda m: m)(tm)
    np.testing.assert_array_equal(np.asarray(again.materialise()), want)


@pytest.mark.parametrize("name", ["segments", "causal", "camlm_pass", "cross"])
def test_kernel_with_a_token_mask_equals_xla_with_its_array(name):
    tm, array = _rules()[name]
    tq, tk = array.shape[2:]
    rng = np.random.default_rng(1)
    f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)
    q, k, v, cot = f(B, tq, H, DH), f(B, tk, H, DH), f(B, tk, H, DH), f(B, tq, H, DH)
    table = f(12, H)
    pq, pk = jnp.asarray(np.tile(np.arange(tq), (B, 1))), jnp.asarray(np.tile(np.arange(tk), (B, 1)))
    kw = dict(dropout_rate=0.2, dropout_rng=jax.random.PRNGKey(3), deterministic=False)

    def run(backend, mask):
        def fn(q, k, v, table):
            rel = position.RelativeBias(table, pq, pk, None, 12, 20)
            return attention.dot_product_attention(q, k, v, mask=mask, relative=rel,
                                                   backend=backend, **kw)
        return jax.vjp(fn, q, k, v, table)

    got, pull_got = run("pallas", tm)
    want, pull_want = run("xla", array)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    for g, w in zip(pull_got(cot), pull_want(cot)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    # the rule matters: a kernel ignoring it would equal the padding-free result
    loose = fused_attention.flash_attention(q, k, v, relative=position.RelativeBias(
        table, pq, pk, None, 12, 20), dropout_rate=0.2, dropout_rng=jax.random.PRNGKey(3))
    assert not np.allclose(np.asarray(loose), np.asarray(got), atol=1e-3)


def test_cudnn_lengths_only_for_one_segment_then_padding():
    """cuDNN takes a segments-only TokenMask as sequence lengths; a packed row is flagged
    (its output becomes NaN) instead of attending across examples."""
    seg = jnp.asarray([[1, 1, 1, 0, 0], [2, 2, 2, 2, 2], [1, 1, 2, 2, 0], [0, 0, 0, 0, 0],
                       [1, 0, 1, 0, 0]])
    n, ok = attention_backends._prefix_lengths(seg)  # noqa: SLF001
    assert n.tolist() == [3, 5, 4, 0, 2]
    assert ok.tolist() == [True, True, False, True, False]
    assert attention_backends._lengths_only(TokenMask.segments(seg))  # noqa: SLF001
    assert not attention_backends._lengths_only(TokenMask.segments(seg).causal(seg))  # noqa: SLF001


@pytest.mark.parametrize("name", ["segments", "causal"])
def test_kernel_reads_no_array_mask_when_no_key_is_padding(name):
    """A length the tiles divide: the kernels decide by the TokenMask alone (its all-ones
    array mask is not read, `array_mask` False), and tokens with id 0 inside the length stay
    hidden, as the XLA path with the array has them."""
    seg, pos = SEG[:, 8:], POS[:, 8:]  # 32 tokens; row 0's last 5 and row 1's none are id 0
    tm = TokenMask.segments(seg)
    array = masks.segment_mask(seg)
    if name == "causal":
        tm = tm.causal(pos)
        array = masks.mask_from_features({"segment_ids": seg, "positions": pos}, "causal")
    t = seg.shape[1]
    rng = np.random.default_rng(2)
    f = lambda *s: jnp.asarray(rng.normal(size=s), jnp.float32)  # noqa: E731
    q, k, v, cot = (f(B, t, H, DH) for _ in range(4))
    drop = dict(dropout_rate=0.2, dropout_rng=jax.random.PRNGKey(5))
    assert fused_attention.prepare(q, k, v, mask=tm, block_q=16, block_k=16,
                                   **drop).st.array_mask is False
    got, pull_got = jax.vjp(lambda q, k, v: fused_attention.flash_attention(
        q, k, v, mask=tm, block_q=16, block_k=16, **drop), q, k, v)
    want, pull_want = jax.vjp(lambda q, k, v: attention.dot_product_attention(
        q, k, v, mask=array, backend="xla", deterministic=False, **drop), q, k, v)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
    for g, w in zip(pull_got(cot), pull_want(cot)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
