"""Corpora and prepared data on `gs://` (issue 54, Build 5 and must-show 4), against the GCS
emulator (tests/testlib/gcs_emulator.py): a corpus in a bucket, prepared by
`python -m xlm_jax.data.prepared.prepare` on Beam's DirectRunner (2 worker processes) into a bucket,
read by a short training run.

The references are independent of the remote path: the same corpus prepared from a local disk
into a local directory (the files must be byte for byte the same), and the same training run
on that local preparation (the same losses, bit for bit). Only the retry test fakes something:
a transient outage of GCS, which cannot be produced on demand here.
"""
from __future__ import annotations

import os
import urllib.request

import numpy as np
import pytest
from etils import epath

from tests.testlib import gcs_emulator
from tests.testlib.gcs_emulator import gcs, google_auth_logging  # noqa: F401  (fixtures)
from tests.testlib import prepared_corpus as pc
from tests.testlib import process_state, tiny_run
from xlm_jax.data import corpus_fs, sources
from xlm_jax.data.prepared import corpus_units, prepare_console, remote_reads
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.train import loop

pytestmark = pytest.mark.usefixtures("seqio_isolated")

BUCKET = gcs_emulator.BUCKET
CORPUS = f"gs://{BUCKET}/corpus"
PREPARED = f"gs://{BUCKET}/prepared"
TASKS = "pd_mono,pd_pairs"  # every unit layout: byte ranges of text and TSV, .xz, aligned .xz


def _upload(local: str, remote: str) -> None:
    for dirpath, _, names in os.walk(local):
        for name in names:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                epath.Path(f"{remote}/{os.path.relpath(path, local)}").write_bytes(f.read())


def _remote_tree(url: str, prefix: str) -> dict[str, bytes]:
    """Every object under `gs://BUCKET/prefix/` by relative name, with its bytes."""
    return {name[len(prefix) + 1:]: epath.Path(f"gs://{BUCKET}/{name}").read_bytes()
            for name in gcs_emulator.objects(url, prefix + "/")}


@pytest.fixture(scope="module")
def corpus(gcs, tmp_path_factory):
    """(local root with its preparation, remote root whose tasks module reads the bucket,
    `prepare`'s completed process for the bucket)."""
    with pytest.MonkeyPatch.context() as mp, gcs_emulator.google_auth_logging_kept(mp):
        yield from _corpus(tmp_path_factory)


def _corpus(tmp_path_factory):
    local = pc.write(str(tmp_path_factory.mktemp("local")))
    _upload(os.path.join(local, "mono"), f"{CORPUS}/mono")
    _upload(os.path.join(local, "parallel"), f"{CORPUS}/parallel")
    remote = str(tmp_path_factory.mktemp("remote"))
    with open(os.path.join(local, f"{pc.MODULE}.py"), encoding="utf-8") as f:
        module = f.read()
    here = 'MONO, PARALLEL = os.path.join(HERE, "mono"), os.path.join(HERE, "parallel")'
    assert here in module
    with open(os.path.join(remote, f"{pc.MODULE}.py"), "w", encoding="utf-8") as f:
        f.write(module.replace(here, f'MONO, PARALLEL = "{CORPUS}/mono", "{CORPUS}/parallel"'))
    with process_state.restored("seqio", "prepared data"):
        with pc.on_path(local):
            for task in TASKS.split(","):
                pc.prepare_here(local, os.path.join(local, "prepared"), pattern=task)
        r = pc.prepare(remote, PREPARED, pattern=TASKS)
        yield local, remote, r


def test_the_corpus_files_are_found_and_cut_into_units_in_the_bucket(gcs, corpus):
    local, _, _ = corpus
    assert sources.languages_in_dir(f"{CORPUS}/mono") == ["de", "fr"]
    assert sources.pairs_in_dir(f"{CORPUS}/parallel") == ["en-de", "en-fr"]
    de = sources.find_monolingual_files(f"{CORPUS}/mono", "de")
    assert de == [f"{CORPUS}/mono/de.txt"]
    local_de = os.path.join(local, "mono", "de.txt")
    assert corpus_fs.getsize(de[0]) == os.path.getsize(local_de)
    units = corpus_units.document_units(de[0], 8192)
    local_units = corpus_units.document_units(local_de, 8192)
    assert len(units) == len(local_units) > 3
    # a unit in the middle, entered by seeking in the remote object, reads what the local
    # file's unit reads; and the whole .xz pair, decompressed from the bucket
    assert (list(corpus_units.read_unit(units[2]))
            == list(corpus_units.read_unit(local_units[2])))
    pair = sources.find_parallel_files(f"{CORPUS}/parallel", "en", "de")
    local_pair = sources.find_parallel_files(os.path.join(local, "parallel"), "en", "de")
    assert list(sources.iter_pairs(pair)) == list(sources.iter_pairs(local_pair))
    with pytest.raises(FileNotFoundError, match=f"no corpus file for language 'xx'.*{CORPUS}"):
        sources.find_monolingual_files(f"{CORPUS}/mono", "xx")
    with pytest.raises(FileNotFoundError, match=f"corpus directory gs://{BUCKET}/nowhere does "
                       "not exist"):
        sources.find_monolingual_files(f"gs://{BUCKET}/nowhere", "de")


def test_a_plan_samples_a_remote_file_as_a_local_one(gcs, tmp_path):
    big = tmp_path / "big.txt"  # over 1 MiB: sampled in 16 blocks, not read whole
    big.write_bytes(np.random.default_rng(0).integers(0, 256, 3 << 20, np.uint8).tobytes())
    remote = f"gs://{BUCKET}/sampled/big.txt"
    epath.Path(remote).write_bytes(big.read_bytes())
    assert pf.content_sample(remote) == pf.content_sample(str(big))
    assert pf.source_entries([remote]) == pf.source_entries([str(big)])


def test_a_corpus_in_a_bucket_prepares_into_a_bucket_as_on_a_local_disk(gcs, corpus):
    local, _, r = corpus
    assert r.returncode == 0, r.stderr[-3000:]
    # objects are written in place (no rename, no copy-and-delete to log about): on stderr
    # only the two inputs one worker reads whole (as on a local disk: prepare_test)
    warned = r.stderr.splitlines()
    assert len(warned) == 2 and all(line.startswith(f"WARNING:xlm_jax.data.prepared.prepare:{CORPUS}/") and "is read by one worker"
                                    in line for line in warned), r.stderr[-3000:]
    here = pc.tree(os.path.join(local, "prepared"))
    there = _remote_tree(gcs, "prepared")
    assert sorted(there) == sorted(here)
    assert any(name.endswith(".bin") for name in there) and "pd_mono_de/manifest.json" in there
    assert there == here  # every shard, index, count file, plan and manifest byte for byte


def _train(model_dir: str, prepared: str, root: str) -> loop.TrainResult:
    def mlm(kind):
        return lambda model, name: MaskedLM(model, name=name, kind=kind, max_predictions=6)

    specs = {"mmlm": loop.ObjectiveSpec(factory=mlm("mono"), task="pd_mono"),
             "tlm": loop.ObjectiveSpec(factory=mlm("pair"), task="pd_pairs")}
    with pc.on_path(root):
        return tiny_run.train_tiny(model_dir, 3, objectives=specs, model={"vocab_size": 8002},
                                   batch=4, task_modules=[pc.MODULE], prepared_data=prepared)


def test_a_short_run_reads_the_prepared_bucket_as_the_local_preparation(gcs, corpus, tmp_path):
    local, remote, r = corpus
    assert r.returncode == 0, r.stderr[-3000:]
    there = _train(str(tmp_path / "remote"), PREPARED, remote)
    here = _train(str(tmp_path / "local"), os.path.join(local, "prepared"), local)
    assert len(there.losses) == 3 and all(0 < x < 20 for x in there.losses)
    assert there.losses == here.losses


def test_a_missing_shard_in_the_bucket_is_one_line_before_any_read(gcs, corpus):
    _, _, r = corpus
    assert r.returncode == 0, r.stderr[-3000:]
    manifest = pf.read_json(f"{PREPARED}/pd_mono_de/{pf.MANIFEST}")
    entry = manifest["corpora"]["de"]
    records = pf.CorpusRecords(f"{PREPARED}/pd_mono_de/de", entry)
    assert records.read([0, records.num_records - 1])[0].size > 0
    shard = entry["shards"][1]["name"]
    gone = epath.Path(f"{PREPARED}/pd_mono_de/de/{shard}.idx")
    kept = gone.read_bytes()
    gone.unlink()
    try:
        with pytest.raises(pf.PreparedError, match=f"{shard}.idx is missing"):
            pf.CorpusRecords(f"{PREPARED}/pd_mono_de/de", entry)
    finally:
        gone.write_bytes(kept)


class _Flaky(remote_reads.RemoteFiles):
    """The bucket's reads, with the first `failures` rounds failing as a connection reset
    would (the one fake of this file: an outage cannot be produced on demand)."""

    def __init__(self, failures: int):
        self.waits: list[float] = []
        super().__init__(pf.PreparedError, sleep=self.waits.append)
        self.failures = failures

    def _read_round(self, ranges):
        if self.failures:
            self.failures -= 1
            return [ConnectionResetError("connection reset by peer")] * len(ranges)
        return super()._read_round(ranges)


def test_reads_are_retried_with_backoff_then_name_the_file(gcs, corpus):
    _, _, r = corpus
    assert r.returncode == 0, r.stderr[-3000:]
    entry = pf.read_json(f"{PREPARED}/pd_mono_de/{pf.MANIFEST}")["corpora"]["de"]
    path = f"{PREPARED}/pd_mono_de/de/{entry['shards'][0]['name']}.bin"
    whole = epath.Path(path).read_bytes()
    want = whole[:64]
    flaky = _Flaky(failures=remote_reads.RETRIES - 1)
    assert flaky.read([(path, 0, 64)]) == [want]
    assert flaky.waits == [remote_reads.BACKOFF_S * 2 ** i for i in range(remote_reads.RETRIES - 1)]
    down = _Flaky(failures=remote_reads.RETRIES)
    with pytest.raises(pf.PreparedError) as e:
        down.read([(path, 0, 64), (path, 64, 64)])
    assert str(e.value) == (f"{path}: 64 bytes at offset 0 could not be read after "
                            f"{remote_reads.RETRIES} tries (2 of 2 ranges failed; the last "
                            "error: ConnectionResetError: connection reset by peer)")
    with pytest.raises(pf.PreparedError, match="shorter than its index says"):
        remote_reads.RemoteFiles(pf.PreparedError).read([(path, len(whole) - 4, 8)])


def test_without_fsspec_the_ranges_are_read_by_threads_through_epath(gcs, corpus):
    _, _, r = corpus
    assert r.returncode == 0, r.stderr[-3000:]
    entry = pf.read_json(f"{PREPARED}/pd_mono_de/{pf.MANIFEST}")["corpora"]["de"]
    directory = f"{PREPARED}/pd_mono_de/de"
    path = f"{directory}/{entry['shards'][0]['name']}.bin"
    whole = epath.Path(path).read_bytes()
    reader = remote_reads.RemoteFiles(pf.PreparedError)
    reader._fs["gs"] = None  # what a scheme without an installed fsspec implementation gets
    ranges = [(path, o, 12) for o in (0, 40, 400, len(whole) - 12)]
    assert reader.read(ranges) == [whole[o:o + n] for _, o, n in ranges]
    assert reader.sizes(directory) == remote_reads.RemoteFiles(pf.PreparedError).sizes(directory)
    assert reader.sizes(directory)[path] == len(whole)


def _upload_elsewhere(url: str, name: str, data: bytes) -> None:
    """An object written by another client (the emulator's upload API), as a Beam worker's."""
    req = urllib.request.Request(
        f"{url}/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name={name}", data=data,
        method="POST", headers={"Content-Type": "application/octet-stream"})
    with urllib.request.urlopen(req, timeout=10) as r:
        r.read()


def test_files_other_processes_wrote_after_a_listing_are_seen(gcs):
    """gcsfs keeps directory listings: after this process listed a directory, a counts file a
    worker wrote looked missing (a prepare on a loaded machine ended 'shard-00002-of-00009.json
    is missing after the pipeline ran'), and the progress poll saw no new unit."""
    directory = f"gs://{BUCKET}/listed/pd_x/de"
    epath.Path(f"{directory}/shard-00000-of-00002.json").write_text("{}")
    item = type("Item", (), {"directory": directory})
    items = [item(), item()]
    items[0].prefix, items[1].prefix = (f"{directory}/shard-0000{k}-of-00002" for k in (0, 1))
    assert prepare_console.written_units(items) == 1  # listed: the listing is cached now
    _upload_elsewhere(gcs, "listed/pd_x/de/shard-00001-of-00002.json", b"{}")
    assert not pf.exists(f"{directory}/shard-00001-of-00002.json")  # the stale listing
    assert prepare_console.written_units(items) == 2  # the poll forgets it first
    pf.forget_listings(directory)
    assert pf.exists(f"{directory}/shard-00001-of-00002.json")
