"""Corpus files on any filesystem: local paths through `os`, `gs://` (and every other scheme
`etils.epath` knows) through `etils.epath`.

The corpus readers (`sources`, `corpus_units`, `stats_cache`) and the registry reach corpus
files only through this module, so that a task registered over `gs://bucket/cc100` is read,
planned into work units and prepared by `python -m xlm_jax.data.prepared.prepare` on the
DataflowRunner straight from the bucket (issue 54). A local path takes the plain `os` calls it
always took (the same speed, the same errors); a remote one goes through `etils.epath`, which
is fsspec's gcsfs on machines without TensorFlow (and where `EPATH_USE_TF=false`) and
`tf.io.gfile` where TensorFlow is installed.

A remote file is read through `io.BufferedReader` over the backend's file object
(`open_binary`), 4 MiB at a time: fsspec's own line iteration reads a whole cache block for
every line it returns, and `lzma`/`gzip` read their input in small pieces. Retries of
transient errors are the backend's (gcsfs and TensorFlow's GCS filesystem both retry).

Plain python besides `etils` (imported only for a remote path), so that Beam workers need not
install the training stack.
"""
from __future__ import annotations

import io
import os
import posixpath
from typing import Any, BinaryIO

__all__ = ["is_remote", "join", "abspath", "isfile", "isdir", "listdir", "getsize",
           "stat_key", "open_binary", "READ_BUFFER"]

READ_BUFFER = 4 << 20  # bytes a remote file is read in (our choice: a few round trips a MB)


def is_remote(path: Any) -> bool:
    """Whether `path` names a file on a remote filesystem (`scheme://...`)."""
    return "://" in os.fspath(path)


def _epath(path: str):
    from etils import epath  # pylint: disable=g-import-not-at-top

    return epath.Path(path)


def join(directory: str, *names: str) -> str:
    """`os.path.join` for a local directory; `/`-joined for a remote one."""
    return (posixpath if is_remote(directory) else os.path).join(directory, *names)


def abspath(path: str) -> str:
    """The absolute form of a local path; a remote path unchanged (`os.path.abspath` would
    turn `gs://b/x` into `CWD/gs:/b/x`)."""
    return path if is_remote(path) else os.path.abspath(path)


def isfile(path: str) -> bool:
    return _epath(path).is_file() if is_remote(path) else os.path.isfile(path)


def isdir(path: str) -> bool:
    return _epath(path).is_dir() if is_remote(path) else os.path.isdir(path)


def listdir(path: str) -> list[str]:
    """The names in directory `path` (files and directories)."""
    if is_remote(path):
        return [p.name for p in _epath(path).iterdir()]
    return os.listdir(path)


def getsize(path: str) -> int:
    return int(_epath(path).stat().length) if is_remote(path) else os.path.getsize(path)


def stat_key(path: str) -> tuple[int, int]:
    """(size, modification time in ns) of a file: what the stats cache's fast key holds. A
    remote file's time is the backend's (gcsfs: the object's update time, in seconds)."""
    if is_remote(path):
        st = _epath(path).stat()
        return int(st.length), int(float(st.mtime or 0) * 1e9)
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


class _Raw(io.RawIOBase):
    """A backend's file object (fsspec's, `tf.io.gfile.GFile`) as a raw stream, so that
    `io.BufferedReader` can buffer it: only `read`, `seek` and `tell` are asked of it."""

    def __init__(self, f: Any) -> None:
        super().__init__()
        self._f = f

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        data = self._f.read(len(b))
        n = len(data)
        b[:n] = data
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._f.seek(offset, whence)
        return self._f.tell()

    def tell(self) -> int:
        return self._f.tell()

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()


def open_binary(path: str) -> BinaryIO:
    """`path` opened for binary reading: the built-in `open` for a local file, a 4 MiB
    `io.BufferedReader` over the backend's file for a remote one. Raises FileNotFoundError
    for a missing file either way."""
    if not is_remote(path):
        return open(path, "rb")  # pylint: disable=consider-using-with
    p = _epath(path)
    if not p.exists():
        raise FileNotFoundError(f"no such file: {path}")
    return io.BufferedReader(_Raw(p.open("rb")), READ_BUFFER)  # type: ignore[return-value]
