"""The trainer saves each seqio stream's position with its checkpoints and resumes from it.

Real seqio mixtures of the demo corpus (small ones: a 77-task mixture takes tens of seconds
to build), real orbax checkpoints, the real `loop.train`.
"""
from __future__ import annotations

import io
import json
import os
import shutil

import jax
import orbax.checkpoint as ocp
import pytest
import seqio
from etils import epath

import xlm_jax_tasks.demo  # noqa: F401  (registers the demo tasks)
from tests.testlib import tiny_run
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax import model_dir as md
from xlm_jax.train import data_state, loop

for _name, _members in (("state_mono", ["demo_mono_af", "demo_mono_ig", "demo_mono_nl"]),
                        ("state_pairs", ["demo_parallel_en_de", "demo_parallel_en_fr"]),
                        ("state_pairs_other", ["demo_parallel_en_es", "demo_parallel_en_it"])):
    if _name not in seqio.MixtureRegistry.names():
        seqio.MixtureRegistry.add(_name, [(m, 1.0) for m in _members])


def _specs(pairs: str = "state_pairs"):
    def mlm(kind):
        return lambda model, name: MaskedLM(model, name=name, kind=kind, max_predictions=6)

    return {"mmlm": loop.ObjectiveSpec(factory=mlm("mono"), task="state_mono"),
            "tlm": loop.ObjectiveSpec(factory=mlm("pair"), task=pairs)}


def _train(model_dir, steps, pairs="state_pairs", **kw):
    out = io.StringIO()
    result = tiny_run.train_tiny(model_dir, steps, objectives=_specs(pairs),
                                 model={"vocab_size": 8002}, batch=4, save_every=3,
                                 task_modules=["xlm_jax_tasks.demo"], out=out, **kw)
    return result, out.getvalue()


def _params(model_dir, step):
    """(params, the checkpoint's JSON extra) of checkpoint `step`."""
    with ocp.StandardCheckpointer() as ckptr:
        state = ckptr.restore(md.trainer_state_dir(str(model_dir), step))
    extra_dir = os.path.join(os.path.dirname(md.trainer_state_dir(str(model_dir), step)),
                             md.EXTRA_ITEM)
    return state["params"], ocp.JsonCheckpointHandler().restore(epath.Path(extra_dir))


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """6 uninterrupted steps, checkpoints at 3 and 6."""
    root = tmp_path_factory.mktemp("straight")
    result, _ = _train(root, 6)
    return root, result


def _preempted_copy(straight_dir, dst):
    """The straight run as it was on disk right after its step-3 checkpoint."""
    shutil.copytree(straight_dir, dst)
    shutil.rmtree(dst / "checkpoints" / "6")
    shutil.rmtree(dst / data_state.STATE_DIR / "6")


def test_resume_restores_the_saved_positions_and_ends_bit_identical(straight, tmp_path):
    root, result = straight
    params, extra = _params(root, 6)
    assert set(extra["data_state"]) == {"mmlm", "tlm"}
    assert extra["data_state"]["tlm"] == {"seed": 1000, "task": "state_pairs",
                                          "batch_size": 4, "seq_len": 32}
    assert sorted(os.listdir(root / data_state.STATE_DIR)) == ["3", "6"]

    _preempted_copy(root, tmp_path / "resumed")
    resumed, log = _train(tmp_path / "resumed", 6)
    assert "restored the input position of mmlm, tlm" in log and "replaying" not in log
    assert resumed.losses == result.losses[3:]
    tiny_run.assert_trees_close(_params(tmp_path / "resumed", 6)[0], params, atol=0)
    # the copy's log held steps 4-6 of the straight run; each step is logged once
    rows = [json.loads(line) for line in open(tmp_path / "resumed" / "metrics.jsonl")]
    assert [r["step"] for r in rows if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]


def test_without_a_saved_position_the_stream_replays_to_the_same_end(straight, tmp_path):
    root, result = straight
    _preempted_copy(root, tmp_path / "replayed")
    shutil.rmtree(tmp_path / "replayed" / data_state.STATE_DIR / "3")
    replayed, log = _train(tmp_path / "replayed", 6)
    assert "replaying the input batches of mmlm, tlm" in log
    assert replayed.losses == result.losses[3:]
    # the control for both tests: a fresh draw (reseed) gives other batches
    _preempted_copy(root, tmp_path / "reseeded")
    reseeded, _ = _train(tmp_path / "reseeded", 6, data_resume="reseed")
    assert reseeded.losses != result.losses[3:]


def test_a_position_saved_for_another_task_is_refused_before_anything_is_written(
        straight, tmp_path):
    root, _ = straight
    _preempted_copy(root, tmp_path / "run")
    with pytest.raises(ValueError, match=r"objective 'tlm': the checkpoint at step 3 in .* "
                                         r"saved the input position of task='state_pairs', "
                                         r"but this run has task='state_pairs_other'"):
        _train(tmp_path / "run", 6, pairs="state_pairs_other")
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["3"]


def test_positions_of_steps_orbax_no_longer_keeps_are_deleted(tmp_path):
    _train(tmp_path / "run", 6, keep=1)
    assert sorted(os.listdir(tmp_path / "run" / data_state.STATE_DIR)) == ["6"]
    assert sorted(os.listdir(tmp_path / "run" / "checkpoints")) == ["6"]
    names = sorted(os.listdir(tmp_path / "run" / data_state.STATE_DIR / "6"))
    suffix = f".shard_000-of-{jax.process_count():03d}"
    assert names == [f"mmlm{suffix}.tfdata.zz", f"tlm{suffix}.tfdata.zz"]
