"""Metrics output: TensorBoard event files + a JSONL log, and a console progress line.

What: `MetricsWriter.write_scalars(step, {"loss": ...}, prefix="train")` appends one
TensorBoard scalar event per key to `model_dir/{prefix}/events.out.tfevents.*` and one
JSON line `{"step": .., "split": prefix, ...}` to `model_dir/metrics.jsonl`.
`Progress` shows a carriage-return progress bar on a terminal and plain log lines every
N steps otherwise (batch jobs, files).

Why this way: TensorBoard is what pod users look at, but core must not import
TensorFlow, so the events are written with the `tensorboard` package's pure-python
record writer and protos (TFRecord framing + masked CRC32C), readable by TensorBoard's
own `EventAccumulator`. The JSONL copy is for scripts and tests (no protobuf needed).
Only the primary process (jax.process_index() == 0) writes; the others get no-ops,
so call sites need no `if`. The model directory may be local or gs:// (`xlm_jax.model_dir`):
both files only grow, which an object store cannot do in place, so there they are rewritten
whole (`_GrowingFile`).
"""

from __future__ import annotations

import collections
import itertools
import json
import math
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Mapping
from typing import Any, IO

from etils import epath
from tensorboard.compat.proto import event_pb2, summary_pb2
from tensorboard.summary.writer.record_writer import RecordWriter

from xlm_jax import model_dir as md

_file_counter = itertools.count()

# How often a log on an object store (gs://) is rewritten at most: each rewrite uploads the
# whole file, and GCS takes about one write per second to an object.
REMOTE_FLUSH_SECONDS = 30.0
# An event file's name, `events.out.tfevents.{seconds}.{host}.{pid}.{n}`; TensorBoard reads the
# files of a directory in the order of their names.
_EVENT_NAME = re.compile(r"^events\.out\.tfevents\.(\d+)\.")


def _name_seconds(logdir: epath.Path) -> int:
    """The seconds field for a new event file in `logdir`: now, or one more than the newest
    file's when that is not earlier. Why: a resumed run's file must sort after the killed
    run's, or its SessionLog.START is read first and purges nothing (and the old steps, read
    after the new ones, look like a restart that purges the new ones); in the same second the
    names would order by host and pid compared as strings ("1000" < "999")."""
    now = int(time.time())
    newest = [int(m.group(1)) for p in (logdir.iterdir() if logdir.exists() else ())
              if (m := _EVENT_NAME.match(p.name))]
    return max([now, *(t + 1 for t in newest)])


def _to_float(key: str, value: Any) -> float:
    """A python float from a python/numpy/jax scalar; one-line error naming the key."""
    try:
        if hasattr(value, "shape") and tuple(value.shape) not in ((), (1,)):
            raise TypeError
        return float(value)
    except (TypeError, ValueError):
        raise ValueError(f"metric {key!r}: value {value!r} is not a scalar number") from None


class _GrowingFile:
    """A binary log that only grows and can be read while it grows, local or on gs://.

    Locally it is a file opened for appending. An object in a bucket cannot be appended to
    (gcsfs opens mode "a" as "w", with a warning: a resumed run would wipe its log), so there
    the content is kept in memory, starting from the object's current content, and the whole
    object is rewritten on `flush` (at most every REMOTE_FLUSH_SECONDS; the first flush at
    once) and on `close`. A killed process loses at most that window of lines.
    """

    def __init__(self, path: epath.Path) -> None:
        self.path = path
        self.closed = False
        self._remote = md.is_remote(path)
        self._last_upload = -math.inf
        self._dirty = False
        if self._remote:
            self._content = bytearray(path.read_bytes() if path.exists() else b"")
        else:
            self._file = path.open("ab")

    def write(self, data: bytes) -> None:
        if self._remote:
            self._content += data
            self._dirty = True
        else:
            self._file.write(data)

    def flush(self) -> None:
        if not self._remote:
            self._file.flush()
        elif self._dirty and time.monotonic() - self._last_upload >= REMOTE_FLUSH_SECONDS:
            self._upload()

    def _upload(self) -> None:
        self.path.write_bytes(bytes(self._content))
        self._last_upload, self._dirty = time.monotonic(), False

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self._remote:
            self._file.close()
        elif self._dirty:
            self._upload()


class _EventFile:
    """One TensorBoard event file (TFRecord of `Event` protos), written without TF."""

    def __init__(self, logdir: epath.Path, purge_step: int | None = None) -> None:
        logdir.mkdir(parents=True, exist_ok=True)
        name = (f"events.out.tfevents.{_name_seconds(logdir)}.{socket.gethostname()}."
                f"{os.getpid()}.{next(_file_counter)}")
        self.path = logdir / name
        self._writer = RecordWriter(_GrowingFile(self.path))
        self._write(event_pb2.Event(wall_time=time.time(), file_version="brain.Event:2"))
        if purge_step is not None:
            # TensorBoard drops the events of earlier files at steps >= a SessionLog START's
            # step (what tf.summary writers do on restart): the steps a killed run logged
            # after its last checkpoint, which this run trains again.
            self._write(event_pb2.Event(wall_time=time.time(), step=int(purge_step),
                                        session_log=event_pb2.SessionLog(
                                            status=event_pb2.SessionLog.START)))

    def _write(self, event: event_pb2.Event) -> None:
        self._writer.write(event.SerializeToString())

    def scalars(self, step: int, values: Mapping[str, float]) -> None:
        summary = summary_pb2.Summary(
            value=[summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in values.items()])
        self._write(event_pb2.Event(wall_time=time.time(), step=int(step), summary=summary))
        self._writer.flush()

    def close(self) -> None:
        if not self._writer.closed:
            self._writer.close()


def _event_splits(root: epath.Path) -> list[str]:
    """The split directories under `root` (`train`, `eval`, ...) that hold event files."""
    return sorted(p.name for p in root.iterdir()
                  if p.is_dir() and not p.name.startswith(".")
                  and any(_EVENT_NAME.match(f.name) for f in p.iterdir()))


def _drop_rows_after(path: epath.Path, step: int) -> None:
    """Rewrites the JSONL log at `path` without its rows of steps after `step` (other lines,
    unreadable ones included, are kept as they are); nothing to do when there are none."""
    if not path.exists():
        return
    lines = path.read_bytes().splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            row_step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            row_step = None
        if not isinstance(row_step, int) or row_step <= step:
            kept.append(line)
    if len(kept) < len(lines):
        tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
        tmp.write_bytes(b"".join(kept))
        tmp.replace(path)  # a kill mid-way leaves the old log whole


class MetricsWriter:
    """Scalars -> TensorBoard events under model_dir/{prefix}/ and model_dir/metrics.jsonl.

    Only the primary process writes (pass `is_primary=jax.process_index() == 0`); on the
    others every method is a no-op and nothing is created. Non-train splits (e.g.
    "eval") are also echoed as one line to `out`; training progress goes through
    `Progress` instead.
    """

    def __init__(self, model_dir: str, is_primary: bool = True, out: IO[str] = sys.stdout,
                 resume_step: int | None = None):
        """`resume_step`: the step a run starts (or resumes) at. The rows and events of later
        steps, logged by an earlier process that was stopped before its next checkpoint, are
        dropped (they are trained again), so every step is in the log once: metrics.jsonl is
        rewritten without them, and every split directory that holds event files gets a new
        file starting with a SessionLog START at `resume_step + 1` (TensorBoard's own purge
        of orphaned data), at once, so that a split this run writes late or never (an
        evaluator's) loses its orphans too."""
        self.model_dir = str(model_dir)
        self.is_primary = bool(is_primary)
        self.out = out
        self._purge_step = None if resume_step is None else int(resume_step) + 1
        self._events: dict[str, _EventFile] = {}
        self._jsonl: _GrowingFile | None = None
        self._closed = False
        if self.is_primary:
            self._root = md.resolve(self.model_dir)
            try:
                self._root.mkdir(parents=True, exist_ok=True)
                if resume_step is not None:
                    _drop_rows_after(self._root / md.METRICS_FILE, int(resume_step))
                self._jsonl = _GrowingFile(self._root / md.METRICS_FILE)  # a restart appends
                if resume_step is not None:
                    for prefix in _event_splits(self._root):
                        self._events[prefix] = _EventFile(self._root / prefix, self._purge_step)
            except OSError as e:
                raise OSError(f"metrics: cannot write to model_dir {self.model_dir!r}: "
                              f"{e.strerror or e}") from None

    def write_scalars(self, step: int, scalars: Mapping[str, Any], prefix: str = "train") -> None:
        """Record `scalars` at `step` for split `prefix` (TensorBoard + one JSONL line)."""
        if not self.is_primary:
            return
        if self._closed:
            raise RuntimeError(f"MetricsWriter for {self.model_dir!r} is closed")
        if not prefix or "/" in prefix or prefix.startswith("."):
            raise ValueError(f"metrics: prefix {prefix!r} must be a plain directory name")
        values = {str(k): _to_float(str(k), v) for k, v in scalars.items()}
        if prefix not in self._events:
            self._events[prefix] = _EventFile(self._root / prefix, self._purge_step)
        self._events[prefix].scalars(step, values)
        record = {"step": int(step), "split": prefix, **values}
        assert self._jsonl is not None
        self._jsonl.write((json.dumps(record) + "\n").encode("utf-8"))
        self._jsonl.flush()
        if prefix != "train" and self.out is not None:
            shown = " ".join(f"{k}={_fmt(v)}" for k, v in values.items())
            self.out.write(f"[{prefix}] step {int(step)}: {shown}\n")
            self.out.flush()

    def close(self) -> None:
        """Flush and close all files; safe to call twice."""
        if self._closed:
            return
        self._closed = True
        for f in self._events.values():
            f.close()
        if self._jsonl is not None:
            self._jsonl.close()

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class WindowMean:
    """The scalars logged for a window of steps: each key's mean over the steps that reported
    it (an objective of an alternating mixture reports only on its own steps), and the last
    value of the keys that are a state rather than a step's measurement (`LAST`)."""

    LAST = ("learning_rate",)

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}

    def add(self, metrics: Mapping[str, Any]) -> None:
        for key, value in metrics.items():
            value = _to_float(key, value)
            if key in self.LAST:
                self._sums[key], self._counts[key] = value, 1
            else:
                self._sums[key] = self._sums.get(key, 0.0) + value
                self._counts[key] = self._counts.get(key, 0) + 1

    def pop(self) -> dict[str, float]:
        """The window's scalars, in first-reported order; the window starts anew."""
        out = {k: v / self._counts[k] for k, v in self._sums.items()}
        self._sums, self._counts = {}, {}
        return out


def _fmt(v: float) -> str:
    if v == 0 or not math.isfinite(v):
        return str(v)
    return f"{v:.4g}" if 1e-3 <= abs(v) < 1e5 else f"{v:.3e}"


def _fmt_si(v: float) -> str:
    """1234 -> '1.23k', 2.5e6 -> '2.5M' (3 significant digits)."""
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(v) >= scale:
            return f"{v / scale:.3g}{unit}"
    return f"{v:.3g}"


def _fmt_duration(seconds: float) -> str:
    seconds = int(max(seconds, 0))
    h, rem = divmod(seconds, 3600)
    m, s = divmod(rem, 60)
    return f"{h}:{m:02d}:{s:02d}"


# The longest progress line (our choice): a log line keeps the step, the loss, each objective's
# loss, tokens/s, steps/s and the ETA; every metric is in TensorBoard and metrics.jsonl.
MAX_LINE = 160
# Recent log points that steps/s and the ETA are measured over (our choice).
RATE_WINDOW = 8


class Progress:
    """Training progress on the console.

    On a terminal (`out.isatty()`): one line rewritten in place with '\\r' (bar, step,
    loss, ...), cut to the terminal's width so that it never wraps, at most every
    `min_interval_s`. Otherwise (log files, SLURM output): a plain line every `log_every`
    steps and at the last step, so logs stay greppable. Only the primary process prints.

    A line holds the step, the step's `loss`, each objective's loss (`<name>/loss` shown as
    `name=`), tokens/s, steps/s and the ETA, at most `MAX_LINE` characters (objectives that
    do not fit are counted as "+N"); the full metric set goes to TensorBoard and
    metrics.jsonl. Steps/s and the ETA are measured over the last `RATE_WINDOW` log points,
    starting when the first step has finished (`note_step`), so compilation and start-up
    are not averaged into them; until two points exist the ETA is "?".
    """

    def __init__(self, total_steps: int, out: IO[str] = sys.stdout, log_every: int = 100,
                 is_primary: bool = True, desc: str = "train", min_interval_s: float = 0.2,
                 clock: Any = time.monotonic):
        if total_steps < 1:
            raise ValueError(f"Progress: total_steps={total_steps} must be >= 1")
        if log_every < 1:
            raise ValueError(f"Progress: log_every={log_every} must be >= 1")
        self.total_steps = int(total_steps)
        self.out = out
        self.log_every = int(log_every)
        self.is_primary = bool(is_primary)
        self.desc = desc
        self.min_interval_s = float(min_interval_s)
        isatty = getattr(out, "isatty", None)
        self.tty = bool(isatty()) if callable(isatty) else False
        self._clock = clock
        self._marks: collections.deque[tuple[float, int]] = collections.deque(
            maxlen=RATE_WINDOW)
        self._last_draw = -math.inf
        self._drawn = False

    def note_step(self, step: int) -> None:
        """Call after every step: the first one (compiled and run) starts the clock."""
        if not self._marks:
            self._marks.append((self._clock(), int(step)))

    def rate(self) -> float | None:
        """Steps per second over the recent log points (None before two exist)."""
        if len(self._marks) < 2:
            return None
        (t0, s0), (t1, s1) = self._marks[0], self._marks[-1]
        return (s1 - s0) / (t1 - t0) if t1 > t0 and s1 > s0 else None

    def _status(self, step: int, scalars: Mapping[str, Any]) -> str:
        rate = self.rate()
        eta = (_fmt_duration((self.total_steps - step) / rate) if rate else "?")
        head = [f"{self.desc} {step}/{self.total_steps}"]
        if "loss" in scalars:
            head.append(f"loss={_fmt(_to_float('loss', scalars['loss']))}")
        parts = [f"{k[:-len('/loss')]}={_fmt(_to_float(k, v))}" for k, v in scalars.items()
                 if k.endswith("/loss") and k.count("/") == 1]
        tail = []
        if "tokens_per_sec" in scalars:
            tail.append(f"{_fmt_si(_to_float('tokens_per_sec', scalars['tokens_per_sec']))} "
                        "tok/s")
        tail.append(f"{rate:.2f} step/s eta {eta}" if rate else f"eta {eta}")
        for keep in range(len(parts), -1, -1):  # as many objectives as fit
            more = [f"+{len(parts) - keep}"] if keep < len(parts) else []
            line = " ".join([*head, *parts[:keep], *more, *tail])
            if len(line) <= MAX_LINE:
                return line
        return line

    def update(self, step: int, scalars: Mapping[str, Any] | None = None) -> None:
        """Report that `step` steps are done (with optional latest scalars)."""
        if not self.is_primary:
            return
        scalars = scalars or {}
        last = step >= self.total_steps
        if self._marks and step > self._marks[-1][1]:
            self._marks.append((self._clock(), int(step)))
        if self.tty:
            now = time.monotonic()
            if not last and now - self._last_draw < self.min_interval_s:
                return
            self._last_draw = now
            frac = min(max(step / self.total_steps, 0.0), 1.0)
            width = 20
            bar = "#" * int(frac * width) + "." * (width - int(frac * width))
            # Cut to the terminal's width: a line that wraps cannot be rewritten with '\r'
            # and leaves one stale line per update (a log line has every scalar instead).
            cols = shutil.get_terminal_size((100, 24)).columns
            line = f"[{bar}] {self._status(step, scalars)}"[:max(cols - 1, 20)]
            self.out.write(f"\r{line}\x1b[K")
            self._drawn = True
        elif step % self.log_every == 0 or last:
            self.out.write(self._status(step, scalars) + "\n")
        else:
            return
        self.out.flush()

    def close(self) -> None:
        """End the in-place line (terminal mode) so later output starts on a new line."""
        if self.is_primary and self.tty and self._drawn:
            self.out.write("\n")
            self.out.flush()
            self._drawn = False
