"""One `prepare` at a time per output directory: a lock that dies with its process.

Two `python -m xlm_jax.data.prepared.prepare` runs into one directory with different SentencePiece
models used to interleave their shards: both failed, a rerun of one alone finished with rc 0,
and 17 of 516 shards held the other model's ids (issue 54). `held(output_dir)` takes an
exclusive `flock` on `OUTPUT_DIR/.prepare.lock` for the whole preparation and writes who holds
it (pid, host, start, tasks) into the file; a second run is refused at once with one line
naming the holder. The kernel drops the lock when its process ends, killed or not, so a
crashed run never leaves a stale lock to delete (unlike a marker file).

A `gs://` directory has no such lock: there one preparation per directory is the user's to
ensure (Dataflow jobs are named; docs/scaling.md). The shards' counts files also carry their
plan's digest, and the manifest is written only when every shard has the task's
(`prepare.finish_task`), which catches two preparations interleaved where no lock could stop
them.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import time
from collections.abc import Iterator, Sequence

from xlm_jax.data.prepared import shard_files as pf

LOCK = ".prepare.lock"


@contextlib.contextmanager
def held(output_dir: str, tasks: Sequence[str]) -> Iterator[None]:
    """Holds `output_dir`'s lock for the block (local directories; remote ones pass), or
    raises `PreparedError` at once naming the run that holds it."""
    if "://" in output_dir:
        yield
        return
    import fcntl  # pylint: disable=g-import-not-at-top  (POSIX)

    os.makedirs(output_dir, exist_ok=True)
    path = os.path.join(output_dir, LOCK)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise pf.PreparedError(
                f"{output_dir}: another prepare is writing there ({_holder(fd)}); wait for it "
                "to finish, or use another --output_dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "tasks": list(tasks),
            "since": datetime.datetime.now().isoformat(timespec="seconds")}).encode())
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays (removing it would race a waiter)


def _holder(fd: int, tries: int = 20) -> str:
    """Who holds the lock, from what it wrote into the file: the holder writes it just after
    taking the lock, so a reader that came in between waits for it (up to `tries` x 50 ms)."""
    for attempt in range(tries):
        try:
            who = json.loads(os.pread(fd, 4096, 0).decode())
            return (f"pid {who['pid']} on {who['host']} since {who['since']}, tasks "
                    f"{','.join(who['tasks'])}")
        except (OSError, ValueError, KeyError, TypeError):
            if attempt < tries - 1:
                time.sleep(0.05)
    return "a process that has not said which yet"
