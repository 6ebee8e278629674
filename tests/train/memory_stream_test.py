"""Input streams passed as objects (`data.MemoryStream` as `ObjectiveSpec.task`) and the kind
check every task gets (seqio, synthetic, in-memory): a stream object trains exactly like the
synthetic stream it wraps, and a task of another kind than its objective's fails before
anything is compiled, in one line naming both kinds."""
import numpy as np
import pytest

from testlib.tiny_run import mlm_objectives
from testlib.tiny_run import train_tiny as _train
from xlm_jax import model_dir as md
from xlm_jax.data.synthetic import synthetic_batches
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import streams as streams_lib
from xlm_jax.train import loop


def _synthetic(kind: str, vocab_size: int = 256) -> streams_lib.MemoryStream:
    """The synthetic stream of `kind` as a stream object (what fine-tuning hands the trainer)."""
    return streams_lib.MemoryStream(
        lambda b, t, seed, start: synthetic_batches(b, t, vocab_size, kind, seed=seed,
                                                    start_step=start),
        kind=kind, name=f"memory {kind}")


def test_make_stream_takes_each_process_rows_of_a_stream_object():
    stream = _synthetic("pair")
    full = next(synthetic_batches(8, 16, 256, "pair", seed=3, start_step=2))
    for p in range(2):
        got = next(streams_lib.make_stream(stream, 8, 16, 3, 2, 256, process_index=p,
                                        process_count=2))
        assert sorted(got) == sorted(full)
        for k, v in got.items():
            np.testing.assert_array_equal(v, full[k][4 * p:4 * (p + 1)])
    assert streams_lib.task_kinds(stream) == [("memory pair", "pair")]
    assert not streams_lib.is_seqio(stream) and streams_lib.task_label(stream) == "memory pair"


def test_a_stream_object_trains_like_the_synthetic_stream(tmp_path):
    """The same batches by name (`synthetic:mono`) or as an object: the same losses."""
    by_name = _train(tmp_path / "name", 3, objectives=mlm_objectives(pair=False))
    specs = mlm_objectives(pair=False)
    specs["mmlm"] = loop.ObjectiveSpec(specs["mmlm"].factory, task=_synthetic("mono"))
    as_object = _train(tmp_path / "object", 3, objectives=specs)
    np.testing.assert_allclose(as_object.losses, by_name.losses, rtol=1e-6)


@pytest.mark.parametrize("task", ["synthetic:split_pair", "object"])
def test_a_task_of_another_kind_fails_before_compiling(tmp_path, task):
    task = _synthetic("split_pair") if task == "object" else task
    name = streams_lib.task_label(task)
    specs = {"mmlm": loop.ObjectiveSpec(factory=lambda model, name: MaskedLM(
        model, name=name, kind="mono", max_predictions=6), task=task)}
    with pytest.raises(ValueError) as e:
        _train(tmp_path, 2, objectives=specs)
    # (gin appends the configurable it was called in on a line of its own)
    assert str(e.value).splitlines()[0] == (
        f"objective 'mmlm' (MaskedLM) reads examples of kind 'mono', but task {name} holds "
        f"examples of kind 'split_pair'")
    assert md.checkpoint_steps(str(tmp_path)) == []  # nothing trained or saved


def test_a_stream_of_an_unknown_kind_is_a_one_line_error():
    with pytest.raises(ValueError) as e:
        streams_lib.MemoryStream(lambda *a: iter(()), kind="bilingual", name="mine")
    assert str(e.value) == (
        "MemoryStream('mine'): unknown example kind 'bilingual': expected one of mono, pair, "
        "split_pair, mixup_pair (old names: veco = split_pair, mixup = mixup_pair)")
