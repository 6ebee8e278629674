"""The two gradients written by hand to keep less between the passes (`common.bias_gelu`,
`mlm.weighted_nll_sum`): the same values and gradients as an independent computation (numpy,
or autodiff of the unfused form), and, what they are for, what the forward pass keeps for the
backward one (`jax.ad_checkpoint.print_saved_residuals`)."""
import contextlib
import io

import flax.linen as nn
import jax
from jax.ad_checkpoint import print_saved_residuals
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import erf

from xlm_jax.models import common
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import MlpBlock
from xlm_jax.objectives.mlm import masked_lm_sums, weighted_nll_sum
from tests.testlib.versions import jaxlib_before


def _saved(fn, *args) -> list[str]:
    """The residuals the forward pass of `fn` keeps, one line each."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_saved_residuals(fn, *args)
    return [line for line in buf.getvalue().splitlines() if line.strip()]


def _np_gelu_and_grad(x):
    """Exact GELU x Phi(x) and its derivative Phi(x) + x phi(x), in float64."""
    cdf = 0.5 * (1 + erf(x / np.sqrt(2)))
    return x * cdf, cdf + x * np.exp(-x * x / 2) / np.sqrt(2 * np.pi)


def test_bias_gelu_matches_numpy_value_and_gradients():
    rng = np.random.default_rng(0)
    y = rng.normal(size=(3, 5, 16)).astype(np.float32) * 2
    b = rng.normal(size=(16,)).astype(np.float32)
    g = rng.normal(size=(3, 5, 16)).astype(np.float32)
    out, vjp = jax.vjp(common.bias_gelu, jnp.asarray(y), jnp.asarray(b))
    dy, db = vjp(jnp.asarray(g))
    ref, slope = _np_gelu_and_grad((y + b).astype(np.float64))
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(dy), g * slope, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.asarray(db), (g * slope).sum((0, 1)), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_bias_gelu_is_autodiffs_gradient_bit_for_bit(dtype):
    """The backward pass is autodiff's of the same function, recomputed: equal in any dtype."""
    rng = np.random.default_rng(1)
    y = jnp.asarray(rng.normal(size=(4, 8, 32)) * 2, dtype)
    b = jnp.asarray(rng.normal(size=(32,)), dtype)
    g = jnp.asarray(rng.normal(size=(4, 8, 32)), dtype)
    ours = jax.jit(lambda y, b: jax.vjp(common.bias_gelu, y, b)[1](g))(y, b)
    theirs = jax.jit(lambda y, b: jax.vjp(lambda y, b: common.gelu(y + b), y, b)[1](g))(y, b)
    for a, r in zip(ours, theirs):
        assert a.dtype == r.dtype == dtype
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(r, np.float32))


def test_bias_gelu_keeps_only_its_inputs_for_the_backward_pass():
    y = jnp.ones((4, 8, 16), jnp.bfloat16)
    b = jnp.ones((16,), jnp.bfloat16)
    plain = _saved(lambda y, b: jnp.sum(common.gelu(y + b).astype(jnp.float32)), y, b)
    fused = _saved(lambda y, b: jnp.sum(common.bias_gelu(y, b).astype(jnp.float32)), y, b)
    full = [line for line in plain if "bf16[4,8,16]" in line]
    assert len(full) >= 2, plain  # what autodiff keeps of the unfused form (jax 0.10: 3)
    assert [line.split(" from ")[0] for line in fused] == ["bf16[4,8,16]", "bf16[16]"], fused
    assert all("argument" in line for line in fused), fused


def test_compiled_bias_gelu_stores_two_fewer_activations():
    """What XLA keeps, not only what jax hands it: compiled (CPU), the gradient of a matmul
    after `bias_gelu` needs two [N, F] activations less of temporary memory than after the
    unfused form. Without the optimization barrier in its backward pass XLA merges the
    recomputation with the forward pass and stores them again (the compiled GPU step showed
    it: 3 tensors written a layer instead of 1)."""
    n, f = 4096, 512
    y, b = jnp.ones((n, f), jnp.bfloat16), jnp.ones((f,), jnp.bfloat16)
    w = jnp.ones((f, 8), jnp.bfloat16)

    def temp_activations(act):
        grad = jax.jit(jax.grad(lambda y, b: jnp.sum((act(y, b) @ w).astype(jnp.float32) ** 2),
                                (0, 1)))
        temp = grad.lower(y, b).compile().memory_analysis().temp_size_in_bytes
        return temp / (n * f * 2)

    plain = temp_activations(lambda y, b: common.gelu(y + b))
    fused = temp_activations(common.bias_gelu)
    assert fused <= 2.1, (plain, fused)  # the input and the gradient: 2.06 on jax 0.10 and 0.11
    # What the unfused form keeps is the CPU compiler's: 4.04 on jax 0.10.2, 3.02 on 0.11.2,
    # whose XLA already recomputes one of them (the GPU step's compiler kept 3 more, above).
    fewer = 1.9 if jaxlib_before(0, 11) else 0.9
    assert fused <= plain - fewer, (plain, fused)


def test_mlp_block_has_nn_dense_parameters_values_and_gradients():
    """The FFN's first projection is no longer `nn.Dense`: the same parameter tree and initial
    values from the same key, and the same output and gradients as the `nn.Dense` + GELU form
    it replaced (so checkpoints and HF conversion are unaffected)."""
    cfg = get_config("tiny", hidden_size=16, mlp_dim=48, num_heads=2, num_layers=1,
                     vocab_size=64, max_positions=20, dtype="float32")

    class DenseMlp(nn.Module):  # the form before `bias_gelu`
        @nn.compact
        def __call__(self, x):
            dense = lambda n, name: nn.Dense(n, kernel_init=common.normal_init(cfg, ("a", "b")),
                                             bias_init=common.zeros_init(("b",)), name=name)
            return dense(cfg.hidden_size, "output")(common.gelu(dense(cfg.mlp_dim,
                                                                     "intermediate")(x)))

    x = jax.random.normal(jax.random.PRNGKey(1), (2, 5, 16))
    ours = nn.meta.unbox(MlpBlock(cfg).init(jax.random.PRNGKey(0), x))
    theirs = nn.meta.unbox(DenseMlp().init(jax.random.PRNGKey(0), x))
    assert jax.tree.structure(ours) == jax.tree.structure(theirs)
    jax.tree.map(np.testing.assert_array_equal, ours, theirs)

    def loss(module, params):
        return jnp.sum(jnp.sin(module.apply(params, x)))
    np.testing.assert_allclose(loss(MlpBlock(cfg), ours), loss(DenseMlp(), ours), rtol=1e-6)
    jax.tree.map(lambda a, r: np.testing.assert_allclose(a, r, rtol=1e-5, atol=1e-6),
                 jax.grad(lambda p: loss(MlpBlock(cfg), p))(ours),
                 jax.grad(lambda p: loss(DenseMlp(), p))(ours))


def _np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def test_weighted_nll_sum_gradient_is_softmax_minus_onehot():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(3, 5, 11)).astype(np.float32) * 3
    targets = rng.integers(0, 11, (3, 5))
    weights = (rng.random((3, 5)) > 0.3).astype(np.float32)
    d_logits, d_weights = jax.grad(lambda lg, w: 2.5 * weighted_nll_sum(lg, targets, w),
                                   (0, 1))(logits, weights)
    x = logits.astype(np.float64)
    onehot = np.eye(11)[targets]
    np.testing.assert_allclose(np.asarray(d_logits),
                               2.5 * weights[..., None] * (_np_softmax(x) - onehot),
                               rtol=1e-5, atol=1e-6)
    lse = np.log(np.exp(x).sum(-1))
    nll = lse - np.take_along_axis(x, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(d_weights), 2.5 * nll, rtol=1e-5)


def test_masked_lm_sums_keeps_no_float32_copy_of_the_logits():
    """The loss's forward pass keeps the logits it was given (bfloat16 here, the vocabulary
    matmul's output) and per-slot floats; autodiff of the same formula keeps a float32
    [B, P, V] exponential besides."""
    rng = np.random.default_rng(3)
    logits = jnp.asarray(rng.normal(size=(2, 4, 64)), jnp.bfloat16)
    targets = jnp.asarray(rng.integers(0, 64, (2, 4)))
    weights = jnp.ones((2, 4), jnp.float32)

    def unfused(lg):
        x = lg.astype(jnp.float32)
        picked = jnp.take_along_axis(x, targets[..., None], -1)[..., 0]
        return jnp.sum((jax.nn.logsumexp(x, -1) - picked) * weights)

    assert any("f32[2,4,64]" in line for line in _saved(unfused, logits))
    kept = _saved(lambda lg: masked_lm_sums(lg, targets, weights)[0], logits)
    assert not any("f32[2,4,64]" in line for line in kept), kept
    assert sum("bf16[2,4,64]" in line for line in kept) == 1, kept
