"""Work units: a corpus file cut into byte ranges that parallel workers read independently.

A 300 GB CC-100 file read by one process takes a day to tokenise; cut into byte ranges
(`Unit`s), many Apache Beam workers read it at once, each seeking straight to its own range.
Reading all units of a file in order gives exactly what the serial readers of
`xlm_jax.data.sources` give for the whole file (`iter_documents`, `iter_pairs`), and the
per-unit `ReadCounts` add up to the serial pass's counts.

Which unit owns what:

  documents  A document belongs to the unit whose range holds the byte offset of its first
             line. A unit that starts inside a document skips the rest of it (it looks
             backwards from its start to find out), and a unit whose last document runs past
             its end reads on until that document ends (a separator or EOF).
  tsv        A line (one pair) belongs to the unit whose range holds its first byte.
  counts     A unit counts the physical lines that start in its range: the continuation of the
             previous unit's document that it skips included, the lines it reads past its end
             excluded.

Local and remote (`gs://`) files alike, through `corpus_fs`.

Compressed files (`.xz`, `.gz`) cannot be entered in the middle, and a byte offset in one of
two line-aligned files says nothing about the line number in the other: those are one unit
each, read by the serial readers themselves.

Plain python (no TensorFlow, seqio, jax or numpy of its own), so that Beam workers need not
install the training stack.
"""

from __future__ import annotations

import dataclasses
from typing import BinaryIO, Iterator, Optional, Union

from xlm_jax.data import corpus_fs, sources

__all__ = ["Unit", "document_units", "pair_units", "read_unit"]

DOCUMENTS, TSV, ALIGNED = "documents", "tsv", "aligned"
_BACKWARD_CHUNK = 1 << 13  # first backward read; doubles while no valid line is found


@dataclasses.dataclass(frozen=True)
class Unit:
    """A contiguous piece of one corpus that one worker reads.

    layout: "documents" (a CC-100 file), "tsv" (`src<TAB>tgt` lines) or "aligned" (two
      line-aligned files). paths: the file; the two files for "aligned". swapped: as
      `sources.ParallelFiles.swapped`. start, end: the byte range [start, end) of the unit's
      share; end None is the end of the file.
    """

    layout: str
    paths: tuple[str, ...]
    swapped: bool = False
    start: int = 0
    end: Optional[int] = None


def _is_compressed(path: str) -> bool:
    return path.endswith(tuple(s for s in sources.COMPRESSED_SUFFIXES if s))


def _check_split(split_bytes: int) -> None:
    if split_bytes < 1:
        raise ValueError(f"split_bytes must be >= 1, got {split_bytes}")


def _byte_units(layout: str, path: str, swapped: bool, split_bytes: int) -> list[Unit]:
    """Ranges [0, s), [s, 2s), ... of a plain file (the last one open-ended, at least one
    unit); a single whole-file unit for a compressed one."""
    _check_split(split_bytes)
    if _is_compressed(path):
        return [Unit(layout, (path,), swapped)]
    n = max(1, -(-corpus_fs.getsize(path) // split_bytes))
    return [Unit(layout, (path,), swapped, i * split_bytes,
                 (i + 1) * split_bytes if i < n - 1 else None) for i in range(n)]


def document_units(path: str, split_bytes: int) -> list[Unit]:
    """The units of a CC-100 file: `split_bytes`-byte ranges of a plain file, one unit for a
    compressed one. Raises ValueError when split_bytes < 1."""
    return _byte_units(DOCUMENTS, path, False, split_bytes)


def pair_units(files: sources.ParallelFiles, split_bytes: int) -> list[Unit]:
    """The units of a parallel corpus: `split_bytes`-byte ranges of a plain TSV file, one unit
    for a compressed TSV or two line-aligned files. Raises ValueError when split_bytes < 1."""
    if files.tgt is None:
        return _byte_units(TSV, files.src, files.swapped, split_bytes)
    _check_split(split_bytes)
    return [Unit(ALIGNED, files.paths, files.swapped)]


# ----------------------------------------------------------------------------- plain files

def _first_line_start(f: BinaryIO, start: int) -> int:
    """The offset of the first line that starts at or after `start`."""
    if start == 0:
        return 0
    f.seek(start - 1)
    f.readline()  # the rest of the line holding byte start - 1 (just its b"\n" at a start)
    return f.tell()


def _lines_from(f: BinaryIO, offset: int) -> Iterator[tuple[int, bytes]]:
    """(start offset, line without its b"\\r\\n") of the lines from the line start `offset`."""
    f.seek(offset)
    for line in f:
        yield offset, line.rstrip(b"\r\n")
        offset += len(line)


def _lines_before(f: BinaryIO, p: int) -> Iterator[bytes]:
    """The lines (without b"\\r\\n") before the line start `p` > 0, last first, read backwards
    in growing chunks. Byte p - 1 is the b"\\n" that ends the line just before p."""
    pos, buf, stop, chunk = p - 1, b"", 0, _BACKWARD_CHUNK
    while True:  # buf holds the bytes from `pos`; the next line to yield ends at buf[stop]
        cut = buf.rfind(b"\n", 0, stop)
        if cut >= 0:
            yield buf[cut + 1:stop].rstrip(b"\r\n")
            stop = cut
        elif pos == 0:
            yield buf[:stop].rstrip(b"\r\n")
            return
        else:
            step = min(chunk, pos)
            pos -= step
            f.seek(pos)
            buf = f.read(step) + buf[:stop]
            stop, chunk = len(buf), chunk * 2


def _inside_document(f: BinaryIO, p: int) -> bool:
    """Whether the line start `p` lies inside a document, i.e. whether the last valid UTF-8
    line before it is not a separator (there is none at the start of the file)."""
    for raw in _lines_before(f, p) if p > 0 else ():
        line = sources._decode(raw)  # pylint: disable=protected-access
        if line is not None:
            return bool(line.strip())
    return False


def _plain_documents(unit: Unit, counts: sources.ReadCounts) -> Iterator[list[str]]:
    """The documents that start in the unit's range (see the module docstring)."""
    end = unit.end
    with corpus_fs.open_binary(unit.paths[0]) as f:
        p = _first_line_start(f, unit.start)
        limit = corpus_fs.getsize(unit.paths[0]) if end is None else end
        skipping = p < limit and _inside_document(f, p)  # the previous unit's document
        doc: list[str] = []
        for offset, raw in _lines_from(f, p):
            in_range = end is None or offset < end
            if not in_range and not doc:
                break
            counts.lines += int(in_range)
            line = sources._decode(raw)  # pylint: disable=protected-access
            if line is None:
                counts.invalid_utf8 += int(in_range)
            elif line.strip():
                if not skipping:
                    doc.append(line)
            else:
                skipping = False
                if doc:
                    yield doc
                    doc = []
        if doc:
            yield doc


def _tsv_pair(raw: bytes, swapped: bool, counts: sources.ReadCounts
              ) -> Optional[tuple[str, str]]:
    """The pair of one TSV line, or None (counted) as `sources.iter_pairs` skips it."""
    line = sources._decode(raw)  # pylint: disable=protected-access
    if line is None:
        counts.invalid_utf8 += 1
        return None
    fields = line.split("\t")
    if len(fields) != 2:
        counts.malformed += 1
        return None
    a, b = (fields[1], fields[0]) if swapped else (fields[0], fields[1])
    if not a.strip() or not b.strip():
        counts.empty_pairs += 1
        return None
    return a, b


def _plain_pairs(unit: Unit, counts: sources.ReadCounts) -> Iterator[tuple[str, str]]:
    """The pairs of the TSV lines that start in the unit's range."""
    with corpus_fs.open_binary(unit.paths[0]) as f:
        for offset, raw in _lines_from(f, _first_line_start(f, unit.start)):
            if unit.end is not None and offset >= unit.end:
                break
            counts.lines += 1
            pair = _tsv_pair(raw, unit.swapped, counts)
            if pair is not None:
                yield pair


# ----------------------------------------------------------------------------- reading

def read_unit(unit: Unit, counts: Optional[sources.ReadCounts] = None
              ) -> Union[Iterator[list[str]], Iterator[tuple[str, str]]]:
    """Yields the unit's documents ("documents") or (src, tgt) pairs ("tsv", "aligned"),
    counting what it reads in `counts` (see the module docstring for which lines).

    Raises ValueError for an unknown layout, or a range other than the whole file of a
    compressed or aligned unit (those cannot be entered in the middle).
    """
    counts = counts if counts is not None else sources.ReadCounts()
    if unit.layout not in (DOCUMENTS, TSV, ALIGNED):
        raise ValueError(f"unknown unit layout {unit.layout!r}; expected one of "
                         f"{DOCUMENTS!r}, {TSV!r}, {ALIGNED!r}")
    whole = unit.layout == ALIGNED or _is_compressed(unit.paths[0])
    if whole and (unit.start != 0 or unit.end is not None):
        raise ValueError(f"{', '.join(unit.paths)}: a compressed or line-aligned corpus is "
                         f"read as one unit, got the byte range [{unit.start}, {unit.end})")
    if unit.layout == ALIGNED:
        return sources.iter_pairs(sources.ParallelFiles(*unit.paths, unit.swapped), counts)
    if unit.layout == DOCUMENTS:
        return (sources.iter_documents(unit.paths[0], counts) if whole
                else _plain_documents(unit, counts))
    files = sources.ParallelFiles(unit.paths[0], None, unit.swapped)
    return sources.iter_pairs(files, counts) if whole else _plain_pairs(unit, counts)
