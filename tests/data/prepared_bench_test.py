"""`python -m xlm_jax.accelerator.bench --pipeline` on raw and prepared data, as one process of two:
the bytes it reads (the OS's count), its throughput, and resumes, as JSON."""
from __future__ import annotations

import importlib
import json
import os

import numpy as np
import pytest

from tests.testlib import prepared_corpus as pc
from tests.testlib import process_state
from xlm_jax.data import pipeline_bench
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.prepared import shard_index

# seqio's registries and the prepared-data switch put back after each test: the tests
# register tasks again over the prepared data (issue 56).
pytestmark = [pytest.mark.skipif(pipeline_bench.bytes_read() is None,
                                 reason="needs /proc/self/io (Linux)"),
              pytest.mark.usefixtures("seqio_isolated")]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = pc.write(str(tmp_path_factory.mktemp("corpus")))
    out = os.path.join(root, "prepared")
    # prep_tasks importable for the module's tests, which register its tasks again over the
    # prepared data; seqio, the prepared-data switch and sys.path as before after them
    with process_state.restored("seqio", "prepared data"), pc.on_path(root):
        pc.prepare_here(root, out, pattern="pd_mono")
        importlib.import_module(pc.MODULE)  # the module's, forgotten after it (on_path)
        yield root, out


def _bench(tmp_path, *args):
    path = str(tmp_path / "out.json")
    pipeline_bench.main(["--pipeline", "pd_mono", "--module", pc.MODULE, "--sequence_length",
                         "32", "--num_processes", "2", "--process_index", "1", "--json", path,
                         *args])
    return json.load(open(path))


def test_one_process_of_two_reads_half_the_prepared_bytes_and_all_the_raw_ones(
        corpus, tmp_path):
    root, out = corpus
    share = 0  # the bytes of process 1's records (positions 1, 3, ...) and their index entries
    for task, member in (("pd_mono_de", "de"), ("pd_mono_fr", "fr")):
        corpora = pf.read_json(os.path.join(out, task, pf.MANIFEST))["corpora"][member]
        sizes = np.concatenate([np.diff(np.fromfile(os.path.join(
            out, task, member, s["name"] + ".idx"), "<i8", offset=shard_index.HEADER_BYTES))
            for s in corpora["shards"]])
        share += int(sizes[1::2].sum()) + 16 * len(sizes[1::2])
    raw_files = sum(os.path.getsize(os.path.join(root, "mono", f))
                    for f in ("de.txt", "fr.txt.xz"))
    prepared = _bench(tmp_path, "--epoch", "--prepared", out)
    raw = _bench(tmp_path, "--epoch")
    assert prepared["examples"] == raw["examples"] > 100  # the same segments, as many
    # the OS's count: the share, plus a little else the process read meanwhile
    assert share <= prepared["bytes_read"] < share + 20000, (share, prepared["bytes_read"])
    assert raw["bytes_read"] >= raw_files  # every byte of every file, for half the examples
    assert prepared["examples_per_s"] > 0 and prepared["num_processes"] == 2


def test_resumes_are_timed_and_checked_as_json(corpus, tmp_path):
    _, out = corpus
    got = _bench(tmp_path, "--prepared", out, "--batch_size", "4", "--resume_at", "3,9",
                 "--no_replay")
    assert [r["step"] for r in got["resume"]] == [3, 9]
    for r in got["resume"]:
        assert r["restore_seconds"] < 60 and r["first_batch_seconds"] > 0
        assert r["replay_seconds"] is None and r["settle"] == 8
    timed = _bench(tmp_path, "--prepared", out, "--batch_size", "4", "--batches", "5",
                   "--warmup", "1")
    assert timed["examples_per_s"] > 0 and timed["bytes_read"] > 0
    assert timed["process_index"] == 1 and timed["prepared"] == out
