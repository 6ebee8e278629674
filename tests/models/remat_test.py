"""Per-layer rematerialisation (`ModelConfig.remat`): the same function and gradients as no
remat (dropout on, per-row masks), the same parameter tree (checkpoints load either way), and
fewer activations kept for the backward pass (jax's saved residuals)."""
import contextlib
import io
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax.ad_checkpoint import print_saved_residuals

from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer

TOL = 1e-6  # relative to max |grad|; measured 1.5e-13 for both policies (pytest -s prints it)
IDS = jax.random.randint(jax.random.PRNGKey(0), (4, 32), 4, 200)


def _model(remat, num_layers=3):
    cfg = get_config("tiny", vocab_size=256, hidden_size=64, num_layers=num_layers,
                     num_heads=4, mlp_dim=128, remat=remat, dropout_rate=0.1,
                     attention_dropout_rate=0.1)
    return Transformer(cfg)


def _loss(model, ids=IDS):
    def f(params):
        h = model.apply({"params": params}, ids, deterministic=False,
                        rngs={"dropout": jax.random.PRNGKey(2)},
                        row_ids=jnp.arange(ids.shape[0]), method=Transformer.encode)
        return jnp.mean(h.last_hidden_state ** 2)
    return f


@pytest.mark.parametrize("remat", ["full", "dots_saveable"])
def test_remat_computes_the_same_loss_and_gradients(remat):
    plain = _model("none")
    params = jax.jit(plain.init)(jax.random.PRNGKey(1), IDS)["params"]
    remat_params = jax.jit(_model(remat).init)(jax.random.PRNGKey(1), IDS)["params"]
    # Same names, shapes and initial values: a checkpoint of one loads into the other.
    assert jax.tree_util.tree_structure(params) == jax.tree_util.tree_structure(remat_params)
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(remat_params)):
        np.testing.assert_array_equal(a, b)
    # jitted: one program each (run eagerly, every primitive of the backward pass compiled
    # on its own took 20 s)
    v0, g0 = jax.jit(jax.value_and_grad(_loss(plain)))(params)
    v1, g1 = jax.jit(jax.value_and_grad(_loss(_model(remat))))(params)
    # Recomputation reorders float32 sums inside XLA's fusions; the tolerance is on the
    # scale of the whole gradient (TOL below, from the measured difference).
    np.testing.assert_allclose(v1, v0, rtol=1e-6)
    scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(g0))
    worst = max(float(jnp.max(jnp.abs(a - b))) for a, b in
                zip(jax.tree_util.tree_leaves(g1), jax.tree_util.tree_leaves(g0)))
    print(remat, "max |grad diff| / max |grad| =", worst / scale)
    assert worst <= TOL * scale


_DTYPE_BYTES = {"f32": 4, "f64": 8, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "i32": 4, "i64": 8, "u64": 8, "s64": 8, "s8": 1, "u8": 1,
                "bool": 1, "pred": 1}


def _saved_activation_bytes(remat):
    """Bytes the backward pass keeps from the forward, as jax reports them
    (`print_saved_residuals`), less the parameters and constants (kept anyway)."""
    model = _model(remat, num_layers=4)
    params = model.init(jax.random.PRNGKey(1), IDS[:1])["params"]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        print_saved_residuals(_loss(model), params)
    total = 0
    for line in buf.getvalue().splitlines():
        if "from the argument" in line or "from a literal" in line:
            continue
        m = re.match(r"(\w+)\[([\d,]*)\]", line)
        shape = [int(d) for d in m.group(2).split(",") if d]
        total += _DTYPE_BYTES[m.group(1)] * int(np.prod(shape))
    return total


def test_remat_keeps_less_for_the_backward_pass():
    # What jax saves between the passes. XLA's CPU buffer assignment did not turn it into a
    # smaller compiled temp size (8 x 128 model, 16 x 256 tokens, no dropout: 898 MiB without
    # remat, 850 MiB full, 914 MiB dots_saveable), so the compiled figure is for accelerators
    # (docs/performance.md).
    none, full, dots = (_saved_activation_bytes(r) for r in ("none", "full", "dots_saveable"))
    assert full < none / 3, (full, none)
    assert full < dots < none, (full, dots, none)


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match=r"ModelConfig.remat='some'.*none, full, dots_saveable"):
        get_config("tiny", remat="some")
