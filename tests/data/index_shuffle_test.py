"""The per-epoch permutation of prepared corpora (`data/index_shuffle.py`) and the shard
reader's file handling (`data/prepared/shard_files.py`), against numpy references."""
from __future__ import annotations

import os

import numpy as np
import pytest

from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.prepared.index_shuffle import IndexShuffle


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 16, 17, 100, 255, 256, 257, 1000, 4097])
def test_every_size_gets_a_permutation(n):
    for seed in range(3):
        image = IndexShuffle(n, (seed, 0, 9))(np.arange(n))
        assert sorted(image.tolist()) == list(range(n))


def test_the_map_is_a_function_of_its_seed_words_only():
    a, b = IndexShuffle(1000, (1, 2)), IndexShuffle(1000, (1, 2))
    idx = np.array([5, 999, 0, 5])
    assert a(idx).tolist() == b(idx).tolist() and a(idx)[0] == a(idx)[3]
    assert int(a(7)) == int(a(np.array([7]))[0])  # scalars and arrays agree
    assert a(np.arange(1000)).tolist() != IndexShuffle(1000, (1, 3))(np.arange(1000)).tolist()
    with pytest.raises(ValueError, match=r"indices must be in \[0, 1000\)"):
        a(np.array([1000]))
    with pytest.raises(ValueError, match="n must be >= 1"):
        IndexShuffle(0, (1,))


def test_positions_are_spread_evenly_over_seeds():
    """Where index 0 lands, over 4000 seeds, is near uniform on 10 places (a chi-square test
    at a level no plausible permutation fails: 9 degrees of freedom, bound 40, p < 1e-5), and
    the map does not keep the order (rank correlation near 0)."""
    landing = np.array([int(IndexShuffle(10, (s, 0))(0)) for s in range(4000)])
    counts = np.bincount(landing, minlength=10)
    chi2 = float(((counts - 400.0) ** 2 / 400.0).sum())
    assert chi2 < 40, counts
    n = 100_000
    image = IndexShuffle(n, (5, 1))(np.arange(n))
    assert abs(np.corrcoef(np.arange(n), image)[0, 1]) < 0.02


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc")
def test_the_reader_keeps_few_files_open_and_reads_every_record(tmp_path):
    """60 shards of 5 records each, read in a random order with at most 4 idle files open."""
    rng = np.random.default_rng(0)
    records, shards = [], []
    for k in range(60):
        recs = [rng.integers(0, 50000, rng.integers(0, 9)).astype(np.int32) for _ in range(5)]
        name = pf.shard_name(k, 60)
        written = pf.write_shard(str(tmp_path / name), recs)
        n, nbytes = written.records, written.bytes
        shards.append({"name": name, "records": n, "bytes": nbytes})
        records += recs
    before = _fds()
    reader = pf.CorpusRecords(str(tmp_path), {"shards": shards}, open_files=4)
    order = rng.permutation(len(records))
    got = reader.read(order)
    assert all(np.array_equal(g, records[i]) for g, i in zip(got, order))
    assert reader.bytes_read == sum(16 + 4 * len(records[i]) for i in order)
    assert _fds() - before <= 4
