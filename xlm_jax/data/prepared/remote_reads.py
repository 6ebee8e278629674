"""Ranged reads of prepared shards on a remote filesystem (`gs://`), a block at a time, retried.

`shard_files.CorpusRecords` reads a block of records (the tf.data source asks for 256 at a
time) as two rounds of byte ranges: the index entries of every record, then the records. On a
local disk each range is an `os.pread`. On GCS each range is an HTTP request of ~10-50 ms, so
one request after another would read a block of 256 records in seconds: here every range of a
round goes out at once (fsspec's `cat_ranges`, which gcsfs sends concurrently), so a block
costs about two round trips whatever its size. Where the path's filesystem has no fsspec
implementation installed, the ranges are read by a pool of threads, each opening the file
through `etils.epath` (TensorFlow's `tf.io.gfile` where it is installed).

A round that fails (a connection reset, a 503, a timeout) is retried up to `RETRIES` times in
all, waiting `BACKOFF_S`, then twice that, and so on (our choice, on top of gcsfs's own
retries of each request); a range that still cannot be read is one `PreparedError` naming the
file, the range and the last error. A range that comes back short (a truncated object) is not
retried: it is the data, and the message says so.

Neither the index nor the records are cached (the global shuffle reads each record once an
epoch, in an order no cache could exploit); what a block costs is what it reads: 16 bytes of
index and the record per record.
"""
from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Sequence
from typing import Any, Optional

__all__ = ["RETRIES", "BACKOFF_S", "RemoteFiles", "Range", "fsspec_filesystem"]

RETRIES = 4
BACKOFF_S = 0.5
THREADS = 16  # ranges read at once where fsspec is not available (our choice)

Range = tuple[str, int, int]  # (path, offset, length)


def fsspec_filesystem(path: str) -> Optional[Any]:
    """The fsspec filesystem of `path`, or None when fsspec or the scheme's implementation
    (gcsfs for gs://) is not installed."""
    try:
        import fsspec  # pylint: disable=g-import-not-at-top

        return fsspec.core.url_to_fs(path)[0]
    except (ImportError, ValueError):
        return None


class RemoteFiles:
    """Reads byte ranges of remote files, a round at a time (see the module docstring).

    `error` makes the exception raised for a range that cannot be read (the reader's
    `PreparedError`); `sleep` is `time.sleep` (a test's can count the waits)."""

    def __init__(self, error: type[Exception], sleep=time.sleep) -> None:
        self._error, self._sleep = error, sleep
        self._fs: dict[str, Optional[Any]] = {}
        self._lock = threading.Lock()
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def _filesystem(self, path: str) -> Optional[Any]:
        scheme = path.split("://", 1)[0]
        with self._lock:
            if scheme not in self._fs:
                self._fs[scheme] = fsspec_filesystem(path)
            return self._fs[scheme]

    def _read_round(self, ranges: Sequence[Range]) -> list[Any]:
        """Each range's bytes, or the exception reading it raised."""
        fs = self._filesystem(ranges[0][0])
        if fs is not None:
            strip = fs._strip_protocol  # pylint: disable=protected-access  (fsspec's own way)
            paths = [strip(p) for p, _, _ in ranges]
            return list(fs.cat_ranges(paths, [o for _, o, _ in ranges],
                                      [o + n for _, o, n in ranges], on_error="return"))
        with self._lock:
            if self._pool is None:
                self._pool = concurrent.futures.ThreadPoolExecutor(THREADS)
        return list(self._pool.map(_read_one, ranges))

    def sizes(self, directory: str) -> dict[str, int]:
        """{path: bytes} of the files in `directory`: one listing where fsspec serves the
        path, a query per file otherwise."""
        fs = self._filesystem(directory)
        base = directory.rstrip("/")
        if fs is not None:
            strip = fs._strip_protocol  # pylint: disable=protected-access
            listing = fs.ls(strip(base), detail=True)
            return {f"{base}/{e['name'].rstrip('/').rsplit('/', 1)[-1]}": int(e["size"])
                    for e in listing if e.get("type") == "file"}
        from etils import epath  # pylint: disable=g-import-not-at-top

        return {f"{base}/{p.name}": int(p.stat().length) for p in epath.Path(base).iterdir()
                if p.is_file()}

    def read(self, ranges: Sequence[Range]) -> list[bytes]:
        """The bytes of every range, in order. Raises `error` for a range still failing after
        `RETRIES` rounds, or one that comes back shorter than asked."""
        out: list[Any] = [None] * len(ranges)
        todo = list(range(len(ranges)))
        for attempt in range(RETRIES):
            if not todo:
                break
            got = self._read_round([ranges[i] for i in todo])
            failed = []
            for i, data in zip(todo, got):
                if isinstance(data, FileNotFoundError):
                    raise self._error(f"{ranges[i][0]} is missing (the manifest lists it): the "
                                      "prepared data is incomplete")
                if isinstance(data, BaseException):
                    failed.append(i)
                    out[i] = data
                else:
                    out[i] = bytes(data)
            todo = failed
            if todo and attempt < RETRIES - 1:
                self._sleep(BACKOFF_S * 2 ** attempt)
        if todo:
            path, offset, length = ranges[todo[0]]
            e = out[todo[0]]
            raise self._error(f"{path}: {length} bytes at offset {offset} could not be read "
                              f"after {RETRIES} tries ({len(todo)} of {len(ranges)} ranges "
                              f"failed; the last error: {type(e).__name__}: {e})")
        for (path, offset, length), data in zip(ranges, out):
            if len(data) != length:
                raise self._error(f"{path}: read {len(data)} of {length} bytes at offset "
                                  f"{offset}: the file is shorter than its index says")
        return out


def _read_one(r: Range) -> Any:
    """One range through `etils.epath`, or the exception it raised."""
    from etils import epath  # pylint: disable=g-import-not-at-top

    path, offset, length = r
    try:
        with epath.Path(path).open("rb") as f:
            f.seek(offset)
            return f.read(length)
    except Exception as e:  # pylint: disable=broad-except  (retried, then reported)
        return e
