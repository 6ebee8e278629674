"""Time per training step by kind of op, read from a `jax.profiler` trace (`*.xplane.pb`).

  python -m xlm_jax.accelerator.profile_summary TRACE_OR_DIR --steps N [--top K] [--json OUT]
    Prints the summary of TRACE_OR_DIR, or of the newest trace under that directory (such as
    the `--profile_dir` of `python -m xlm_jax.accelerator.bench`): exit 0. A trace without
    op events: one line, exit 1. No trace there, or one that does not read: one line, exit 2.
    `--json OUT` also writes the figures (ms per step) to OUT, whole or not at all.

Where the op time comes from, by the kind of trace:
  * GPU (jax 0.10, 0.11): the kernels on each `/device:GPU:N` plane's stream lines
    (`Stream #14(Memset,Compute)`); the memcpy-only streams carry host<->device transfers and
    are reported apart. The kernels of a CUDA graph may run at once, so the busy time (the
    union of the kernels' intervals) can be below the kernel time (their sum); the span, from
    the first kernel's start to the last one's end, shows the device's idle gaps.
  * TPU: the `XLA Ops` line of each device plane (preferred on any plane that has one).
  * CPU: the XLA:CPU executor's op events (those with an `hlo_op` stat) on `/host:CPU`, each
    op's self time (a `while` op's own time, without the ops of its body): summed over the
    threads that run ops at once, i.e. CPU time, not wall time.

`KINDS` and `op_kind` are the shared names of op kinds (a cost model reports by the same names).
This module imports no TensorFlow, and jax only when it reads a trace.
"""
from __future__ import annotations

import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Sequence
from typing import Any

from xlm_jax import cli_help

# The kinds of op, in the order a report lists them when it lists them all. "optimizer update"
# is for a cost model that knows which ops update parameters; kernel names do not say it.
KINDS: tuple[str, ...] = ("matmul", "attention kernel", "elementwise/fusion", "RNG",
                          "gather/scatter", "copy/transpose", "collective", "optimizer update",
                          "other")


@dataclasses.dataclass(frozen=True)
class KindRule:
    """An op or kernel name that contains one of `keys` (lower case) is of `kind`."""

    kind: str
    keys: tuple[str, ...]


# First match wins; the order matters where names share words.
KIND_RULES: tuple[KindRule, ...] = (
    # before gather/scatter, which would take all-gather and reduce-scatter
    KindRule("collective", ("all-reduce", "all_reduce", "allreduce", "all-gather", "all_gather",
                            "allgather", "reduce-scatter", "reduce_scatter", "reducescatter",
                            "all-to-all", "all_to_all", "alltoall", "collective-permute",
                            "collective_permute", "nccl")),
    # A Pallas kernel is named after its function (this library's: relbias_flash_*); cuDNN's
    # fused attention kernels carry cudnn, fmha, sdpa or flash in their names.
    KindRule("attention kernel", ("flash", "fmha", "sdpa", "cudnn", "attention")),
    # jax's threefry hash, once XLA fuses it, shows as add/xor fusions (loop_add_xor_fusion_19)
    KindRule("RNG", ("rng", "threefry", "philox", "xor")),
    # cuBLAS kernels (nvjet_*, *gemm*), XLA's Triton gemm fusions (gemm_fusion_dot_103), XLA:CPU
    # dots run by YNNPACK or oneDNN (ynn_fusion, onednn...)
    KindRule("matmul", ("gemm", "cublas", "nvjet", "cutlass", "xmma", "dot", "matmul",
                        "convolution", "ynn_fusion", "onednn")),
    KindRule("gather/scatter", ("scatter", "gather", "dynamic-slice", "dynamic_slice",
                                "dynamic-update-slice", "dynamic_update_slice")),
    # memcpy32_post and `Memset 0` run on the compute stream between kernels
    KindRule("copy/transpose", ("copy", "transpose", "memcpy", "memset", "concatenate")),
    # XLA's fusion kernels: loop_add_fusion_59, input_reduce_fusion_8, wrapped_convert
    KindRule("elementwise/fusion", ("fusion", "loop_", "input_", "wrapped_")),
)

_STREAM = re.compile(r"Stream #\d+(?:\((?P<what>[^)]*)\))?")
_XLA_OPS = "XLA Ops"

GPU_KERNELS = "GPU kernel time"
DEVICE_OPS = "device op time"
CPU_OPS = "XLA:CPU op time (summed over threads)"


class NoOpEventsError(ValueError):
    """The trace read, but holds none of the events a summary is made of."""


class UnreadableTraceError(OSError):
    """The file is not an XSpace trace (or not a whole one)."""


def op_kind(name: str, hlo_op: str | None = None) -> str:
    """The kind (one of `KINDS`) of an op or kernel `name`; when the name says nothing,
    the kind of the HLO instruction `hlo_op` that launched it (a trace's `hlo_op` stat; a
    kernel launched from a CUDA graph has the graph's `command_buffer_N`, of kind "other")."""
    for text in (name, hlo_op):
        if not text:
            continue
        low = text.lower()
        for rule in KIND_RULES:
            if any(k in low for k in rule.keys):
                return rule.kind
    return "other"


@dataclasses.dataclass
class OpTime:
    """One op's (or kernel's) time over the whole trace."""

    name: str
    kind: str
    ns: float  # summed duration, or self time on host threads
    count: int  # events


@dataclasses.dataclass
class ProfileSummary:
    """What a trace says of the steps it covers. The `*_ns` totals are over the whole trace
    and every device; `ms()` turns one into ms per step and per device."""

    trace: str
    source: str  # what the op time is: GPU_KERNELS, DEVICE_OPS or CPU_OPS
    steps: int
    devices: int  # device planes read (0: a CPU host's threads)
    op_ns: float  # summed op time
    busy_ns: float  # time when at least one op ran, summed over devices
    span_ns: float  # first op start to last op end, summed over devices
    transfer_ns: float  # GPU memcpy-only streams (host<->device), not in op_ns
    ops: list[OpTime]  # longest first

    def ms(self, ns: float) -> float:
        """`ns` of the whole trace as ms per step and per device."""
        return ns / (self.steps * max(self.devices, 1)) / 1e6

    def kind_ns(self) -> dict[str, float]:
        """Op time by kind, longest first (kinds without time left out)."""
        kinds: collections.Counter[str] = collections.Counter()
        for op in self.ops:
            kinds[op.kind] += op.ns
        return dict(kinds.most_common())

    def format(self, top: int = 12) -> str:
        """The printed summary: op time, busy time and span per step, then by kind, then the
        `top` ops."""
        where = (f"{self.devices} devices, per device" if self.devices > 1 else
                 "1 device" if self.devices else "host")
        total = self.op_ns or 1.0  # events of zero duration only: shares of 0
        out = [f"profile ({self.trace}), {where}: {self.source} per step "
               f"{self.ms(self.op_ns):.1f} ms; busy {self.ms(self.busy_ns):.1f} ms of a "
               f"{self.ms(self.span_ns):.1f} ms span per step (first op start to last op end)"]
        out += [f"  {k:<20} {self.ms(ns):9.2f} ms  {ns / total:6.1%}"
                for k, ns in self.kind_ns().items()]
        if self.transfer_ns:
            out.append(f"  host<->device copies {self.ms(self.transfer_ns):.2f} ms per step "
                       "(memcpy streams, not in the op time)")
        out.append(f"  top {top} ops:")
        out += [f"  {self.ms(op.ns):9.2f} ms  {op.ns / total:6.1%}  {op.name[:90]}"
                for op in self.ops[:top]]
        return "\n".join(out)

    def to_json(self) -> dict[str, Any]:
        """The figures in ms per step and per device (what `--json` writes)."""
        return {"trace": self.trace, "source": self.source, "steps": self.steps,
                "devices": self.devices, "op_ms": self.ms(self.op_ns),
                "busy_ms": self.ms(self.busy_ns), "span_ms": self.ms(self.span_ns),
                "transfer_ms": self.ms(self.transfer_ns),
                "kinds_ms": {k: self.ms(ns) for k, ns in self.kind_ns().items()},
                "ops": [{"name": op.name, "kind": op.kind, "ms": self.ms(op.ns),
                         "count": op.count} for op in self.ops]}


@dataclasses.dataclass
class _Event:
    name: str
    start: float  # ns
    end: float
    hlo_op: str | None = None


@dataclasses.dataclass
class _PlaneEvents:
    """The op events of one device plane, what their time is, and the transfers apart."""

    events: list[_Event]
    source: str  # GPU_KERNELS, DEVICE_OPS or CPU_OPS
    transfer_ns: float = 0.0


def _union_ns(events: Iterable[_Event]) -> float:
    total, end = 0.0, float("-inf")
    for ev in sorted(events, key=lambda e: e.start):
        total += max(0.0, ev.end - max(ev.start, end))
        end = max(end, ev.end)
    return total


def _self_ns(events: list[_Event]) -> list[float]:
    """Each event's duration less that of the events nested in it (events of one thread,
    which nest: a `while` op and the ops of its body)."""
    order = sorted(range(len(events)), key=lambda i: (events[i].start, -events[i].end))
    own = [ev.end - ev.start for ev in events]
    stack: list[int] = []
    for i in order:
        ev = events[i]
        while stack and events[stack[-1]].end <= ev.start:
            stack.pop()
        if stack:
            own[stack[-1]] -= min(ev.end, events[stack[-1]].end) - ev.start
        stack.append(i)
    return own


def _stat(event: Any, key: str) -> Any:
    for k, v in event.stats:
        if k == key:
            return v
    return None


def _device_events(plane: Any) -> _PlaneEvents:
    """A device plane's op events: its `XLA Ops` line when it has one (TPU), else the kernels
    on its stream lines (GPU), the memcpy-only streams' time apart."""
    lines = list(plane.lines)
    ops = [ln for ln in lines if ln.name == _XLA_OPS]
    if ops:
        return _PlaneEvents([_Event(ev.name, ev.start_ns, ev.end_ns)
                             for ln in ops for ev in ln.events], DEVICE_OPS)
    out = _PlaneEvents([], GPU_KERNELS)
    for ln in lines:
        m = _STREAM.match(ln.name)
        if not m:
            continue  # derived lines (XLA Modules, Steps, ...) repeat the kernels' time
        what = [w.strip() for w in (m["what"] or "").split(",") if w.strip()]
        if what and all(w.startswith("Memcpy") for w in what):
            out.transfer_ns += sum(ev.duration_ns for ev in ln.events)
            continue
        out.events += [_Event(ev.name, ev.start_ns, ev.end_ns, _stat(ev, "hlo_op"))
                       for ev in ln.events]
    return out


def _host_events(plane: Any) -> list[list[_Event]]:
    """XLA:CPU's op events on the host plane, one list per thread: those with an `hlo_op`
    stat (not the executor's wrapper events, nor its `end:` markers)."""
    threads = []
    for ln in plane.lines:
        events = []
        for ev in ln.events:
            hlo_op = _stat(ev, "hlo_op")
            if hlo_op is not None:
                events.append(_Event(ev.name, ev.start_ns, ev.end_ns, hlo_op))
        if events:
            threads.append(events)
    return threads


def _ops(events: Sequence[_Event], ns: Sequence[float]) -> list[OpTime]:
    by_name: dict[str, OpTime] = {}
    for ev, t in zip(events, ns):
        op = by_name.get(ev.name)
        if op is None:
            op = by_name[ev.name] = OpTime(ev.name, op_kind(ev.name, ev.hlo_op), 0.0, 0)
        op.ns += t
        op.count += 1
    return sorted(by_name.values(), key=lambda o: (-o.ns, o.name))


def summarize(data: Any, steps: int, trace: str = "trace") -> ProfileSummary:
    """The summary of a read trace (`jax.profiler.ProfileData`) that covers `steps` steps;
    `trace` names it in the output. Raises NoOpEventsError when it holds no op events."""
    if steps < 1:
        raise ValueError(f"steps={steps}: must be >= 1")
    planes = list(data.planes)
    devices = [_device_events(p) for p in planes if p.name.startswith("/device:")]
    devices = [d for d in devices if d.events]
    if devices:
        events = [ev for d in devices for ev in d.events]
        return ProfileSummary(
            trace, " + ".join(dict.fromkeys(d.source for d in devices)), steps, len(devices),
            op_ns=sum(ev.end - ev.start for ev in events),
            busy_ns=sum(_union_ns(d.events) for d in devices),
            span_ns=sum(max(e.end for e in d.events) - min(e.start for e in d.events)
                        for d in devices),
            transfer_ns=sum(d.transfer_ns for d in devices),
            ops=_ops(events, [ev.end - ev.start for ev in events]))
    threads = [t for p in planes if p.name == "/host:CPU" for t in _host_events(p)]
    events = [ev for t in threads for ev in t]
    if not events:
        raise NoOpEventsError(
            f"{trace}: no op events (looked for kernels on the stream lines of /device:GPU:N "
            "planes, an 'XLA Ops' line on /device:* planes, XLA:CPU ops with an hlo_op stat "
            "on /host:CPU)")
    return ProfileSummary(
        trace, CPU_OPS, steps, 0, op_ns=sum(sum(_self_ns(t)) for t in threads),
        busy_ns=_union_ns(events),
        span_ns=max(e.end for e in events) - min(e.start for e in events), transfer_ns=0.0,
        ops=_ops(events, [ns for t in threads for ns in _self_ns(t)]))


def find_trace(path: str) -> str:
    """`path` when it is a file, else the newest `*.xplane.pb` (or `.xplane.pb.gz`) under the
    directory `path` (jax.profiler writes DIR/plugins/profile/RUN/HOST.xplane.pb). Raises
    FileNotFoundError when there is none."""
    if os.path.isfile(path):
        return path
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: no such trace file or directory")
    files = [f for pattern in ("*.xplane.pb", "*.xplane.pb.gz")
             for f in glob.glob(os.path.join(path, "**", pattern), recursive=True)]
    if not files:
        raise FileNotFoundError(f"no trace (*.xplane.pb) found under {path}")
    return max(files, key=os.path.getmtime)


def read_trace(path: str) -> Any:
    """The `jax.profiler.ProfileData` of the trace file `path` (gzipped when it ends in .gz).
    Raises UnreadableTraceError for a file that is not a whole XSpace."""
    from jax.profiler import ProfileData

    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                return ProfileData.from_serialized_xspace(f.read())
        return ProfileData.from_file(path)
    except OSError:
        raise
    except Exception as e:  # the reader raises what its C++ side throws
        raise UnreadableTraceError(f"{path}: not a readable jax.profiler trace ({e})") from e


def summarize_profile(log_dir: str, steps: int, top: int = 12) -> str:
    """The printed summary of the newest trace under `log_dir` (written by
    `loop.train(profile_steps=...)`), which covers `steps` steps. Raises FileNotFoundError
    when there is no trace, NoOpEventsError when it holds no op events."""
    trace = find_trace(log_dir)
    return summarize(read_trace(trace), steps, trace).format(top)


def write_json(summary: ProfileSummary, path: str) -> None:
    """Writes `summary.to_json()` to `path` through a temporary file renamed into place, so
    that `path` is whole or absent (never half-written)."""
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".profile_summary.", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(summary.to_json(), f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: Sequence[str] | None = None) -> int:
    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.profile_summary",
                        description=__doc__)
    p.add_argument("trace", metavar="TRACE_OR_DIR",
                   help="an .xplane.pb trace, or a directory to take the newest one from")
    p.add_argument("--steps", type=int, required=True, help="steps the trace covers")
    p.add_argument("--top", type=int, default=12, help="ops listed by name")
    p.add_argument("--json", default=None, help="also write the figures here (ms per step)")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    if args.steps < 1:
        p.error(f"--steps {args.steps}: must be >= 1")
    try:
        trace = find_trace(args.trace)
        summary = summarize(read_trace(trace), args.steps, trace)
    except NoOpEventsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(summary.format(args.top))
    if args.json:
        write_json(summary, args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
