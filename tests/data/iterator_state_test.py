"""The input position: `BlockReader` reads blocks by number, tf.data saves and restores it.

The trainer-level resume on these pipelines is in tests/train/data_state_test.py.
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import seqio
import tensorflow as tf

import xlm_jax_tasks.demo  # noqa: F401  (registers the demo tasks)
from xlm_jax.data import block_reader, pipeline, registry
from xlm_jax.data.vocab import get_vocabulary


def _examples(n):
    return lambda: ({"lines": [f"doc {i}"] * (i % 3 + 1), "lang": i} for i in range(n))


# Small mixtures of demo tasks (building a 77-task demo mixture takes tens of seconds); `ig`
# has one document, so shard 1 of 2 reads it through the small-corpus rule.
for _name, _members in (("iterstate_mono", ["demo_mono_af", "demo_mono_ig", "demo_mono_de"]),
                        ("iterstate_pairs", ["demo_parallel_en_de", "demo_parallel_en_fr"])):
    if _name not in seqio.MixtureRegistry.names():
        seqio.MixtureRegistry.add(_name, [(m, 1.0) for m in _members])
# demo_mixup's construction over three pairs instead of all of them (a mixup task reads every
# corpus it joins; the demo's reads about 70)
if "iterstate_mixup" not in seqio.TaskRegistry.names():
    registry.register_parallel(
        "iterstate_mixup", xlm_jax_tasks.demo.PARALLEL_DIR, ["en-de", "en-fr", "en-ja"],
        get_vocabulary(xlm_jax_tasks.demo.SPM_PATH), sequence_length=128, kind="mixup_pair",
        shuffle_buffer_size=xlm_jax_tasks.demo.SHUFFLE_BUFFER)

SIG = {"lines": tf.TensorSpec([None], tf.string), "lang": tf.TensorSpec([], tf.int32)}


def _reader(n, index=0, num=1, block=4):
    return block_reader.BlockReader(_examples(n), SIG, ["lines"], index, num, block)


def _langs(block):  # the `lang` column of a flushed block: [lines, lang, lines/len]
    return block[1].tolist()


def test_block_reader_reads_any_block_by_number_and_ends_with_empty_blocks():
    ordered = _reader(10)
    blocks = [_langs(ordered.read(i)) for i in range(4)]
    assert blocks == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9], []]
    jumping = _reader(10)
    assert [_langs(jumping.read(i)) for i in (2, 0, 1, 1)] == [[8, 9], [0, 1, 2, 3],
                                                                [4, 5, 6, 7], [4, 5, 6, 7]]
    assert jumping.restarts == 2  # read(2) and the second read(1) started new passes
    lines, lang, lens = ordered.read(0)
    assert lens.tolist() == [1, 2, 3, 1] and lines.tolist()[:3] == ["doc 0", "doc 1", "doc 1"]


def test_block_reader_shards_and_gives_a_small_corpus_to_every_shard():
    assert [_langs(_reader(10, 1, 3, block=8).read(0))] == [[1, 4, 7]]
    # one document, two shards: shard 1 would be empty and end a seqio Mixture on its host
    assert _langs(_reader(1, 1, 2).read(0)) == [0]
    assert _langs(_reader(2, 1, 3).read(0)) == [1]  # example 1 mod 2
    assert _langs(_reader(0, 1, 2).read(0)) == []  # an empty corpus stays empty


def _batches(it, n):
    return [next(it) for _ in range(n)]


def _assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k], err_msg=k)


@pytest.mark.parametrize("task", ["iterstate_mono", "iterstate_pairs", "iterstate_mixup"])
def test_restored_iterator_continues_exactly_where_it_was_saved(tmp_path, task):
    straight = pipeline.make_batch_iterator(task, 4, 32, seed=5, shard_index=1, num_shards=2)
    head = _batches(straight, 7)
    saving = pipeline.make_batch_iterator(task, 4, 32, seed=5, shard_index=1, num_shards=2)
    _assert_same(_batches(saving, 7), head)
    path = saving.save(str(tmp_path / "state"))
    expected = _batches(straight, 5)
    _assert_same(_batches(saving, 5), expected)  # saving does not move the iterator
    fresh = pipeline.make_batch_iterator(task, 4, 32, seed=5, shard_index=1, num_shards=2)
    fresh.restore(path)
    _assert_same(_batches(fresh, 5), expected)
    # the control: a fresh iterator that is not restored starts from the beginning
    other = pipeline.make_batch_iterator(task, 4, 32, seed=5, shard_index=1, num_shards=2)
    key = sorted(expected[0])[0]
    assert not np.array_equal(next(other)[key], expected[0][key])


def test_a_position_saved_in_the_earlier_checkpoint_form_still_restores(tmp_path):
    straight = pipeline.make_batch_iterator("iterstate_pairs", 4, 32, seed=5)
    _batches(straight, 3)
    # what `save` wrote before positions were one compressed file: TensorFlow checkpoint files
    prefix = tf.train.Checkpoint(iterator=straight._it).write(str(tmp_path / "old"))
    assert pipeline.position_saved(prefix) and not os.path.exists(prefix + pipeline.STATE_SUFFIX)
    expected = _batches(straight, 4)
    fresh = pipeline.make_batch_iterator("iterstate_pairs", 4, 32, seed=5)
    fresh.restore(prefix)
    _assert_same(_batches(fresh, 4), expected)
    assert not pipeline.position_saved(str(tmp_path / "nothing"))


def test_every_shard_of_a_mixture_with_a_one_document_corpus_is_endless():
    # demo_mono's Igbo file has one document: shard 1 of 2 used to be empty, and seqio's
    # Mixture (stop_on_empty_dataset=True) ended that host's stream after two batches (here
    # in a three-language part of demo_mono, one member in three Igbo)
    it = pipeline.make_batch_iterator("iterstate_mono", 8, 64, seed=3, shard_index=1,
                                      num_shards=2)
    assert len(_batches(it, 12)) == 12


def test_restore_into_another_batch_shape_is_refused_naming_the_file(tmp_path):
    it = pipeline.make_batch_iterator("iterstate_pairs", 4, 32, seed=0)
    next(it)
    path = it.save(str(tmp_path / "state"))
    other = pipeline.make_batch_iterator("iterstate_mono", 4, 32, seed=0)
    with pytest.raises(ValueError, match=r"state.*cannot restore the input position of "
                                         r"iterstate_mono \(shard 0 of 1\)"):
        other.restore(path)


def test_a_from_generator_pipeline_says_it_cannot_be_saved(tmp_path):
    ds = tf.data.Dataset.from_generator(lambda: iter(range(100)),
                                        output_signature=tf.TensorSpec([], tf.int32))
    options = tf.data.Options()  # as make_batch_iterator's pipelines
    options.experimental_external_state_policy = (
        tf.data.experimental.ExternalStatePolicy.IGNORE)
    ds = ds.map(lambda x: {"input_ids": x}).with_options(options)
    it = pipeline.BatchIterator(ds, "user_task")
    next(it)
    with pytest.raises(pipeline.IteratorNotSaveable, match="user_task: .*GeneratorDataset"):
        it.save(str(tmp_path / "state"))
