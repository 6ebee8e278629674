"""Objective-owned modules in the trainer (`params = {encoder, objectives}`), with the test
objective `testlib.probe.TokenProbe` (a head of its own reading the tied word embeddings):
its loss and gradients against numpy, its sharding by the rule it declares, 8 devices = 1,
per-module learning rates, export-hf without it, and the declaration errors, each raised before
anything is compiled. The SIGKILL/resume test of the same objective is in cli_test.py."""
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec

from testlib.probe import TokenProbe
from testlib.tiny_run import TINY_MODEL, mlm_objectives
from testlib.tiny_run import assert_trees_close as _assert_close
from testlib.tiny_run import train_tiny as _train
from xlm_jax import model_dir as md
from xlm_jax.convert import hf
from xlm_jax.data.synthetic import synthetic_batch
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import declarations, loop, optim, partitioning
from xlm_jax.train import step as step_lib

EIGHT = dict(mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2), num_devices=8)


def _with_probe(**kw):
    specs = mlm_objectives(pair=False)
    specs["probe"] = loop.ObjectiveSpec(
        factory=lambda model, name: TokenProbe(model, name=name, **kw), task="synthetic:mono")
    return specs


def _state(model_dir, step=None):
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(md.trainer_state_dir(str(model_dir), step))


def test_loss_and_gradients_match_numpy_and_reach_head_and_tied_embeddings():
    net = Transformer(get_config("tiny", **TINY_MODEL))
    obj = TokenProbe(net, tied=True)
    params = nn.meta.unbox(step_lib.init_params(net, [step_lib.WeightedObjective(obj)], 16,
                                                   jax.random.PRNGKey(0)))
    assert set(params) == {"encoder", "objectives"} and set(params["objectives"]) == {"probe_head"}
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, 16, 256, "mono", seed=1).items()}

    def loss(p):
        return obj.loss(p, batch, jax.random.PRNGKey(0), {}, deterministic=True).losses["loss"]

    # numpy: CE of (h @ W + b + h @ E[:8].T) against id % 8 over the real tokens
    h = np.asarray(net.apply({"params": params["encoder"]}, batch["input_ids"],
                             method=Transformer.encode).last_hidden_state, np.float64)
    head = params["objectives"]["probe_head"]
    emb = np.asarray(params["encoder"]["embeddings"]["word_embeddings"]["embedding"], np.float64)
    logits = h @ np.asarray(head["kernel"]) + np.asarray(head["bias"]) + h @ emb[:8].T
    logits -= logits.max(-1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    ids = np.asarray(batch["input_ids"])
    nll = -np.take_along_axis(logp, (ids % 8)[..., None], -1)[..., 0]
    np.testing.assert_allclose(float(loss(params)), (nll * (ids != 1)).sum(), rtol=1e-5)

    grads = jax.jit(jax.grad(loss))(params)  # jitted: one program, not one per primitive
    assert float(jnp.abs(grads["objectives"]["probe_head"]["kernel"]).sum()) > 0
    table = grads["encoder"]["embeddings"]["word_embeddings"]["embedding"]
    # rows 0..7 are read directly (tied) as well as through the encoder's lookup
    without_tie = jax.jit(jax.grad(lambda p: TokenProbe(net).loss(
        p, batch, jax.random.PRNGKey(0), {}, True).losses["loss"]))(params)
    diff = np.abs(np.asarray(table - without_tie["encoder"]["embeddings"]["word_embeddings"][
        "embedding"]))
    assert diff[:8].sum() > 0 and diff[8:].max() < diff[:8].max()


def test_module_is_sharded_by_its_declared_rule_and_eight_devices_match_one(tmp_path):
    net = Transformer(get_config("tiny", **TINY_MODEL))
    probe = TokenProbe(net)
    init = step_lib.make_init_fn(net, [step_lib.WeightedObjective(probe)],
                                    optim.make_optimizer(optim.OptimizerConfig()), 16)
    mesh = partitioning.make_mesh(EIGHT["mesh"], jax.devices()[:8])
    rules = declarations.merge_rules(partitioning.standard_logical_axis_rules(), [probe])
    _, shard = step_lib.state_shardings(init, mesh, rules)
    assert shard.params["objectives"]["probe_head"]["kernel"].spec == PartitionSpec(
        "fsdp", "tensor")  # ("embed", "probe_classes") with the objective's rule -> tensor
    assert shard.params["objectives"]["probe_head"]["bias"].spec == PartitionSpec("tensor")

    single = _train(tmp_path / "one", 4, objectives=_with_probe(tied=True))
    sharded = _train(tmp_path / "eight", 4, objectives=_with_probe(tied=True), **EIGHT)
    assert single.last_metrics["probe/loss"] > 0.1
    np.testing.assert_allclose(sharded.losses, single.losses, atol=1e-5, rtol=0)
    a, b = _state(tmp_path / "eight"), _state(tmp_path / "one")
    _assert_close(a["params"], b["params"], 1e-5)
    _assert_close(a["opt_state"], b["opt_state"], 1e-5)


def test_module_learning_rate_multiplier_scales_its_first_update_only(tmp_path):
    def first_update(mult):
        d = tmp_path / f"m{mult}"
        cfg = optim.OptimizerConfig(learning_rate=1e-3, total_steps=10, schedule="constant",
                                    module_lr_multipliers={"probe_head": mult} if mult else {})
        _train(d, 1, objectives=_with_probe(), optimizer=cfg, save_initial=True)
        s0, s1 = _state(d, 0)["params"], _state(d, 1)["params"]
        return jax.tree_util.tree_map(lambda a, b: np.asarray(b) - np.asarray(a), s0, s1)

    full, half = first_update(None), first_update(0.5)
    _assert_close(half["encoder"], full["encoder"], 1e-9)
    kernel = full["objectives"]["probe_head"]["kernel"]
    assert np.abs(kernel).max() > 1e-4
    np.testing.assert_allclose(half["objectives"]["probe_head"]["kernel"], 0.5 * kernel,
                               rtol=1e-5, atol=1e-9)


def test_export_hf_leaves_objective_modules_out_and_keeps_parity(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from safetensors.numpy import load_file

    from testlib.hf_export import assert_export_parity
    from xlm_jax.convert.__main__ import main as convert_main

    _train(tmp_path / "run", 3, objectives=_with_probe(tied=True),
           model={"max_positions": 66})
    assert "probe_head" in _state(tmp_path / "run")["params"]["objectives"]
    out = tmp_path / "hf"
    assert convert_main(["export-hf", "--checkpoint", str(tmp_path / "run"),
                         "--out", str(out)]) == 0
    keys = load_file(os.path.join(out, "model.safetensors")).keys()
    assert not [k for k in keys if "probe" in k or "objectives" in k]
    ids = np.array([[0, 5, 17, 200, 9, 2, 1, 1], [0, 44, 3, 2, 1, 1, 1, 1]])
    assert_export_parity(out, tmp_path / "run", ids)


# ------------------------------------------------------------------ declaration errors


def _fails_before_compiling(tmp_path, objectives, match, **kw):
    with pytest.raises(ValueError, match=match):
        _train(tmp_path, 2, objectives=objectives, **kw)
    assert not os.path.exists(tmp_path / "checkpoints" / "2")


def test_module_axis_without_a_rule_is_named(tmp_path):
    _fails_before_compiling(
        tmp_path, _with_probe(rules=()),
        r"objective 'probe': module 'probe_head' parameter \['(bias|kernel)'\] uses logical axis "
        r"'probe_classes', which has no rule")


def test_two_objectives_declaring_one_module_name_is_an_error(tmp_path):
    specs = _with_probe()
    specs["probe2"] = loop.ObjectiveSpec(
        factory=lambda model, name: TokenProbe(model, name=name), task="synthetic:mono")
    _fails_before_compiling(tmp_path, specs,
                            r"objectives 'probe' and 'probe2' both declare module 'probe_head'")


def test_declared_sharing_trains_one_module(tmp_path):
    specs = _with_probe(shared=True)
    specs["probe2"] = loop.ObjectiveSpec(
        factory=lambda model, name: TokenProbe(model, name=name, shared=True, kind="pair"),
        task="synthetic:pair")
    r = _train(tmp_path, 2, objectives=specs)
    assert list(_state(tmp_path)["params"]["objectives"]) == ["probe_head"]
    assert r.last_metrics["probe2/loss"] > 0.1
    specs["probe2"] = loop.ObjectiveSpec(
        factory=lambda model, name: TokenProbe(model, name=name, shared=True, classes=4),
        task="synthetic:mono")
    _fails_before_compiling(tmp_path / "b", specs, r"objectives 'probe' and 'probe2' share "
                                                   r"module 'probe_head' but declare it with "
                                                   r"different parameter shapes")


def test_missing_encoder_parameter_is_named(tmp_path):
    _fails_before_compiling(
        tmp_path, _with_probe(tied=True, encoder_param="embeddings/word_embedding/embedding"),
        r"objective 'probe' reads encoder parameter 'embeddings/word_embedding/embedding', "
        r"which the encoder does not have")


def test_conflicting_rule_and_unknown_lr_multiplier_are_named(tmp_path):
    _fails_before_compiling(tmp_path, _with_probe(rules=(("embed", "tensor"),)),
                            r"objective 'probe' declares logical axis rule 'embed'")
    _fails_before_compiling(
        tmp_path / "b", _with_probe(),
        r"module_lr_multipliers names module\(s\) \['generator'\] that no objective declares",
        optimizer=optim.OptimizerConfig(module_lr_multipliers={"generator": 2.0}))


def test_feature_the_kind_does_not_have_is_named(tmp_path):
    class NeedsX(TokenProbe):
        def features(self):
            return ("input_ids", "x_input_ids")

    specs = _with_probe()
    specs["probe"] = loop.ObjectiveSpec(factory=lambda model, name: NeedsX(model, name=name),
                                        task="synthetic:mono")
    _fails_before_compiling(tmp_path, specs, r"objective 'probe' \(NeedsX\) reads feature\(s\) "
                                             r"\['x_input_ids'\], which examples of kind 'mono'")


def test_task_of_the_wrong_kind_fails_before_compiling_naming_both(tmp_path):
    pytest.importorskip("seqio")
    specs = {"tlm": loop.ObjectiveSpec(
        factory=lambda model, name: MaskedLM(model, name=name, kind="pair", max_predictions=6),
        task="demo_mono")}
    _fails_before_compiling(
        tmp_path, specs,
        r"objective 'tlm' \(MaskedLM\) reads examples of kind 'pair', but task demo_mono_\w+ "
        r"\(in demo_mono\) holds examples of kind 'mono'",
        model={"vocab_size": 8002}, task_modules=["xlm_jax_tasks.demo"])


def test_checkpoint_from_before_the_split_loads_as_encoder_and_refuses_resume(tmp_path):
    """An old trainer state (`params` = the encoder alone) still loads with load_xlm_jax /
    load_encoder (migrated), and resuming on it names the change."""
    _train(tmp_path, 2)
    state = _state(tmp_path, 2)
    old = {**state, "params": state["params"]["encoder"], "opt_state": state["opt_state"]}
    old_dir = tmp_path / "old"
    from xlm_jax.train import checkpoints

    os.makedirs(old_dir)
    for name in (md.CONFIG_NAME,):
        with open(tmp_path / name) as f, open(old_dir / name, "w") as g:
            g.write(f.read())
    with checkpoints.Checkpointer(str(old_dir), checkpoints.CheckpointConfig(
            async_save=False)) as ck:
        ck.save(2, old, extra={"step": 2}, force=True)
    _, params = hf.load_xlm_jax(str(old_dir))
    _assert_close(params, state["params"]["encoder"], 0.0)
    with pytest.raises(ValueError, match=r"written before parameters were split into "
                                         r"\{encoder, objectives\}.*init_from"):
        _train(old_dir, 4)
