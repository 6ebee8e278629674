"""`ModelConfig.scan_layers`: the scanned stack computes what the per-layer loop computes (every
remat policy, hidden states, gated relative bias with shared and per-layer tables, decoding),
parameters convert exactly between the two layouts, every reader accepts either layout
(trainer `init_from`, `load_encoder`, HF export, reassembly, layer-wise LR decay), and the
combinations that cannot work fail with one clear line.

The equality tests run deterministic (no dropout): the scan splits the dropout rng per layer,
so its dropout bits differ from the loop's by design; with dropout only per-row independence
is checked."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec

from testlib.tiny_run import TINY_MODEL, mlm_objectives, train_tiny
from xlm_jax.convert import hf
from xlm_jax.encoder import load_encoder
from xlm_jax.models import layer_stack, reassemble
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.train import optim, partitioning
from xlm_jax.train import step as step_lib

TOL = 1e-6  # relative to the largest |value| of the compared tree (fp32)
IDS = jax.random.randint(jax.random.PRNGKey(0), (2, 12), 4, 120)


def _cfg(**kw):
    return get_config("tiny", **{"vocab_size": 128, "hidden_size": 32, "num_layers": 2,
                                 "num_heads": 4, "mlp_dim": 64, "max_positions": 40,
                                 "dropout_rate": 0.0, "attention_dropout_rate": 0.0, **kw})


def _params(cfg, ids=IDS, **kw):
    return nn.meta.unbox(Transformer(cfg).init(jax.random.PRNGKey(1), ids, **kw)["params"])


def _max_rel_diff(a, b):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    scale = max(float(jnp.max(jnp.abs(x))) for x in lb)
    return max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(la, lb)) / scale


def _hidden_loss(model):
    def f(params):
        out = model.apply({"params": params}, IDS, return_hidden_states=True,
                          method=Transformer.encode)
        # every layer's output enters the loss, with distinct weights
        return sum((i + 1) * jnp.mean(h ** 2) for i, h in enumerate(out.hidden_states)), out
    return f


@pytest.mark.parametrize("remat,kw", [
    ("none", {"ln_style": "post", "share_relative_table": True}),
    ("full", {"ln_style": "pre", "share_relative_table": False}),
    ("dots_saveable", {"ln_style": "post", "share_relative_table": False})])
def test_scan_equals_loop_outputs_and_gradients(remat, kw):
    cfg = _cfg(remat=remat, position_type="both", **kw)  # absolute + gated relative bias
    loop_params = _params(cfg)
    scan_params = layer_stack.stack_layers(loop_params)
    (v0, out0), g0 = jax.jit(jax.value_and_grad(_hidden_loss(Transformer(cfg)), has_aux=True))(
        loop_params)
    (v1, out1), g1 = jax.jit(jax.value_and_grad(
        _hidden_loss(Transformer(cfg.replace(scan_layers=True))), has_aux=True))(scan_params)
    assert len(out1.hidden_states) == cfg.num_layers + 1
    out_diff = _max_rel_diff(out1.hidden_states, out0.hidden_states)
    grad_diff = _max_rel_diff(g1, layer_stack.stack_layers(g0))
    print(remat, kw, "outputs", out_diff, "gradients", grad_diff)  # pytest -s
    np.testing.assert_allclose(v1, v0, rtol=TOL)
    np.testing.assert_array_equal(out1.last_hidden_state, out1.hidden_states[-1])
    assert out_diff <= TOL and grad_diff <= TOL


def test_scanned_parameters_are_stacked_with_a_layers_axis():
    cfg = _cfg(position_type="both", share_relative_table=False, scan_layers=True)
    is_box = lambda x: isinstance(x, nn.Partitioned)  # noqa: E731

    def boxed(c):  # shapes and logical names, without computing anything
        return dict(jax.eval_shape(lambda: Transformer(c).init(jax.random.PRNGKey(1), IDS))[
            "params"])

    scanned, loop = boxed(cfg), boxed(cfg.replace(scan_layers=False))
    assert not any(k.startswith("layers_") for k in scanned)
    kernel = scanned["layers"]["mlp"]["intermediate"]["kernel"]
    assert kernel.names == ("layers", "embed", "mlp") and kernel.value.shape == (2, 32, 64)
    assert {"rel_pos_0", "rel_pos_1"} <= set(scanned)  # per-layer tables stay per layer
    # the layer axis is never sharded; the per-layer dimensions keep their rules
    mesh = partitioning.make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
    shardings = partitioning.logical_shardings(
        scanned, mesh, partitioning.standard_logical_axis_rules())
    assert shardings["layers"]["mlp"]["intermediate"]["kernel"].spec == \
        PartitionSpec(None, "fsdp", "tensor")
    # stack_layers of the loop's boxed tree is the scanned model's tree, names included
    names = lambda t: [x.names for x in jax.tree_util.tree_leaves(t, is_leaf=is_box)]  # noqa
    stacked = layer_stack.stack_layers(jax.tree_util.tree_map(
        lambda x: x.replace_boxed(jnp.zeros(x.value.shape)), loop, is_leaf=is_box))
    assert (jax.tree_util.tree_structure(stacked, is_leaf=is_box)
            == jax.tree_util.tree_structure(scanned, is_leaf=is_box))
    assert names(stacked) == names(scanned)
    assert names(layer_stack.unstack_layers(stacked)) == names(loop)


def test_dropout_with_row_ids_in_the_scan():
    """Per-row dropout masks (`row_ids`) still make a row's output independent of the other
    rows, and dropout is on (equal rows with different ids differ)."""
    model = Transformer(_cfg(scan_layers=True, remat="full", dropout_rate=0.2,
                             attention_dropout_rate=0.2))
    params = _params(model.config)
    run = jax.jit(lambda ids: model.apply(
        {"params": params}, ids, deterministic=False, rngs={"dropout": jax.random.PRNGKey(3)},
        row_ids=jnp.arange(4), method=Transformer.encode).last_hidden_state)
    a = run(jnp.concatenate([IDS, IDS]))
    b = run(jnp.concatenate([IDS[::-1] + 1, IDS]))  # other rows 0, 1; the same rows 2, 3
    np.testing.assert_allclose(b[2:], a[2:], atol=1e-6)
    assert float(jnp.max(jnp.abs(a[0] - a[2]))) > 1e-2


def test_decode_step_with_scan_equals_the_loop():
    n, length, mem_len = 2, 3, 3
    cfg = _cfg(cross_attention=True, ln_style="pre", position_type="both",
               share_relative_table=False, remat="dots_saveable")
    mem = jax.random.normal(jax.random.PRNGKey(4), (n, mem_len, 32))
    ids = IDS[:n, :length]
    loop_params = _params(cfg, ids, encoder_states=mem)
    steps = [jax.jit(lambda i, t, c, m=Transformer(c_), p=p_: m.apply(
                {"params": p}, i, t, c, encoder_states=mem, method=Transformer.decode_step))
             for c_, p_ in ((cfg, loop_params),
                            (cfg.replace(scan_layers=True), layer_stack.stack_layers(loop_params)))]
    caches = [Transformer.init_cache(cfg, n, length) for _ in steps]
    for t in range(length):
        outs = []
        for i, step in enumerate(steps):
            h, caches[i] = step(ids[:, t:t + 1], jnp.int32(t), caches[i])
            outs.append(h)
        assert len(caches[1]) == cfg.num_layers and caches[1][0].key.shape == (n, length, 4, 8)
        assert _max_rel_diff(outs[1], outs[0]) <= TOL
        assert _max_rel_diff(caches[1], caches[0]) <= TOL


def test_stack_unstack_round_trip_is_exact():
    params = _params(_cfg(position_type="both", share_relative_table=False, num_layers=4))
    stacked = layer_stack.stack_layers(params)
    assert set(stacked) == (set(params) - {f"layers_{i}" for i in range(4)}) | {"layers"}
    np.testing.assert_array_equal(stacked["layers"]["attention"]["query"]["kernel"][2],
                                  params["layers_2"]["attention"]["query"]["kernel"])
    back = layer_stack.unstack_layers(stacked)
    assert jax.tree_util.tree_structure(back) == jax.tree_util.tree_structure(params)
    for a, b in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(params)):
        np.testing.assert_array_equal(a, b)
    # to_layout converts only when needed; numpy trees (an optimizer moment, a loaded
    # checkpoint) stay numpy
    assert layer_stack.to_layout(stacked, True)["layers"] is stacked["layers"]
    moments = jax.tree_util.tree_map(lambda x: np.asarray(x) * 2, params)
    stacked_moments = layer_stack.to_layout(moments, True)
    assert isinstance(stacked_moments["layers"]["mlp"]["output"]["bias"], np.ndarray)
    assert layer_stack.is_stacked(stacked_moments) and not layer_stack.is_stacked(moments)


def test_layerwise_lr_decay_scales_each_slice_of_the_stack():
    cfg = _cfg(position_type="both", share_relative_table=False)
    params = _params(cfg)
    updates = jax.tree_util.tree_map(jnp.ones_like, params)
    scale = optim.scale_by_layer(num_layers=2, decay=0.5)
    per_layer, _ = scale.update(updates, scale.init(params))
    stacked, _ = scale.update(layer_stack.stack_layers(updates),
                              scale.init(layer_stack.stack_layers(params)))
    np.testing.assert_array_equal(stacked["layers"]["mlp"]["output"]["kernel"][:, 0, 0],
                                  [0.5 ** 2, 0.5 ** 1])
    for a, b in zip(jax.tree_util.tree_leaves(stacked),
                    jax.tree_util.tree_leaves(layer_stack.stack_layers(per_layer))):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match=r"parameter 'layers/.*' of shape \(2, .*leading axis "
                                         r"is not num_layers=3"):
        bad = optim.scale_by_layer(num_layers=3, decay=0.5)
        bad.update(layer_stack.stack_layers(updates), bad.init(params))


def test_hf_export_and_reassembly_read_the_stacked_layout():
    cfg = _cfg(cross_attention=True)
    loop_params = _params(cfg)
    scan_cfg, scan_params = cfg.replace(scan_layers=True), layer_stack.stack_layers(loop_params)
    nlu_cfg, nlu = reassemble.nlu_encoder(cfg, loop_params)
    scan_nlu_cfg, scan_nlu = reassemble.nlu_encoder(scan_cfg, scan_params)
    assert scan_nlu_cfg.scan_layers and "cross_attention" not in scan_nlu["layers"]
    want = hf.params_to_hf_state(nlu, nlu_cfg)
    got = hf.params_to_hf_state(scan_nlu, scan_nlu_cfg)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    # HF -> a scanned config: stacked params
    back = hf.hf_state_to_params(got, scan_nlu_cfg)
    np.testing.assert_array_equal(back["layers"]["mlp"]["output"]["kernel"],
                                  scan_nlu["layers"]["mlp"]["output"]["kernel"])
    ed, scan_ed = (reassemble.encoder_decoder(c, p, 1) for c, p in
                   ((cfg, loop_params), (scan_cfg, scan_params)))
    assert scan_ed.decoder_source_layers == ed.decoder_source_layers == (1,)
    for ours, theirs in ((scan_ed.decoder_params, ed.decoder_params),
                         (scan_ed.encoder_params, ed.encoder_params)):
        assert "layers" in ours
        for a, b in zip(jax.tree_util.tree_leaves(ours),
                        jax.tree_util.tree_leaves(layer_stack.stack_layers(theirs))):
            np.testing.assert_array_equal(a, b)


def test_a_checkpoint_loads_into_the_other_layout(tmp_path):
    """A per-layer model directory -> `init_from` of a scanned trainer run on a 2x2x2 mesh (one
    step trains): its step 0 holds the loaded weights stacked and computes what the loaded
    model computes. Those stacked weights -> `load_pretrained_params` of a per-layer model: the
    original ones. Resuming the scanned run with the per-layer layout: one line naming both."""
    model = {**TINY_MODEL, "num_layers": 2, "vocab_size": 128, "position_type": "both"}
    cfg = get_config("tiny", **model)
    hf.save_xlm_jax(str(tmp_path / "pre"), cfg, _params(cfg))
    pre = load_encoder(str(tmp_path / "pre"))
    assert not pre.config.scan_layers and "layers_1" in pre.params
    # 8 devices: the loaded arrays sit on one device while the run's mesh is set, where jax
    # refuses to stack or slice them unless the conversion leaves the mesh
    run = train_tiny(tmp_path / "run", 1, model={**model, "scan_layers": True},
                     objectives=mlm_objectives(pair=False), init_from=str(tmp_path / "pre"),
                     save_initial=True, num_devices=8,
                     mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2))
    assert np.isfinite(run.losses).all()
    at0 = load_encoder(str(tmp_path / "run"), step=0)
    assert at0.config.scan_layers and "layers" in at0.params
    _assert_equal(at0.params, layer_stack.stack_layers(pre.params))
    mask = np.ones(IDS.shape, np.int32)
    np.testing.assert_allclose(at0.hidden_states(np.asarray(IDS), mask),
                               pre.hidden_states(np.asarray(IDS), mask), atol=TOL, rtol=0)
    fresh = {"encoder": _params(cfg), "objectives": {}}
    into_loop = step_lib.load_pretrained_params(fresh, at0.params, "run")["encoder"]
    _assert_equal(into_loop, pre.params)
    with pytest.raises(ValueError, match=r"stores the encoder layers stacked \(scan_layers=True"
                                         r".*model uses per-layer \(scan_layers=False.*init_from"):
        train_tiny(tmp_path / "run", 2, model=model, objectives=mlm_objectives(pair=False))


def _assert_equal(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(x, y)


def test_clear_errors():
    with pytest.raises(ValueError, match=r"ModelConfig.scan_layers=1: must be True or False"):
        _cfg(scan_layers=1)
    params = _params(_cfg(num_layers=3))
    gap = {k: v for k, v in params.items() if k != "layers_1"}
    with pytest.raises(ValueError, match=r"are not layers_0 \.\.\. layers_1: cannot stack"):
        layer_stack.stack_layers(gap)
    both = {**layer_stack.stack_layers(params), "layers_0": params["layers_0"]}
    with pytest.raises(ValueError, match="both 'layers' and layers_i"):
        layer_stack.stack_layers(both)
