"""What a compiled train step needs on its target: memory per device against the device's
memory, FLOPs (XLA's and ours), collectives, kernel calls, compile time; and, when it does not
fit, the first knob to turn. Pure functions over the compiled step's figures (no jax here)."""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

GIB = 2**30
MEMORY_KEYS = ("argument", "output", "alias", "temp", "generated_code")
# XLA:TPU's out-of-memory messages: "Ran out of memory in memory space hbm. Used 21.88G of
# 15.75G hbm. Exceeded hbm capacity by 6.13G." and "Ran out of memory on HBM, the total memory
# required for HLO temporaries (76.39G) exceeds available HBM (15.75G)."
_OOM = (re.compile(r"Used ([0-9.]+)([KMGT]) of ([0-9.]+)([KMGT]) hbm"),
        re.compile(r"\(([0-9.]+)([KMGT])\) exceeds available HBM \(([0-9.]+)([KMGT])\)"))
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def memory_per_device(stats: Any) -> dict[str, int]:
    """XLA's CompiledMemoryStats as bytes per device, with `peak` (XLA's own peak of the
    buffer assignment) and `total` = argument + output - alias + temp + generated code: what
    must be resident at once, the figure this tool holds against the device's memory."""
    mem = {k: int(getattr(stats, f"{k}_size_in_bytes")) for k in MEMORY_KEYS}
    mem["peak"] = int(getattr(stats, "peak_memory_in_bytes", 0) or 0)
    mem["total"] = (mem["argument"] + mem["output"] - mem["alias"] + mem["temp"]
                    + mem["generated_code"])
    return mem


def padded_bytes(shape: tuple[int, ...], itemsize: int, layout: Any) -> int:
    """Bytes of one device's array of `shape` in the executable's `layout` (a jax Layout:
    dimensions in `major_to_minor` order, the minor ones padded to the first tile of
    `tiling`: TPU stores arrays in tiles of e.g. 8 x 128, so a [768] vector of f32 takes a
    whole tile row). Without tiling (GPU, CPU) the plain size."""
    dims = ([shape[i] for i in layout.major_to_minor] if layout is not None
            and len(layout.major_to_minor) == len(shape) else list(shape))
    tiles = getattr(layout, "tiling", None) or ()
    tile = list(tiles[0]) if tiles else []
    dims = [1] * max(0, len(tile) - len(dims)) + dims
    for j, t in enumerate(reversed(tile)):
        i = len(dims) - 1 - j
        dims[i] = -(-dims[i] // t) * t
    bits = getattr(layout, "sub_byte_element_size_in_bits", 0) or 0
    n = 1
    for d in dims:
        n *= d
    return n * bits // 8 if bits else n * itemsize


def out_of_memory(message: str) -> tuple[int, int] | None:
    """(bytes needed, bytes available) from XLA:TPU's out-of-memory compile error, or None."""
    found = next(filter(None, (p.search(message) for p in _OOM)), None)
    if not found:
        return None
    return (int(float(found[1]) * _UNITS[found[2]]), int(float(found[3]) * _UNITS[found[4]]))


@dataclasses.dataclass(frozen=True)
class Knobs:
    """The settings that decide a step's memory, as the report names them."""

    remat: str  # ModelConfig.remat
    mesh: Mapping[str, int]  # data, fsdp, tensor
    devices: int
    accum_steps: int
    rows_per_device: int  # the largest objective batch over the data-parallel shards


def first_knob(k: Knobs) -> str:
    """The first setting to change when a step does not fit (our order: the cheapest in
    throughput first): rematerialisation, then sharding the state over more devices (FSDP),
    then gradient accumulation, then fewer rows per device (a larger slice)."""
    if k.remat != "full":
        return f"rematerialise every layer (--remat full; the run has remat={k.remat!r})"
    if k.mesh.get("fsdp", 1) * k.mesh.get("tensor", 1) < k.devices:
        return (f"shard parameters and optimiser state over all {k.devices} devices "
                f"(--mesh fsdp={k.devices // k.mesh.get('tensor', 1)}"
                f"{',tensor=' + str(k.mesh['tensor']) if k.mesh.get('tensor', 1) > 1 else ''})")
    if k.rows_per_device // k.accum_steps > 1:
        return (f"accumulate gradients (--accum_steps {k.accum_steps * 2}: "
                f"{k.rows_per_device // (k.accum_steps * 2)} rows per device per microbatch)")
    return "fewer rows per device: a larger slice, or a smaller --batch_size"


def size(n: float) -> str:
    """Bytes as GiB (or MiB below one GiB), two decimals."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / 2**20:.1f} MiB"


def verdict(report: Mapping[str, Any]) -> str:
    """The report's one-line outcome: compiled and fits, or why not."""
    if report.get("error"):
        return f"does not compile: {report['error']}"
    mem, limit = report["memory_per_device_bytes"], report["device_memory_bytes"]
    if mem["total"] > limit:
        return (f"does not fit: {size(mem['total'])} per device, {size(limit)} available "
                f"({size(mem['total'] - limit)} over); first knob: {report['first_knob']}")
    return (f"compiles and fits: {size(mem['total'])} of {size(limit)} per device "
            f"({100 * mem['total'] / limit:.0f}%)")


def format_report(r: Mapping[str, Any]) -> str:
    """The report as text: configuration, memory per device, FLOPs, kernels, collectives."""
    lines = [f"{', '.join(r['gin_files'])} on {r['target']} ({r['devices']} x "
             f"{r['device_kind']}), mesh {r['mesh']} ({r['mesh_source']}); model {r['model']}, "
             f"remat {r['remat']}; batches {r['batches']}, accum_steps {r['accum_steps']}"]
    t = r["compile_seconds"]
    lines.append(f"lower {t['lower']} s, compile {t['compile']} s")
    lines.append(verdict(r))
    if "argument" not in r.get("memory_per_device_bytes", {}):  # no memory analysis
        return "\n".join(lines)
    mem = r["memory_per_device_bytes"]
    lines += ["", "| per device | bytes |", "|---|---|"]
    lines += [f"| {k} | {size(mem[k])} |" for k in MEMORY_KEYS + ("peak",)]
    lines.append(f"| **total** (argument + output - alias + temp + code) | "
                 f"**{size(mem['total'])}** |")
    lines.append(f"| device memory ({r['device_memory_source']}) | "
                 f"{size(r['device_memory_bytes'])} |")
    st = r["state_per_device_bytes"]
    lines += [f"| state {k} (from the shardings) | {size(st[k])} |"
              for k in ("params", "opt_state", "obj_state", "total")]
    f = r["flops_per_device"]
    xla = f"{f['xla'] / 1e12:.2f} TFLOP" if f["xla"] is not None else "n/a (XLA:GPU gives none)"
    lines += ["", f"FLOPs per step per device: XLA's cost analysis {xla} (Pallas kernels are "
              f"not in it); ours {f['ours'] / 1e12:.2f} TFLOP (xlm_jax.train.step_flops, model "
              "FLOPs)"]
    lines.append(f"kernel calls: {r['custom_calls'] or 'none'}")
    if r.get("collectives"):
        c = r["collectives"]
        lines += ["", "| collective | in program | per step | result bytes per device per step |",
                  "|---|---|---|---|"]
        lines += [f"| {k} | {v['count']} | {v['per_step']} | {size(v['bytes'])} |"
                  for k, v in c.items() if isinstance(v, dict)]
    return "\n".join(lines)
