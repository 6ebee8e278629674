"""Tests for xlm_jax.models.attention against an independent float64 numpy softmax reference."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import attention, masks

B, T, H, DH = 2, 7, 3, 8


def np_attention(q, k, v, bias=None, mask=None, keep=None, rate=0.0):
    """Float64 loop reference: softmax over the visible keys only; rows with none give zeros."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    b_, tq, h_, dh = q.shape
    tk = k.shape[1]
    logits = np.einsum("bqhd,bkhd->bhqk", q, k) / np.sqrt(dh)
    if bias is not None:
        logits = logits + np.broadcast_to(np.asarray(bias, np.float64), logits.shape)
    vis = np.ones(logits.shape, bool)
    if mask is not None:
        vis = np.broadcast_to(np.asarray(mask, bool), logits.shape)
    out = np.zeros((b_, tq, h_, v.shape[-1]))
    for b in range(b_):
        for h in range(h_):
            for i in range(tq):
                idx = [j for j in range(tk) if vis[b, h, i, j]]
                if not idx:
                    continue
                row = logits[b, h, i, idx]
                p = np.exp(row - row.max())
                p = p / p.sum()
                if keep is not None:
                    p = p * np.asarray(keep)[b, h, i, idx] / (1.0 - rate)
                out[b, i, h] = p @ v[b, idx, h]
    return out


def _qkv(seed, tq=T, tk=T, dh=DH, dtype=jnp.float32):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, tq, H, dh)).astype(np.float32)
    k = rng.normal(size=(B, tk, H, dh)).astype(np.float32)
    v = rng.normal(size=(B, tk, H, dh)).astype(np.float32)
    return jnp.asarray(q, dtype), jnp.asarray(k, dtype), jnp.asarray(v, dtype)


def _random_mask(seed, tq=T, tk=T):
    rng = np.random.default_rng(seed)
    m = rng.random((B, H, tq, tk)) < 0.5
    m[0, 1, 2, :] = False  # guarantee fully masked rows
    m[1, :, 0, :] = False
    return jnp.asarray(m)


VALID = np.array([[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0]], bool)
SEGMENTS = np.array([[1, 1, 1, 2, 2, 0, 0], [1, 1, 2, 2, 2, 3, 0]])
POSITIONS = np.array([[0, 1, 2, 0, 1, 0, 0], [0, 1, 0, 1, 2, 0, 0]])
CAMLM_SIDES = np.array([[1, 1, 1, 2, 2, 2, 0], [1, 1, 2, 2, 0, 0, 0]])
BTMLM_SIDES = np.array([[1, 1, 1, 1, 2, 2, 0], [1, 1, 1, 2, 2, 2, 2]])


def _mask_family(name):
    if name == "padding":
        return masks.padding_mask(VALID)
    if name == "packing":
        return masks.segment_mask(SEGMENTS)
    if name == "camlm":
        return masks.camlm_mask(CAMLM_SIDES)
    if name == "btmlm_stage1":
        return masks.btmlm_stage1_mask(BTMLM_SIDES)
    if name == "causal_packed":
        return masks.combine(masks.segment_mask(SEGMENTS), masks.causal_mask(POSITIONS))
    if name == "random":
        return _random_mask(3)
    if name == "none":
        return None
    raise AssertionError(name)


FAMILIES = ["padding", "packing", "camlm", "btmlm_stage1", "causal_packed", "random", "none"]


def _assert_masked_rows_zero(out, mask):
    """Rows whose mask is all False must be exactly zero (per head)."""
    out = np.asarray(out)
    assert np.all(np.isfinite(out))
    if mask is None:
        return
    m = np.broadcast_to(
        np.asarray(mask), (out.shape[0], out.shape[2], out.shape[1], mask.shape[-1])
    )
    dead = ~m.any(-1)  # [B, H, Tq]
    assert dead.any(), "test setup: expected at least one fully masked row"
    b, h, i = np.nonzero(dead)
    np.testing.assert_array_equal(out[b, i, h], 0.0)


@pytest.mark.parametrize("family", FAMILIES)
def test_matches_numpy_reference_per_mask_family(family):
    q, k, v = _qkv(0)
    mask = _mask_family(family)
    got = jax.jit(lambda q, k, v, m: attention.dot_product_attention(q, k, v, mask=m))(
        q, k, v, mask
    )
    np.testing.assert_allclose(
        np.asarray(got), np_attention(q, k, v, mask=mask), atol=1e-5, rtol=1e-5
    )
    assert got.shape == (B, T, H, DH) and got.dtype == jnp.float32
    if family != "none":
        _assert_masked_rows_zero(got, mask)


@pytest.mark.parametrize("bias_shape", [(B, H, T, T), (1, H, T, T), (H, T, T), (B, 1, 1, T)])
def test_additive_bias_with_mask(bias_shape):
    q, k, v = _qkv(1)
    bias = jnp.asarray(np.random.default_rng(2).normal(size=bias_shape).astype(np.float32) * 3)
    mask = _mask_family("packing")
    got = attention.dot_product_attention(q, k, v, bias=bias, mask=mask)
    np.testing.assert_allclose(
        np.asarray(got), np_attention(q, k, v, bias=bias, mask=mask), atol=1e-5, rtol=1e-5
    )
    _assert_masked_rows_zero(got, mask)


def test_bias_changes_result():
    """Guards the bias test itself: a nonzero bias must move the output."""
    q, k, v = _qkv(1)
    bias = jnp.asarray(np.random.default_rng(2).normal(size=(B, H, T, T)).astype(np.float32) * 3)
    a = attention.dot_product_attention(q, k, v, bias=bias)
    b = attention.dot_product_attention(q, k, v)
    assert np.max(np.abs(np.asarray(a) - np.asarray(b))) > 1e-2


@pytest.mark.parametrize("kind", ["padding", "random"])
def test_cross_attention_tq_ne_tk(kind):
    tq, tk = 5, 7
    q, k, v = _qkv(4, tq=tq, tk=tk)
    if kind == "padding":
        valid_q = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
        mask = masks.padding_mask(valid_q, VALID)
    else:
        mask = _random_mask(5, tq=tq, tk=tk)
    got = attention.dot_product_attention(q, k, v, mask=mask)
    assert got.shape == (B, tq, H, DH)
    np.testing.assert_allclose(
        np.asarray(got), np_attention(q, k, v, mask=mask), atol=1e-5, rtol=1e-5
    )
    _assert_masked_rows_zero(got, mask)


def test_fully_masked_everything_is_zero_not_nan():
    q, k, v = _qkv(6)
    mask = jnp.zeros((B, 1, T, T), bool)
    got = attention.dot_product_attention(q, k, v, mask=mask)
    np.testing.assert_array_equal(np.asarray(got), 0.0)


@pytest.mark.parametrize("family", ["padding", "packing", "camlm", "causal_packed", "random"])
def test_gradients_finite_with_fully_masked_rows(family):
    q, k, v = _qkv(7)
    bias = jnp.asarray(np.random.default_rng(8).normal(size=(B, H, T, T)).astype(np.float32))
    mask = _mask_family(family)
    cot = jnp.asarray(np.random.default_rng(9).normal(size=(B, T, H, DH)).astype(np.float32))

    def loss(q, k, v, bias):
        return jnp.sum(attention.dot_product_attention(q, k, v, bias=bias, mask=mask) * cot)

    grads = jax.jit(jax.grad(loss, argnums=(0, 1, 2, 3)))(q, k, v, bias)
    for g in grads:
        assert np.all(np.isfinite(np.asarray(g)))
    gq, _, _, gbias = (np.asarray(g) for g in grads)
    m = np.broadcast_to(np.asarray(mask), (B, H, T, T))
    # No gradient flows into masked logits, nor out of fully masked query rows.
    np.testing.assert_array_equal(gbias[~m], 0.0)
    b, h, i = np.nonzero(~m.any(-1))
    np.testing.assert_array_equal(gq[b, i, h], 0.0)
    assert np.abs(gq).max() > 0 and np.abs(gbias).max() > 0


def test_gradients_match_finite_differences_float64():
    """Reverse-mode grads of the masked path agree with central differences (x64)."""
    from jax.test_util import check_grads

    with jax.enable_x64(True):
        rng = np.random.default_rng(10)
        q = jnp.asarray(rng.normal(size=(B, 4, H, DH)))
        k = jnp.asarray(rng.normal(size=(B, 5, H, DH)))
        v = jnp.asarray(rng.normal(size=(B, 5, H, DH)))
        bias = jnp.asarray(rng.normal(size=(B, H, 4, 5)))
        m = rng.random((B, H, 4, 5)) < 0.6
        m[0, 0, 1, :] = False
        mask = jnp.asarray(m)

        def f(q, k, v, bias):
            return attention.dot_product_attention(q, k, v, bias=bias, mask=mask)

        assert f(q, k, v, bias).dtype == jnp.float64
        check_grads(f, (q, k, v, bias), order=1, modes=["rev"], atol=1e-6, rtol=1e-6, eps=1e-5)


def test_bf16_inputs_output_bf16_and_close_to_reference():
    q, k, v = _qkv(11, dtype=jnp.bfloat16)
    mask = _mask_family("packing")
    got = attention.dot_product_attention(q, k, v, mask=mask)
    assert got.dtype == jnp.bfloat16
    ref = np_attention(
        np.asarray(q, np.float32), np.asarray(k, np.float32), np.asarray(v, np.float32), mask=mask
    )
    np.testing.assert_allclose(np.asarray(got, np.float32), ref, atol=3e-2, rtol=3e-2)
    _assert_masked_rows_zero(np.asarray(got, np.float32), mask)


def _np_fmix(x: np.ndarray) -> np.ndarray:
    """murmur3's 32-bit finaliser in numpy uint32 (independent of the int32 jnp version)."""
    x = x.astype(np.uint32)
    x ^= x >> np.uint32(16)
    x = (x * np.uint32(0x85EBCA6B)).astype(np.uint32)
    x ^= x >> np.uint32(13)
    x = (x * np.uint32(0xC2B2AE35)).astype(np.uint32)
    return x ^ (x >> np.uint32(16))


def np_keep_bits(rng, keep_prob: float, rows: np.ndarray) -> np.ndarray:
    """The attention-dropout keep mask [B, H, T, T] from `attention_dropout`'s definition."""
    seed = np.asarray(jax.random.bits(rng, (2,), jnp.uint32))
    gold = np.uint32(0x9E3779B9)
    with np.errstate(over="ignore"):
        r = rows.astype(np.uint32)[:, None, None, None]
        h = np.arange(H, dtype=np.uint32)[None, :, None, None]
        i = np.arange(T, dtype=np.uint32)[None, None, :, None]
        j = np.arange(T, dtype=np.uint32)[None, None, None, :]
        a = _np_fmix(seed[0] ^ _np_fmix(r * gold + np.uint32(1)))
        key = _np_fmix(seed[1] ^ _np_fmix(a + h * gold))
        bits = _np_fmix(key ^ _np_fmix(i * gold + np.uint32(7)))
        bits = _np_fmix(bits + j * np.uint32(0xC2B2AE35))
    return (bits & np.uint32((1 << 24) - 1)) < np.uint32(round(keep_prob * (1 << 24)))


def test_dropout_matches_reference_with_same_keep_mask():
    q, k, v = _qkv(12)
    mask = _mask_family("padding")
    rate = 0.3
    rng = jax.random.PRNGKey(0)
    got = attention.dot_product_attention(
        q, k, v, mask=mask, dropout_rate=rate, dropout_rng=rng, deterministic=False
    )
    keep = np_keep_bits(rng, 1.0 - rate, np.arange(B))
    assert 0 < keep.mean() < 1
    np.testing.assert_allclose(
        np.asarray(got),
        np_attention(q, k, v, mask=mask, keep=keep, rate=rate),
        atol=1e-5,
        rtol=1e-5,
    )
    # deterministic=True ignores the rate entirely.
    det = attention.dot_product_attention(q, k, v, mask=mask, dropout_rate=rate, deterministic=True)
    np.testing.assert_allclose(
        np.asarray(det), np_attention(q, k, v, mask=mask), atol=1e-5, rtol=1e-5
    )


def test_dropout_without_rng_is_an_error():
    q, k, v = _qkv(12)
    with pytest.raises(ValueError, match="dropout_rng"):
        attention.dot_product_attention(q, k, v, dropout_rate=0.1, deterministic=False)


# ---------------------------------------------------------------- cudnn selection / fallback


def test_cudnn_reason_on_cpu():
    q, k, v = _qkv(0, dtype=jnp.bfloat16)
    assert attention.cudnn_unavailable_reason(q, k, v, None, None, 0.0) == "platform is cpu"


@pytest.mark.parametrize(
    "dtype,dh,tq,bias,mask,rate,expected",
    [
        (jnp.bfloat16, 8, 8, None, None, 0.0, None),
        (jnp.float16, 128, 8, None, None, 0.0, None),
        (jnp.bfloat16, 64, 8, None, "mask", 0.0, None),
        (jnp.float32, 8, 8, None, None, 0.0, "dtype is float32"),
        (jnp.bfloat16, 12, 8, None, None, 0.0, "head_dim is 12"),
        (jnp.bfloat16, 136, 8, None, None, 0.0, "head_dim is 136"),
        (jnp.bfloat16, 8, 8, None, None, 0.1, "dropout_rate is 0.1"),
        (jnp.bfloat16, 8, 8, "bias", None, 0.0, "additive bias"),
        (jnp.bfloat16, 8, 7, None, "mask", 0.0, "odd lengths"),
    ],
)
def test_cudnn_reason_on_pretend_gpu(dtype, dh, tq, bias, mask, rate, expected):
    q, k, v = _qkv(0, tq=tq, tk=tq, dh=dh, dtype=dtype)
    bias_arr = jnp.zeros((B, H, tq, tq)) if bias else None
    mask_arr = jnp.ones((B, 1, tq, tq), bool) if mask else None
    reason = attention.cudnn_unavailable_reason(q, k, v, bias_arr, mask_arr, rate, platform="gpu")
    if expected is None:
        assert reason is None
    else:
        assert reason is not None and expected in reason


def test_cudnn_asked_for_on_cpu_is_a_one_line_error_naming_layer_and_reason():
    q, k, v = _qkv(13)
    mask = _mask_family("camlm")
    with pytest.raises(attention.AttentionBackendError) as e:
        attention.dot_product_attention(q, k, v, mask=mask, backend="cudnn", layer="enc/l0")
    msg = str(e.value)
    assert "\n" not in msg and "enc/l0" in msg and "'cudnn'" in msg and "platform is cpu" in msg


def test_auto_on_cpu_runs_xla_and_warns_once(caplog, monkeypatch):
    monkeypatch.setattr(attention.backends, "_WARNED", set())
    caplog.set_level(logging.WARNING, logger=attention.__name__)
    q, k, v = _qkv(13)
    mask = _mask_family("camlm")
    for _ in range(3):
        got = attention.dot_product_attention(q, k, v, mask=mask, backend="auto")
        np.testing.assert_allclose(
            np.asarray(got), np_attention(q, k, v, mask=mask), atol=1e-5, rtol=1e-5
        )
    records = [r for r in caplog.records if "auto" in r.getMessage()]
    assert len(records) == 1 and records[0].levelno == logging.WARNING
    assert "xla" in records[0].getMessage()


@pytest.mark.parametrize(
    "platform,relative,rate,dtype,expected",
    [
        ("gpu", False, 0.0, jnp.bfloat16, "cudnn"),
        ("gpu", True, 0.0, jnp.bfloat16, "pallas"),
        ("gpu", False, 0.1, jnp.bfloat16, "pallas"),
        ("gpu", False, 0.0, jnp.float32, "pallas"),  # cudnn needs bf16/fp16
        ("cpu", True, 0.1, jnp.bfloat16, "xla"),
    ],
)
def test_auto_choice_per_platform(platform, relative, rate, dtype, expected, monkeypatch):
    monkeypatch.setattr(attention.backends, "_WARNED", set())
    q, k, v = _qkv(0, dtype=dtype)
    rel = None
    if relative:
        from xlm_jax.models import position

        pos = jnp.tile(jnp.arange(T)[None], (B, 1))
        rel = position.RelativeBias(jnp.zeros((8, H)), pos, pos, None, 8, 16)
    with attention.lowering_for(platform):
        got = attention.backends.select("auto", q, k, v, bias=None, mask=None, relative=rel,
                                        dropout_rate=rate, layer="l")
    assert got == expected


def test_lowering_for_a_gpu_assumes_its_architecture_only_where_none_is_found(monkeypatch):
    """jax >= 0.11 asks `jax._src.pallas.triton.gpu_info.get_gpu_info()` for the target GPU
    while lowering a Triton kernel and raises without one; `lowering_for('cuda')` answers
    with the H100's architecture (what jax 0.10 assumes), only inside the block and only when
    the query finds no GPU. That module is not in the pinned jax 0.10, so a stand-in with
    jax 0.11's names plays it here; the CUDA lowerings of the step (`lower_test`,
    `kernel_launch_test`) are the real check on jax 0.11."""
    import sys
    import types

    from xlm_jax.models import attention_backends

    class GpuVersion(str, __import__("enum").Enum):
        H100 = "NVIDIA H100"

    found = {"gpu": None}

    def get_gpu_info():
        if found["gpu"] is None:
            raise ValueError("Unsupported GPU device kind: cpu")
        return found["gpu"]

    module = types.ModuleType("jax._src.pallas.triton.gpu_info")
    module.GpuVersion = GpuVersion
    module.get_gpu_info = get_gpu_info
    module.get_gpu_info_from_version = lambda version: ("info of", version.value)
    monkeypatch.setitem(sys.modules, "jax._src.pallas.triton.gpu_info", module)
    import jax._src.pallas.triton as triton_package

    monkeypatch.setattr(triton_package, "gpu_info", module, raising=False)  # jax 0.11 has one

    with pytest.raises(ValueError, match="Unsupported GPU"):
        module.get_gpu_info()
    with attention.lowering_for("cuda"):
        assert module.get_gpu_info() == ("info of", "NVIDIA H100")
        found["gpu"] = "the card in this machine"
        assert module.get_gpu_info() == "the card in this machine"  # a real GPU wins
        found["gpu"] = None
    assert module.get_gpu_info is get_gpu_info  # put back
    with attention.lowering_for("tpu"), pytest.raises(ValueError, match="Unsupported GPU"):
        module.get_gpu_info()  # only a GPU lowering assumes a GPU
    assert attention_backends.ASSUMED_GPU == GpuVersion.H100.value


@pytest.mark.skipif(jax.default_backend() != "gpu", reason="cuDNN path needs a GPU")
@pytest.mark.parametrize("family", ["padding", "packing", "none"])
def test_cudnn_matches_xla_on_gpu(family):
    rng = np.random.default_rng(14)
    shape = (2, 16, 4, 64)
    q, k, v = (jnp.asarray(rng.normal(size=shape), jnp.bfloat16) for _ in range(3))
    valid = np.arange(16)[None] < np.array([[11], [16]])
    seg = np.where(valid, 1 + (np.arange(16)[None] >= 6), 0)
    mask = {"padding": masks.padding_mask(valid), "packing": masks.segment_mask(seg), "none": None}[
        family
    ]
    assert attention.cudnn_unavailable_reason(q, k, v, None, mask, 0.0) is None
    got = jax.jit(
        lambda q, k, v: attention.dot_product_attention(q, k, v, mask=mask, backend="cudnn")
    )(q, k, v)
    ref = attention.reference_attention(q, k, v, mask=mask)
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(ref, np.float32), atol=2e-2, rtol=2e-2
    )
    if mask is not None:
        _assert_masked_rows_zero(np.asarray(got, np.float32), mask)


# ---------------------------------------------------------------- bad input


def test_unknown_backend_names_value_and_valid_ones():
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match=r"'flash'.*\['xla', 'cudnn', 'pallas', 'auto'\]"):
        attention.dot_product_attention(q, k, v, backend="flash")


def test_non_bool_mask_rejected():
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match="mask must be boolean.*int32"):
        attention.dot_product_attention(q, k, v, mask=jnp.ones((B, 1, T, T), jnp.int32))


def test_mask_of_wrong_shape_rejected():
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match=r"mask shape \(2, 1, 7, 6\)"):
        attention.dot_product_attention(q, k, v, mask=jnp.ones((B, 1, T, T - 1), bool))


def test_bias_of_rank_5_rejected():
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match=r"bias must be broadcastable.*\(4, 2, 3, 7, 7\)"):
        attention.dot_product_attention(q, k, v, bias=jnp.zeros((4, B, H, T, T)))


def test_bias_that_would_enlarge_output_rejected():
    q, k, v = (x[:1] for x in _qkv(0))
    with pytest.raises(ValueError, match=r"bias shape \(2, 3, 7, 7\) would enlarge"):
        attention.dot_product_attention(q, k, v, bias=jnp.zeros((B, H, T, T)))


def test_q_of_wrong_rank_rejected():
    q, k, v = _qkv(0)
    with pytest.raises(ValueError, match=r"q must be 4-D.*\(2, 7, 24\)"):
        attention.dot_product_attention(q.reshape(B, T, H * DH), k, v)


def test_kv_mismatch_rejected():
    q, k, v = _qkv(0, tk=7)
    with pytest.raises(ValueError, match="k and v must agree"):
        attention.dot_product_attention(q, k, v[:, :5])
