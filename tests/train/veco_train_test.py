"""VECO (IS-MLM + CS-MLM on a stack with cross-attention) in the real trainer: 8 fake devices
with gradient accumulation = 1 device (the four terms' means use global counts)."""
import functools

import numpy as np
import orbax.checkpoint as ocp

from testlib.tiny_run import assert_trees_close as _assert_close
from testlib.tiny_run import train_tiny as _train
from xlm_jax import model_dir as md
from xlm_jax.objectives.veco import VariableMLM
from xlm_jax.train import loop, partitioning

MODEL = {"cross_attention": True}


def _veco():
    return {"veco": loop.ObjectiveSpec(factory=lambda model, name: VariableMLM(
        model, name=name, mask_prob=0.25, max_predictions=9), task="synthetic:split_pair")}


def _state(model_dir):
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(md.trainer_state_dir(str(model_dir)))


def test_eight_devices_with_accumulation_match_one_device(tmp_path):
    """One run on 8 devices with 2 microbatches against one device and one batch: sharding
    and accumulation (whose exactness rests on the global per-side counts) in one comparison."""
    one = _train(tmp_path / "one", 3, model=MODEL, objectives=_veco(), batch=16)
    eight = _train(tmp_path / "eight", 3, model=MODEL, objectives=_veco(), batch=16, accum=2,
                   mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2), num_devices=8)
    m = one.last_metrics
    terms = ("is_x", "is_y", "cs_xy", "cs_yx")
    assert abs(m["veco/loss"] - sum(m[f"veco/{t}_loss"] for t in terms)) < 1e-4
    np.testing.assert_allclose(eight.losses, one.losses, atol=1e-5, rtol=1e-6)
    b = _state(tmp_path / "one")
    assert "cross_attention" in b["params"]["encoder"]["layers_0"]
    _assert_close(_state(tmp_path / "eight")["params"], b["params"], 1e-5)


def test_cross_attention_warm_up_resumes_exactly_across_the_switch(tmp_path):
    """train_only='cross_attention' for 2 updates: only cross-attention moves in them, and a
    run stopped at the switch and resumed ends where the uninterrupted run ends."""
    from xlm_jax.train import optim

    opt = optim.OptimizerConfig(learning_rate=3e-3, warmup_steps=0, total_steps=20,
                                train_only="cross_attention", train_only_steps=2)
    _train(tmp_path / "straight", 4, model=MODEL, objectives=_veco(), optimizer=opt)
    _train(tmp_path / "split", 2, model=MODEL, objectives=_veco(), optimizer=opt,
           save_initial=True)
    start = _state_at(tmp_path / "split", 0)["params"]["encoder"]
    switch = _state_at(tmp_path / "split", 2)["params"]["encoder"]
    for name in ("attention", "mlp", "cross_attention"):
        moved = not np.array_equal(switch["layers_0"][name]["query" if "att" in name else
                                                        "intermediate"]["kernel"],
                                   start["layers_0"][name]["query" if "att" in name else
                                                       "intermediate"]["kernel"])
        assert moved == (name == "cross_attention"), name
    np.testing.assert_array_equal(switch["embeddings"]["word_embeddings"]["embedding"],
                                  start["embeddings"]["word_embeddings"]["embedding"])
    _train(tmp_path / "split", 4, model=MODEL, objectives=_veco(), optimizer=opt)
    a, b = _state(tmp_path / "straight"), _state(tmp_path / "split")
    _assert_close(a["params"], b["params"], 0.0)
    _assert_close(a["opt_state"], b["opt_state"], 0.0)
    assert not np.array_equal(b["params"]["encoder"]["layers_0"]["mlp"]["intermediate"]["kernel"],
                              switch["layers_0"]["mlp"]["intermediate"]["kernel"])


def _state_at(model_dir, step):
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(md.trainer_state_dir(str(model_dir), step))


def test_translation_starts_from_a_veco_checkpoint_and_trains(tmp_path):
    """`init_from` a VECO run into the Translation objective (what `python -m xlm_jax.translate
    --init_from` does): at step 0 the decoder's layer is the stack's last layer, the shared
    arrays are separate buffers (the state is donated to the step; one buffer at two paths
    used to fail with "donate the same buffer twice"), and after training the decoder layer
    and the stack layer it came from have moved apart."""
    from xlm_jax.objectives.translation import Translation

    _train(tmp_path / "veco", 1, model={**MODEL, "num_layers": 2}, objectives=_veco())
    veco = _state(tmp_path / "veco")["params"]["encoder"]["layers_1"]
    spec = {"translate": loop.ObjectiveSpec(factory=functools.partial(
        Translation, decoder_layers=1), task="synthetic:split_pair")}
    _train(tmp_path / "mt", 2, model={**MODEL, "num_layers": 2, "num_languages": 4,
                                               "language_init": "zeros"},
           objectives=spec, init_from=str(tmp_path / "veco"), save_initial=True)
    start = _state_at(tmp_path / "mt", 0)["params"]
    _assert_close(start["objectives"]["decoder"]["layers_0"], veco, 0.0)
    _assert_close(start["encoder"]["layers_1"], veco, 0.0)
    end = _state(tmp_path / "mt")["params"]
    dec = end["objectives"]["decoder"]["layers_0"]["mlp"]["intermediate"]["kernel"]
    enc = end["encoder"]["layers_1"]["mlp"]["intermediate"]["kernel"]
    assert not np.array_equal(dec, veco["mlp"]["intermediate"]["kernel"])
    assert not np.array_equal(dec, enc)
