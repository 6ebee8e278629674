"""The trainer on prepared data (`loop.train.prepared_data`): it trains, a resume from a saved
input position ends bit-identical to the uninterrupted run, a position saved by another
process count reseeds the prepared streams at once, and a run whose task is not prepared is
stopped before anything is built."""
from __future__ import annotations

import importlib
import contextlib
import io
import os
import shutil

import orbax.checkpoint as ocp
import pytest
from etils import epath

from tests.testlib import prepared_corpus as pc
from tests.testlib import process_state, tiny_run
from xlm_jax import model_dir as md
from xlm_jax.models.config import get_config
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import data_state, loop, mixture, setup, streams
from xlm_jax.train.resume import ResumeInfo


# seqio's registries and the prepared-data switch put back after each test: the tests
# register tasks again over the prepared data (issue 56).
pytestmark = pytest.mark.usefixtures("seqio_isolated")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = pc.write(str(tmp_path_factory.mktemp("corpus")))
    out = os.path.join(root, "prepared")
    # prep_tasks importable for the module's tests, which register its tasks again over the
    # prepared data; seqio, the prepared-data switch and sys.path as before after them
    with process_state.restored("seqio", "prepared data"), pc.on_path(root):
        pc.prepare_here(root, out, pattern="pd_mono")
        pc.prepare_here(root, out, pattern="pd_pairs")
        importlib.import_module(pc.MODULE)  # the module's, forgotten after it (on_path)
        yield root, out


def _specs():
    def mlm(kind):
        return lambda model, name: MaskedLM(model, name=name, kind=kind, max_predictions=6)

    return {"mmlm": loop.ObjectiveSpec(factory=mlm("mono"), task="pd_mono"),
            "tlm": loop.ObjectiveSpec(factory=mlm("pair"), task="pd_pairs")}


def _train(model_dir, steps, prepared_data, **kw):
    out = io.StringIO()
    result = tiny_run.train_tiny(model_dir, steps, objectives=_specs(),
                                 model={"vocab_size": 8002}, batch=4, save_every=3,
                                 task_modules=[pc.MODULE], prepared_data=prepared_data, out=out,
                                 **kw)
    return result, out.getvalue()


def test_a_prepared_run_resumes_bit_identical_from_its_saved_positions(corpus, tmp_path):
    _, out = corpus
    straight, _ = _train(tmp_path / "straight", 6, out)
    assert len(straight.losses) == 6 and all(0 < x < 20 for x in straight.losses)
    shutil.copytree(tmp_path / "straight", tmp_path / "resumed")
    shutil.rmtree(tmp_path / "resumed" / "checkpoints" / "6")
    shutil.rmtree(tmp_path / "resumed" / data_state.STATE_DIR / "6")
    resumed, log = _train(tmp_path / "resumed", 6, out)
    assert "restored the input position of mmlm, tlm" in log and "replaying" not in log
    assert resumed.losses == straight.losses[3:]
    # the same run on the raw files reads other batches (the raw sources are in file order)
    raw, _ = _train(tmp_path / "raw", 3, None)
    assert raw.losses != straight.losses[:3]


def _state_bytes(model_dir, step) -> int:
    folder = os.path.join(model_dir, data_state.STATE_DIR, str(step))
    return sum(os.path.getsize(os.path.join(folder, name)) for name in os.listdir(folder))


def _extra(model_dir, step) -> dict:
    """The checkpoint's JSON record (`ResumeInfo`) at `step`."""
    folder = os.path.join(os.path.dirname(md.trainer_state_dir(str(model_dir), step)),
                          md.EXTRA_ITEM)
    return ocp.JsonCheckpointHandler().restore(epath.Path(folder))


def test_prepared_positions_are_small_and_do_not_grow_with_the_step(corpus, tmp_path):
    _, out = corpus
    _train(tmp_path / "run", 12, out)
    # symbolic positions, no shuffle buffer, compressed: a few integers per dataset op of each
    # Task (the buffered examples were 1.4 MB for pd_mono alone at 32 x 64, uncompressed)
    sizes = [_state_bytes(tmp_path / "run", step) for step in (3, 12)]
    assert all(size < 16_000 for size in sizes), sizes
    assert abs(sizes[0] - sizes[1]) < 1_000, sizes


def test_input_shards_are_recorded_and_files_of_the_old_naming_still_restore(corpus, tmp_path):
    _, out = corpus
    run = tmp_path / "run"
    _train(run, 3, out, input_shards=2)
    assert _extra(run, 3)["input_shards"] == 2
    names = sorted(os.listdir(run / data_state.STATE_DIR / "3"))
    assert names == [f"{o}.shard_00{v}-of-002.tfdata.zz" for o in ("mmlm", "tlm") for v in (0, 1)]
    with pytest.raises(ValueError, match=r"^loop.train.input_shards=3: must be a multiple of "
                                         r"the 1 processes and divide every objective's batch "
                                         r"\(4 rows\)"):
        _train(tmp_path / "three", 3, out, input_shards=3)
    assert not os.listdir(tmp_path / "three")  # refused before anything was written

    # a checkpoint from before input shards: one shard per process, files named by process
    _train(tmp_path / "old", 3, out)
    folder = tmp_path / "old" / data_state.STATE_DIR / "3"
    for name in os.listdir(folder):
        os.rename(folder / name, folder / name.replace(".shard_", ".process_"))
    extra = _extra(tmp_path / "old", 3)
    old = ResumeInfo(step=3, process_count=1, data_state=extra["data_state"])  # no input_shards
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        setup.make_streams({"mmlm": "pd_mono", "tlm": "pd_pairs"},
                           {"mmlm": mixture.Shape(4, 32), "tlm": mixture.Shape(4, 32)}, 0, old,
                           "checkpoint", get_config("tiny", vocab_size=8002),
                           str(tmp_path / "old"), old.saved_shards)
    assert "restored the input position of mmlm, tlm" in log.getvalue(), log.getvalue()


def test_positions_saved_by_another_process_count_reseed_prepared_streams(corpus, tmp_path):
    _, out = corpus
    streams.import_modules([pc.MODULE], out, ["pd_mono"])
    shapes = {"mmlm": mixture.Shape(4, 32)}
    saved = {"mmlm": {"seed": 0, "task": "pd_mono", "batch_size": 4, "seq_len": 32}}
    model = get_config("tiny", vocab_size=8002)
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        got, built = setup.make_streams({"mmlm": "pd_mono"}, shapes, 0,
                                        ResumeInfo(step=5000, process_count=2, data_state=saved),
                                        "checkpoint", model, str(tmp_path))
    assert ("the prepared data of mmlm continues in a new order drawn from (seed, step 5000): "
            "its positions were saved for 2 input shards") in log.getvalue()
    assert "replaying" not in log.getvalue()
    seed, position = streams.resume_plan(0, 5000, "reseed")
    assert built["mmlm"].seed == seed and position == 0
    want = streams.make_stream("pd_mono", 4, 32, seed, 0, 8002, 0, 1)
    first = next(got["mmlm"])
    assert all((first[k] == v).all() for k, v in next(want).items())


def test_a_run_whose_task_is_not_prepared_there_is_stopped_before_it_builds(corpus, tmp_path):
    _, out = corpus
    with pytest.raises(ValueError, match=r"task pd_veco_de \(in pd_veco\) is not prepared in "
                                         r"loop.train.prepared_data = "):
        streams.import_modules([pc.MODULE], out, ["pd_veco"])
