"""XLM-E (MRTD + TRTD, one shared generator and RTD head) in the real trainer: sharded on 8
fake devices = 1 device, exact gradient accumulation, the discriminator as the pre-trained
encoder (load_encoder; export-hf writes it in the self-contained HF format and refuses it as
XLM-R, which has no relative bias),
and a TRTD task whose rows are not pairs failing before compiling. The SIGKILL/resume test is
in cli_test.py (tests/testlib/objective_mix.gin)."""
import os

import numpy as np
import orbax.checkpoint as ocp
import pytest

from testlib.tiny_run import assert_trees_close as _assert_close
from testlib.tiny_run import train_tiny as _train
from xlm_jax import model_dir as md
from xlm_jax.objectives.xlme import ReplacedTokenDetection
from xlm_jax.train import loop, partitioning

EIGHT = dict(mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2), num_devices=8)
MODEL = {"position_type": "both"}


def _xlme(trtd=True, mono_task="synthetic:mono", **kw):
    def spec(kind, task):
        return loop.ObjectiveSpec(factory=lambda model, name: ReplacedTokenDetection(
            model, name=name, kind=kind, generator_layers=1, max_predictions=6, **kw), task=task)
    specs = {"mrtd": spec("mono", mono_task)}
    if trtd:
        specs["trtd"] = spec("pair", "synthetic:pair")
    return specs


def _state(model_dir, step=None):
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(md.trainer_state_dir(str(model_dir), step))


def test_eight_devices_with_accumulation_match_one_and_the_modules_are_shared(tmp_path):
    """One 8-device run with 4 microbatches against one device and one batch: sharding and
    exact accumulation (the RTD sums are rescaled by global counts) in one comparison."""
    one = _train(tmp_path / "one", 3, batch=16, model=MODEL, objectives=_xlme())
    eight = _train(tmp_path / "eight", 3, batch=16, accum=4, model=MODEL, objectives=_xlme(),
                   **EIGHT)
    m = one.last_metrics
    assert m["mrtd/mlm_loss"] > 1.0 and 0 < m["trtd/rtd_loss"] < 1.0
    for k in ("rtd_accuracy", "rtd_precision", "rtd_recall", "replaced_fraction"):
        assert 0.0 <= m[f"mrtd/{k}"] <= 1.0, k
    assert not any(k.split("/")[-1].startswith("_") for k in m)
    # losses are ~50 (lambda = 50 times the BCE): float32 summation order leaves ~1e-5
    np.testing.assert_allclose(eight.losses, one.losses, atol=1e-5, rtol=2e-6)
    for k in ("mrtd/rtd_recall", "trtd/mlm_accuracy", "trtd/rtd_loss"):
        assert eight.last_metrics[k] == pytest.approx(m[k], abs=1e-5), k
    a, b = _state(tmp_path / "eight"), _state(tmp_path / "one")
    assert sorted(b["params"]["objectives"]) == ["generator", "rtd_head"]  # one of each
    _assert_close(a["params"], b["params"], 1e-5)
    _assert_close(a["opt_state"], b["opt_state"], 1e-5)


def test_discriminator_is_the_encoder_and_exports_but_not_as_xlmr(tmp_path):
    from xlm_jax.convert.__main__ import main as convert_main
    from xlm_jax.encoder import load_encoder

    _train(tmp_path / "run", 2, model=MODEL, objectives=_xlme(trtd=False))
    enc = load_encoder(str(tmp_path / "run"))
    disc = _state(tmp_path / "run")["params"]["encoder"]
    _assert_close(enc.params, disc, 0.0)
    assert "rel_pos" in enc.params and enc.config.position_type == "both"
    out = tmp_path / "hf"
    assert convert_main(["export-hf", "--checkpoint", str(tmp_path / "run"),
                         "--out", str(out), "--format", "xlm-roberta"]) == 2
    assert not os.path.exists(out / "model.safetensors")
    assert convert_main(["export-hf", "--checkpoint", str(tmp_path / "run"),
                         "--out", str(out)]) == 0  # the self-contained format (auto)
    back = load_encoder(str(out))
    _assert_close(back.params, enc.params, 0.0)


def test_trtd_on_rows_that_are_not_pairs_fails_before_compiling(tmp_path):
    pytest.importorskip("seqio")
    specs = {"trtd": loop.ObjectiveSpec(factory=lambda model, name: ReplacedTokenDetection(
        model, name=name, kind="pair", generator_layers=1, max_predictions=6),
        task="demo_mono")}
    with pytest.raises(ValueError, match=r"objective 'trtd' \(ReplacedTokenDetection\) reads "
                                         r"examples of kind 'pair', but task demo_mono_\w+ "
                                         r"\(in demo_mono\) holds examples of kind 'mono'"):
        _train(tmp_path, 2, objectives=specs, model={"vocab_size": 8002},
               task_modules=["xlm_jax_tasks.demo"])
    assert md.checkpoint_steps(str(tmp_path)) == []  # nothing trained or saved
