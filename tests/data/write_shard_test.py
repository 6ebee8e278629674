"""The shard writer of `prepare` (issue 54, Build 7): bounded memory, whole files or none, and
the WARNING for a unit one worker must read whole.

References: numpy's own concatenation and cumulative sum of the records, hashlib over the
files' bytes, and `tracemalloc` for what Python held at the peak."""
from __future__ import annotations

import hashlib
import logging
import lzma
import os
import tracemalloc

import numpy as np
import pytest

from xlm_jax.data.prepared import corpus_units as cu
from xlm_jax.data.prepared import prepare
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.prepared import shard_index, verify
from xlm_jax.data.sources import ParallelFiles


def _records(n: int, size: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    for _ in range(n):
        yield rng.integers(0, 8002, rng.integers(1, 2 * size), dtype=np.int32)


def test_a_shard_is_written_as_its_records_come_in_bounded_memory(tmp_path):
    n, size = 12_000, 1_000  # ~48 MB of int32 ids
    want = list(_records(n, size))
    prefix = str(tmp_path / "shard-00000-of-00001")
    tracemalloc.start()
    try:
        written = pf.write_shard(prefix, _records(n, size))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    blob = np.concatenate(want).astype("<i4").tobytes()
    index = shard_index.header(4) + np.concatenate(
        [[0], np.cumsum([4 * len(r) for r in want])]).astype("<i8").tobytes()
    with open(prefix + ".bin", "rb") as f:
        assert f.read() == blob
    with open(prefix + ".idx", "rb") as f:
        assert f.read() == index
    assert written == pf.WrittenShard(n, len(blob), hashlib.sha1(blob).hexdigest(),
                                      hashlib.sha1(index).hexdigest())
    # one write buffer (gathered, then joined) and 8 bytes a record, not the 48 MB shard
    assert len(blob) > 40e6 and peak < 2 * pf.WRITE_BUFFER + 16 * n + (1 << 20), peak
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(prefix) + s for s in (".bin", ".idx")]


def test_a_writer_that_fails_leaves_no_shard_and_no_temporary(tmp_path):
    def failing():
        yield from _records(2_000, 1_000)  # past a write buffer: a part is on disk
        raise ValueError("parallel files have different line counts")

    prefix = str(tmp_path / "shard-00000-of-00001")
    with pytest.raises(ValueError, match="different line counts"):
        pf.write_shard(prefix, failing())
    assert os.listdir(tmp_path) == []


def test_ids_are_uint16_where_the_vocabulary_fits_and_the_index_header_says_so(tmp_path):
    rng = np.random.default_rng(1)
    recs = [rng.integers(0, 8002, rng.integers(1, 40)).astype(np.int32) for _ in range(50)]
    for vocab, dtype, width in ((8002, "<u2", 2), (250_002, "<i4", 4), (None, "<i4", 4)):
        prefix = str(tmp_path / f"v{vocab}" / "shard-00000-of-00001")
        os.makedirs(os.path.dirname(prefix))
        written = pf.write_shard(prefix, recs, vocab)
        with open(prefix + ".bin", "rb") as f:
            assert f.read() == np.concatenate(recs).astype(dtype).tobytes()
        with open(prefix + ".idx", "rb") as f:
            head = f.read(16)
        assert head == b"XLMJXIDX" + np.asarray([2, width], "<u4").tobytes()
        shard = {"name": os.path.basename(prefix), "records": 50, "bytes": written.bytes,
                 "sha1": written.sha1, "index_sha1": written.index_sha1}
        reader = pf.CorpusRecords(os.path.dirname(prefix), {"shards": [shard]}, vocab_size=vocab)
        got = reader.read(np.arange(50)[::-1])
        assert all(g.dtype == np.int32 and np.array_equal(g, r) for g, r in zip(got, recs[::-1]))
        assert verify.check_shard(prefix, shard, vocab, False) == (
            None, written.bytes + 16 + 8 * 51)
    with pytest.raises(ValueError, match=r"token id 70000 does not fit the uint16 ids of a "
                                         r"8002-id vocabulary"):
        pf.write_shard(str(tmp_path / "wide"), [np.asarray([5, 70000])], 8002)


def test_format_1_shards_are_still_read_and_verified(tmp_path):
    """A shard as format 1 wrote it (int32 ids, an index without header), built here with
    numpy: the reader and verify take it when the manifest says format 1."""
    recs = [np.arange(k, 3 * k + 1, dtype=np.int32) for k in range(1, 20)]
    blob = np.concatenate(recs).astype("<i4").tobytes()
    index = np.concatenate([[0], np.cumsum([4 * len(r) for r in recs])]).astype("<i8").tobytes()
    prefix = tmp_path / "shard-00000-of-00001"
    (tmp_path / "shard-00000-of-00001.bin").write_bytes(blob)
    (tmp_path / "shard-00000-of-00001.idx").write_bytes(index)
    shard = {"name": prefix.name, "records": len(recs), "bytes": len(blob),
             "sha1": hashlib.sha1(blob).hexdigest(), "index_sha1": hashlib.sha1(index).hexdigest()}
    reader = pf.CorpusRecords(str(tmp_path), {"shards": [shard]}, vocab_size=100,
                              format_version=1)
    assert all(np.array_equal(g, r) for g, r in zip(reader.read(np.arange(len(recs))), recs))
    assert verify.check_shard(str(prefix), shard, 100, False, format_version=1)[0] is None
    with pytest.raises(pf.PreparedError, match=r"\.idx: 160 bytes, but the manifest says 176"):
        pf.CorpusRecords(str(tmp_path), {"shards": [shard]}, vocab_size=100)


def _write(path, data: bytes) -> str:
    with (lzma.open if path.endswith(".xz") else open)(path, "wb") as f:
        f.write(data)
    return str(path)


def test_a_unit_one_worker_must_read_whole_is_warned_about_once_with_the_fix(tmp_path, caplog):
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, 20_000, np.uint8).tobytes()  # incompressible: 20 kB as .xz
    big_xz = _write(str(tmp_path / "en.txt.xz"), noise)
    small_xz = _write(str(tmp_path / "fr.txt.xz"), b"one line\n")
    plain = _write(str(tmp_path / "de.txt"), b"a line\n" * 4000)  # 28 kB: split in units
    src = _write(str(tmp_path / "en-de.en"), b"a line\n" * 2000)
    tgt = _write(str(tmp_path / "en-de.de"), b"eine Zeile\n" * 2000)
    split = 8192
    units = [*cu.document_units(big_xz, split), *cu.document_units(small_xz, split),
             *cu.document_units(plain, split),
             *cu.pair_units(ParallelFiles(src, tgt), split)]
    with caplog.at_level(logging.WARNING, logger=prepare.__name__):
        prepare.warn_serial_units(units, split)
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    xz_size = os.path.getsize(big_xz)
    assert lines[0].startswith(f"{big_xz} ({xz_size:,} bytes) is read by one worker from start "
                               "to end, more than a work unit's 8,192 bytes: decompress it, or "
                               "recompress it in parts: `mkdir en && xz -dc en.txt.xz | split")
    assert lines[1].startswith(f"{src} + {tgt} (")
    assert "paste them into one TSV file" in lines[1]
