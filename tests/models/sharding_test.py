"""Logical axes on every parameter; an 8-device (data=2, fsdp=2, tensor=2) forward equals 1 device;
activation constraints take effect; FSDP does not replicate activations in the embeddings' backward."""
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Embeddings, Transformer
from xlm_jax.train import partitioning
from tests.testlib.versions import jaxlib_before

FULL = dict(vocab_size=96, num_layers=2, hidden_size=32, num_heads=4, mlp_dim=64,
            max_positions=40, dropout_rate=0.0, attention_dropout_rate=0.0)
VARIANTS = {
    "xlmr": {},
    "everything": dict(position_type="both", share_relative_table=False, cross_attention=True,
                       num_languages=3, ln_style="pre"),
}


def _batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(4, 96, (8, 12)).astype(np.int32)
    ids[:, 0] = 0
    for b, n in enumerate([12, 9, 5, 12, 3, 8, 10, 6]):
        ids[b, n - 1] = 2
        ids[b, n:] = 1
    return {"input_ids": ids, "lang_ids": (ids % 3).astype(np.int32)}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_every_param_has_logical_axes(variant):
    cfg = get_config("tiny", **FULL, **VARIANTS[variant])
    model = Transformer(cfg)
    b = _batch()
    boxed = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), b["input_ids"],
                                              lang_ids=b["lang_ids"]))["params"]
    leaves = jax.tree_util.tree_flatten_with_path(
        boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))[0]
    assert len(leaves) > 20
    rules = dict(partitioning.standard_logical_axis_rules())
    for path, leaf in leaves:
        name = jax.tree_util.keystr(path)
        assert isinstance(leaf, nn.Partitioned), f"{name} has no logical axes"
        assert len(leaf.names) == leaf.value.ndim, f"{name}: {leaf.names} vs {leaf.value.shape}"
        for axis in leaf.names:
            assert axis in rules, f"{name}: logical axis {axis!r} has no rule"


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_eight_device_forward_equals_single_device(variant):
    assert jax.device_count() >= 8, "tests/conftest.py must force 8 host devices"
    cfg = get_config("tiny", **FULL, **VARIANTS[variant])
    model = Transformer(cfg)
    b = _batch()
    boxed = model.init(jax.random.PRNGKey(1), b["input_ids"], lang_ids=b["lang_ids"])["params"]
    params = nn.meta.unbox(boxed)
    kw = {}
    if cfg.cross_attention:
        kw["encoder_states"] = np.random.default_rng(2).normal(size=(8, 5, 32)).astype(np.float32)

    def forward(p, ids, lang, **extra):
        h = model.apply({"params": p}, ids, lang_ids=lang, return_hidden_states=True,
                        method=Transformer.encode, **extra).hidden_states
        return jnp.stack(h)

    single = jax.jit(forward)(params, b["input_ids"], b["lang_ids"], **kw)

    mesh = partitioning.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, jax.devices()[:8])
    rules = partitioning.standard_logical_axis_rules()
    shardings = partitioning.logical_shardings(boxed, mesh, rules)
    with partitioning.activate(mesh, rules):  # the trainer's context: constraints on
        sharded_params = jax.device_put(params, shardings)
        batch_sh = partitioning.batch_sharding(mesh)
        ids = jax.device_put(b["input_ids"], batch_sh)
        lang = jax.device_put(b["lang_ids"], batch_sh)
        extra = {k: jax.device_put(v, partitioning.batch_sharding(mesh, 3)) for k, v in kw.items()}
        out = jax.jit(forward)(sharded_params, ids, lang, **extra)
    # the parameters really are distributed
    q = sharded_params["layers_0"]["attention"]["query"]["kernel"]
    assert len(q.sharding.device_set) == 8 and q.addressable_shards[0].data.shape == (16, 2, 8)
    np.testing.assert_allclose(np.asarray(out), np.asarray(single), atol=1e-5, rtol=0)


def test_activation_constraints_take_effect_in_the_trainer_context():
    """Under `partitioning.activate` (what the trainer uses) every layer's activations carry
    sharding constraints; under the legacy `with mesh:` flax silently dropped all of them."""
    cfg = get_config("tiny", **FULL)
    model = Transformer(cfg)
    ids = _batch()["input_ids"]
    params = nn.meta.unbox(model.init(jax.random.PRNGKey(1), ids))["params"]
    fwd = lambda p: model.apply({"params": p}, ids, method=Transformer.encode)  # noqa: E731
    mesh = partitioning.make_mesh({"data": 2, "fsdp": 2, "tensor": 2}, jax.devices()[:8])
    rules = partitioning.standard_logical_axis_rules()

    def count(jaxpr):
        return str(jaxpr).count("sharding_constraint")

    # the legacy context, deprecated since jax 0.11: the control runs while jax has it
    if hasattr(type(mesh), "__enter__"):
        with mesh, nn.logical_axis_rules(rules):
            assert count(jax.make_jaxpr(fwd)(params)) == 0
    with partitioning.activate(mesh, rules):
        active = count(jax.make_jaxpr(fwd)(params))
    # embeddings + per layer: q, k, v, attention output, FFN intermediate, layer output
    assert active >= 1 + cfg.num_layers * 5, active


def _all_gathered_shapes(hlo: str) -> list[str]:
    """Result shapes of the all-gathers in a compiled (partitioned) HLO text, e.g. 'f32[96,32]'."""
    return re.findall(r"(\w+\[[\d,]*\])(?:\{[\d,]*\})? all-gather\(", hlo)


@pytest.mark.parametrize("lookup", ["ours", "plain"])
def test_fsdp_embedding_gradient_does_not_replicate_activations(monkeypatch, lookup):
    """With `embed` on fsdp, a plain `table(ids)` lookup let XLA keep the lookup in the table's
    layout, and the gradient (a scatter-add into the table) all-gathered the whole global
    [B, T, D] activation gradient onto every device. `Embeddings._lookup` gathers the [V, D]
    table instead, as FSDP does for every weight. "plain" shows that the check can fail."""
    if lookup == "plain":
        if not jaxlib_before(0, 11):
            pytest.skip("jax 0.11's partitioner no longer gathers the plain lookup's activation "
                        "gradient, so this control cannot fail there (it does on jax 0.10)")
        monkeypatch.setattr(Embeddings, "_lookup", lambda self, table, rows, ids: table(ids))
    cfg = get_config("tiny", **{**FULL, "num_layers": 1})
    model = Transformer(cfg)
    ids = _batch()["input_ids"]  # [8, 12]
    boxed = model.init(jax.random.PRNGKey(1), ids)["params"]
    mesh = partitioning.make_mesh({"data": 2, "fsdp": 4}, jax.devices()[:8])
    rules = partitioning.standard_logical_axis_rules()
    shardings = partitioning.logical_shardings(boxed, mesh, rules)
    params = nn.meta.unbox(boxed)  # outside the mesh context: unboxing there constrains

    def loss(p, x):
        return jnp.sum(model.apply({"params": p}, x, method=Transformer.encode)
                       .last_hidden_state ** 2)

    with partitioning.activate(mesh, rules):
        hlo = jax.jit(jax.grad(loss), in_shardings=(shardings, partitioning.batch_sharding(mesh)),
                      out_shardings=shardings).lower(params, ids).compile().as_text()
    gathered = _all_gathered_shapes(hlo)
    assert gathered, "no all-gather found: the HLO text format changed"
    global_activation = "f32[8,12,32]"
    if lookup == "ours":
        assert global_activation not in gathered, gathered
        assert "f32[96,32]" in gathered, gathered  # the word-embedding table, gathered once
    else:
        assert global_activation in gathered, gathered


def test_mesh_errors():
    with pytest.raises(ValueError, match="needs 12 devices, but 8"):
        partitioning.make_mesh({"data": 3, "fsdp": 2, "tensor": 2}, jax.devices()[:8])
    with pytest.raises(ValueError, match="unknown mesh axes"):
        partitioning.make_mesh({"model": 2})
    assert dict(partitioning.make_mesh({"data": -1, "tensor": 2}, jax.devices()[:8]).shape) == {
        "data": 4, "fsdp": 1, "tensor": 2}
