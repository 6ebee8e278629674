"""The files of a prepared task: tokenised records in sharded, random-access files.

`python -m xlm_jax.data.prepared.prepare` writes, per task, under `ROOT/TASK/`:

  plan.json                        what is being prepared (written first; a rerun that finds
                                   another plan refuses instead of mixing two preparations)
  MEMBER/shard-KKKKK-of-UUUUU.bin  the records of work unit K: little-endian token ids, record
                                   after record, uint16 where the vocabulary fits, else int32
  MEMBER/shard-KKKKK-of-UUUUU.idx  a 16-byte header (magic, format, id width:
                                   `shard_index`), then int64 little-endian byte offsets of the
                                   records in .bin (records + 1 entries, the first 0, the last
                                   the .bin size)
  MEMBER/shard-KKKKK-of-UUUUU.json the unit's counts (records, tokens, bytes, sha1, lines,
                                   skipped lines), written after the two files it describes
  manifest.json                    the plan plus every shard and the corpus statistics;
                                   written last: a task without it is not prepared

MEMBER is a corpus of the task: its language (`af`) or pair (`en-de`); a task that mixes
corpora (XLCo mixup) has one per pair. A record is a tokenised document (the ids of its lines,
concatenated, as `preprocessors.tokenize` makes them) or a tokenised pair (`[len(src), src...,
tgt...]`). Records hold what no later choice changes: the sequence length, truncation, kind
and language ids are applied when the records are read (the registry's preprocessors), so one
preparation serves every sequence length and example kind (a fairseq-style indexed dataset;
our choice over ArrayRecord, docs/scaling.md says why).

`CorpusRecords` reads records by number (two positioned reads each, the index entry and the
record), checking the shards against the manifest first, and counts the bytes it read.
TensorFlow-free. Files are reached through `etils.epath` (local, `gs://`, ...); only the
record reads of local files bypass it, for `os.pread`.
"""
from __future__ import annotations

import array
import dataclasses
import hashlib
import json
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from xlm_jax.data import corpus_fs
from xlm_jax.data.prepared import remote_reads, shard_index
from xlm_jax.data.prepared.shard_index import bad_ids, bad_record, index_span_problem

__all__ = ["FORMAT", "MANIFEST", "PLAN", "RECORD_TYPES", "Corpus", "Plan", "ShardCounts",
           "CorpusRecords", "PreparedError", "WrittenShard", "shard_name", "write_shard",
           "read_json",
           "write_json", "exists", "vocab_size", "shard_files_problem", "index_span_problem",
           "bad_record", "bad_ids"]

FORMAT = 2  # 2: an index header and uint16 ids where they fit (issue 54); 1: neither
READ_FORMATS = (1, 2)  # format 1 is read for one release
MANIFEST = "manifest.json"
PLAN = "plan.json"
RECORD_TYPES = ("documents", "pairs")


class PreparedError(ValueError):
    """A prepared directory that cannot be used as it is; the message is one line naming the
    directory or file, and what differs."""


# ----------------------------------------------------------------------------- file system

def _local(path: str) -> bool:
    """Whether `path` is a local file, which `CorpusRecords` reads with `os.pread`."""
    return not corpus_fs.is_remote(path)


def _epath(path: str):
    from etils import epath  # pylint: disable=g-import-not-at-top

    return epath.Path(path)


def exists(path: str) -> bool:
    return _epath(path).exists()


def size(path: str) -> int:
    return _epath(path).stat().length


def read_bytes(path: str) -> bytes:
    return _epath(path).read_bytes()


def open_read(path: str):
    """A binary file object for reading `path` (local or remote)."""
    return _epath(path).open("rb")


def children(path: str) -> list[str]:
    """The names in directory `path`."""
    return [p.name for p in _epath(path).iterdir()]


def forget_listings(path: str) -> None:
    """Drops the directory listings the filesystem layer keeps for a remote `path` (gcsfs
    caches them: a file another process wrote after a listing then looks missing to
    `exists`, and a progress poll would list the old contents forever). Local paths: nothing
    to drop."""
    fs = None if _local(path) else remote_reads.fsspec_filesystem(path)
    if fs is None:  # local, or no fsspec implementation: epath reads uncached
        return
    # every live instance of the filesystem's class: epath holds its own (made with other
    # options than this one), and fsspec keeps its instances in the class's `_cache`
    for instance in [fs, *getattr(type(fs), "_cache", {}).values()]:
        instance.invalidate_cache()


def is_dir(path: str) -> bool:
    return _epath(path).is_dir()


def makedirs(path: str) -> None:
    _epath(path).mkdir(parents=True, exist_ok=True)


def rmtree(path: str) -> None:
    """Deletes the directory `path` and everything under it."""
    _epath(path).rmtree()


def remove_temporaries(directory: str) -> int:
    """Deletes the `.tmp-*` files a killed writer left in a task's `directory` (its plan and
    manifest) and its members' directories (the shards); returns how many."""
    root = _epath(directory)
    found = [*root.glob("*.tmp-*"), *root.glob("*/*.tmp-*")]
    for path in found:
        path.unlink()
    return len(found)


def remove(path: str) -> None:
    """Deletes `path` if it is there."""
    _epath(path).unlink(missing_ok=True)


def write_atomic(path: str, data: bytes) -> None:
    """Writes `path` whole or not at all: a temporary name, then a rename (a killed writer
    leaves only a `.tmp-*` file, which nothing reads). On an object store (`gs://`) an upload
    is atomic already (the object appears when it is complete) and a rename is a copy and a
    delete, so the object is written in place."""
    if not _local(path):
        _epath(path).write_bytes(data)
        return
    tmp = _epath(f"{path}.tmp-{uuid.uuid4().hex}")
    tmp.write_bytes(data)
    tmp.replace(path)


def read_json(path: str) -> dict[str, Any]:
    """The JSON object of a plan, manifest or counts file; `PreparedError` naming the file
    when it is not valid JSON (a damaged or half-copied file; issue 54)."""
    text = _epath(path).read_text()
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise PreparedError(f"{path}: not valid JSON ({e.msg} at line {e.lineno}, column "
                            f"{e.colno}): a damaged or half-copied file; copy it again, or "
                            "prepare again into a new directory") from None


def write_json(path: str, value: Mapping[str, Any]) -> None:
    write_atomic(path, (json.dumps(value, indent=1, sort_keys=True) + "\n").encode())


# ----------------------------------------------------------------------------- what is prepared

@dataclasses.dataclass(frozen=True)
class Corpus:
    """One corpus of a registered task, as `prepare` reads it.

    member: the corpus's name in the task (`af`, `en-de`), its directory under the task's.
    records: "documents" (a CC-100 file) or "pairs" (OPUS/Moses files or a TSV).
    paths: the corpus files: one, or (src, tgt) for line-aligned pairs.
    swapped: the files hold (tgt, src) (`sources.ParallelFiles.swapped`).
    """

    member: str
    records: str
    paths: tuple[str, ...]
    swapped: bool = False


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one task's preparation is made of: its identity in `plan.json` and
    `manifest.json`. Two preparations with equal plans write identical files."""

    task: str
    records: str
    vocabulary: str  # `stats_cache.vocab_fingerprint` of the task's vocabulary
    corpora: Mapping[str, Mapping[str, Any]]  # member -> {"sources": [{file, bytes}], "swapped", "units"}

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "task": self.task, "records": self.records,
                "vocabulary": self.vocabulary,
                "corpora": {m: dict(c) for m, c in sorted(self.corpora.items())}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Plan":
        return cls(task=d["task"], records=d["records"], vocabulary=d["vocabulary"],
                   corpora={m: {k: c[k] for k in ("sources", "swapped", "units")}
                            for m, c in d["corpora"].items()})

    @property
    def digest(self) -> str:
        """Identifies the plan (16 hex digits of the sha1 of its JSON): every shard's counts
        carry it, and a manifest is written only over shards of its own plan."""
        import hashlib  # pylint: disable=g-import-not-at-top

        text = json.dumps(self.to_json(), sort_keys=True)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def differences(self, other: "Plan") -> list[str]:
        """What differs between two plans, in words (empty when they are the same)."""
        out = []
        for key in ("task", "records", "vocabulary"):
            if getattr(self, key) != getattr(other, key):
                out.append(f"{key} {getattr(other, key)!r} vs {getattr(self, key)!r}")
        if set(self.corpora) != set(other.corpora):
            out.append(f"corpora {sorted(other.corpora)} vs {sorted(self.corpora)}")
        for member in sorted(set(self.corpora) & set(other.corpora)):
            a, b = self.corpora[member], other.corpora[member]
            changed = changed_sources(b["sources"], a["sources"])
            out += [f"{member}: {phrase}" for phrase in changed]
            for key in ("swapped", "units"):
                if a[key] != b[key]:
                    out.append(f"{member} {key} {b[key]} vs {a[key]}")
        return out


SAMPLE_BLOCK = 64 * 1024  # bytes read at each sampled offset of a corpus file
SAMPLE_BLOCKS = 16  # evenly spaced, the first at byte 0 and the last ending at the file's end


def content_sample(path: str, length: Optional[int] = None) -> str:
    """16 hex digits of the sha1 of a file's size and of `SAMPLE_BLOCKS` blocks of
    `SAMPLE_BLOCK` bytes at evenly spaced offsets (the whole file when it is no larger): 1 MiB
    read per file whatever its size, so a plan and every registration over prepared data can
    afford it (CC-100's ~120 files: ~120 MB, against the 2.5 TB a full sha1 would read on
    one host). Our choice: it sees an edit of the same size inside a sampled block, and any
    change of size, but not an edit between the samples (the full sha1 `data.prepared.verify` checks
    is of the prepared shards, not of the corpus)."""
    n = size(path) if length is None else length
    digest = hashlib.sha1(str(n).encode())
    if n <= SAMPLE_BLOCKS * SAMPLE_BLOCK:
        digest.update(read_bytes(path))
        return digest.hexdigest()[:16]
    ranges = [(path, (n - SAMPLE_BLOCK) * i // (SAMPLE_BLOCKS - 1), SAMPLE_BLOCK)
              for i in range(SAMPLE_BLOCKS)]
    if not _local(path):  # 16 exact ranges at once (a file object would fetch 5 MiB each)
        blocks = remote_reads.RemoteFiles(PreparedError).read(ranges)
    else:
        with open_read(path) as f:
            blocks = []
            for _, offset, length in ranges:
                f.seek(offset)
                blocks.append(f.read(length))
    for block in blocks:
        digest.update(block)
    return digest.hexdigest()[:16]


def source_entries(paths: Sequence[str]) -> list[dict[str, Any]]:
    """How a plan names its corpus files: base name, size and `content_sample` (not the
    directory, so a corpus moved elsewhere keeps its preparation; not the mtime, which a copy
    changes)."""
    out = []
    for p in paths:
        n = size(p)
        out.append({"file": os.path.basename(p), "bytes": n, "sample": content_sample(p, n)})
    return out


def changed_sources(prepared: Sequence[Mapping[str, Any]],
                    here: Sequence[Mapping[str, Any]]) -> list[str]:
    """What changed between the corpus files a task was prepared from and those here, one
    phrase per file naming it (empty when nothing did). An entry without a sample (prepared
    before samples were recorded) is compared by name and size."""
    if [e["file"] for e in prepared] != [e["file"] for e in here]:
        return [f"the files were {[e['file'] for e in prepared]}, they are now "
                f"{[e['file'] for e in here]}"]
    out = []
    for was, now in zip(prepared, here):
        if was["bytes"] != now["bytes"]:
            out.append(f"{now['file']} had {was['bytes']} bytes when it was prepared and has "
                       f"{now['bytes']} now")
        elif "sample" in was and "sample" in now and was["sample"] != now["sample"]:
            out.append(f"{now['file']} has the same size but other content than when it was "
                       "prepared")
    return out


def shard_name(index: int, count: int) -> str:
    return f"shard-{index:05d}-of-{count:05d}"


@dataclasses.dataclass(frozen=True)
class ShardCounts:
    """What one work unit wrote (its `.json` file), summed into the manifest's statistics."""

    records: int
    tokens: int
    bytes: int
    sha1: str
    lines: int
    invalid_utf8: int
    malformed: int
    empty_pairs: int
    # sha1 of the .idx (`data.prepared.verify` checks it: an index entry moved by a multiple of
    # 4 within its record's neighbours leaves every other check passing); "" in preparations
    # made before issue 54, whose indexes are then checked for their form only
    index_sha1: str = ""
    plan: str = ""  # the digest of the plan that wrote it (`Plan.digest`); "" before issue 54

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ShardCounts":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls)
                      if f.name in d or f.default is dataclasses.MISSING})


@dataclasses.dataclass(frozen=True)
class WrittenShard:
    """What `write_shard` wrote: records, bytes of the .bin, the sha1 of each file."""

    records: int
    bytes: int
    sha1: str
    index_sha1: str


class _StreamedFile:
    """A file written piece by piece, whole or not at all: locally under a temporary name
    renamed on success (deleted on failure); on an object store straight to its name, the
    upload discarded on failure (an object appears only when its upload completes)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._target = path if not _local(path) else f"{path}.tmp-{uuid.uuid4().hex}"
        self._f: Any = None

    def __enter__(self) -> Any:
        self._f = (_epath(self._target).open("wb") if self._target == self.path
                   else open(self._target, "wb"))  # pylint: disable=consider-using-with
        return self._f

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self._f.close()
            if self._target != self.path:
                os.replace(self._target, self.path)
            return
        discard = getattr(self._f, "discard", None)  # fsspec: abort the upload
        if discard is not None:
            discard()
        else:
            self._f.close()
            remove(self._target)


WRITE_BUFFER = 4 << 20  # bytes of records gathered before a write (our choice)


def write_shard(prefix: str, records: Iterable[np.ndarray],
                vocab_size: Optional[int] = None) -> WrittenShard:
    """Writes `prefix.bin` and `prefix.idx` (each whole or not at all) as the records come:
    what is held at once is one `WRITE_BUFFER` of ids and 8 bytes of index per record, not
    the shard, which was held whole and then joined (docs/scaling.md has the measurement). Ids
    are uint16 where `vocab_size` fits (`shard_index.id_bytes_for`), else int32; an id that
    does not fit its width is a ValueError (it would wrap silently)."""
    lay = shard_index.layout(FORMAT, shard_index.id_bytes_for(vocab_size))
    offsets, total, digest = array.array("q", [0]), 0, hashlib.sha1()
    pending: list[bytes] = []
    pending_bytes = 0
    with _StreamedFile(prefix + ".bin") as f:
        for rec in records:
            rec = np.asarray(rec)
            if lay.id_bytes == 2 and rec.size and (rec.min() < 0 or rec.max() >= 1 << 16):
                wide = int(rec.min()) if rec.min() < 0 else int(rec.max())
                raise ValueError(f"{prefix}.bin: token id {wide} does not fit the uint16 ids "
                                 f"of a {vocab_size}-id vocabulary")
            data = rec.astype(lay.dtype).tobytes()
            pending.append(data)
            pending_bytes += len(data)
            total += len(data)
            offsets.append(total)
            if pending_bytes >= WRITE_BUFFER:
                chunk = b"".join(pending)
                digest.update(chunk)
                f.write(chunk)
                del chunk  # not held while the next one gathers
                pending, pending_bytes = [], 0
        chunk = b"".join(pending)
        digest.update(chunk)
        f.write(chunk)
    index = (shard_index.header(lay.id_bytes)
             + np.frombuffer(offsets, dtype=np.int64).astype("<i8").tobytes())
    write_atomic(prefix + ".idx", index)
    return WrittenShard(len(offsets) - 1, total, digest.hexdigest(),
                        hashlib.sha1(index).hexdigest())


# ----------------------------------------------------------------------------- reading

def _read_at(path: str, offset: int, length: int, fd: Optional[int] = None) -> bytes:
    """`length` bytes of `path` at `offset`: `os.pread` on `fd` (thread-safe: no shared file
    offset), or a file object of `etils.epath` for a remote path."""
    if fd is not None:
        data = os.pread(fd, length, offset)
    else:
        with _epath(path).open("rb") as f:
            f.seek(offset)
            data = f.read(length)
    if len(data) != length:
        raise PreparedError(f"{path}: read {len(data)} of {length} bytes at offset {offset}: "
                            "the file is shorter than its index says")
    return data


class _FilePool:
    """Open descriptors of local files, shared by all threads, at most `limit` of them kept
    when idle (a descriptor in use is never closed under a reader)."""

    def __init__(self, limit: int) -> None:
        self._limit, self._lock = limit, threading.Lock()
        self._open: OrderedDict[str, list[int]] = OrderedDict()  # path -> [fd, users]

    def read(self, path: str, offset: int, length: int) -> bytes:
        if not _local(path):
            return _read_at(path, offset, length)
        with self._lock:
            entry = self._open.get(path)
            if entry is None:
                entry = self._open[path] = [os.open(path, os.O_RDONLY), 0]
            entry[1] += 1
            self._open.move_to_end(path)
        try:
            return _read_at(path, offset, length, entry[0])
        finally:
            with self._lock:
                entry[1] -= 1
                if len(self._open) > self._limit:  # close the least recently used idle ones
                    idle = [p for p, (_, users) in self._open.items() if not users]
                    for p in idle[:len(self._open) - self._limit]:
                        os.close(self._open.pop(p)[0])


def vocab_size(fingerprint: str) -> Optional[int]:
    """The vocabulary size a plan's `vocabulary` fingerprint ends with
    (`stats_cache.vocab_fingerprint`: `spm:SHA:SIZE`), or None where it has none."""
    tail = fingerprint.rsplit(":", 1)[-1]
    return int(tail) if tail.isdigit() else None


def shard_files_problem(prefix: str, shard: Mapping[str, Any], header: int,
                        sizes: Optional[Mapping[str, int]] = None) -> Optional[str]:
    """Why shard `prefix`'s two files do not match its manifest entry `shard` (missing, or
    another size; the index has `header` bytes of header), else None; what the reader checks
    on open and `verify` first. `sizes` ({path: bytes} of the files there, from one listing)
    saves a query per file."""
    index_bytes = header + 8 * (shard["records"] + 1)
    for suffix, want in ((".bin", shard["bytes"]), (".idx", index_bytes)):
        path = prefix + suffix
        if not (exists(path) if sizes is None else path in sizes):
            return (f"{path} is missing (the manifest lists it): the prepared data is "
                    "incomplete; prepare it again into a new directory")
        got = size(path) if sizes is None else sizes[path]
        if got != want:
            what = "index" if suffix == ".idx" else "shard"
            return (f"{path}: {got} bytes, but the manifest says {want} (a truncated or "
                    f"replaced {what}); prepare it again into a new directory")
    return None


class CorpusRecords:
    """The records of one prepared corpus (`TASK/MEMBER/`), read by number.

    `entry` is the corpus's entry of the manifest. Every shard is checked when this is built
    (before anything is trained): present, the size the manifest records, an index whose
    length, first and last offsets match; a mismatch is a one-line `PreparedError` naming the
    file. Every record read is checked too, at the cost of a min and max over its ids: index
    entries that cannot delimit it, and ids outside the vocabulary (`vocab_size`; the
    manifest's fingerprint gives it) stop the run with one line naming the shard and record,
    where they used to train silently or end in a NaN loss (issue 54; `xlm_jax.data.prepared.verify`
    checks every byte against the manifest's sha1 ahead of a run). At most `open_files` idle
    files stay open (CC-100 English is over a thousand shards).
    """

    def __init__(self, directory: str, entry: Mapping[str, Any], open_files: int = 32,
                 vocab_size: Optional[int] = None, records: str = "documents",
                 format_version: int = FORMAT) -> None:
        self.directory, self._format = directory, format_version
        self.vocab_size, self._pairs = vocab_size, records == "pairs"
        self._bytes = [int(s["bytes"]) for s in entry["shards"]]
        self._shards = [s["name"] for s in entry["shards"]]
        counts = np.asarray([s["records"] for s in entry["shards"]], np.int64)
        self._starts = np.concatenate([[0], np.cumsum(counts)])
        self.num_records = int(self._starts[-1])
        self._files = _FilePool(open_files)
        self._remote = None if _local(directory) else remote_reads.RemoteFiles(PreparedError)
        self._lock = threading.Lock()
        self.bytes_read = 0  # by `read`, index entries included
        self._check(entry["shards"])

    def _check(self, shards: Sequence[Mapping[str, Any]]) -> None:
        """Every shard's files against the manifest, then every index's first and last entry
        (on a remote filesystem: one listing and one round of reads for all shards)."""
        sizes = self._remote.sizes(self.directory) if self._remote is not None else None
        prefixes = [os.path.join(self.directory, shard["name"]) for shard in shards]
        header = shard_index.layout(self._format).header
        for prefix, shard in zip(prefixes, shards):
            wrong = shard_files_problem(prefix, shard, header, sizes)
            if wrong:
                raise PreparedError(wrong)
        ranges = []  # per shard: its header (format 2 only), its first and last entries
        for prefix, shard in zip(prefixes, shards):
            if header:
                ranges.append((prefix + ".idx", 0, header))
            ranges += [(prefix + ".idx", header, 8),
                       (prefix + ".idx", header + 8 * shard["records"], 8)]
        got, per_shard = self._ranges(ranges), 3 if header else 2
        self._layouts = []
        for i, (prefix, shard) in enumerate(zip(prefixes, shards)):
            *head, first, last = got[per_shard * i:per_shard * (i + 1)]
            try:
                lay = (shard_index.parse_header(prefix + ".idx", head[0]) if header
                       else shard_index.FORMAT1)
            except ValueError as e:
                raise PreparedError(f"{e}; run python -m xlm_jax.data.prepared.verify on the "
                                    "prepared directory") from None
            self._layouts.append(lay)
            wrong = index_span_problem(prefix, shard, int(np.frombuffer(first, "<i8")[0]),
                                       int(np.frombuffer(last, "<i8")[0]))
            if wrong:
                raise PreparedError(wrong)

    def _ranges(self, ranges: Sequence[tuple[str, int, int]]) -> list[bytes]:
        """The bytes of (path, offset, length) ranges: `os.pread` each on a local disk; all at
        once, retried, on a remote filesystem (`remote_reads`)."""
        if self._remote is not None:
            return self._remote.read(ranges) if ranges else []
        return [self._files.read(*r) for r in ranges]

    def read(self, numbers: np.ndarray) -> list[np.ndarray]:
        """The records `numbers` (ints in [0, num_records)), as int32 arrays, in order."""
        numbers = np.asarray(numbers, np.int64)
        shards = np.searchsorted(self._starts, numbers, side="right") - 1
        where = [(os.path.join(self.directory, self._shards[shard]), shard, k) for shard, k in
                 zip(shards.tolist(), (numbers - self._starts[shards]).tolist())]
        entries = self._ranges([(prefix + ".idx", self._layouts[shard].entry(k), 16)
                                for prefix, shard, k in where])
        spans = []
        for (prefix, shard, k), entry in zip(where, entries):
            start, end = (int(x) for x in np.frombuffer(entry, "<i8"))
            wrong = bad_record(prefix, k, start, end, self._bytes[shard], self._layouts[shard])
            if wrong:
                raise PreparedError(wrong + "; run python -m xlm_jax.data.prepared.verify on the "
                                    "prepared directory")
            spans.append((start, end))
        blobs = self._ranges([(prefix + ".bin", start, end - start)
                              for (prefix, _, _), (start, end) in zip(where, spans)])
        out, nbytes = [], 0
        for (prefix, shard, k), (start, end), blob in zip(where, spans, blobs):
            ids = np.frombuffer(blob, self._layouts[shard].dtype).astype(np.int32, copy=False)
            wrong = bad_ids(ids, self.vocab_size, self._pairs)
            if wrong:
                raise PreparedError(f"{prefix}.bin: record {k}: {wrong} (a damaged shard, or "
                                    "ids of another SentencePiece model); run python -m "
                                    "xlm_jax.data.prepared.verify on the prepared directory")
            out.append(ids)
            nbytes += 16 + end - start
        with self._lock:
            self.bytes_read += nbytes
        return out
