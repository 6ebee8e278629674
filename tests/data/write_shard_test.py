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

from xlm_jax.data import corpus_units as cu
from xlm_jax.data import prepare
from xlm_jax.data import prepared_files as pf
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
    index = np.concatenate([[0], np.cumsum([4 * len(r) for r in want])]).astype("<i8").tobytes()
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
