"""Simulated pods: per-device memory and collectives of the sharded train step, compiled
for a mesh of fake devices, without a pod and without allocating the model.

  python -m xlm_jax.accelerator.pod_memory --gin_file=runs/xlme_large.gin --devices 256 \\
      --mesh data=16,fsdp=16 --batch_size 256 --seq_len 512 [--size xl] [--json OUT]

It builds what `loop.train` builds from the gin files, with `train.setup`'s functions (mesh,
objectives, rules, optimiser, init function, state shardings, the jitted step with its donated
state), from an abstract state (`jax.eval_shape` of the init function) and abstract batches of
the synthetic streams' shapes, and compiles the step for `--devices` host devices
(`--xla_force_host_platform_device_count`). It reports per device XLA's memory analysis
(arguments, outputs, aliased = donated, temporaries, generated code), the parameter and
optimiser state bytes computed from the shardings alone, whether the total fits each chip's
memory (`CAPACITIES_GIB`), and the compiled HLO's collectives by kind.

With `--target v5p:4x4x4` (or any target `python -m xlm_jax.accelerator.compile` takes) it is a view
of that tool's report instead: the same step compiled by the target's own compiler on
compile-only devices, where libtpu (TPU) or the CUDA plugin (GPU) is installed. Without
`--target` the devices are fake CPU devices, as below, and the report's first line says so.

This only simulates a pod: the devices are CPU devices and the program is XLA:CPU's. The SPMD
partitioner, and so each array's sharding and the collectives it needs, is the accelerators'
one; the rest is the CPU compiler's:
- buffer assignment and scheduling: no TPU/GPU fusions, no latency-hiding scheduler or async
  collectives, no HLO rematerialisation to fit a memory limit (TPU has it) and no TPU layout
  tiling (8x128 tiles pad odd-shaped arrays there), so temporaries differ either way;
- collectives: XLA:CPU has no reduce-scatter creator (a gradient's reduce-scatter stays an
  all-reduce followed by a slice: "reduce-scatter" reads 0 and the all-reduce bytes are full
  gradients) and combines all-reduces by its own rule (`cpu-all-reduce-combiner`); "per
  step" counts a loop body's collectives once per iteration (its known trip count);
- dtypes are as configured (`ModelConfig.dtype` / `param_dtype`, named in the report); XLA:CPU
  may compute some bfloat16 operations in float32. XLA_FLAGS already set are kept (e.g.
  `--xla_disable_hlo_passes=...`).
Treat the totals as an estimate for choosing meshes and batches, not a guarantee.

The default mesh is `fsdp=-1` (every device on the fsdp axis: parameters, gradients and
optimiser state sharded 256 ways, ZeRO-3 style; our choice). Only the phase that runs at step
0 of a mixture is compiled (`train.mixture`: alternating objectives compile one program each).
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from xlm_jax import cli_help
# the HLO text's grammar, shared with the cost model's reader
from xlm_jax.accelerator.cost.hlo import _ARRAY, _BRANCHES, _COMPUTATION, _TRIP
from xlm_jax.accelerator.cost.hlo import ITEMSIZE as _ITEMSIZE

GIB = 2**30
# What one jax device may hold, as XLA:TPU states its limit for each chip (libtpu 0.0.42.1:
# a v4 chip in megacore mode, one jax device, has 32 GiB of which XLA:TPU allows 30.75; see
# xlm_jax.accelerator.compile.targets) and, for H100, its 80 GB at the 0.9 share our launch scripts
# give jax's allocator (XLA_PYTHON_CLIENT_MEM_FRACTION).
CAPACITIES_GIB = {"TPU v4 (30.75 GiB usable of 32)": 30.75, "TPU v5e (15.75 of 16)": 15.75,
                  "TPU v5p (95.74 of 95)": 95.74, "TPU v6e (31.25 of 32)": 31.25,
                  "H100 (0.9 x 80 GB)": 0.9 * 80e9 / GIB}
COLLECTIVES = ("all-gather", "reduce-scatter", "all-reduce", "all-to-all", "collective-permute")
_CALLEE = re.compile(r"\b(body|condition|to_apply|calls|true_computation|false_computation)"
                     r"=%?([\w.\-]+)")
_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?[\w.\-]+\s*=\s*(?P<shape>.*?)\s+"
                    r"(?P<op>[a-z][a-z0-9\-]*)\(")


def parse_mesh(text: str) -> dict[str, int]:
    """'data=16,fsdp=16' -> {'data': 16, 'fsdp': 16, 'tensor': 1}; axes left out are 1 (a
    size may be -1: the remaining devices). Raises a one-line ValueError naming the text."""
    sizes = {"data": 1, "fsdp": 1, "tensor": 1}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, value = part.partition("=")
        if name not in sizes or not re.fullmatch(r"-?[0-9]+", value.strip()):
            raise ValueError(f"--mesh {text!r}: expected AXIS=SIZE[,AXIS=SIZE] with axes "
                             "data, fsdp, tensor")
        sizes[name] = int(value)
    return sizes


def _array_bytes(shape_text: str) -> list[int]:
    return [_ITEMSIZE.get(dt, 1) * math.prod(int(d) for d in dims.split(",") if d)
            for dt, dims in _ARRAY.findall(shape_text)]


def hlo_instructions(hlo: str) -> list[tuple[str, str]]:
    """(opcode, result shape text) of every instruction of an HLO module's text."""
    return [(m["op"], m["shape"]) for m in map(_INSTR.match, hlo.splitlines()) if m]


def _executions(hlo: str) -> tuple[dict[str, list[str]], dict[str, int], int]:
    """The module's computations (name -> instruction lines), how often each runs per call
    of the entry computation (a while body `known_trip_count` times), and how many while
    loops have no known trip count (their bodies are counted once)."""
    comps: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        head = _COMPUTATION.match(line)
        if head:
            current = comps.setdefault(head[2], [])
            entry = head[2] if head[1] else entry
        elif current is not None and line.startswith(" "):
            current.append(line)
    runs: dict[str, int] = {}
    unknown = 0

    def visit(name: str, times: int) -> None:
        nonlocal unknown
        runs[name] = runs.get(name, 0) + times
        for line in comps.get(name, ()):
            callees = [c for _, c in _CALLEE.findall(line)]
            for group in _BRANCHES.findall(line):
                callees += [c.strip().lstrip("%") for c in group.split(",")]
            trip = 1
            if " while(" in line:
                found = _TRIP.search(line)
                trip = int(found[1]) if found else 1
                unknown += not found
            for callee in callees:
                visit(callee, times * trip)

    visit(entry, 1)
    return comps, runs, unknown


def collectives(hlo: str) -> dict[str, Any]:
    """For each collective kind of the HLO text: "count" (instructions in the program),
    "per_step" (executions per step: a collective in a loop body runs once per iteration)
    and "bytes" (result bytes per device per step). An async `-start` counts once, its result
    being the largest array of its tuple; `-done` is not counted. "unknown_trip_counts" says
    how many while loops were counted once for lack of a known trip count."""
    comps, runs, unknown = _executions(hlo)
    out: dict[str, Any] = {k: {"count": 0, "per_step": 0, "bytes": 0} for k in COLLECTIVES}
    for name, lines in comps.items():
        for op, shape in hlo_instructions("\n".join(lines)):
            kind = op.removesuffix("-start")
            if kind not in out:
                continue
            sizes = _array_bytes(shape)
            times = runs.get(name, 0)
            out[kind]["count"] += 1
            out[kind]["per_step"] += times
            out[kind]["bytes"] += times * (max(sizes, default=0) if op != kind else sum(sizes))
    out["unknown_trip_counts"] = unknown
    return out


def whole_activations(hlo: str, batch_seq: Iterable[tuple[int, int]], widths: Iterable[int],
                      ops: Sequence[str] | None = None) -> list[tuple[str, str]]:
    """(opcode, shape) of the instructions (of `ops`, or any) whose result holds a whole
    activation on one device: B*S*w elements with a dimension of B or B*S, for a global batch
    B x S in `batch_seq` and a width w in `widths` (an activation gathered or replicated over
    the batch; a parameter of that many elements lacks the batch dimension)."""
    wanted = {(b * s * w, frozenset((b, b * s))) for b, s in batch_seq for w in widths}
    found = []
    for op, shape in hlo_instructions(hlo):
        if ops is not None and op.removesuffix("-start") not in ops:
            continue
        for _, text in _ARRAY.findall(shape):
            dims = [int(d) for d in text.split(",") if d]
            if any(math.prod(dims) == n and lead & set(dims) for n, lead in wanted):
                found.append((op, shape))
                break
    return found


def per_device_state_bytes(abstract: Any, shardings: Any) -> dict[str, int]:
    """Bytes one device holds of each part of the train state (params, opt_state, obj_state,
    step), from the leaves' shapes and their shardings' shard shapes (no compilation)."""
    import jax

    out = {}
    for part in ("params", "opt_state", "obj_state", "step"):
        leaves = jax.tree_util.tree_leaves(getattr(abstract, part))
        specs = jax.tree_util.tree_leaves(getattr(shardings, part))
        out[part] = sum(math.prod(s.shard_shape(a.shape)) * a.dtype.itemsize
                        for a, s in zip(leaves, specs, strict=True))
    return out


def train_bindings() -> dict[str, Any]:
    """`loop.train`'s arguments as the parsed gin files set them (defaults for the rest)."""
    import gin

    from xlm_jax.train import loop

    params = inspect.signature(loop.train).parameters
    kw = {k: p.default for k, p in params.items() if p.default is not inspect.Parameter.empty}
    kw.update(gin.get_bindings("loop.train"))
    return kw


@dataclasses.dataclass
class Built:
    """What `loop.train` would compile, abstract: the jitted step and its arguments."""

    mesh: Any  # jax.sharding.Mesh
    rules: Any  # the run's logical-axis rules
    model: Any  # ModelConfig
    shapes: dict[str, Any]  # objective name -> mixture.Shape
    parts: Any  # setup.StateParts (abstract state and its shardings)
    step_fn: Any  # the jitted train step
    args: tuple[Any, ...]  # (state, batches, rng) as sharded jax.ShapeDtypeStructs
    objs: Any = None  # the step's objectives (step.WeightedObjective), for FLOP counts
    # non-pad input tokens of step 0's synthetic batches, all objectives (what the benchmark
    # counts: its tokens/s and MFU are over non-pad tokens)
    tokens: int = 0


def build(mesh_sizes: Mapping[str, int], batch_size: int | None = None,
          seq_len: int | None = None, devices: Sequence[Any] | None = None) -> Built:
    """The parsed gin configuration's train step for `mesh_sizes` over `devices` (default: all
    of jax's devices; `xlm_jax.accelerator.compile` passes compile-only TPU/GPU devices), built by
    `train.setup`'s functions as `loop.train` builds it, with an abstract state and the
    batches of step 0 (the objectives that run then, synthetic streams of their kinds)."""
    import jax
    import numpy as np

    from xlm_jax.models.transformer import Transformer
    from xlm_jax.train import streams as streams_lib
    from xlm_jax.train import mixture, partitioning, setup

    kw = train_bindings()
    batch_size = batch_size or kw["batch_size"]
    seq_len = seq_len or kw["seq_len"]
    model, specs = kw["model"], kw["objectives"]
    shapes = mixture.resolve(specs, batch_size, seq_len)
    mesh = partitioning.make_mesh(partitioning.MeshConfig(**mesh_sizes),
                                  jax.devices() if devices is None else devices)
    setup.check_batches(shapes, batch_size, kw["accum_steps"], mesh)
    net = Transformer(model)
    # languages=None: no seqio task records a language table for synthetic streams (as train)
    objs, rules = setup.build_objectives(net, specs, None, kw["axis_rule_overrides"],
                                        kw["optimizer"], check_tasks=False)
    parts = setup.build_state(net, objs, rules, kw["optimizer"], seq_len, mesh)
    state = jax.tree_util.tree_map(
        lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
        parts.abstract, parts.shardings)
    batches = setup.batch_specs(objs, shapes, mesh, 0)
    tokens = 0
    for o in objs:
        if o.name not in batches:
            continue
        shape = shapes[o.name]
        first = next(streams_lib.make_stream(
            f"{streams_lib.SYNTHETIC}{o.objective.kind}", shape.batch_size, shape.seq_len, 0, 0,
            model.vocab_size,
            num_languages=streams_lib.synthetic_language_count(model.num_languages)))
        tokens += sum(int((v != model.pad_id).sum()) for k, v in first.items()
                      if k.endswith("input_ids"))
    rng = jax.ShapeDtypeStruct((2,), np.uint32, sharding=partitioning.replicated(mesh))
    step_fn = setup.jit_train_step(objs, parts, mesh, kw["accum_steps"],
                                  kw["loss_normalization"])
    return Built(mesh, rules, model, {n: shapes[n] for n in batches}, parts, step_fn,
                 (state, batches, rng), objs, tokens)


def measure(built: Built, hlo_out: str | None = None) -> dict[str, Any]:
    """Lowers and compiles `built` and returns the report (see `format_report`); `hlo_out`
    saves the compiled HLO text."""
    import jax

    from xlm_jax.train import partitioning

    t0 = time.perf_counter()
    with partitioning.activate(built.mesh, built.rules):
        lowered = built.step_fn.lower(*built.args)
    t1 = time.perf_counter()
    compiled = lowered.compile()
    t2 = time.perf_counter()
    hlo = compiled.as_text()
    if hlo_out:
        with open(hlo_out, "w") as f:
            f.write(hlo)
    ma = compiled.memory_analysis()
    mem = {k: int(getattr(ma, f"{k}_size_in_bytes")) for k in
           ("argument", "output", "alias", "temp", "generated_code")}
    mem["total"] = mem["argument"] + mem["temp"] + mem["output"] - mem["alias"]
    state = per_device_state_bytes(built.parts.abstract, built.parts.shardings)
    model = built.model
    batch_seq = [(s.batch_size, s.seq_len) for s in built.shapes.values()]
    return {
        "model": {**model.to_dict(), "params": sum(
            math.prod(a.shape) for a in jax.tree_util.tree_leaves(built.parts.abstract.params))},
        "objectives": {n: f"{s.batch_size}x{s.seq_len}" for n, s in built.shapes.items()},
        "devices": built.mesh.size, "mesh": dict(built.mesh.shape),
        "compile_seconds": {"lower": round(t1 - t0, 1), "compile": round(t2 - t1, 1)},
        "memory_per_device": mem,
        "state_per_device": {**state, "total": sum(state.values())},
        "fits": {name: mem["total"] <= gib * GIB for name, gib in CAPACITIES_GIB.items()},
        "collectives": collectives(hlo),
        "activation_all_gathers": len(whole_activations(
            hlo, batch_seq, (model.hidden_size, model.mlp_dim), ("all-gather",))),
    }


def _size(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / 2**20:.1f} MiB"


def format_report(r: Mapping[str, Any]) -> str:
    """The report as markdown: the configuration, memory per device, collectives."""
    m, mem, st = r["model"], r["memory_per_device"], r["state_per_device"]
    lines = [f"model {m['num_layers']}L d={m['hidden_size']} mlp={m['mlp_dim']} "
             f"({m['params'] / 1e6:.0f}M parameters with the objectives' modules; dtype "
             f"{m['dtype']}, params {m['param_dtype']}, remat {m['remat']}, scan_layers "
             f"{m.get('scan_layers', False)}); batches {r['objectives']}; {r['devices']} "
             f"devices, mesh {r['mesh']}; lower {r['compile_seconds']['lower']} s, compile "
             f"{r['compile_seconds']['compile']} s", "",
             "| per device | bytes |", "|---|---|"]
    lines += [f"| {k} | {_size(mem[k])} |" for k in
              ("argument", "output", "alias", "temp", "generated_code")]
    lines.append(f"| **total** (argument + temp + output - alias) | **{_size(mem['total'])}** |")
    lines += [f"| state {k} (from the shardings) | {_size(st[k])} |"
              for k in ("params", "opt_state", "obj_state", "total")]
    lines += [f"| fits {name} | {'yes' if ok else 'NO'} |" for name, ok in r["fits"].items()]
    c = r["collectives"]
    lines += ["", "| collective | in program | per step | result bytes per device per step |",
              "|---|---|---|---|"]
    lines += [f"| {k} | {c[k]['count']} | {c[k]['per_step']} | {_size(c[k]['bytes'])} |"
              for k in COLLECTIVES]
    if c["unknown_trip_counts"]:
        lines.append(f"\n{c['unknown_trip_counts']} loop(s) of unknown trip count counted once")
    lines.append(f"\nall-gathers of a whole activation (global batch x seq x hidden|mlp): "
                 f"{r['activation_all_gathers']}")
    return "\n".join(lines)


def _setup_devices(devices: int) -> None:
    """Asks XLA for `devices` CPU devices; must run before jax starts its backend."""
    os.environ["XLA_FLAGS"] = " ".join(
        [f for f in os.environ.get("XLA_FLAGS", "").split()
         if not f.startswith("--xla_force_host_platform_device_count")]
        + [f"--xla_force_host_platform_device_count={devices}"])
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def _runtime_installed() -> bool:
    """Whether libtpu or jax's CUDA plugin is installed (then --target can compile for real)."""
    import importlib.util

    if importlib.util.find_spec("libtpu") is not None:
        return True
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (see the module docstring); returns the exit status."""
    from xlm_jax.train import cli

    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.pod_memory", description=__doc__,
                        formatter_class=cli.HelpFormatter)
    p.add_argument("--gin_file", action="append", default=[], required=True,
                   help="run file (repeatable); --gin.NAME=VALUE binds")
    p.add_argument("--gin_bindings", action="append", default=[],
                   help="extra gin binding (repeatable)")
    p.add_argument("--devices", type=int, default=256, help="fake CPU devices of the mesh")
    p.add_argument("--mesh", default="fsdp=-1", help="e.g. data=16,fsdp=16")
    p.add_argument("--batch_size", type=int, default=None, help="global rows per objective "
                   "(default: the gin file's loop.train.batch_size)")
    p.add_argument("--seq_len", type=int, default=None,
                   help="row length (default: the gin file's loop.train.seq_len)")
    p.add_argument("--size", default=None, help="model size override (loop.model_config.size)")
    p.add_argument("--json", default=None, help="also write the report as JSON here")
    p.add_argument("--hlo", default=None, help="save the compiled HLO text here")
    p.add_argument("--target", default=None, help="compile for this TPU slice or GPU node "
                   "instead (v5p:4x4x4, h100:1x1x8, ...): the report of `python -m "
                   "xlm_jax.accelerator.compile`, whose flags --mesh/--batch_size/--seq_len/"
                   "--size/--json this passes on (--devices is the target's)")
    argv = list(sys.argv[1:] if argv is None else argv)
    from xlm_jax.train.gin_utils import rewrite_gin_args

    args = p.parse_args(rewrite_gin_args(argv))  # --gin.NAME=VALUE -> --gin_bindings
    bindings = list(args.gin_bindings)
    if args.target:  # the same report, by the target's own compiler on compile-only devices
        passed = [f"--gin_file={f}" for f in args.gin_file]
        passed += [f"--gin_bindings={b}" for b in bindings] + ["--target", args.target]
        for flag in ("batch_size", "seq_len", "size", "json"):
            if getattr(args, flag) is not None:
                passed += [f"--{flag}", str(getattr(args, flag))]
        if "--mesh" in " ".join(argv):
            passed += ["--mesh", args.mesh]
        # its own process: the compile tool sets up jax for compile-only devices itself
        return subprocess.run([sys.executable, "-m", "xlm_jax.accelerator.compile",
                               *passed]).returncode
    _setup_devices(args.devices)
    from xlm_jax.train import partitioning

    try:  # before jax starts its devices: a bad mesh is reported at once
        mesh = partitioning.MeshConfig(**parse_mesh(args.mesh)).resolve(args.devices)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    import jax

    if jax.device_count() != args.devices:  # jax started before the flag was set
        print(f"error: jax has {jax.device_count()} devices, --devices is {args.devices}; "
              "run as a fresh process", file=sys.stderr)
        return 2
    from xlm_jax.train import gin_utils

    extra = list(gin_utils.SYNTHETIC_RUN_MACROS)
    if args.size:
        extra.append(f"loop.model_config.size = {args.size!r}")
    from xlm_jax.train import cli

    reports: list[dict[str, Any]] = []

    def run() -> int:
        gin_utils.parse(args.gin_file, extra + bindings)
        reports.append(measure(build(mesh, args.batch_size, args.seq_len), args.hlo))
        return 0

    if cli.run_reporting(run):
        return 1
    report = reports[0]
    print(f"fake CPU devices ({args.devices}): XLA:CPU's program with the accelerators' "
          "sharding; --target compiles with the target's own compiler"
          + (" (its runtime is installed here)" if _runtime_installed() else ""))
    print(format_report(report))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
