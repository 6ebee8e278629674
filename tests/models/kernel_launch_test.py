"""Each flash-attention kernel with a launch of its own (`fused_attention.KernelLaunch`), and
one kernel run alone (`fused_attention.prepare` + `run_kernel`, what `accelerator.kernel_sweep`
times).

The oracle is the XLA path (`attention.reference_attention` with the bias materialised by
`RelativeBias.materialise`, gradients by `jax.vjp`), as in fused_attention_test. On a CPU the
kernels run interpreted; the launches' warps and stages only reach Triton on a GPU, so what
is checked here is that tiles of different sizes per kernel (and padding to the largest)
give the same attention, dropout bits included.
"""
from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import attention, fused_attention, masks, position
from xlm_jax.models.fused_attention import KernelLaunch, Launch

B, T, H, DH = 2, 40, 2, 16  # T = 40: padded to 64 by the largest tile (32)
NUM_BUCKETS, MAX_DISTANCE = 12, 20
TOL = dict(rtol=1e-5, atol=1e-5)
# every kernel its own tile: forward and dq hold 32 queries, dk/dv 32 keys
MIXED = KernelLaunch(forward=Launch(32, 16), dkv=Launch(16, 32), dq=Launch(32, 32))


def _problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    f = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)  # noqa: E731
    q, k, v, cot = f(B, T, H, DH), f(B, T, H, DH), f(B, T, H, DH), f(B, T, H, DH)
    pos = jnp.tile(jnp.arange(T, dtype=jnp.int32), (B, 1))
    relative = position.RelativeBias(f(NUM_BUCKETS, H), pos, pos,
                                     jnp.asarray(rng.uniform(0.5, 1.5, (B, H, T)), jnp.float32),
                                     NUM_BUCKETS, MAX_DISTANCE)
    mask = masks.padding_mask(np.arange(T)[None] < np.array([[T - 9], [T]]))
    return (q, k, v), cot, relative, mask


def _vjp(fn, qkv, cot):
    out, pull = jax.vjp(fn, *qkv)
    return out, pull(cot)


def test_mixed_launches_equal_the_reference_forward_and_gradients():
    qkv, cot, relative, mask = _problem()
    want = _vjp(lambda q, k, v: attention.reference_attention(
        q, k, v, bias=relative.materialise(), mask=mask), qkv, cot)
    got = _vjp(lambda q, k, v: fused_attention.flash_attention(
        q, k, v, mask=mask, relative=relative, launch=MIXED), qkv, cot)
    np.testing.assert_allclose(np.asarray(got[0]), np.asarray(want[0]), **TOL)
    for name, g, w in zip("qkv", got[1], want[1]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), err_msg=f"d{name}", **TOL)
    assert float(jnp.max(jnp.abs(want[1][0]))) > 1e-2  # the gradients are not trivially zero


def test_mixed_launches_draw_the_same_dropout_bits():
    """The keep bits hash global query/key indices: a kernel's tile shape cannot change them
    (the forward's and the backward kernels' must agree for the gradient to be right)."""
    qkv, cot, relative, mask = _problem(seed=1)
    kw = dict(mask=mask, relative=relative, dropout_rate=0.3, dropout_rng=jax.random.key(5))
    uniform = _vjp(lambda q, k, v: fused_attention.flash_attention(
        q, k, v, launch=KernelLaunch.uniform(Launch(16, 16)), **kw), qkv, cot)
    mixed = _vjp(lambda q, k, v: fused_attention.flash_attention(q, k, v, launch=MIXED, **kw),
                 qkv, cot)
    xla = _vjp(lambda q, k, v: attention.dot_product_attention(
        q, k, v, backend="xla", deterministic=False, **kw), qkv, cot)
    for got in (uniform, mixed):
        np.testing.assert_allclose(np.asarray(got[0]), np.asarray(xla[0]), **TOL)
        for g, w in zip(got[1], xla[1]):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w), **TOL)
    plain = fused_attention.flash_attention(*qkv, mask=mask, relative=relative)
    assert not np.allclose(np.asarray(plain), np.asarray(xla[0]), atol=1e-3)  # dropout acted


def test_one_kernel_alone_gives_its_share_of_the_call():
    """`run_kernel` on `prepare`d inputs: the forward's output is the call's (padded), and
    the dk/dv and dq kernels, each at its own launch, give the call's gradients."""
    qkv, cot, relative, mask = _problem(seed=2)
    out, grads = _vjp(lambda q, k, v: fused_attention.flash_attention(
        q, k, v, mask=mask, relative=relative), qkv, cot)
    inputs = fused_attention.prepare(*qkv, mask=mask, relative=relative)
    assert inputs.tq == T and inputs.dh == DH
    assert inputs.arrays[0].shape[1] == 64  # the interpreted 128-tiles clipped to 64
    do = jnp.pad(cot, ((0, 0), (0, inputs.arrays[0].shape[1] - T), (0, 0), (0, 0)))
    o, lse = fused_attention.run_kernel(inputs, "forward", Launch(64, 32))
    np.testing.assert_allclose(np.asarray(o[:, :T]), np.asarray(out), **TOL)
    assert lse.shape == (B, H, 64) and np.isinf(np.asarray(lse)[:, :, T:]).all()  # padded rows
    dk, dv = fused_attention.run_kernel(inputs, "dkv", Launch(32, 64), o=o, lse=lse, do=do)
    dq, dtable, dfactor = fused_attention.run_kernel(inputs, "dq", Launch(16, 64), o=o, lse=lse,
                                                     do=do)
    for name, g, w in (("dq", dq, grads[0]), ("dk", dk, grads[1]), ("dv", dv, grads[2])):
        np.testing.assert_allclose(np.asarray(g[:, :T]), np.asarray(w), err_msg=name, **TOL)
    assert dtable.shape[0] == H and dfactor.shape == (B, H, inputs.arrays[0].shape[1])


def test_launch_mistakes_are_one_line_errors():
    q = jnp.zeros((1, 32, 1, DH))
    with pytest.raises(ValueError, match=r"launch\.dkv\.block_k must be a power of two >= 16, "
                                         r"got 24"):
        fused_attention.flash_attention(q, q, q, launch=KernelLaunch(dkv=Launch(16, 24)))
    with pytest.raises(ValueError, match="block_q must be a power of two >= 16, got 8"):
        fused_attention.flash_attention(q, q, q, block_q=8, launch=MIXED)
    with pytest.raises(ValueError, match="unknown kernel 'bwd': one of forward, dkv, dq"):
        MIXED.of("bwd")
    inputs = fused_attention.prepare(q, q, q, block_q=16, block_k=16)
    with pytest.raises(ValueError, match="dq block_q=64 does not tile the prepared length 32"):
        fused_attention.run_kernel(inputs, "dq", Launch(64, 16))
    with pytest.raises(ValueError, match="the dkv kernel needs the forward's o and lse"):
        fused_attention.run_kernel(inputs, "dkv", Launch(16, 16))


def test_block_sizes_given_override_every_kernels_tile():
    qkv, _, relative, mask = _problem(seed=3)
    inputs = fused_attention.prepare(*qkv, mask=mask, relative=relative, block_q=16,
                                     block_k=32, launch=MIXED)
    launch = inputs.st.launch
    assert [(launch.of(n).block_q, launch.of(n).block_k) for n in fused_attention.KERNELS] == [
        (16, 32)] * 3
    assert inputs.arrays[0].shape[1] == 48 and inputs.arrays[1].shape[1] == 64  # 40 padded
    assert fused_attention.GPU_LAUNCH == KernelLaunch.uniform(Launch(64, 64, 4, 3))


def test_each_kernel_is_lowered_for_a_gpu_with_its_own_warps_and_stages():
    """Lowered for CUDA from this CPU (no GPU needed to lower): each Triton call carries its
    own kernel's `num_warps` and `num_stages`, the settings the launch gave it."""
    launch = KernelLaunch(forward=Launch(128, 64, 8, 2), dkv=Launch(64, 128, 4, 4),
                          dq=Launch(32, 64, 2, 3))
    q = jnp.zeros((2, 128, 2, 64), jnp.bfloat16)

    def loss(q, k, v):
        out = fused_attention.flash_attention(q, k, v, launch=launch, interpret=False)
        return out.astype(jnp.float32).sum()

    from xlm_jax.models import attention_backends

    with attention_backends.lowering_for("cuda"):  # jax 0.11 asks for the GPU's architecture
        text = jax.jit(jax.grad(loss, argnums=(0, 1, 2))).trace(q, q, q).lower(
            lowering_platforms=("cuda",)).as_text()
    found = {m.group(1): (int(m.group(3)), int(m.group(2))) for m in re.finditer(
        r'name = "relbias_flash_(\w+)", num_stages = (\d+) : i32, num_warps = (\d+) : i32', text)}
    assert found == {"forward": (8, 2), "dkv": (4, 4), "dq": (2, 3)}, found


def test_the_text_form_reads_back_and_names_what_is_wrong():
    from xlm_jax.models import kernel_launch

    assert kernel_launch.parse("") is None and kernel_launch.parse("  ") is None
    assert kernel_launch.parse("128x64w8s3") == KernelLaunch.uniform(Launch(128, 64, 8, 3))
    some = kernel_launch.parse("forward=128x64w8s3, dq=64x32w4s2")
    assert some == KernelLaunch(forward=Launch(128, 64, 8, 3), dq=Launch(64, 32, 4, 2))
    assert kernel_launch.parse(kernel_launch.text(some)) == some
    for bad, message in (("64x64", "'64x64' is not BQxBKwWARPSsSTAGES"),
                         ("fwd=64x64w4s3", "unknown kernel 'fwd' (one of forward, dkv, dq)"),
                         ("48x64w4s3", "block_q 48 is not a power of two >= 16"),
                         ("64x64w3s3", "warps must be a power of two")):
        with pytest.raises(ValueError, match=re.escape(message)):
            kernel_launch.parse(bad)
    from xlm_jax.models import config

    with pytest.raises(ValueError, match=r"ModelConfig.attention_launch='dq=64x64': "
                                         r"'64x64' is not"):
        config.get_config("tiny", attention_launch="dq=64x64")


def test_a_models_attention_launch_reaches_its_gpu_kernels():
    """`ModelConfig.attention_launch` -> the transformer's attention -> the Triton calls of
    the step lowered for a GPU; the kernels it does not name keep the default launch."""
    from xlm_jax.models import attention_backends, config, transformer

    cfg = config.get_config("tiny", num_layers=1, attention_backend="pallas", dtype="bfloat16",
                            attention_launch="forward=128x64w8s2")
    model = transformer.Transformer(cfg)
    ids = jnp.ones((2, 128), jnp.int32)
    params = jax.eval_shape(lambda: model.init(jax.random.key(0), ids))

    def loss(p):
        return model.apply(p, ids).last_hidden_state.astype(jnp.float32).sum()

    with attention_backends.lowering_for("cuda"):
        text = jax.jit(jax.grad(loss)).trace(params).lower(
            lowering_platforms=("cuda",)).as_text()
    found = {m.group(1): (int(m.group(3)), int(m.group(2))) for m in re.finditer(
        r'name = "relbias_flash_(\w+)", num_stages = (\d+) : i32, num_warps = (\d+) : i32', text)}
    assert found == {"forward": (8, 2), "dkv": (4, 3), "dq": (4, 3)}, found
