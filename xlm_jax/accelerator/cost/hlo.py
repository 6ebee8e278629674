"""The optimised HLO text of a compiled step, read into the ops a device runs.

XLA prints an optimised module as computations of instructions. The ops that cost device
time are the instructions of the entry computation (and of the computations it calls: while
bodies, `call`s, command buffers, conditional branches), each of them one kernel or library
call: a `fusion` (whose fused computation holds the element-wise work, the reductions and
sometimes a dot), a `custom-call` (cuBLAS, cuDNN, a Pallas kernel through Triton or
Mosaic), a copy, a collective. Bitcasts, tuples, get-tuple-elements, parameters and
constants cost nothing. This module reads the text only (no jax), so that an HLO dump from
any machine (`--xla_dump_to`) can be read here; `model.py` turns the ops into time.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator

ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s4": 1, "u4": 1, "s16": 2, "u16": 2, "f16": 2,
            "bf16": 2, "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8,
            "c128": 16, "f8e4m3fn": 1, "f8e5m2": 1, "token": 0}
_ARRAY = re.compile(r"\b([a-z]+[0-9]*(?:e[0-9]m[0-9][a-z]*)?)\[([0-9,]*)\]")
_COMPUTATION = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_INSTR = re.compile(r"^\s*(?P<root>ROOT\s+)?%(?P<name>[\w.\-]+)\s*=\s*(?P<shape>.*?)\s+"
                    r"(?P<op>[a-z][a-z0-9\-]*)\((?P<args>[^)]*)\)(?P<rest>.*)$")
_OPERAND = re.compile(r"%([\w.\-]+(?:#[0-9]+)?)")
_CALLS = re.compile(r"\b(calls|to_apply|body|true_computation|false_computation)=%?([\w.\-]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_TRIP = re.compile(r'"known_trip_count":\{"n":"([0-9]+)"\}')
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_DIMS = re.compile(r"(lhs_contracting_dims|lhs_batch_dims)=\{([0-9,]*)\}")
_GEMM_DIMS = re.compile(r'"(lhs_contracting_dimensions|lhs_batch_dimensions)":\[([^\]]*)\]')
_FUSION_KIND = re.compile(r"\bkind=(k\w+)")

# Instructions that run no kernel of their own.
FREE_OPS = frozenset({"parameter", "constant", "bitcast", "tuple", "get-tuple-element",
                      "after-all", "partition-id", "replica-id", "opt-barrier",
                      "add-dependency", "domain", "all-reduce-done", "all-gather-done",
                      "collective-permute-done", "async-done", "copy-done", "send-done",
                      "recv-done"})
# Ops whose callees run as part of the caller's own schedule (their instructions are ops).
_CONTROL = frozenset({"while", "call", "conditional"})
# Element-wise instructions that take a special-function unit (several cycles per element).
TRANSCENDENTAL = frozenset({"exponential", "log", "log-plus-one", "exponential-minus-one",
                            "tanh", "rsqrt", "sqrt", "erf", "logistic", "power", "sine",
                            "cosine", "atan2", "cbrt", "divide"})
_NOT_ARITHMETIC = FREE_OPS | {"broadcast", "reshape", "transpose", "slice", "concatenate",
                              "pad", "iota", "dynamic-slice", "dynamic-update-slice", "copy",
                              "reverse", "gather", "scatter", "convert", "bitcast-convert",
                              "select", "compare"}


def shape_arrays(shape: str) -> list[tuple[str, tuple[int, ...]]]:
    """(dtype, dims) of every array in a shape text (a tuple gives several)."""
    return [(dt, tuple(int(d) for d in dims.split(",") if d))
            for dt, dims in _ARRAY.findall(shape)]


_LAID_OUT = re.compile(_ARRAY.pattern + r"(\{[^}]*\})?")  # an array and its layout, if any
_MEMORY_SPACE = re.compile(r"S\((\d+)\)")


def memory_spaces(shape: str) -> list[int]:
    """The memory space of each array of a shape text, from its layout (0, the default: HBM;
    XLA:TPU writes `S(1)` for VMEM and `S(2)` for SMEM)."""
    return [int(m.group(1)) if (m := _MEMORY_SPACE.search(layout)) else 0
            for _, _, layout in _LAID_OUT.findall(shape)]


def is_memory_space_copy(ins: Instruction) -> bool:
    """A `copy-start` between memory spaces: XLA:TPU's memory-space assignment prefetching a
    buffer from HBM into VMEM or evicting one, an asynchronous DMA scheduled to overlap the
    compute between its start and its `copy-done`. Its result is (source, destination,
    context)."""
    if ins.op != "copy-start":
        return False
    spaces = memory_spaces(ins.shape)
    return len(spaces) >= 2 and spaces[0] != spaces[1]


def shape_bytes(shape: str) -> int:
    return sum(ITEMSIZE.get(dt, 4) * math.prod(dims) for dt, dims in shape_arrays(shape))


def shape_elements(shape: str) -> int:
    return sum(math.prod(dims) for _, dims in shape_arrays(shape))


@dataclasses.dataclass
class Instruction:
    """One HLO instruction: its name, result shape text, opcode, operand names and the rest
    of its line (attributes, metadata, backend config)."""

    name: str
    shape: str
    op: str
    operands: list[str]
    rest: str
    args: str = ""  # the text inside the parentheses (a parameter's number)

    @property
    def op_name(self) -> str:
        """The jax source op path in the metadata ("jit(train_step)/.../dot_general")."""
        m = _OP_NAME.search(self.rest)
        return m.group(1) if m else ""

    @property
    def target(self) -> str:
        m = _TARGET.search(self.rest)
        return m.group(1) if m else ""

    @property
    def fusion_kind(self) -> str:
        m = _FUSION_KIND.search(self.rest)
        return m.group(1) if m else ""

    def callees(self) -> list[str]:
        names = [c for _, c in _CALLS.findall(self.rest)]
        for group in _BRANCHES.findall(self.rest):
            names += [c.strip().lstrip("%") for c in group.split(",") if c.strip()]
        return names

    def trip_count(self) -> int | None:
        m = _TRIP.search(self.rest)
        return int(m.group(1)) if m else None


@dataclasses.dataclass
class Module:
    """The computations of an HLO module (name -> instructions) and its entry's name."""

    computations: dict[str, list[Instruction]]
    entry: str

    def shapes(self, computation: str) -> "Shapes":
        return Shapes({i.name: i.shape for i in self.computations.get(computation, [])})


class Shapes(dict):
    """Instruction name -> result shape text; `name#k` (how XLA's text names element k of a
    multi-output instruction's tuple) gives that element's shape."""

    def get(self, key: str, default: str = "") -> str:  # type: ignore[override]
        name, sep, index = key.partition("#")
        shape = super().get(name, default)
        if not sep or not index.isdigit():
            return shape
        arrays = _ARRAY.findall(shape)
        k = int(index)
        return f"{arrays[k][0]}[{arrays[k][1]}]" if k < len(arrays) else default


def parse_module(text: str) -> Module:
    """Reads an HLO module's text. ValueError (one line) when it holds no entry computation."""
    comps: dict[str, list[Instruction]] = {}
    entry, current = "", None
    for line in text.splitlines():
        head = _COMPUTATION.match(line)
        if head and not line.startswith(" "):
            current = comps.setdefault(head.group(2), [])
            if head.group(1):
                entry = head.group(2)
            continue
        if current is None or not line.startswith(" "):
            continue
        m = _INSTR.match(line)
        if m:
            current.append(Instruction(m["name"], m["shape"], m["op"],
                                       _OPERAND.findall(m["args"]), m["rest"], m["args"]))
    if not entry:
        raise ValueError("not an HLO module's text: no ENTRY computation found")
    return Module(comps, entry)


def optimizer_state(module: Module) -> frozenset[str]:
    """Names of the entry's parameters that hold optimiser state: named after it (XLA:GPU
    names parameters after their pytree path, `state_opt_state_...`) or with it in their
    metadata (XLA:TPU: `op_name="state.opt_state[1][0].mu[...]"`)."""
    return frozenset(i.name for i in module.computations.get(module.entry, [])
                     if i.op == "parameter" and ("opt_state" in i.name
                                                 or "opt_state" in i.op_name))


@dataclasses.dataclass
class Op:
    """An instruction that runs on the device (`runs` times per step), with what it moves
    and computes."""

    instruction: Instruction
    computation: str
    runs: int
    bytes_read: int
    bytes_written: int
    matmul_flops: float  # 2 x M x N x K of its dots (for a kernel: see model.py)
    vector_ops: float  # element-wise arithmetic, one per element per instruction
    transcendental_ops: float  # exp, log, erf, rsqrt, divide ... per element
    body: list[Instruction]  # a fusion's fused instructions (empty otherwise)


def _dot_flops(ins: Instruction, shapes: dict[str, str]) -> float:
    """2 x (output elements) x (contracted size) of a `dot` (or a cuBLAS gemm custom call)."""
    out = shape_arrays(ins.shape)
    if not out or not ins.operands:
        return 0.0
    lhs = shape_arrays(shapes.get(ins.operands[0], ""))
    if not lhs:
        return 0.0
    found = dict(_DIMS.findall(ins.rest)) or {
        ("lhs_contracting_dims" if k.startswith("lhs_contracting") else "lhs_batch_dims"):
            v.replace('"', "") for k, v in _GEMM_DIMS.findall(ins.rest)}
    contracting = [int(d) for d in found.get("lhs_contracting_dims", "").split(",") if d]
    k = math.prod(lhs[0][1][d] for d in contracting if d < len(lhs[0][1]))
    return 2.0 * math.prod(out[0][1]) * k


_DIM_LABELS = re.compile(r"dim_labels=(\w+)_(\w+)->(\w+)")
_GROUPS = re.compile(r"feature_group_count=(\d+)")
_WINDOW = re.compile(r"window=\{([^}]*)\}")


def _window(ins: Instruction, spatial: int) -> list[tuple[int, int, int, int]]:
    """(size, pad low, stride, rhs dilation) per spatial dim of a convolution's window."""
    m = _WINDOW.search(ins.rest)
    fields = dict(f.split("=", 1) for f in (m.group(1).split() if m else []) if "=" in f)

    def ints(key: str, default: int) -> list[int]:
        if key not in fields:
            return [default] * spatial
        return [int(x.split("_")[0]) for x in fields[key].split("x")]

    sizes, pads = ints("size", 1), ints("pad", 0)
    strides, dil = ints("stride", 1), ints("rhs_dilate", 1)
    return list(zip(sizes, pads, strides, dil))


def _conv_flops(ins: Instruction, shapes: dict[str, str]) -> float:
    """2 x the multiply-adds of a `convolution` (how XLA:TPU writes its matmuls): per output
    element, the input features ('i') times the window taps that land on real (unpadded)
    input, over the feature groups. XLA:TPU writes a per-head projection as a convolution
    whose window slides over the heads with padding so that one tap per output is real;
    counting every tap would count each such projection heads-times over."""
    m = _DIM_LABELS.search(ins.rest)
    out = shape_arrays(ins.shape)
    lhs = shape_arrays(shapes.get(ins.operands[0], "")) if ins.operands else []
    rhs = shape_arrays(shapes.get(ins.operands[1], "")) if len(ins.operands) > 1 else []
    if not m or not out or not lhs or not rhs or len(rhs[0][1]) != len(m.group(2)) \
            or len(lhs[0][1]) != len(m.group(1)) or len(out[0][1]) != len(m.group(3)):
        return 0.0
    lhs_l, rhs_l, out_l = m.groups()
    spatial = sorted(ch for ch in rhs_l if ch.isdigit())
    in_features = math.prod(size for label, size in zip(rhs_l, rhs[0][1]) if label == "i")
    taps = 1.0  # valid (output position, window tap) pairs per output row, all spatial dims
    outer = math.prod(size for label, size in zip(out_l, out[0][1]) if not label.isdigit())
    for d, (_, low, stride, dil) in zip(spatial, _window(ins, len(spatial))):
        n = lhs[0][1][lhs_l.index(d)]
        w = rhs[0][1][rhs_l.index(d)]
        out_d = out[0][1][out_l.index(d)]
        taps *= sum(1 for o in range(out_d) for k in range(w)
                    if 0 <= o * stride + k * dil - low < n)
    groups = _GROUPS.search(ins.rest)
    return 2.0 * outer * taps * in_features / (int(groups.group(1)) if groups else 1)


def _body_costs(body: list[Instruction], shapes: dict[str, str]) -> tuple[float, float, float]:
    """(matmul FLOPs, vector ops, transcendental ops) of a fused computation."""
    matmul = vector = special = 0.0
    for ins in body:
        if ins.op == "dot":
            matmul += _dot_flops(ins, shapes)
        elif ins.op == "convolution":
            matmul += _conv_flops(ins, shapes)
        elif ins.op in TRANSCENDENTAL:
            special += shape_elements(ins.shape)
        elif ins.op in ("reduce", "reduce-window"):
            vector += sum(shape_elements(shapes.get(o, "")) for o in ins.operands[:1])
        elif ins.op not in _NOT_ARITHMETIC:
            vector += shape_elements(ins.shape)
    return matmul, vector, special


def device_ops(module: Module) -> Iterator[Op]:
    """Every op of the module that runs on the device, with its runs per step: the entry's
    instructions and those of the computations it runs (a while body `known_trip_count`
    times; once where XLA states no trip count)."""
    seen: set[tuple[str, int]] = set()

    def visit(comp: str, runs: int) -> Iterator[Op]:
        if (comp, runs) in seen:
            return
        seen.add((comp, runs))
        shapes = module.shapes(comp)
        for ins in module.computations.get(comp, []):
            if ins.op in _CONTROL:
                times = runs * (ins.trip_count() or 1) if ins.op == "while" else runs
                for callee in ins.callees():  # a while's body (its condition is not listed)
                    yield from visit(callee, times)
                continue
            if ins.op in FREE_OPS:
                continue
            body: list[Instruction] = []
            body_shapes = Shapes()
            if ins.op == "fusion" or (ins.op.endswith("-start") and ins.callees()):
                for callee in ins.callees():
                    body += module.computations.get(callee, [])
                    body_shapes.update(module.shapes(callee))
            if ins.op == "fusion":
                matmul, vector, special = _body_costs(body, body_shapes)
            elif ins.op == "convolution":
                matmul, vector, special = _conv_flops(ins, shapes), 0.0, 0.0
            elif ins.op == "dot" or "gemm" in ins.target or "matmul" in ins.target:
                matmul, vector, special = _dot_flops(ins, shapes), 0.0, 0.0
            elif ins.op not in _NOT_ARITHMETIC and ins.op != "custom-call":
                matmul, vector, special = 0.0, float(shape_elements(ins.shape)), 0.0
            else:
                matmul = vector = special = 0.0
            yield Op(ins, comp, runs, _fusion_read_bytes(ins, shapes, body),
                     _written_bytes(ins), matmul, vector, special, body)

    yield from visit(module.entry, 1)


def _written_bytes(ins: Instruction) -> int:
    """Bytes an op writes: its result, less a cuBLAS call's workspace (the s8 scratch of the
    result tuple). An in-place scatter's update-only traffic is `model.op_cost`'s."""
    arrays = shape_arrays(ins.shape)
    if ins.op == "custom-call":
        arrays = [a for a in arrays if a[0] != "s8"] or arrays
    if ins.op == "copy-start":  # (source, destination, context): the destination is written
        arrays = arrays[1:2]
    return sum(ITEMSIZE.get(dt, 4) * math.prod(d) for dt, d in arrays)


def _fusion_read_bytes(ins: Instruction, shapes: dict[str, str], body: list[Instruction]) -> int:
    """Bytes an op reads, each operand once; for a fusion, an operand that the fused code only
    slices (or gathers rows of) counts as the slices' bytes."""
    params = {int(b.args): b.name for b in body if b.op == "parameter" and b.args.isdigit()}
    users: dict[str, list[Instruction]] = {}
    for b in body:
        for o in b.operands:
            users.setdefault(o, []).append(b)
    total = 0
    for pos, operand in enumerate(ins.operands):
        full = shape_bytes(shapes.get(operand, ""))
        pname = params.get(pos)
        used = users.get(pname, []) if pname else []
        if used and all(u.op in ("slice", "dynamic-slice", "gather") for u in used):
            full = min(full, sum(shape_bytes(u.shape) for u in used))
        total += full
    return total
