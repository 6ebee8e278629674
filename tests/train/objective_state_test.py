"""Objective state in the trainer, with InfoXLM's XLCo (EMA key encoder + queue) in the mixture:
sharded like the parameters, equal on 1 and 8 devices, under accumulation and across a
restart, started from loaded parameters with `init_from`; and the loss normalisation option."""
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from jax.sharding import PartitionSpec

from testlib.tiny_run import TINY_MODEL, mlm_objectives
from testlib.tiny_run import assert_trees_close as _assert_close
from testlib.tiny_run import train_tiny as _train
from xlm_jax import model_dir as md
from xlm_jax.convert import hf
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.xlco import XLCo
from xlm_jax.train import declarations, loop, optim, partitioning
from xlm_jax.train import step as step_lib

EIGHT = dict(mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2), num_devices=8)


def _with_xlco(queue_size=16, momentum=0.9, **kw):
    """MMLM + TLM + XLCo (with its projection module) on synthetic streams; batch 8 fills a
    queue of 16 with the stream's first 2 batches before step 1."""
    specs = mlm_objectives()
    specs["xlco"] = loop.ObjectiveSpec(
        factory=lambda model, name: XLCo(model, name=name, kind="mixup_pair", layer=1,
                                         queue_size=queue_size, momentum=momentum,
                                         projection_dim=16, **kw),
        task="synthetic:mixup_pair")
    return specs


def _state(model_dir, step=None):
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(md.trainer_state_dir(str(model_dir), step))


def test_key_encoder_is_sharded_like_the_params_and_the_queue_by_its_rule():
    cfg = get_config("tiny", **TINY_MODEL)
    net = Transformer(cfg)
    xlco = XLCo(net, queue_size=32, projection_dim=16)
    objs = [step_lib.WeightedObjective(xlco)]
    init = step_lib.make_init_fn(net, objs, optim.make_optimizer(optim.OptimizerConfig()), 16)
    mesh = partitioning.make_mesh(EIGHT["mesh"], jax.devices()[:8])
    for overrides, queue_spec in (((), PartitionSpec(None, None)),
                                  ((("queue", ("data", "fsdp")),),
                                   PartitionSpec(("data", "fsdp"), None))):
        # the queue's rule comes from the objective; a run's override still wins
        rules = declarations.merge_rules(partitioning.standard_logical_axis_rules(), [xlco],
                                         overrides)
        _, shard = step_lib.state_shardings(init, mesh, rules)
        specs = jax.tree_util.tree_map(lambda s: s.spec, shard)
        assert specs.obj_state["xlco"]["key_params"] == specs.params  # encoder + projection
        assert specs.obj_state["xlco"]["key_params"]["encoder"]["embeddings"]["word_embeddings"][
            "embedding"] == PartitionSpec("tensor", "fsdp")  # not replicated
        assert specs.params["objectives"]["xlco"]["dense"]["kernel"] == PartitionSpec(
            "fsdp", None)  # ("embed", "embed_proj")
        assert specs.obj_state["xlco"]["queue"] == queue_spec


def test_eight_devices_match_single_device_with_xlco(tmp_path):
    single = _train(tmp_path / "one", 6, objectives=_with_xlco())
    sharded = _train(tmp_path / "eight", 6, objectives=_with_xlco(), **EIGHT)
    # XLCo's loss is on from step 1 (the queue of 16 filled from two batches of 8 before it);
    # the fill runs over the sharded state too, so the queues below agree
    assert single.last_metrics["xlco/loss"] > 1.0
    np.testing.assert_allclose(sharded.losses, single.losses, atol=1e-5, rtol=0)
    a, b = _state(tmp_path / "eight"), _state(tmp_path / "one")
    _assert_close(a["obj_state"], b["obj_state"], 1e-5)
    assert int(a["obj_state"]["xlco"]["filled"]) == 16 and int(a["obj_state"]["xlco"]["ptr"]) == 0


def test_accumulation_enqueues_the_same_keys_in_the_same_order(tmp_path):
    big = _train(tmp_path / "big", 4, batch=16, objectives=_with_xlco(queue_size=32))
    acc = _train(tmp_path / "acc", 4, batch=16, accum=4,
                 objectives=_with_xlco(queue_size=32))
    assert big.last_metrics["xlco/loss"] > 1.0
    np.testing.assert_allclose(acc.losses, big.losses, atol=1e-5, rtol=0)
    _assert_close(_state(tmp_path / "acc")["obj_state"], _state(tmp_path / "big")["obj_state"],
                  1e-5)


def test_resume_restores_key_encoder_and_queue(tmp_path):
    straight = _train(tmp_path / "straight", 8, objectives=_with_xlco())
    _train(tmp_path / "split", 4, objectives=_with_xlco())
    second = _train(tmp_path / "split", 8, objectives=_with_xlco())
    assert len(second.losses) == 4
    np.testing.assert_allclose(second.losses, straight.losses[4:], atol=1e-6, rtol=0)
    _assert_close(_state(tmp_path / "split")["obj_state"],
                  _state(tmp_path / "straight")["obj_state"], 1e-6)


def test_init_from_starts_the_key_encoder_at_the_loaded_params(tmp_path):
    _train(tmp_path / "pre", 3)  # MMLM + TLM only
    _, loaded = hf.load_xlm_jax(str(tmp_path / "pre"))
    _train(tmp_path / "run", 1, objectives=_with_xlco(),
           init_from=str(tmp_path / "pre"), save_initial=True)
    start = _state(tmp_path / "run", step=0)
    _assert_close(start["params"]["encoder"], loaded, 0.0)
    _assert_close(start["obj_state"]["xlco"]["key_params"]["encoder"], loaded, 0.0)
    # the projection (an objective module) is not in the encoder checkpoint: it keeps its init
    _assert_close(start["obj_state"]["xlco"]["key_params"]["objectives"],
                  start["params"]["objectives"], 0.0)
    # the queue was filled before step 1 from the loaded encoder (continued pre-training)
    assert int(start["obj_state"]["xlco"]["filled"]) == 16


@pytest.mark.parametrize("normalization", ["per_objective", "pooled"])
def test_loss_normalization(tmp_path, normalization):
    r = _train(tmp_path, 1, loss_normalization=normalization)
    m = r.last_metrics  # per-objective metrics are per-unit means in both modes
    if normalization == "per_objective":
        want = m["mmlm/loss"] + m["tlm/loss"]
    else:
        want = ((m["mmlm/loss"] * m["mmlm/count"] + m["tlm/loss"] * m["tlm/count"])
                / (m["mmlm/count"] + m["tlm/count"]))
    assert r.losses[0] == pytest.approx(want, rel=1e-5)


def test_unknown_loss_normalization_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"loop.train.loss_normalization='mean': expected one "
                                         r"of per_objective, pooled"):
        _train(tmp_path, 1, loss_normalization="mean")
