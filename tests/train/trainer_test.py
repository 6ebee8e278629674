"""Trainer correctness: sharded == single device, accumulation == big batch, restore onto a
different mesh, NaN stop, and the bad-input errors."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from testlib.tiny_run import assert_trees_close as _assert_trees_close
from testlib.tiny_run import mlm_objectives as _objectives
from testlib.tiny_run import train_tiny as _train
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import data as data_lib
from xlm_jax.train import loop, partitioning


def _final_params(model_dir):
    from xlm_jax.convert import hf

    return hf.load_xlm_jax(str(model_dir))[1]


@pytest.mark.parametrize("embed_proj", ["replicated", "tensor"])
def test_eight_devices_match_single_device(tmp_path, embed_proj):
    # "tensor": the heads' d x d projection split over `tensor` too; it gave wrong gradients
    # while the model's activation constraints were inactive (legacy `with mesh:`).
    # "replicated" runs as users do: dropout on (its masks are the same bits on any mesh:
    # jax's partitionable threefry) and asynchronous saves of the donated state.
    overrides = [("embed_proj", "tensor")] if embed_proj == "tensor" else []
    kw = {} if embed_proj == "tensor" else {
        "model": {"dropout_rate": 0.1, "attention_dropout_rate": 0.1}, "async_save": True,
        "save_every": 2}
    single = _train(tmp_path / "one", 5, **kw)
    sharded = _train(tmp_path / "eight", 5, mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2),
                     num_devices=8, axis_rule_overrides=overrides, **kw)
    assert len(single.losses) == 5 and single.losses[0] > 5.0
    np.testing.assert_allclose(sharded.losses, single.losses, atol=1e-5, rtol=0)
    _assert_trees_close(_final_params(tmp_path / "eight"), _final_params(tmp_path / "one"), 1e-5)


def test_gradient_accumulation_equals_big_batch(tmp_path):
    # As users run: dropout on (each row's masks are drawn from its index in the step's global
    # batch, so 4 microbatches draw the big batch's masks) and asynchronous saves of the
    # donated state. Drawing the masks from the microbatch's key instead fails at step 1.
    kw = {"model": {"dropout_rate": 0.1, "attention_dropout_rate": 0.1}, "async_save": True,
          "save_every": 2}
    big = _train(tmp_path / "big", 3, batch=16, **kw)
    acc = _train(tmp_path / "acc", 3, batch=16, accum=4, **kw)
    np.testing.assert_allclose(acc.losses, big.losses, atol=1e-5, rtol=0)
    _assert_trees_close(_final_params(tmp_path / "acc"), _final_params(tmp_path / "big"), 1e-5)


def test_restore_one_device_checkpoint_onto_eight(tmp_path):
    straight = _train(tmp_path / "straight", 8)
    first = _train(tmp_path / "moved", 4)  # 1 device; final save at step 4
    assert first.losses == straight.losses[:4]
    second = _train(tmp_path / "moved", 8, mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2),
                    num_devices=8)
    assert len(second.losses) == 4  # resumed at step 4, ran 5..8
    np.testing.assert_allclose(second.losses, straight.losses[4:], atol=1e-5, rtol=0)
    _assert_trees_close(_final_params(tmp_path / "moved"), _final_params(tmp_path / "straight"),
                        1e-5)


class _NanAfterThreeSteps(MaskedLM):
    """Counts optimizer steps in its objective state; its loss turns NaN from the 4th step."""

    def init_state(self, params):
        return {"updates": jnp.zeros((), jnp.int32)}

    def after_update(self, params, state, inputs):
        return {"updates": state["updates"] + 1}

    def loss(self, params, prepared, rng, state, deterministic=False):
        out = super().loss(params, prepared, rng, state, deterministic)
        bad = jnp.where(state["updates"] >= 3, jnp.nan, 0.0)
        return out.replace(loss_sum=out.loss_sum + bad,
                           metrics={**out.metrics, "loss": out.metrics["loss"] + bad})


def test_nan_loss_stops_naming_step_and_objective_keeping_last_good_checkpoint(tmp_path):
    with pytest.raises(FloatingPointError) as e:
        _train(tmp_path, 10, save_every=2, objectives=_objectives(_NanAfterThreeSteps))
    msg = str(e.value)
    assert "step 4" in msg and "'mmlm'" in msg and "last good checkpoint: step 2" in msg
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
    steps = [json.loads(line)["step"] for line in open(tmp_path / "metrics.jsonl")]
    assert steps == [1, 2, 3]  # the NaN step was not logged as a normal step


def test_nan_between_log_steps_is_found_at_the_next_fetch_before_any_save(tmp_path):
    # the host reads metrics at steps 3 (save) and 5 (log) only: the NaN of step 4 is found at
    # step 5, named as step 4, and nothing after the good step-3 checkpoint is saved
    with pytest.raises(FloatingPointError) as e:
        _train(tmp_path, 10, save_every=3, log_every=5,
               objectives=_objectives(_NanAfterThreeSteps))
    msg = str(e.value)
    assert "step 4" in msg and "'mmlm'" in msg and "last good checkpoint: step 3" in msg
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["3"]


def test_batch_not_divisible_by_data_parallel_size(tmp_path):
    with pytest.raises(ValueError, match=r"global batch size 6 is not divisible by the "
                                         r"data-parallel size 4"):
        _train(tmp_path, 2, batch=6, mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2),
               num_devices=8)


def test_unwritable_model_dir_fails_at_start(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises((ValueError, PermissionError, OSError)) as e:
        _train(blocker / "run", 2)
    assert str(blocker) in str(e.value)


def test_periodic_eval_writes_eval_metrics(tmp_path):
    objectives = _objectives()
    objectives["mmlm"] = loop.ObjectiveSpec(
        factory=objectives["mmlm"].factory, task="synthetic:mono", eval_task="synthetic:mono")
    _train(tmp_path, 4, objectives=objectives, eval_every=2, eval_batches=2)
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    evals = [r for r in rows if r["split"] == "eval"]
    assert [r["step"] for r in evals] == [2, 4]
    for r in evals:  # only the objective with an eval task is evaluated
        assert 4.0 < r["mmlm/loss"] < 7.0 and 0.0 <= r["mmlm/accuracy"] <= 1.0
        assert "tlm/loss" not in r
    assert evals[0]["mmlm/loss"] != evals[1]["mmlm/loss"]  # the parameters changed


def test_data_resume_reseed_is_a_deterministic_new_draw(tmp_path):
    # (data_resume="replay", the default, is the exact resume of cli_test's SIGKILL test)
    import shutil

    straight = _train(tmp_path / "straight", 4, save_every=2)
    for name in ("a", "b"):  # a run preempted after its step-2 checkpoint
        shutil.copytree(tmp_path / "straight", tmp_path / name)
        shutil.rmtree(tmp_path / name / "checkpoints" / "4")
    a = _train(tmp_path / "a", 4, data_resume="reseed")
    b = _train(tmp_path / "b", 4, data_resume="reseed")
    assert len(a.losses) == 2 and a.losses == b.losses  # same checkpoint, same batches
    # other batches than the uninterrupted run's (the model and the rng are the same)
    assert all(abs(x - y) > 1e-4 for x, y in zip(a.losses, straight.losses[2:]))
    assert data_lib.resume_plan(7, 0, "reseed") == (7, 0)  # fresh runs ignore the mode
    assert data_lib.resume_plan(7, 3, "replay") == (7, 3)
    assert data_lib.resume_plan(7, 3, "reseed") != data_lib.resume_plan(7, 4, "reseed")


def test_unknown_data_resume_mode_fails_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match=r"data_resume='resume' is not one of \('checkpoint', 'replay', "
                                         r"'reseed'\)"):
        _train(tmp_path / "run", 2, data_resume="resume")
    assert not os.path.exists(tmp_path / "run")


def test_bfloat16_compute_on_eight_devices_tracks_float32(tmp_path):
    fp32 = _train(tmp_path / "fp32", 3)
    bf16 = _train(tmp_path / "bf16", 3, model={"dtype": "bfloat16"},
                  mesh=partitioning.MeshConfig(data=2, fsdp=2, tensor=2), num_devices=8)
    np.testing.assert_allclose(bf16.losses, fp32.losses, atol=1e-2, rtol=0)
    assert bf16.losses != fp32.losses  # the activations really were bf16
    params = _final_params(tmp_path / "bf16")
    assert {str(v.dtype) for v in jax.tree_util.tree_leaves(params)} == {"float32"}


def test_language_embedding_model_trains_and_evaluates_on_synthetic_streams(tmp_path):
    # Synthetic lang_ids used to reach num_languages, one past the table (row 0 = padding):
    # jnp.take filled that row with NaN and the run stopped at step 1.
    from xlm_jax.data.synthetic import synthetic_batch

    n = data_lib.synthetic_language_count(3)
    lang_ids = synthetic_batch(64, 32, 256, "pair", seed=0, num_languages=n)["lang_ids"]
    assert set(np.unique(lang_ids)) == {0, 1, 2}  # padding plus the table's two languages
    objectives = _objectives()
    objectives["mmlm"] = loop.ObjectiveSpec(
        factory=objectives["mmlm"].factory, task="synthetic:mono", eval_task="synthetic:mono")
    result = _train(tmp_path, 3, model={"num_languages": 3}, objectives=objectives,
                    eval_every=3, eval_batches=1)
    assert len(result.losses) == 3 and all(np.isfinite(result.losses))
    (evaluated,) = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")
                    if json.loads(line)["split"] == "eval"]
    assert np.isfinite(evaluated["mmlm/loss"])
