"""Tests for xlm_jax.train.optim against closed forms and a NumPy AdamW."""
from __future__ import annotations

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from xlm_jax.train import optim

NUM_LAYERS = 2


class _Layer(nn.Module):
    """A toy encoder layer with the model's naming: attention/query, attention_norm, mlp."""

    @nn.compact
    def __call__(self, x):
        q = nn.Dense(8, name="query")
        x = x + nn.Dense(8, name="out")(q(x))
        x = nn.LayerNorm(name="attention_norm")(x)
        x = x + nn.Dense(8, name="output")(nn.gelu(nn.Dense(16, name="intermediate")(x)))
        return nn.LayerNorm(name="mlp_norm")(x)


class _TinyModel(nn.Module):
    """embeddings/{word_embeddings, LayerNorm}, layers_{i}, mlm_head/{dense, LayerNorm, bias}."""

    boxed: bool = False

    @nn.compact
    def __call__(self, ids):
        init = nn.initializers.normal(0.5)
        if self.boxed:
            init = nn.with_logical_partitioning(init, ("vocab", "embed"))
        emb = nn.Embed(11, 8, embedding_init=init, name="word_embeddings")
        x = nn.LayerNorm(name="LayerNorm")(emb(ids))
        for i in range(NUM_LAYERS):
            x = _Layer(name=f"layers_{i}")(x)
        x = nn.LayerNorm(name="final_norm")(nn.Dense(8, name="dense")(x))
        bias_init = nn.initializers.normal(0.5)
        if self.boxed:
            bias_init = nn.with_logical_partitioning(bias_init, ("vocab",))
        return emb.attend(x) + self.param("bias", bias_init, (11,))


def _params(boxed: bool = False):
    """Params regrouped into the model's top-level names (embeddings/, layers_i/, mlm_head/)."""
    p = _TinyModel(boxed=boxed).init(jax.random.PRNGKey(0), jnp.zeros((2, 3), jnp.int32))["params"]
    layers = {f"layers_{i}": {
        "attention": {"query": p[f"layers_{i}"]["query"], "out": p[f"layers_{i}"]["out"]},
        "attention_norm": p[f"layers_{i}"]["attention_norm"],
        "mlp": {"intermediate": p[f"layers_{i}"]["intermediate"],
                "output": p[f"layers_{i}"]["output"]},
        "mlp_norm": p[f"layers_{i}"]["mlp_norm"],
    } for i in range(NUM_LAYERS)}
    return {
        "embeddings": {"word_embeddings": p["word_embeddings"], "LayerNorm": p["LayerNorm"]},
        **layers,
        "final_norm": p["final_norm"],
        "mlm_head": {"dense": p["dense"], "bias": p["bias"]},
    }


def _flat(tree):
    """{'a/b/c': leaf} with boxes unboxed."""
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(nn.meta.unbox(tree))[0]:
        out["/".join(optim.param_path_names(path))] = leaf
    return out


# --- schedules ---------------------------------------------------------------------------------


def test_linear_schedule_matches_closed_form():
    cfg = optim.OptimizerConfig(learning_rate=1e-3, warmup_steps=10, total_steps=110,
                                end_lr_factor=0.1)
    sched = optim.make_schedule(cfg)
    for s in [0, 1, 5, 10, 11, 35, 60, 109, 110, 500]:
        if s < 10:
            want = 1e-3 * s / 10
        else:
            frac = min(s - 10, 100) / 100
            want = 1e-3 * (1 - (1 - 0.1) * frac)
        assert float(sched(s)) == pytest.approx(want, rel=1e-5, abs=1e-12), s


def test_cosine_schedule_matches_closed_form():
    cfg = optim.OptimizerConfig(learning_rate=2e-4, schedule="cosine", warmup_steps=4,
                                total_steps=104, end_lr_factor=0.0)
    sched = optim.make_schedule(cfg)
    for s in [0, 2, 4, 30, 54, 90, 104, 200]:
        if s < 4:
            want = 2e-4 * s / 4
        else:
            t = min(s - 4, 100) / 100
            want = 2e-4 * 0.5 * (1 + math.cos(math.pi * t))
        assert float(sched(s)) == pytest.approx(want, rel=1e-5, abs=1e-12), s


def test_constant_schedule_after_warmup():
    sched = optim.make_schedule(optim.OptimizerConfig(learning_rate=3e-4, schedule="constant",
                                                      warmup_steps=3, total_steps=5))
    got = [float(sched(s)) for s in [0, 1, 3, 5, 1000]]
    np.testing.assert_allclose(got, [0.0, 1e-4, 3e-4, 3e-4, 3e-4], rtol=1e-6)


@pytest.mark.parametrize("schedule", ["linear", "cosine"])
def test_warmup_longer_than_the_run_warns_and_ramps(schedule):
    """A smoke run (`--gin.TRAIN_STEPS=2` of a run file with 50 warmup steps) is a warning
    naming both numbers, not an error; the learning rate follows the warmup ramp."""
    with pytest.warns(UserWarning, match=r"warmup_steps=20 > total_steps=10"):
        cfg = optim.OptimizerConfig(learning_rate=1e-3, schedule=schedule, warmup_steps=20,
                                    total_steps=10)
    sched = optim.make_schedule(cfg)
    got = [float(sched(s)) for s in [0, 1, 9]]
    np.testing.assert_allclose(got, [0.0, 5e-5, 4.5e-4], rtol=1e-6)


def test_no_warmup_starts_at_peak():
    sched = optim.make_schedule(optim.OptimizerConfig(learning_rate=5e-4, total_steps=10))
    assert float(sched(0)) == pytest.approx(5e-4)
    assert float(sched(5)) == pytest.approx(2.5e-4)


# --- weight decay mask and layer indices -------------------------------------------------------


_EXPECT_DECAY = {
    "embeddings/word_embeddings/embedding": True,
    "embeddings/LayerNorm/scale": False,
    "embeddings/LayerNorm/bias": False,
    "layers_0/attention/query/kernel": True,
    "layers_0/attention/query/bias": False,
    "layers_0/attention/out/kernel": True,
    "layers_0/attention_norm/scale": False,
    "layers_1/mlp/intermediate/kernel": True,
    "layers_1/mlp/output/bias": False,
    "layers_1/mlp_norm/scale": False,
    "final_norm/scale": False,
    "mlm_head/dense/kernel": True,
    "mlm_head/bias": False,
}


@pytest.mark.parametrize("boxed", [False, True])
def test_weight_decay_mask_on_flax_params(boxed):
    params = _params(boxed)
    mask = optim.weight_decay_mask(params)
    # Same structure (boxes included), only bools.
    assert jax.tree_util.tree_structure(mask) == jax.tree_util.tree_structure(params)
    flat = _flat(mask)
    assert set(flat) == set(_flat(params))
    for name, want in _EXPECT_DECAY.items():
        assert flat[name] is want, name
    if boxed:
        box = mask["embeddings"]["word_embeddings"]["embedding"]
        assert isinstance(box, nn.Partitioned) and box.names == ("vocab", "embed")


def test_layer_index():
    L = 12
    assert optim.layer_index(("embeddings", "word_embeddings", "embedding"), L) == 0
    assert optim.layer_index(("rel_pos", "rel_embedding"), L) == 0
    assert optim.layer_index(("rel_pos_3", "rel_embedding"), L) == 4
    assert optim.layer_index(("layers_0", "attention", "query", "kernel"), L) == 1
    assert optim.layer_index(("params", "layers_11", "mlp_norm", "scale"), L) == 12
    assert optim.layer_index(("final_norm", "scale"), L) == 13
    assert optim.layer_index(("mlm_head", "dense", "kernel"), L) == 13
    with pytest.raises(ValueError, match=r"layers_12/mlp.*num_layers=12"):
        optim.layer_index(("layers_12", "mlp", "kernel"), L)


# --- one AdamW step vs NumPy --------------------------------------------------------------------


def _numpy_adamw(params, grads_seq, lrs, *, b1, b2, eps, wd, clip, decay_mask, scale=None):
    """Reference AdamW (Loshchilov & Hutter, decoupled decay) with global-norm clipping.

    p <- p - lr_t * (m_hat / (sqrt(v_hat) + eps) + wd * mask * p)   [ * llrd scale ]
    """
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}
    for t, (grads, lr) in enumerate(zip(grads_seq, lrs), start=1):
        g = {k: np.asarray(x, np.float64) for k, x in grads.items()}
        norm = math.sqrt(sum(float(np.sum(x * x)) for x in g.values()))
        if clip is not None and norm > clip:
            g = {k: x * clip / norm for k, x in g.items()}
        for k in p:
            m[k] = b1 * m[k] + (1 - b1) * g[k]
            v[k] = b2 * v[k] + (1 - b2) * g[k] ** 2
            mhat = m[k] / (1 - b1 ** t)
            vhat = v[k] / (1 - b2 ** t)
            upd = mhat / (np.sqrt(vhat) + eps) + wd * decay_mask[k] * p[k]
            p[k] = p[k] - lr * (1.0 if scale is None else scale[k]) * upd
    return p


def _random_grads(params, seed, magnitude=3.0):
    rng = np.random.default_rng(seed)
    return jax.tree_util.tree_map(
        lambda x: jnp.asarray(rng.normal(0, magnitude, x.shape), jnp.float32), params)


def _run_optax(cfg, params, grads_seq):
    tx = optim.make_optimizer(cfg)
    state = tx.init(params)
    step = jax.jit(lambda g, s, p: tx.update(g, s, p))
    for g in grads_seq:
        updates, state = step(g, state, params)
        params = jax.tree_util.tree_map(lambda a, b: a + b, params, updates)
    return params


@pytest.mark.parametrize("llrd", [None, 0.5])
def test_adamw_steps_match_numpy(llrd):
    cfg = optim.OptimizerConfig(learning_rate=1e-2, warmup_steps=0, total_steps=4,
                                end_lr_factor=0.2, b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.1,
                                clip_norm=1.0, layerwise_lr_decay=llrd, num_layers=NUM_LAYERS)
    params = _params()
    grads_seq = [_random_grads(params, s) for s in range(3)]
    # The clip must actually bite for this test to cover it.
    assert float(optim.global_norm(grads_seq[0])) > 10 * cfg.clip_norm
    got = _flat(_run_optax(cfg, params, grads_seq))

    sched = optim.make_schedule(cfg)
    lrs = [float(sched(s)) for s in range(3)]
    assert lrs[1] < lrs[0]  # the schedule moves between steps
    flat_p = _flat(params)
    mask = {k: float(not (k.endswith("/bias") or "norm" in k.lower())) for k in flat_p}
    scale = None
    if llrd is not None:
        depth = {"embeddings": 0, "layers_0": 1, "layers_1": 2}
        scale = {k: llrd ** (NUM_LAYERS + 1 - depth.get(k.split("/")[0], NUM_LAYERS + 1))
                 for k in flat_p}
    want = _numpy_adamw(flat_p, [_flat(g) for g in grads_seq], lrs, b1=cfg.b1, b2=cfg.b2,
                        eps=cfg.eps, wd=cfg.weight_decay, clip=cfg.clip_norm, decay_mask=mask,
                        scale=scale)
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-6, atol=1e-6, err_msg=k)
    # A decayed leaf moved differently from what a no-decay update would give.
    assert mask["layers_0/attention/query/kernel"] == 1.0


def test_boxed_params_optimise_like_unboxed():
    cfg = optim.OptimizerConfig(learning_rate=1e-2, total_steps=10, weight_decay=0.1,
                                layerwise_lr_decay=0.8, num_layers=NUM_LAYERS)
    boxed = _params(boxed=True)
    plain = nn.meta.unbox(boxed)
    grads = [_random_grads(plain, 7)]
    # Grads in the boxed tree: same values as `grads`, wrapped in the same boxes.
    flat_g = _flat(grads[0])
    boxed_grads = [optim.map_named_params(lambda n, _: flat_g["/".join(n)], boxed)]
    got_boxed = _flat(_run_optax(cfg, boxed, boxed_grads))
    got_plain = _flat(_run_optax(cfg, plain, grads))
    for k in got_plain:
        np.testing.assert_allclose(np.asarray(got_boxed[k]), np.asarray(got_plain[k]),
                                   rtol=1e-7, err_msg=k)
    # And something actually changed.
    before = _flat(plain)["mlm_head/dense/kernel"]
    assert not np.allclose(got_plain["mlm_head/dense/kernel"], before)


def test_layerwise_factors_follow_formula():
    params = _params()
    factors = _flat(optim.layerwise_lr_factors(params, NUM_LAYERS, 0.9))
    for k, f in factors.items():
        top = k.split("/")[0]
        depth = {"embeddings": 0, "layers_0": 1, "layers_1": 2}.get(top, 3)
        assert f == pytest.approx(0.9 ** (3 - depth)), k
    assert factors["embeddings/word_embeddings/embedding"] == pytest.approx(0.729)
    assert factors["mlm_head/bias"] == 1.0


def test_llrd_is_scoped_to_the_encoder_and_modules_get_their_multiplier():
    """In a train state, an objective module's `layers_0` (a generator's) is not an encoder
    layer: it gets its module multiplier (default 1), the encoder gets the decay."""
    cfg = optim.OptimizerConfig(layerwise_lr_decay=0.9, num_layers=2,
                                module_lr_multipliers={"generator": 0.5})
    enc = ("encoder", "layers_0", "mlp", "output", "kernel")
    assert optim.lr_factor(enc, cfg) == pytest.approx(0.9 ** 2)
    assert optim.lr_factor(("objectives", "generator", "layers_0", "mlp", "kernel"), cfg) == 0.5
    assert optim.lr_factor(("objectives", "xlco", "dense", "kernel"), cfg) == 1.0
    assert optim.lr_factor(("opt", "objectives"), cfg) == pytest.approx(0.9 ** 0)  # a leaf name
    params = {"encoder": _params(), "objectives": {"generator": _params()}}
    factors = _flat(optim.layerwise_lr_factors(params, NUM_LAYERS, 0.9))
    assert factors["encoder/embeddings/word_embeddings/embedding"] == pytest.approx(0.729)
    assert factors["objectives/generator/embeddings/word_embeddings/embedding"] == 1.0
    with pytest.raises(ValueError, match=r"module_lr_multipliers\['generator'\]=0 is invalid"):
        optim.OptimizerConfig(module_lr_multipliers={"generator": 0})


def test_global_norm_matches_numpy():
    params = _params(boxed=True)
    want = math.sqrt(sum(float(np.sum(np.asarray(x, np.float64) ** 2))
                         for x in _flat(params).values()))
    assert float(optim.global_norm(params)) == pytest.approx(want, rel=1e-6)
    assert float(optim.global_norm({})) == 0.0


# --- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, field", [
    ({"learning_rate": 0.0}, "learning_rate"),
    ({"learning_rate": float("nan")}, "learning_rate"),
    ({"schedule": "rsqrt"}, "schedule"),
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"total_steps": 0}, "total_steps"),
    ({"end_lr_factor": 1.5}, "end_lr_factor"),
    ({"b1": 1.0}, "b1"),
    ({"b2": -0.1}, "b2"),
    ({"eps": 0.0}, "eps"),
    ({"weight_decay": -0.01}, "weight_decay"),
    ({"clip_norm": 0.0}, "clip_norm"),
    ({"layerwise_lr_decay": 1.5, "num_layers": 12}, "layerwise_lr_decay"),
    ({"layerwise_lr_decay": 0.9}, "num_layers"),
    ({"train_only": "cross_attention"}, "train_only_steps"),
    ({"train_only_steps": 5}, "train_only_steps"),
    ({"train_only": "(", "train_only_steps": 5}, "train_only"),
])
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError) as e:
        optim.OptimizerConfig(**kwargs)
    msg = str(e.value)
    assert f"OptimizerConfig.{field}=" in msg and "\n" not in msg
    value = kwargs.get(field, optim.OptimizerConfig.__dataclass_fields__[field].default)
    assert repr(value) in msg


def test_train_only_first_trains_the_matching_parameters_then_everything():
    """VECO's cross-attention warm-up: for `train_only_steps` updates only the matching leaves
    move (not even weight decay touches the others), then every leaf does; the optimizer
    state keeps one structure across the switch."""
    params = {"encoder": {"layers_0": {"attention": {"kernel": jnp.ones((3, 3))},
                                       "cross_attention": {"kernel": jnp.ones((3, 3))}},
                          "embeddings": {"embedding": jnp.ones((4, 3))}}}
    cfg = optim.OptimizerConfig(learning_rate=0.1, weight_decay=0.1, total_steps=10,
                                train_only="cross_attention", train_only_steps=2)
    tx = optim.make_optimizer(cfg)
    state = tx.init(params)
    structure = jax.tree_util.tree_structure(state)
    grads = jax.tree_util.tree_map(lambda p: jnp.full_like(p, 0.5), params)
    step = jax.jit(lambda p, s: (lambda u, s2: (optax.apply_updates(p, u), s2))(
        *tx.update(grads, s, p)))
    history = [params]
    for _ in range(3):
        params, state = step(params, state)
        history.append(params)
        assert jax.tree_util.tree_structure(state) == structure
    enc = [h["encoder"] for h in history]
    for i in (1, 2):  # the warm-up updates
        assert not np.array_equal(enc[i]["layers_0"]["cross_attention"]["kernel"],
                                  enc[i - 1]["layers_0"]["cross_attention"]["kernel"])
        np.testing.assert_array_equal(enc[i]["layers_0"]["attention"]["kernel"], 1.0)
        np.testing.assert_array_equal(enc[i]["embeddings"]["embedding"], 1.0)
    assert (np.asarray(enc[3]["layers_0"]["attention"]["kernel"]) < 1.0).all()
    assert (np.asarray(enc[3]["embeddings"]["embedding"]) < 1.0).all()
