"""Predicted device time of a compiled step, op by op, from its optimised HLO.

Each op (`hlo.device_ops`) gets FLOPs and bytes, a kind, and a time: the largest of its
matrix FLOPs over the matrix rate, its bytes over the memory bandwidth, its element-wise
results over the vector rate and its special functions over their rate (a roofline), each
rate scaled by the efficiency measured for that kind on a device (`chips.Efficiency`), plus a
launch gap. The step's time is the sum: one stream runs one kernel at a time (XLA:GPU
without a multi-stream schedule; XLA:TPU overlaps its async collectives, which are summed
here all the same). Left out of the sum: XLA:TPU's asynchronous copies between memory
spaces (`copy-start` into or out of VMEM, its memory-space assignment's prefetches and
evictions, scheduled to overlap the compute between start and done); the report lists them
with the time they would take alone. (xlmr_base's step at 32 x 512 on v5p:2x2x1 has 1,258
of them, 5.3 GB, 1.9 ms if alone; summed, and with each copy's source counted as written
too, they had made 2.9 of its 16.2 ms predicted.)

What this cannot see, and says so in its report: the kernels' own code (a Pallas kernel is
timed from its shapes and a measured efficiency, whatever its tiles do inside), contention
(atomics on the same rows are counted only for dtypes without native atomics), caches (every
operand read from HBM), overlap of collectives with compute, host gaps between steps, and
autotuning choices that differ from the compile-only target's.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import re
from typing import Any

from xlm_jax.accelerator.cost import hlo as hlo_lib
from xlm_jax.accelerator.cost.chips import Chip
from xlm_jax.accelerator.profile_summary import KINDS  # the profile summary's kinds, shared

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")
_RNG_NAMES = ("random_bits", "threefry", "bernoulli", "random_uniform", "rng", "_uniform",
              "categorical", "gumbel", "keep_mask")
_ATTENTION_KERNEL = re.compile(r"(flash|fmha|attention)[\w]*?_(forward|dkv|dq|fwd|bwd)"
                               r"|__cudnn\$fmha(\w*)")
_NATIVE_ATOMICS = ("f32", "f64", "s32", "u32", "s64", "u64")
# A scatter-add into a table of at least this many rows is taken to be a vocabulary's
# gradient, whose rows the MLM's <mask> and padding ids make hot: without native atomics
# (bf16) its adds serialise there (measured: 12.6M bf16 updates into the 250k-row table took
# 28.0 ms on an H100; the same count into the 514-row position table, hit evenly, 0.30 ms).
# Our choice of threshold: contention is not in the HLO, so this is a guess by shape.
HOT_ROW_TABLE = 1 << 16


@dataclasses.dataclass
class OpCost:
    """One op's predicted cost (per step: `runs` executions together)."""

    name: str
    kind: str
    runs: int
    flops: float
    bytes_read: int
    bytes_written: int
    time_s: float
    roofline_s: float
    bound: str  # "matmul", "memory", "vector", "special", "atomics", "launch"
    source_op: str  # the jax op path of its metadata
    # an asynchronous copy between memory spaces (`hlo.is_memory_space_copy`): its time is
    # what it would take alone; it overlaps compute, so it is not in the step's sum
    overlapped: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"name": self.name, "kind": self.kind, "runs": self.runs, "flops": self.flops,
                "bytes_read": self.bytes_read, "bytes_written": self.bytes_written,
                "predicted_ms": self.time_s * 1e3, "roofline_ms": self.roofline_s * 1e3,
                "bound": self.bound, "source_op": self.source_op,
                "overlapped": self.overlapped}


def _body_ops(op: hlo_lib.Op) -> set[str]:
    return {i.op for i in op.body}


def _root(op: hlo_lib.Op) -> hlo_lib.Instruction | None:
    return op.body[-1] if op.body else None


def attention_kernel(ins: hlo_lib.Instruction) -> str | None:
    """"forward", "dkv", "dq" or "backward" for a fused-attention kernel call, else None."""
    text = f"{ins.op_name} {ins.target}"
    m = _ATTENTION_KERNEL.search(text)
    if not m:
        return None
    if m.group(3) is not None:  # cuDNN: one forward and one backward call
        return "backward" if "backward" in m.group(3).lower() else "forward"
    return {"fwd": "forward", "bwd": "backward"}.get(m.group(2), m.group(2))


def _counter_hash_ops(op: hlo_lib.Op) -> int:
    """Bit-mixing instructions in a fusion (xor, shifts): threefry's rounds, or a counter hash,
    which XLA fuses into whatever consumes the random bits (a dropout's select)."""
    return sum(i.op in ("xor", "shift-left", "shift-right-logical") for i in op.body)


def classify(op: hlo_lib.Op, optimizer_state: frozenset[str] = frozenset()) -> str:
    """The op's kind, one of `KINDS`; an op reading optimiser state (`optimizer_state`:
    `hlo.optimizer_state`'s parameter names) is an optimiser update."""
    ins = op.instruction
    name = ins.op.removesuffix("-start")
    if name in COLLECTIVES or "nccl" in ins.target:
        return "collective"
    if ins.op == "custom-call":
        if attention_kernel(ins):
            return "attention kernel"
        if any(k in ins.target for k in ("gemm", "matmul", "cublas")):
            return "matmul"
        return "other"
    if op.matmul_flops > 0:
        return "matmul"
    low = ins.op_name.lower()
    if name in ("rng", "rng-bit-generator") or any(k in low for k in _RNG_NAMES) or \
            _counter_hash_ops(op) >= 20:
        return "RNG"
    body = _body_ops(op) | {name}
    root = _root(op)
    if body & {"scatter", "gather"} or (root is not None and root.op in (
            "dynamic-update-slice", "dynamic-slice")):
        return "gather/scatter"
    if any(o.partition("#")[0] in optimizer_state for o in ins.operands) or \
            "/optax" in low or "scale_by_adam" in low:
        return "optimizer update"
    if name in ("copy", "transpose") or (root is not None and root.op in ("copy", "transpose")
                                         and body <= {"copy", "transpose", "parameter",
                                                      "bitcast", "fusion"}):
        return "copy/transpose"
    if ins.op == "fusion" or name in ("reduce", "convert", "add", "multiply", "select",
                                      "broadcast", "concatenate", "pad", "slice"):
        return "elementwise/fusion"
    return "other"


def _attention_flops(ins: hlo_lib.Instruction, shapes: dict[str, str], kernel: str) -> float:
    """Matrix FLOPs of a flash-attention kernel call from its q and k operands (q [B, T, H, D]
    on GPU, [B, H, T, D] on TPU; the heads are taken as the smaller of the two middle dims):
    one Q.K^T or P.V product is 2.B.H.T.S.D; the forward makes 2, the dk/dv kernel 4
    (recomputed scores, dP, dV, dK), the dq kernel 3 (scores, dP, dQ), a whole backward 5."""
    arrays = [hlo_lib.shape_arrays(shapes.get(o, "")) for o in ins.operands[:2]]
    if len(arrays) < 2 or not arrays[0] or not arrays[1] or len(arrays[0][0][1]) != 4:
        return 0.0
    q, k = arrays[0][0][1], arrays[1][0][1]
    b, d = q[0], q[3]
    heads = min(q[1], q[2])
    t = q[1] * q[2] // heads
    s = math.prod(k) // (b * heads * d)
    one = 2.0 * b * heads * t * s * d
    return one * {"forward": 2, "dkv": 4, "dq": 3, "backward": 5}.get(kernel, 2)


def _scatter_updates(op: hlo_lib.Op) -> tuple[int, str]:
    """(update elements, dtype) of a fusion whose root is a scatter (0, "" otherwise)."""
    for ins in reversed(op.body):
        if ins.op == "scatter":
            arrays = hlo_lib.shape_arrays(ins.shape)
            dtype = arrays[0][0] if arrays else ""
            shapes = {i.name: i.shape for i in op.body}
            upd = ins.operands[2] if len(ins.operands) > 2 else ""
            return hlo_lib.shape_elements(shapes.get(upd, "")), dtype
    return 0, ""


def _updated_slices(op: hlo_lib.Op, shapes: dict[str, str]) -> tuple[int, int] | None:
    """(bytes of the buffers updated in place, bytes of the slices written) of an op whose
    every result is a dynamic-update-slice into one of its operands (a scan writing layer
    i's gradient into the stacked array: XLA updates the buffer in place), else None."""
    ins = op.instruction
    if ins.op == "dynamic-update-slice":
        return (hlo_lib.shape_bytes(shapes.get(ins.operands[0], "")),
                hlo_lib.shape_bytes(shapes.get(ins.operands[1], "")))
    root = op.body[-1] if op.body else None
    if root is None:
        return None
    names = {i.name: i for i in op.body}
    results = [names.get(o) for o in root.operands] if root.op == "tuple" else [root]
    if not results or any(r is None or r.op != "dynamic-update-slice" for r in results):
        return None
    index = {i.name: int(i.args) for i in op.body if i.op == "parameter" and i.args.isdigit()}
    body_shapes = {i.name: i.shape for i in op.body}
    buffers = slices = 0
    for r in results:
        pos = index.get(r.operands[0])
        if pos is None or pos >= len(ins.operands):
            return None  # the buffer is computed inside the fusion: not in place
        buffers += hlo_lib.shape_bytes(shapes.get(ins.operands[pos], ""))
        slices += hlo_lib.shape_bytes(body_shapes.get(r.operands[1], ""))
    return buffers, slices


def op_cost(op: hlo_lib.Op, chip: Chip, shapes: dict[str, str],
            seq_len: int | None = None,
            optimizer_state: frozenset[str] = frozenset()) -> OpCost:
    """The predicted time of one op (all its runs in a step)."""
    ins = op.instruction
    kind = classify(op, optimizer_state)
    eff = chip.efficiency
    flops = op.matmul_flops
    matmul_rate = chip.bf16_flops * eff.matmul
    kernel = attention_kernel(ins) if kind == "attention kernel" else None
    if kernel:
        flops = _attention_flops(ins, shapes, kernel)
        tile_rows = _tile_rows(ins, seq_len)
        speedup = eff.attention_small_tile_speedup if tile_rows and tile_rows < 128 else 1.0
        matmul_rate = chip.bf16_flops * min(1.0, eff.attention_of(kernel) * speedup)
    read, written = op.bytes_read, op.bytes_written
    updates, dtype = _scatter_updates(op) if kind == "gather/scatter" else (0, "")
    if updates:  # in place: the updated rows are read and written, the rest untouched
        itemsize = hlo_lib.ITEMSIZE.get(dtype, 4)
        read = read - hlo_lib.shape_bytes(shapes.get(ins.operands[0], "")) + updates * itemsize
        written = updates * itemsize
    else:
        in_place = _updated_slices(op, shapes)
        if in_place is not None:  # a dynamic-update-slice writes its slice into the buffer
            buffers, slices = in_place
            read, written = read - buffers, slices  # the slice operand is read already
    terms = {
        "matmul": flops / matmul_rate if flops else 0.0,
        "memory": (read + written) / (chip.hbm_bytes_per_s * eff.memory),
        "vector": op.vector_ops / chip.vector_ops_per_s,
        "special": op.transcendental_ops / chip.special_ops_per_s,
    }
    if kind == "collective":
        terms["matmul"] = 0.0
        terms["memory"] = written / chip.link_bytes_per_s if chip.link_bytes_per_s else 0.0
    if (updates and dtype not in _NATIVE_ATOMICS and eff.atomic_updates_per_s
            and _table_rows(shapes.get(ins.operands[0], "")) >= HOT_ROW_TABLE):
        terms["atomics"] = updates / eff.atomic_updates_per_s
    roof = max(flops / chip.bf16_flops if flops else 0.0,
               (read + written) / chip.hbm_bytes_per_s, terms["vector"], terms["special"])
    if kind == "collective":  # over the links, at their full rate
        roof = terms["memory"]
    bound = max(terms, key=terms.get)
    time = max(terms.values()) + eff.launch_s
    if time <= eff.launch_s:
        bound = "launch"
    return OpCost(ins.name, kind, op.runs, flops * op.runs, read * op.runs, written * op.runs,
                  time * op.runs, roof * op.runs, bound, ins.op_name,
                  overlapped=hlo_lib.is_memory_space_copy(ins))


def _table_rows(shape: str) -> int:
    arrays = hlo_lib.shape_arrays(shape)
    return arrays[0][1][0] if arrays and arrays[0][1] else 0


def _tile_rows(ins: hlo_lib.Instruction, seq_len: int | None) -> int | None:
    """A Triton flash kernel's query (or key) tile rows: the sequence length over its grid's
    third axis (backend_config `grid_z`), None when either is unknown."""
    m = re.search(r"grid_z = (\d+)", ins.rest)
    if not m or not seq_len:
        return None
    return seq_len // int(m.group(1)) or None


@dataclasses.dataclass
class CostReport:
    """The step's predicted time, op by op."""

    chip: str
    ops: list[OpCost]
    model_flops: float | None = None  # per step per device (xlm_jax.train.step_flops)

    @property
    def predicted_s(self) -> float:
        """The step: every op one after the other, less the overlapped copies."""
        return sum(o.time_s for o in self.ops if not o.overlapped)

    @property
    def roofline_s(self) -> float:
        return sum(o.roofline_s for o in self.ops if not o.overlapped)

    @property
    def overlapped(self) -> list[OpCost]:
        """The asynchronous copies between memory spaces, left out of the step's time."""
        return [o for o in self.ops if o.overlapped]

    def by_kind(self) -> dict[str, float]:
        out: collections.Counter[str] = collections.Counter()
        for o in self.ops:
            if not o.overlapped:
                out[o.kind] += o.time_s
        return {k: out[k] for k in KINDS if out[k]}

    def mfu(self, peak: float) -> float | None:
        return None if not self.model_flops else self.model_flops / self.predicted_s / peak


def analyze(text: str, chip: Chip, seq_len: int | None = None) -> CostReport:
    """The cost report of an optimised HLO module's text on `chip`. `seq_len` lets the
    Triton attention kernels' tile size be read from their grid."""
    module = hlo_lib.parse_module(text)
    opt = hlo_lib.optimizer_state(module)
    shapes: dict[str, hlo_lib.Shapes] = {}
    ops = []
    for op in hlo_lib.device_ops(module):
        if op.computation not in shapes:  # once per computation, not per op
            shapes[op.computation] = module.shapes(op.computation)
        ops.append(op_cost(op, chip, shapes[op.computation], seq_len, opt))
    ops.sort(key=lambda o: -o.time_s)
    return CostReport(chip.name, ops)
