"""The flash-attention kernels' compiled loops, counted from a CPU: instructions per score.

  python -m xlm_jax.accelerator.kernel_ptx [--target h200] [--shape 32,512,12,64]
      [--dtype bfloat16] [--dropout 0.1] [--bias none,gated] [--launch TEXT] [--json OUT]

Why: on a GPU the three Pallas kernels (`fused_attention.KERNELS`) spend their time on the
element-wise work around two to four small matrix products per tile, not on the products: a
64 x 64 x 64 product takes an H200 SM's tensor cores ~140 cycles (989 TFLOP/s over 132 SMs at
1.98 GHz), while a 64 x 64 tile's exps, dropout hash, masking and rescaling are ~30-40
instructions per score for each of the 32 scores a thread of 4 warps holds, ~1,300 issue
cycles of the warp's scheduler. The cost model
(`accelerator.cost`) sees a kernel only as one custom call with a calibrated rate, and a GPU
is lent only now and then; this tool shows, from a CPU, what each kernel's inner loop
costs in instructions, so a change to the kernels can be steered before a GPU times it.

How: each kernel is compiled alone (`fused_attention.run_kernel`, the arguments of
`kernel_sweep.make_call`: the model's TokenMask of valid tokens, attention dropout, for
`gated` XLM-E's relative bias) for a compile-only GPU of the CUDA plugin (no GPU, no CUDA
libraries: `make test-slow` installs it in .venv/cuda_compile; put it on PYTHONPATH), with
XLA's dump of the PTX it generates. A loop is a backward branch in the kernel's PTX; for each
loop the table gives the instructions of its body (those of a loop nested in it left out,
both sides of a branch in it counted), per score a thread handles in one trip
(block_q x block_k / (32 x warps)), and by kind: tensor core (wgmma/mma), special function
(ex2, lg2, rcp, div...), integer arithmetic (the dropout hash, buckets, addresses), float
arithmetic, compare/select, memory, other. It is a count, not a time: latencies, occupancy
and the overlap of the tensor cores with the rest are a GPU's to measure (`kernel_sweep`).
The gated-bias kernels choose per tile between two paths inside their loop; to count each
path alone, `docs/experiments/kernel_ptx_paths.py near|far` runs this with the choice fixed.

Exit status: 0 when every kernel compiled and was counted; 1 when one failed (its row says
why); 2 on a bad flag or without the CUDA plugin.
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

from xlm_jax import cli_help

KINDS = ("tensor core", "special function", "integer", "float", "compare/select", "memory",
         "other")
_LABEL = re.compile(r"^(\$L__BB\d+_\d+):")
_BRANCH = re.compile(r"\bbra(?:\.uni)?\s+(\$L__BB\d+_\d+)\s*;")
_ENTRY = re.compile(r"\.entry\s+([A-Za-z_][\w$]*)\s*\(")


def kind_of(opcode: str) -> str:
    """The kind of a PTX opcode (``mul.lo.s32``, ``ex2.approx.f32``, ...), one of KINDS."""
    base, _, rest = opcode.partition(".")
    types = rest.split(".")
    if base in ("wgmma", "mma", "ldmatrix", "stmatrix"):
        return "tensor core"
    if base in ("ex2", "lg2", "rcp", "rsqrt", "sqrt", "sin", "cos", "tanh", "div"):
        return "special function"
    if base in ("ld", "st", "cp", "atom", "red", "prefetch", "cvta", "fence", "bar", "shfl"):
        return "memory"
    if base in ("setp", "selp", "set", "slct", "max", "min"):
        return "compare/select"
    if base in ("mul", "add", "sub", "fma", "mad", "neg", "abs"):
        return "float" if any(t.startswith(("f", "bf")) for t in types) else "integer"
    if base in ("xor", "and", "or", "not", "shl", "shr", "bfe", "bfi", "popc", "clz", "prmt",
                "lop3", "mul24", "mad24"):
        return "integer"
    return "other"


@dataclasses.dataclass(frozen=True)
class Loop:
    """One loop of a kernel's PTX: its lines [start, end] and its own instructions by opcode
    (those of loops nested in it left out)."""

    start: int
    end: int
    depth: int  # 0: outermost
    opcodes: dict[str, int]

    @property
    def instructions(self) -> int:
        return sum(self.opcodes.values())

    def by_kind(self) -> dict[str, int]:
        out = dict.fromkeys(KINDS, 0)
        for op, n in self.opcodes.items():
            out[kind_of(op)] += n
        return out


def _opcode(line: str) -> str | None:
    """The opcode of a PTX instruction line (a predicate guard skipped), or None for labels,
    directives, braces, comments and blank lines."""
    words = line.split()
    if not words or words[0].startswith(("//", "$", "{", "}", ".", ")")):
        return None
    if words[0].startswith("@"):
        words = words[1:]
    return words[0].rstrip(";") if words else None


def entries(ptx: str) -> list[str]:
    """The kernel (``.entry``) names of a PTX module."""
    return _ENTRY.findall(ptx)


def loops(ptx: str) -> list[Loop]:
    """Every loop of a PTX module, outermost first within each nest: a branch back to an
    earlier label closes the loop that label opens (several such branches, one loop; its
    lines run to the last). Two loops whose lines overlap without nesting (a branch inside a
    loop whose sides each jump back to a label of their own, as a `lax.cond` in a kernel's
    loop may compile) are reported apart, each with the lines up to its own branch back: their
    counts are then approximate, each including some of the other side's lines."""
    lines = ptx.splitlines()
    labels = {}
    for i, line in enumerate(lines):
        found = _LABEL.match(line.strip())
        if found:
            labels[found[1]] = i
    last_latch: dict[int, int] = {}  # a loop's header line -> its last branch back to it
    for i, line in enumerate(lines):
        found = _BRANCH.search(line)
        if found and found[1] in labels and labels[found[1]] < i:
            last_latch[labels[found[1]]] = i  # two branches back to one label: one loop
    spans = sorted(last_latch.items(), key=lambda s: (s[0], -s[1]))
    out = []
    for start, end in spans:
        inner = [(a, z) for a, z in spans if (a, z) != (start, end) and start <= a and z <= end]
        depth = sum(1 for a, z in spans if (a, z) != (start, end) and a <= start and end <= z)
        counts: collections.Counter[str] = collections.Counter()
        for i in range(start, end + 1):
            if any(a <= i <= z for a, z in inner):
                continue
            op = _opcode(lines[i])
            if op is not None:
                counts[op] += 1
        out.append(Loop(start, end, depth, dict(counts)))
    return out


@dataclasses.dataclass
class Row:
    """One loop of one kernel, counted; or a kernel that could not be (``reason``)."""

    bias: str
    kernel: str
    launch: str
    loop: int  # the loop's index in the kernel (0: the first in the PTX)
    depth: int = 0
    instructions: int = 0
    per_score: float = 0.0
    by_kind: dict[str, int] = dataclasses.field(default_factory=dict)
    opcodes: dict[str, int] = dataclasses.field(default_factory=dict)
    reason: str = ""


def table_row(row: Row) -> str:
    if row.reason:
        return f"| {row.bias} | {row.kernel} | {row.launch} | — | failed: {row.reason} |" + " |" * 8
    scores = row.instructions / row.per_score if row.per_score else 0
    kinds = " | ".join(f"{row.by_kind.get(k, 0) / scores:.1f}" if scores else "—" for k in KINDS)
    return (f"| {row.bias} | {row.kernel} | {row.launch} | {row.loop} (depth {row.depth}) | "
            f"{row.instructions} | {row.per_score:.1f} | {kinds} |")


def header() -> str:
    cols = ["bias", "kernel", "launch", "loop", "instructions", "per score", *KINDS]
    return "| " + " | ".join(cols) + " |\n|" + "---|" * len(cols)


def _count_kernel(dump_dir: str, seen: set[str], bias: str, kernel: str, launch: Any
                  ) -> list[Row]:
    """Rows for the kernel whose PTX appeared in ``dump_dir`` since ``seen``."""
    name = f"relbias_flash_{kernel}"
    new = sorted(set(glob.glob(os.path.join(dump_dir, "*.ptx"))) - seen)
    seen.update(new)
    texts = [open(p).read() for p in new if os.path.getsize(p)]
    ptx = next((t for t in texts if name in entries(t)), None)
    text = launch.label()
    if ptx is None:
        return [Row(bias, kernel, text, 0, reason=f"no PTX with the entry {name} in XLA's dump")]
    per_trip = launch.block_q * launch.block_k / (32 * launch.num_warps)
    rows = []
    for i, loop in enumerate(loops(ptx)):
        rows.append(Row(bias, kernel, text, i, loop.depth, loop.instructions,
                        loop.instructions / per_trip, loop.by_kind(), loop.opcodes))
    return rows or [Row(bias, kernel, text, 0, reason="no loop found in its PTX")]


def count(problems: Sequence[Any], target: Any, dump_dir: str, launch_text: str | None
          ) -> list[Row]:
    """Compiles each kernel of each problem for ``target``'s first compile-only GPU and
    counts its loops (XLA's dump must already point at ``dump_dir``)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import SingleDeviceSharding

    from xlm_jax.accelerator import kernel_sweep
    from xlm_jax.accelerator.compile import targets
    from xlm_jax.models import attention_backends, fused_attention, kernel_launch

    sharding = SingleDeviceSharding(targets.devices(target)[0])
    spec = lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)  # noqa: E731
    seen = set(glob.glob(os.path.join(dump_dir, "*.ptx")))
    rows: list[Row] = []
    for problem in problems:
        with attention_backends.lowering_for("cuda"):
            call = kernel_sweep.make_call(problem)
            kw = dict(call.kwargs)
            if launch_text:
                kw["launch"] = kernel_launch.parse(launch_text)
            inputs = fused_attention.prepare(call.q, call.k, call.v, dropout_rate=problem.dropout,
                                             interpret=False, **kw)
            q = inputs.arrays[0]
            o = jax.ShapeDtypeStruct(q.shape, q.dtype, sharding=sharding)
            lse = jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[1]), jnp.float32,
                                       sharding=sharding)
            for kernel in fused_attention.KERNELS:
                launch = inputs.st.launch.of(kernel)

                def run(arrays, o, lse, do, kernel=kernel, launch=launch):
                    flash = fused_attention.FlashInputs(inputs.st, arrays, inputs.tq, inputs.dh)
                    return fused_attention.run_kernel(flash, kernel, launch, o=o, lse=lse, do=do)

                try:
                    jax.jit(run).trace(jax.tree.map(spec, inputs.arrays), o, lse,
                                       spec(call.do)).lower(
                        lowering_platforms=("cuda",)).compile()
                except Exception as e:  # noqa: BLE001 - the compiler's message, on one line
                    rows.append(Row(problem.bias, kernel, launch.label(), 0,
                                    reason=" ".join(str(e).split())[:200]))
                    continue
                rows.extend(_count_kernel(dump_dir, seen, problem.bias, kernel, launch))
    return rows


def _parser() -> argparse.ArgumentParser:
    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.kernel_ptx", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default="h200", help="a card of accelerator/compile/gpu_specs")
    p.add_argument("--shape", default="32,512,12,64", help="batch,seq_len,heads,head_dim")
    p.add_argument("--dtype", default="bfloat16", help="bfloat16, float16 or float32")
    p.add_argument("--dropout", type=float, default=0.1, help="attention dropout rate")
    p.add_argument("--bias", default="none,gated", help="comma-separated: none, gated")
    p.add_argument("--launch", default=None,
                   help="the kernels' launch, as ModelConfig.attention_launch (default: the "
                        "GPU default, fused_attention.GPU_LAUNCH)")
    p.add_argument("--json", default=None, help="write the rows here")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI; returns the exit status (see the module docstring)."""
    args = _parser().parse_args(argv)
    from xlm_jax.accelerator import kernel_sweep
    from xlm_jax.accelerator.compile import targets

    try:
        (b, t, h, d), biases = kernel_sweep.problem_flags(args.shape, args.dtype, args.bias)
        target = targets.parse_target(f"{args.target}:1x1x1")
        if target.platform != "cuda":
            raise ValueError(f"--target {args.target!r}: a GPU card of accelerator/compile/"
                             "gpu_specs (the kernels counted here are the Triton ones)")
        if args.launch:
            from xlm_jax.models import kernel_launch
            kernel_launch.parse(args.launch)
        missing = targets.runtime_missing(target)
        if missing:
            raise ValueError(missing)
    except (ValueError, targets.TargetError) as e:
        print(f"error: {str(e).splitlines()[0]}", file=sys.stderr)
        return 2
    dump_dir = tempfile.mkdtemp(prefix="kernel_ptx_")
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={dump_dir}".strip()
    targets.prepare_environment(target)
    problems = [kernel_sweep.Problem(b, t, h, d, args.dtype, args.dropout, x) for x in biases]
    print(f"{args.target}: the kernels' loops in the PTX XLA compiles for it (shape "
          f"{args.shape}, {args.dtype}, dropout {args.dropout:g}); per score: a loop's "
          "instructions per score a thread handles in one trip, the kinds likewise")
    print(header())
    try:
        rows = count(problems, target, dump_dir, args.launch)
    finally:
        import shutil
        shutil.rmtree(dump_dir, ignore_errors=True)
    for row in rows:
        print(table_row(row))
    if args.json:
        from xlm_jax.accelerator.check import write_atomic
        info = {"target": args.target, "shape": [b, t, h, d], "dtype": args.dtype,
                "dropout": args.dropout, "launch": args.launch}
        write_atomic(args.json, json.dumps({**info, "rows": [dataclasses.asdict(r)
                                                             for r in rows]}, indent=1))
    return 1 if any(r.reason for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
