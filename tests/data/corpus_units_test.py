"""corpus_units: reading all units of a file gives what the serial readers of `sources` give.

The reference is `sources.iter_documents` / `sources.iter_pairs` over the whole file; the
corpora are random (seeded) with the awkward cases mixed in: invalid UTF-8 anywhere, Unicode
whitespace separators, CRLF, no final newline, leading separators, and unit boundaries at
every byte (split_bytes 1) up to larger than the file.
"""

import ast
import dataclasses
import gzip
import io
import lzma
import pathlib
import random
import subprocess
import sys

import pytest

from xlm_jax.data import corpus_fs
from xlm_jax.data.prepared import corpus_units as cu
from xlm_jax.data import sources

WORDS = ["a", "word", "é", "中文", "naïve", "x1", "über", "Ω"]
SEPARATORS = [b"", b"  ", b"\t", "\u3000".encode(), "\u00a0 ".encode()]
INVALID = [b"\xff\xfe bad", b"\xc3", b"ok \x80 x", b"\t\xff"]
SPLITS = (1, 2, 3, 5, 7, 13, 50)


def words(rnd: random.Random) -> bytes:
    return " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(1, 4))).encode()


def with_invalid(rnd: random.Random, lines: list[bytes]) -> list[bytes]:
    """`lines` with 0-3 invalid-UTF-8 lines put anywhere (first and last line included)."""
    lines = list(lines)
    for _ in range(rnd.randint(0, 3)):
        lines.insert(rnd.choice([0, len(lines), rnd.randint(0, len(lines))]), rnd.choice(INVALID))
    return lines


def join(rnd: random.Random, lines: list[bytes]) -> bytes:
    """The file's bytes: LF or CRLF endings, sometimes without the final newline."""
    eol = rnd.choice([b"\n", b"\n", b"\r\n"])
    final = eol if lines and rnd.random() < 0.7 else b""
    return eol.join(lines) + final


def random_corpus(rnd: random.Random) -> bytes:
    lines = [rnd.choice(SEPARATORS) for _ in range(rnd.choice([0, 0, 1, 2]))]
    n_docs = rnd.randint(0, 6)
    for d in range(n_docs):
        lines += [words(rnd) for _ in range(rnd.randint(1, 6))]
        if d < n_docs - 1 or rnd.random() < 0.5:
            lines += [rnd.choice(SEPARATORS) for _ in range(rnd.randint(1, 3))]
    return join(rnd, with_invalid(rnd, lines))


def random_tsv(rnd: random.Random) -> bytes:
    kinds = [lambda: words(rnd) + b"\t" + words(rnd)] * 4 + [
        lambda: words(rnd),  # no tab
        lambda: words(rnd) + b"\t" + words(rnd) + b"\t" + words(rnd),  # two tabs
        lambda: b"\t" + words(rnd),  # empty side
        lambda: words(rnd) + b"\t" + rnd.choice(SEPARATORS),  # blank side
        lambda: b"",
    ]
    lines = [rnd.choice(kinds)() for _ in range(rnd.randint(0, 12))]
    return join(rnd, with_invalid(rnd, lines))


def line_starts(data: bytes) -> list[int]:
    """The start offsets of the physical lines (as `open_lines` splits them)."""
    if not data:
        return []
    return [0] + [i + 1 for i, b in enumerate(data) if b == ord("\n") and i + 1 < len(data)]


def read_all(units: list[cu.Unit]) -> tuple[list, list[sources.ReadCounts]]:
    """Everything the units yield, in order, and each unit's own counts."""
    items, counts = [], []
    for unit in units:
        c = sources.ReadCounts()
        items += list(cu.read_unit(unit, c))
        counts.append(c)
    return items, counts


def total(counts: list[sources.ReadCounts]) -> sources.ReadCounts:
    out = sources.ReadCounts()
    for c in counts:
        for f in dataclasses.fields(out):
            setattr(out, f.name, getattr(out, f.name) + getattr(c, f.name))
    return out


def check_units(data: bytes, units: list[cu.Unit], counts: list[sources.ReadCounts]) -> None:
    """Units tile the file; each counted exactly the lines that start in its range."""
    assert units[0].start == 0 and units[-1].end is None
    assert all(a.end == b.start for a, b in zip(units, units[1:]))
    starts = line_starts(data)
    for unit, c in zip(units, counts):
        end = len(data) if unit.end is None else unit.end
        assert c.lines == sum(unit.start <= o < end for o in starts), (unit, data)


def test_documents_match_the_serial_reader(tmp_path):
    rnd = random.Random(1234)
    path = tmp_path / "en.txt"
    for case in range(200):
        data = random_corpus(rnd)
        path.write_bytes(data)
        serial_counts = sources.ReadCounts()
        serial = list(sources.iter_documents(str(path), serial_counts))
        for split in SPLITS + (len(data), len(data) + 1, 2 * len(data) + 10):
            units = cu.document_units(str(path), max(split, 1))
            assert len(units) == max(1, -(-len(data) // max(split, 1)))
            docs, counts = read_all(units)
            assert docs == serial, (case, split, data)
            assert total(counts) == serial_counts, (case, split, data)
            check_units(data, units, counts)


def test_tsv_matches_the_serial_reader(tmp_path):
    rnd = random.Random(99)
    path = tmp_path / "en-fr.tsv"
    for case in range(200):
        data = random_tsv(rnd)
        path.write_bytes(data)
        files = sources.ParallelFiles(str(path), None, swapped=case % 2 == 1)
        serial_counts = sources.ReadCounts()
        serial = list(sources.iter_pairs(files, serial_counts))
        for split in SPLITS + (len(data) + 1,):
            units = cu.pair_units(files, split)
            assert {(u.layout, u.swapped) for u in units} == {("tsv", files.swapped)}
            pairs, counts = read_all(units)
            assert pairs == serial, (case, split, data)
            assert total(counts) == serial_counts, (case, split, data)
            check_units(data, units, counts)


def test_a_unit_starting_inside_a_document_leaves_it_to_the_previous_unit(tmp_path):
    path = tmp_path / "t.txt"
    # offsets: "aa" 0, "bb" 3, "" 6, "cc" 7, "dd" 10; units [0, 4), [4, 8), [8, ...)
    path.write_bytes(b"aa\nbb\n\ncc\ndd")
    per_unit = [list(cu.read_unit(u)) for u in cu.document_units(str(path), 4)]
    assert per_unit == [[["aa", "bb"]], [["cc", "dd"]], []]


@pytest.mark.parametrize("before, expected", [
    (b"aa\n\xff\xfe\n\xc3\n", [["cc"]]),  # "aa", invalid lines: "bb" continues "aa"
    (b"aa\n\n\xff\xfe\n", [["bb"], ["cc"]]),  # a separator before the invalid line
    (b"\xff\n\xc3\n", [["bb"], ["cc"]]),  # only invalid lines back to the file start
])
def test_the_first_line_of_a_unit_looks_back_past_invalid_lines(tmp_path, before, expected):
    path = tmp_path / "t.txt"
    path.write_bytes(before + b"bb\n\ncc\n")
    unit = cu.Unit("documents", (str(path),), start=len(before))
    assert list(cu.read_unit(unit)) == expected
    units = [cu.Unit("documents", (str(path),), end=len(before)), unit]
    assert read_all(units)[0] == list(sources.iter_documents(str(path)))


def test_compressed_files_are_one_unit(tmp_path):
    rnd = random.Random(7)
    doc_data, tsv_data = random_corpus(rnd) * 20, random_tsv(rnd) * 20
    for suffix, compress in ((".xz", lzma.compress), (".gz", gzip.compress)):
        path = tmp_path / f"en.txt{suffix}"
        path.write_bytes(compress(doc_data))
        units = cu.document_units(str(path), 1)
        assert units == [cu.Unit("documents", (str(path),))]
        serial_counts = sources.ReadCounts()
        serial = list(sources.iter_documents(str(path), serial_counts))
        assert serial and read_all(units) == (serial, [serial_counts])

        tsv = tmp_path / f"en-fr.tsv{suffix}"
        tsv.write_bytes(compress(tsv_data))
        files = sources.ParallelFiles(str(tsv), None, swapped=True)
        units = cu.pair_units(files, 1)
        assert units == [cu.Unit("tsv", (str(tsv),), swapped=True)]
        serial_counts = sources.ReadCounts()
        serial = list(sources.iter_pairs(files, serial_counts))
        assert serial and read_all(units) == (serial, [serial_counts])
        with pytest.raises(ValueError, match=r"one unit.*\[3, None\)"):
            cu.read_unit(dataclasses.replace(units[0], start=3))


def test_aligned_files_are_one_unit_and_misalignment_still_raises(tmp_path):
    src, tgt = tmp_path / "en-fr.en", tmp_path / "en-fr.fr.gz"
    src.write_bytes(b"one\n\xff\ntwo\n\nthree\n")
    tgt.write_bytes(gzip.compress(b"un\ndeux\ndeux\nx\ntrois\n"))
    files = sources.ParallelFiles(str(src), str(tgt))
    units = cu.pair_units(files, 1)
    assert units == [cu.Unit("aligned", (str(src), str(tgt)))]
    serial_counts = sources.ReadCounts()
    serial = list(sources.iter_pairs(files, serial_counts))
    assert read_all(units) == (serial, [serial_counts])
    assert serial == [("one", "un"), ("two", "deux"), ("three", "trois")]

    tgt.write_bytes(gzip.compress(b"un\ndeux\n"))
    with pytest.raises(ValueError, match=f"{src}.*{tgt}"):
        read_all(units)


class CountingFile(io.FileIO):
    """A raw file that adds up the bytes it reads from disk."""

    read_bytes = 0

    def readinto(self, b):
        n = super().readinto(b)
        CountingFile.read_bytes += n or 0
        return n


def test_a_unit_in_the_middle_reads_about_its_own_range(tmp_path, monkeypatch):
    rnd = random.Random(3)
    lines = []
    while sum(map(len, lines)) < 2 << 20:
        lines += [words(rnd) * rnd.randint(1, 20) for _ in range(rnd.randint(1, 30))] + [b""]
    path = tmp_path / "big.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    split = 64 << 10
    units = cu.document_units(str(path), split)
    assert len(units) >= 32
    assert read_all(units)[0] == list(sources.iter_documents(str(path)))

    def counting_open(file, mode="r"):
        assert mode == "rb"
        return io.BufferedReader(CountingFile(file))

    monkeypatch.setattr(corpus_fs, "open", counting_open, raising=False)  # local files
    CountingFile.read_bytes = 0
    middle = units[len(units) // 2]
    assert middle.start > 10 * split
    assert list(cu.read_unit(middle))
    assert 0 < CountingFile.read_bytes < 3 * split


@pytest.mark.parametrize("split", [0, -3])
def test_split_bytes_below_one_raises(tmp_path, split):
    (tmp_path / "en.txt").write_bytes(b"a\n")
    with pytest.raises(ValueError, match=f"split_bytes.*{split}"):
        cu.document_units(str(tmp_path / "en.txt"), split)
    with pytest.raises(ValueError, match=f"split_bytes.*{split}"):
        cu.pair_units(sources.ParallelFiles(str(tmp_path / "en.txt"), None), split)
    with pytest.raises(ValueError, match=f"split_bytes.*{split}"):
        cu.pair_units(sources.ParallelFiles(str(tmp_path / "en.txt"), "x.gz"), split)


def test_empty_file_is_one_unit_with_nothing_in_it(tmp_path):
    path = tmp_path / "en.txt"
    path.write_bytes(b"")
    units = cu.document_units(str(path), 5)
    assert units == [cu.Unit("documents", (str(path),))]
    assert read_all(units) == ([], [sources.ReadCounts()])


def _imports(module) -> set[str]:
    tree = ast.parse(pathlib.Path(module.__file__).read_text(encoding="utf-8"))
    top = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    imported = {alias.name.split(".")[0] for node in top
                if isinstance(node, ast.Import) for alias in node.names}
    return imported | {f"{node.module}.{alias.name}" if node.module == "xlm_jax.data"
                       else node.module for node in top if isinstance(node, ast.ImportFrom)
                       for alias in node.names}


def test_the_module_imports_no_heavy_library():
    assert _imports(cu) <= {"__future__", "dataclasses", "typing", "xlm_jax.data.sources",
                            "xlm_jax.data.corpus_fs"}, _imports(cu)
    # the filesystem layer: the standard library at import; etils only for a remote path
    assert _imports(corpus_fs) <= {"__future__", "io", "os", "posixpath", "typing"}
    code = ("import sys, xlm_jax.data.prepared.corpus_units; "
            "print(sorted(m for m in ('tensorflow', 'seqio', 'jax', 'etils') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=pathlib.Path(__file__).resolve().parents[2])
    assert out.stdout.strip() == "[]"
