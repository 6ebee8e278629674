"""Tests for xlm_jax.models.position: T5 buckets and the XLM-E gated relative position bias.

References are written independently here: a pure-python, scalar transcription of
mesh-tensorflow's ``_relative_position_bucket(bidirectional=True)`` and a numpy version of the
paper's gate formula ``r = d + g_u·d + (1 − g_u)·w·g_r·d``.
"""

from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import position


def mtf_bucket(relative_position: int, num_buckets: int = 32, max_distance: int = 128) -> int:
    """mesh_tensorflow.transformer.attention._relative_position_bucket, one scalar, float64."""
    ret = 0
    n = -relative_position
    num_buckets //= 2
    if n < 0:
        ret += num_buckets
        n = -n
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val_if_large = max_exact + int(
        math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    )
    return ret + min(val_if_large, num_buckets - 1)


@pytest.mark.parametrize(
    "num_buckets,max_distance", [(32, 128), (64, 256), (8, 16), (16, 20), (320, 800)]
)
def test_bucket_matches_mesh_tensorflow(num_buckets, max_distance):
    rel = np.arange(-300, 301)
    got = np.asarray(position.relative_position_bucket(jnp.asarray(rel), num_buckets, max_distance))
    expected = np.array([mtf_bucket(int(r), num_buckets, max_distance) for r in rel])
    np.testing.assert_array_equal(got, expected)
    assert got.min() >= 0 and got.max() < num_buckets


def test_bucket_known_values():
    rel = jnp.asarray([0, -1, 1, -7, -8, -15, -16, -32, -64, -127, -128, -300, 300, 16])
    # keys before the query: lower half; after: upper half (offset 16); exact below 8.
    expected = [0, 1, 17, 7, 8, 9, 10, 12, 14, 15, 15, 15, 31, 26]
    np.testing.assert_array_equal(np.asarray(position.relative_position_bucket(rel)), expected)


def test_bucket_is_integer_arithmetic_only():
    """No float (so no device's float32 `log`) anywhere in the bucket computation: every
    backend gets the same buckets, also where mesh-tensorflow's quotient is an exact integer
    (distances 16, 32 and 64 at 32 buckets and distance 128, each the start of a bucket)."""
    jaxpr = jax.make_jaxpr(position.relative_position_bucket)(jnp.arange(-300, 301))
    dtypes = {v.aval.dtype for eqn in jaxpr.jaxpr.eqns for v in eqn.outvars}
    assert all(jnp.issubdtype(d, jnp.integer) or d == jnp.bool_ for d in dtypes), dtypes
    assert position.log_bucket_starts(32, 128) == (12, 16, 23, 32, 46, 64, 91)
    for n, want in ((15, 9), (16, 10), (31, 11), (32, 12), (63, 13), (64, 14)):
        assert mtf_bucket(-n) == want
        assert int(position.relative_position_bucket(jnp.asarray(-n))) == want


def test_bucket_bad_arguments():
    with pytest.raises(ValueError, match="num_buckets must be even and >= 4, got 31"):
        position.relative_position_bucket(jnp.zeros(3, jnp.int32), num_buckets=31)
    with pytest.raises(ValueError, match="max_distance=8 must exceed num_buckets // 4 = 8"):
        position.relative_position_bucket(jnp.zeros(3, jnp.int32), num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="num_buckets=32 and max_distance=8 leave no"):
        position.log_bucket_starts(32, 8)  # not a loop without end


# ---------------------------------------------------------------- numpy reference of the bias


def np_relative_bias(table, pos_q, pos_k, num_buckets=32, max_distance=128):
    """d[b, h, i, j] = table[bucket(pos_k[b, j] - pos_q[b, i]), h], by loops."""
    bsz, tq = pos_q.shape
    tk = pos_k.shape[1]
    d = np.zeros((bsz, table.shape[1], tq, tk))
    for b in range(bsz):
        for i in range(tq):
            for j in range(tk):
                d[b, :, i, j] = table[
                    mtf_bucket(int(pos_k[b, j] - pos_q[b, i]), num_buckets, max_distance)
                ]
    return d


def np_gate(q, d, u, v, w):
    """The paper formula, per head h and query i, in float64."""
    q = np.asarray(q, np.float64)
    sig = lambda x: 1.0 / (1.0 + np.exp(-x))
    bsz, tq, nh, _ = q.shape
    r = np.zeros(np.broadcast_shapes(d.shape, (bsz, nh, tq, d.shape[-1])))
    for b in range(bsz):
        for h in range(nh):
            for i in range(tq):
                g_u = sig(q[b, i, h] @ u[h])
                g_r = sig(q[b, i, h] @ v[h])
                dij = d[b if d.shape[0] > 1 else 0, h, i]
                r[b, h, i] = dij + g_u * dij + (1 - g_u) * w[h] * g_r * dij
    return r


B, TQ, TK, H, DH = 2, 5, 6, 3, 8
POS_Q = np.array([[0, 1, 2, 0, 1], [3, 0, 200, 1, 2]])  # packed / far positions
POS_K = np.array([[0, 1, 2, 0, 1, 2], [0, 1, 2, 3, 150, 4]])


def _random_gate_inputs(seed, scale=1.0):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(B, TQ, H, DH)) * scale
    u = rng.normal(size=(H, DH)) * 0.5
    v = rng.normal(size=(H, DH)) * 0.5
    w = rng.normal(size=(H,))
    table = rng.normal(size=(32, H))
    return q, u, v, w, table


def test_table_params_and_values():
    module = position.RelativePositionTable(num_heads=H)
    variables = module.init(jax.random.PRNGKey(0), POS_Q, POS_K)
    boxed = variables["params"]["rel_embedding"]
    assert isinstance(boxed, nn.LogicallyPartitioned)
    assert boxed.names == ("relpos_buckets", "heads") and boxed.value.shape == (32, H)
    assert 0.005 < float(jnp.std(boxed.value)) < 0.05  # normal(0.02)
    table = np.random.default_rng(1).normal(size=(32, H)).astype(np.float32)
    d = module.apply({"params": {"rel_embedding": table}}, POS_Q, POS_K)
    assert d.shape == (B, H, TQ, TK)
    np.testing.assert_allclose(np.asarray(d), np_relative_bias(table, POS_Q, POS_K), rtol=0, atol=0)


def test_table_other_bucket_settings():
    module = position.RelativePositionTable(num_heads=H, num_buckets=16, max_distance=40)
    table = np.random.default_rng(2).normal(size=(16, H)).astype(np.float32)
    d = module.apply({"params": {"rel_embedding": table}}, POS_Q, POS_K)
    np.testing.assert_array_equal(np.asarray(d), np_relative_bias(table, POS_Q, POS_K, 16, 40))


@pytest.mark.parametrize("num_buckets,max_distance", [(32, 128), (16, 20)])
def test_locality_init_is_minus_slope_times_distance_per_head(num_buckets, max_distance):
    """The "locality" table: every pair (i, j) starts at -2^-h x the smallest distance of its
    bucket (the scalar mesh-tensorflow bucketing above), so within a bucket's exact range the
    bias is -2^-h |i - j| and it never rises with distance; the query itself gets 0."""
    module = position.RelativePositionTable(num_heads=H, num_buckets=num_buckets,
                                            max_distance=max_distance, table_init="locality")
    table = np.asarray(module.init(jax.random.PRNGKey(0), POS_Q, POS_K)["params"]
                       ["rel_embedding"].value)
    smallest = {}
    for r in range(-2 * max_distance, 2 * max_distance + 1):
        b = mtf_bucket(-r, num_buckets, max_distance)  # mtf's argument is query - key
        smallest[b] = min(smallest.get(b, abs(r)), abs(r))
    slopes = 0.5 ** np.arange(H)
    # a bucket no distance reaches (the upper half's first: keys after the query are >= 1
    # away) starts at max_distance, as if the farthest
    expected = np.array([[-slopes[h] * smallest.get(b, max_distance) for h in range(H)]
                         for b in range(num_buckets)])
    assert len(smallest) == num_buckets - 1
    np.testing.assert_array_equal(table, expected.astype(np.float32))
    d = np.asarray(module.apply({"params": {"rel_embedding": table}}, POS_Q, POS_K))
    dist = np.abs(POS_K[:, None, :] - POS_Q[:, :, None])  # [B, TQ, TK]
    near = dist < num_buckets // 4  # one bucket per distance
    for h in range(H):
        np.testing.assert_array_equal(d[:, h][near], (-slopes[h] * dist[near]).astype(np.float32))
    assert d[:, 0][dist == 0].max() == 0 and d[:, 0][dist > 0].max() <= -1

def test_gated_bias_params():
    module = position.GatedRelativeBias(num_heads=H, head_dim=DH)
    d = jnp.ones((B, H, TQ, TK))
    variables = module.init(jax.random.PRNGKey(0), jnp.ones((B, TQ, H, DH)), d)
    p = variables["params"]
    assert p["gate_u"].names == ("heads", "kv") and p["gate_u"].value.shape == (H, DH)
    assert p["gate_v"].names == ("heads", "kv") and p["gate_v"].value.shape == (H, DH)
    assert p["gate_w"].names == ("heads",)
    np.testing.assert_array_equal(np.asarray(p["gate_w"].value), np.ones(H))


def test_gated_bias_matches_numpy_formula():
    q, u, v, w, table = _random_gate_inputs(3)
    d = np_relative_bias(table, POS_Q, POS_K)
    expected = np_gate(q, d, u, v, w)
    f32 = lambda x: jnp.asarray(x, jnp.float32)
    got = position.gated_relative_bias(f32(q), f32(d), f32(u), f32(v), f32(w))
    assert got.dtype == jnp.float32 and got.shape == (B, H, TQ, TK)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)
    # and through the two modules, table -> d -> r
    params = {"rel_embedding": f32(table)}
    d_mod = position.RelativePositionTable(num_heads=H).apply({"params": params}, POS_Q, POS_K)
    gparams = {"gate_u": f32(u), "gate_v": f32(v), "gate_w": f32(w)}
    r_mod = position.GatedRelativeBias(num_heads=H, head_dim=DH).apply(
        {"params": gparams}, f32(q), d_mod
    )
    np.testing.assert_allclose(np.asarray(r_mod), expected, rtol=1e-5, atol=1e-5)


def test_gated_bias_broadcasts_shared_d_over_batch():
    q, u, v, w, table = _random_gate_inputs(4)
    d = np.random.default_rng(5).normal(size=(1, H, TQ, TK))
    got = position.gated_relative_bias(*(jnp.asarray(x, jnp.float32) for x in (q, d, u, v, w)))
    np.testing.assert_allclose(np.asarray(got), np_gate(q, d, u, v, w), rtol=1e-5, atol=1e-5)


def test_gated_bias_bf16_query_computes_gates_in_float32():
    q, u, v, w, table = _random_gate_inputs(6, scale=3.0)
    d = np_relative_bias(table, POS_Q, POS_K)
    q_bf16 = jnp.asarray(q, jnp.bfloat16)
    got = position.gated_relative_bias(
        q_bf16, jnp.asarray(d, jnp.float32), *(jnp.asarray(x, jnp.float32) for x in (u, v, w))
    )
    assert got.dtype == jnp.float32
    # Reference from the bf16-rounded query: only the input rounding differs.
    expected = np_gate(np.asarray(q_bf16, np.float64), d, u, v, w)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5, atol=1e-5)


def _central_differences(f, args, eps=1e-6):
    """Numerical gradient of scalar f w.r.t. each array in args, entry by entry."""
    grads = []
    for a_idx, a in enumerate(args):
        g = np.zeros(a.shape)
        for idx in np.ndindex(a.shape):
            plus = [np.array(x) for x in args]
            minus = [np.array(x) for x in args]
            plus[a_idx][idx] += eps
            minus[a_idx][idx] -= eps
            g[idx] = (float(f(*plus)) - float(f(*minus))) / (2 * eps)
        grads.append(g)
    return grads


def test_gradients_match_finite_differences():
    """d(loss)/d(table, u, v, w) through table lookup + gate, float64, vs central differences."""
    with jax.enable_x64(True):
        q, u, v, w, table = _random_gate_inputs(7)
        nb = 16
        table = table[:nb]
        cot = np.random.default_rng(8).normal(size=(B, H, TQ, TK))
        table_mod = position.RelativePositionTable(
            num_heads=H, num_buckets=nb, max_distance=32, param_dtype=jnp.float64
        )
        gate_mod = position.GatedRelativeBias(num_heads=H, head_dim=DH, param_dtype=jnp.float64)

        def loss(table, u, v, w):
            d = table_mod.apply({"params": {"rel_embedding": table}}, POS_Q, POS_K)
            r = gate_mod.apply(
                {"params": {"gate_u": u, "gate_v": v, "gate_w": w}}, jnp.asarray(q), d
            )
            assert r.dtype == jnp.float64
            return jnp.sum(r * cot)

        args = (table, u, v, w)
        jloss = jax.jit(loss)
        analytic = jax.grad(loss, argnums=(0, 1, 2, 3))(*(jnp.asarray(a) for a in args))
        numeric = _central_differences(jloss, args, eps=1e-6)
        for name, a, n in zip(("table", "u", "v", "w"), analytic, numeric):
            np.testing.assert_allclose(np.asarray(a), n, rtol=1e-6, atol=1e-7, err_msg=name)
            assert np.abs(n).max() > 1e-3, name  # the check is not vacuous


def test_gated_bias_bad_shapes():
    q = jnp.ones((B, TQ, H, DH))
    d = jnp.ones((B, H, TQ, TK))
    with pytest.raises(ValueError, match=r"u must have shape \(3, 8\).*got \(3, 4\)"):
        position.gated_relative_bias(q, d, jnp.ones((H, 4)), jnp.ones((H, DH)), jnp.ones(H))
    with pytest.raises(ValueError, match=r"w must have shape \(3,\).*got \(\)"):
        position.gated_relative_bias(q, d, jnp.ones((H, DH)), jnp.ones((H, DH)), jnp.ones(()))


def test_table_bad_positions():
    module = position.RelativePositionTable(num_heads=H)
    with pytest.raises(ValueError, match=r"positions must be \[B, Tq\] and \[B, Tk\].*\(5,\)"):
        module.init(jax.random.PRNGKey(0), jnp.arange(5), POS_K)


def test_table_gradient_is_a_per_bucket_sum_without_scatter():
    """`bucket_lookup`'s table gradient equals autodiff of the plain gather (a scatter-add)
    within 1e-6 of the gradient's scale, and the lowered backward has no scatter at all."""
    rng = np.random.default_rng(3)
    b, t, h, nb = 2, 50, 3, 32
    table = jnp.asarray(rng.normal(size=(nb, h)), jnp.float32)
    pos = jnp.asarray(np.stack([np.arange(t), np.arange(t)[::-1] * 3]))
    cot = jnp.asarray(rng.normal(size=(b, h, t, t)), jnp.float32)
    buckets = position.relative_position_bucket(pos[:, None, :] - pos[:, :, None], nb, 40)

    def gather(tab):  # what autodiff turns into a scatter-add
        return jnp.sum(jnp.transpose(jnp.take(tab, buckets, axis=0), (0, 3, 1, 2)) * cot)

    def ours(tab):
        return jnp.sum(position.relative_bias_values(tab, pos, pos, nb, 40) * cot)

    np.testing.assert_array_equal(jax.jit(ours)(table), jax.jit(gather)(table))
    want, got = jax.grad(gather)(table), jax.grad(ours)(table)
    assert np.max(np.abs(got - want)) <= 1e-6 * np.max(np.abs(want))
    # an independent count: numpy's per-bucket sums
    np_sum = np.stack([np.asarray(cot).transpose(0, 2, 3, 1)[np.asarray(buckets) == n].sum(0)
                       for n in range(nb)])
    np.testing.assert_allclose(got, np_sum, rtol=1e-5, atol=1e-4)
    assert "scatter" in jax.jit(jax.grad(gather)).lower(table).as_text()
    assert "scatter" not in jax.jit(jax.grad(ours)).lower(table).as_text()
