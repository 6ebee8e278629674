"""What `python -m xlm_jax.data.prepared.prepare` shows in the terminal while Beam runs.

- **Progress**: a line each time more work units are written (`prepare: 12 of 51 work units
  written, 40 s`), polled from the output directories (one listing per corpus directory and
  poll, so a gs:// output costs a few list calls a poll, not one per unit). Beam's
  DirectRunner prints nothing while it works, and a CC-100 preparation runs for hours.
- **Beam's start-up notes left out**: every DirectRunner worker process logs the same notes
  when it starts (apitools absent, its logging handler created, no semi-persistent directory,
  Beam's own two internal flags "discarded"), a screen of lines that say nothing to a user
  (issue 54). The pipeline's stderr (the file descriptor, which the worker processes inherit)
  goes through a filter that drops exactly those lines and passes every other one, warnings
  and tracebacks included. `XLM_JAX_DEBUG=1` keeps them all.
"""
from __future__ import annotations

import ast
import collections
import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from xlm_jax import cli_help
from xlm_jax.data.prepared import shard_files as pf

# The notes Beam (2.x) logs in every worker process it starts; a line is dropped only when it
# contains one of these.
NOISE = (
    "apitools not found, and bigquery client libraries are not available",
    "Logging handler created.",
    "No semi_persistent_directory found",
)
# Flags the DirectRunner passes its own workers, which their option parser then reports as
# "Discarding unparseable args"; the report is dropped only when it names no other flag (a
# user's unknown flag is refused before the pipeline starts: `prepare.unknown_flags`).
BEAM_INTERNAL_FLAGS = frozenset({"--pipeline_type_check", "--direct_runner_use_stacked_bundle"})
_DISCARDING = "Discarding unparseable args: "


def is_noise(line: str) -> bool:
    """Whether a stderr line is one of Beam's start-up notes (see the module docstring)."""
    if any(note in line for note in NOISE):
        return True
    if _DISCARDING in line:
        try:
            flags = ast.literal_eval(line.split(_DISCARDING, 1)[1].strip())
        except (ValueError, SyntaxError):
            return False
        return isinstance(flags, list) and bool(flags) and set(flags) <= BEAM_INTERNAL_FLAGS
    return False


@contextlib.contextmanager
def beam_notes_hidden() -> Iterator[None]:
    """Within the block, lines written to file descriptor 2 (by this process or the worker
    processes it starts) reach the terminal unless `is_noise`; with XLM_JAX_DEBUG set, or
    where stderr has no file descriptor, nothing is filtered."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield
        return
    if cli_help.debug_wanted():
        os.close(saved)
        yield
        return
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)

    def pump() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for line in lines:
                if not is_noise(line.decode("utf-8", "replace")):
                    with contextlib.suppress(OSError):
                        os.write(saved, line)

    thread = threading.Thread(target=pump, name="beam-stderr", daemon=True)
    thread.start()
    try:
        yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        os.dup2(saved, 2)  # this process's write end closes; the pump ends with the workers'
        thread.join(timeout=10)
        if not thread.is_alive():
            os.close(saved)


def written_units(items: Sequence[Any]) -> int:
    """How many of `items` (`prepare_worker.WorkItem`) have their counts file, the last file a
    unit writes: one listing per directory."""
    by_dir: dict[str, list[Any]] = collections.defaultdict(list)
    for item in items:
        by_dir[item.directory].append(item)
    done = 0
    for directory, group in by_dir.items():
        pf.forget_listings(directory)  # what the workers wrote since the last poll
        try:
            names = set(pf.children(directory))
        except OSError:  # not created yet
            continue
        done += sum(os.path.basename(item.prefix) + ".json" in names for item in group)
    return done


@contextlib.contextmanager
def progress(items: Sequence[Any], out: TextIO | None = None, every_s: float = 10.0
             ) -> Iterator[None]:
    """Prints `prepare: N of M work units written, T s` to `out` (default: sys.stdout) when N
    has grown, at most every `every_s` seconds, while the block runs (a daemon thread;
    stopped on exit)."""
    out = out or sys.stdout
    stop = threading.Event()
    start = time.monotonic()

    def watch() -> None:
        last = 0
        while not stop.wait(every_s):
            done = written_units(items)
            if done > last:
                last = done
                print(f"prepare: {done} of {len(items)} work units written, "
                      f"{time.monotonic() - start:.0f} s", file=out, flush=True)

    thread = threading.Thread(target=watch, name="prepare-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=every_s + 5)
