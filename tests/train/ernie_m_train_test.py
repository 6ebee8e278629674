"""ERNIE-M (MMLM + TLM + CAMLM + BTMLM) in the real trainer: 8 fake devices = 1 device,
and BTMLM's target languages resolved against the tasks' language list before compiling. The
SIGKILL/resume test is in cli_test.py (tests/testlib/objective_mix.gin)."""
import functools

import numpy as np
import orbax.checkpoint as ocp
import pytest

from testlib.tiny_run import assert_trees_close as _assert_close
from testlib.tiny_run import mlm_objectives
from testlib.tiny_run import train_tiny as _train
from xlm_jax import model_dir as md
from xlm_jax.objectives.ernie_m import BackTranslationMLM, CrossAttentionMLM
from xlm_jax.train import loop, partitioning

MODEL = {"num_languages": 5}


def _ernie_m(mono_task="synthetic:mono", targets=("de", "fr")):
    specs = mlm_objectives()
    specs["camlm"] = loop.ObjectiveSpec(factory=lambda model, name: CrossAttentionMLM(
        model, name=name, max_predictions=6), task="synthetic:pair")
    # a partial of the class, so that the trainer passes it the run's language table
    specs["btmlm"] = loop.ObjectiveSpec(factory=functools.partial(
        BackTranslationMLM, target_languages=targets, proportion=0.2, max_predictions=6),
        task=mono_task)
    return specs


def _state(model_dir):
    with ocp.StandardCheckpointer() as ckptr:
        return ckptr.restore(md.trainer_state_dir(str(model_dir)))


def test_eight_devices_match_one(tmp_path):
    one = _train(tmp_path / "one", 4, model=MODEL, objectives=_ernie_m())
    eight = _train(tmp_path / "eight", 4, model=MODEL, objectives=_ernie_m(),
                   mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2), num_devices=8)
    m = one.last_metrics
    for k in ("camlm/src_accuracy", "camlm/tgt_accuracy", "btmlm/pseudo_copy_rate"):
        assert 0.0 <= m[k] <= 1.0, k
    assert m["camlm/loss"] == pytest.approx(m["camlm/src_loss"] + m["camlm/tgt_loss"], rel=1e-5)
    assert m["btmlm/loss"] > 1.0
    np.testing.assert_allclose(eight.losses, one.losses, atol=1e-5, rtol=0)
    a, b = _state(tmp_path / "eight"), _state(tmp_path / "one")
    _assert_close(a["params"], b["params"], 1e-5)
    _assert_close(a["opt_state"], b["opt_state"], 1e-5)


def test_btmlm_target_not_in_the_language_list_fails_before_compiling(tmp_path):
    pytest.importorskip("seqio")
    with pytest.raises(ValueError, match=r"BackTranslationMLM\(name='btmlm'\): "
                                         r"target_languages has 'xx': language 'xx' is not in "
                                         r"the language list \(116 languages"):
        _train(tmp_path, 2, objectives=_ernie_m("demo_mono", ("de", "xx")),
               model={"vocab_size": 8002, "num_languages": 117}, task_modules=["xlm_jax_tasks.demo"])
    assert md.checkpoint_steps(str(tmp_path)) == []
