"""Damaged prepared data is found, never trained on (issue 54): `python -m xlm_jax.data.prepared.verify`
names every bad shard and what is wrong, and the trainer's reader (`CorpusRecords`) stops at
the first bad record it reads with one line naming the shard and record. The faults are the
ones a reviewer injected into copies of prepared tasks, on a real preparation of the demo's
text (`tests/testlib/prepared_corpus.py`)."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests.testlib import prepared_corpus as pc
from tests.testlib import process_state
from tests.testlib.cli_run import ROOT, env
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.prepared import shard_index, verify

pytestmark = pytest.mark.usefixtures("seqio_isolated")

MONO, PAIRS = "pd_mono_de", "pd_pairs_en_de"
HEADER = shard_index.HEADER_BYTES  # the index's header (format 2), before its offsets
IDS = "<u2"  # the demo's 8,002-id vocabulary fits uint16 ids


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A preparation of one monolingual and one pair task (in this process, no Beam)."""
    root = pc.write(str(tmp_path_factory.mktemp("corpus")))
    out = os.path.join(root, "prepared")
    with process_state.restored("seqio", "prepared data"), pc.on_path(root):
        for task in (MONO, PAIRS):
            pc.prepare_here(root, out, pattern=task)
        yield out


def _copy(prepared, tmp_path):
    out = str(tmp_path / "copy")
    shutil.copytree(prepared, out)
    return out


def _shard(root, task):
    """(prefix, manifest entry, vocabulary size, pairs?) of the task's largest shard."""
    manifest = json.load(open(os.path.join(root, task, pf.MANIFEST)))
    member, entry = next(iter(manifest["corpora"].items()))
    shard = max(entry["shards"], key=lambda s: s["records"])
    assert shard["records"] >= 8 and shard["index_sha1"]
    return (os.path.join(root, task, member, shard["name"]), entry,
            pf.vocab_size(manifest["vocabulary"]), manifest["records"] == "pairs")


def _offsets(prefix):
    with open(prefix + ".idx", "rb") as f:
        assert shard_index.parse_header(prefix, f.read(HEADER)).dtype == IDS
        return np.frombuffer(f.read(), "<i8")


def _poke(path, offset, value, dtype):
    data = bytearray(open(path, "rb").read())
    data[offset:offset + np.dtype(dtype).itemsize] = np.asarray([value], dtype).tobytes()
    open(path, "wb").write(bytes(data))


def _verify(root, capsys):
    code = verify.main([root])
    out = capsys.readouterr().out.strip().splitlines()
    return code, out


def _read_all(prefix, entry, vocab, pairs):
    records = pf.CorpusRecords(os.path.dirname(prefix), entry, vocab_size=vocab,
                               records="pairs" if pairs else "documents")
    return records.read(np.arange(records.num_records))


def test_a_clean_preparation_verifies_every_byte(prepared, capsys):
    code, out = _verify(prepared, capsys)
    assert code == 0 and len(out) == 1, out
    total = 0
    for task in (MONO, PAIRS):
        for entry in json.load(open(os.path.join(prepared, task, pf.MANIFEST)))["corpora"].values():
            total += sum(s["bytes"] + HEADER + 8 * (s["records"] + 1) for s in entry["shards"])
    assert out[0].startswith("verified 2 task(s), ")
    assert f"{total / 1e6:.1f} MB" in out[0] and out[0].endswith("all as the manifests say")


def test_the_command_runs_without_tensorflow(prepared):
    code = ("import runpy, sys; sys.argv = ['verify', sys.argv[1]]\n"
            "try:\n    runpy.run_module('xlm_jax.data.prepared.verify', run_name='__main__')\n"
            "except SystemExit as e:\n    print('rc', e.code, 'tensorflow' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code, prepared], cwd=ROOT, env=env(),
                       capture_output=True, text=True, timeout=120)
    assert r.stdout.strip().splitlines()[-1] == "rc 0 False", r.stdout + r.stderr[-2000:]


def _middle(prefix):
    offsets = _offsets(prefix)
    return len(offsets) // 2, offsets


def _id_overwritten(prefix, pairs):
    k, offsets = _middle(prefix)
    _poke(prefix + ".bin", int(offsets[k]) + 2, 65535, IDS)  # past a pair's length
    return f"{prefix}.bin: record {k}: token id 65535 outside the vocabulary of"


def _index_backwards(prefix, pairs):
    k, offsets = _middle(prefix)
    _poke(prefix + ".idx", HEADER + 8 * k, int(offsets[k - 1]) - 2, "<i8")
    return f"{prefix}.idx: record {k - 1} ends at byte {int(offsets[k - 1]) - 2}, before its start"


def _index_not_whole_ids(prefix, pairs):
    k, offsets = _middle(prefix)
    _poke(prefix + ".idx", HEADER + 8 * k, int(offsets[k]) + 1, "<i8")
    return (f"{prefix}.idx: record {k - 1} spans bytes {int(offsets[k - 1])}-"
            f"{int(offsets[k]) + 1}, not whole uint16 ids")


def _pair_length(prefix, pairs):
    k, offsets = _middle(prefix)
    _poke(prefix + ".bin", int(offsets[k]), 60_000, IDS)
    return f"{prefix}.bin: record {k}: a pair record of"


def _header_damaged(prefix, pairs):
    _poke(prefix + ".idx", 0, 0, "<i8")  # the magic zeroed
    return f"{prefix}.idx: no index header (it starts with"


# (damage, the task it is done to, whether the reader sees it in the records it reads)
READER_FAULTS = [(_id_overwritten, MONO), (_id_overwritten, PAIRS), (_index_backwards, MONO),
                 (_index_not_whole_ids, MONO), (_pair_length, PAIRS), (_header_damaged, MONO)]


@pytest.mark.parametrize("damage,task", READER_FAULTS,
                         ids=[f"{d.__name__[1:]}-{t}" for d, t in READER_FAULTS])
def test_a_fault_the_reader_sees_stops_it_and_verify_names_it(prepared, tmp_path, capsys,
                                                              damage, task):
    root = _copy(prepared, tmp_path)
    prefix, entry, vocab, pairs = _shard(root, task)
    line = damage(prefix, pairs)
    with pytest.raises(pf.PreparedError) as e:
        _read_all(prefix, entry, vocab, pairs)
    assert str(e.value).startswith(line) and "\n" not in str(e.value), str(e.value)
    assert "xlm_jax.data.prepared.verify" in str(e.value)
    code, out = _verify(root, capsys)
    assert code == 1 and out[0].startswith(line), out
    assert out[-1].endswith("1 bad")


def test_records_cut_elsewhere_and_flipped_bytes_only_verify_sees(prepared, tmp_path, capsys):
    """An index entry moved by one id, +2 bytes (two records cut one id elsewhere, as the
    issue's 1123/784 read as 1124/783) and 400 changed bytes whose ids stay in the vocabulary:
    every record still reads; the sha1s tell."""
    root = _copy(prepared, tmp_path)
    prefix, entry, vocab, pairs = _shard(root, MONO)
    k, offsets = _middle(prefix)
    _poke(prefix + ".idx", HEADER + 8 * k, int(offsets[k]) + 2, "<i8")
    _read_all(prefix, entry, vocab, pairs)  # every record still reads
    other, entry2, vocab2, _ = _shard(root, PAIRS)
    ids = np.fromfile(other + ".bin", IDS)
    rng = np.random.default_rng(0)
    at = rng.choice(np.flatnonzero(ids > 3), 200, replace=False)
    ids[at] = (ids[at] + 1) % vocab2  # 400 bytes changed, every id still a valid one
    ids.tofile(other + ".bin")
    _read_all(other, entry2, vocab2, True)  # the reader cannot tell
    code, out = _verify(root, capsys)
    assert code == 1, out
    assert out[:2] == sorted(out[:2]) and len(out) == 3, out
    assert out[0].startswith(f"{prefix}.idx: sha1 ") and "an offset moved" in out[0]
    assert out[1].startswith(f"{other}.bin: sha1 ") and "its bytes changed" in out[1]


def test_missing_files_unfinished_tasks_and_bad_arguments(prepared, tmp_path, capsys):
    root = _copy(prepared, tmp_path)
    prefix, *_ = _shard(root, MONO)
    os.remove(prefix + ".idx")
    os.remove(os.path.join(root, PAIRS, pf.MANIFEST))
    code, out = _verify(root, capsys)
    assert code == 1 and out[-1].endswith("2 bad"), out
    assert out[0] == (f"{prefix}.idx is missing (the manifest lists it): the prepared data is "
                      "incomplete; prepare it again into a new directory")
    assert out[1].startswith(f"{os.path.join(root, PAIRS)}: unfinished (no manifest.json)")
    assert verify.main([root, "--tasks", "nope*"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: verify: no prepared task matching "
                                               f"'nope*' in {root}")
    assert verify.main([str(tmp_path / "absent")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    assert verify.main([root, "--tasks", MONO]) == 1  # only the task asked for
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("verified 1 task(s)")
