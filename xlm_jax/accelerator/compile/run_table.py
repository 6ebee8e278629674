"""Every run file compiled on the target its header names, at its own batch and length.

  python -m xlm_jax.accelerator.compile.run_table [--jobs 2] [--out table.md] [--only 'runs/xlme_*']
  python -m xlm_jax.accelerator.compile.run_table --smallest --only 'runs/xlme_base.gin' \
      [--chips v4,v5e,v5p,v6e,h100]

A run file names the slice it was sized for in a header line (our convention):

  # compile target: v5p:4x4x4

and sets the mesh, remat and accumulation that fit it as ordinary gin settings
(`loop.train.mesh`, `loop.model_config.remat`, `loop.train.accum_steps`); a file without the
line takes the one of the run file it includes. For each file this runs `python -m
xlm_jax.accelerator.compile --target T --no_collectives` (in `--jobs` processes: XLA compiles on one
thread) and prints a markdown table: run file, target, mesh, remat, accumulation, memory per
device against the device's, fits, compile seconds, FLOPs per step. Exit 1 when any file does
not compile or fit.

`--smallest` finds, for each run file and chip, the smallest slice of `SLICES` on which the
run file's global batch and length compile and fit with the most frugal settings short of
gradient accumulation (our choice: remat full, parameters and optimiser state sharded over
every chip, `--mesh fsdp=-1`; with accumulation nearly any slice fits, at a cost in speed).
TPU slices are tried smallest first (XLA:TPU refuses a program that does not fit within
seconds); GPU nodes by bisection (XLA:GPU compiles it whole, and the tool checks the memory).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import fnmatch
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from xlm_jax import cli_help

_TARGET_LINE = re.compile(r"^#\s*compile target:\s*(\S+)", re.MULTILINE)
_INCLUDE = re.compile(r"^include\s+'([^']+)'", re.MULTILINE)


def gin_root() -> str:
    """The gin_configs directory (the repository's, or the installed copy)."""
    from xlm_jax.train import gin_utils

    return next(p for p in gin_utils.default_search_paths()
                if os.path.isdir(os.path.join(p, "runs")))


def run_files(root: str, only: str | None = None) -> list[str]:
    """Every run file under `root`/runs, relative to `root`, sorted (filtered by `only`)."""
    out = []
    for dirpath, _, names in os.walk(os.path.join(root, "runs")):
        out += [os.path.relpath(os.path.join(dirpath, n), root) for n in names
                if n.endswith(".gin")]
    return sorted(f for f in out if only is None or fnmatch.fnmatch(f, only))


def named_target(root: str, run_file: str) -> str | None:
    """The `# compile target:` of `run_file`, or of the first run file it includes that has
    one (depth first, in include order)."""
    with open(os.path.join(root, run_file)) as f:
        text = f.read()
    found = _TARGET_LINE.search(text)
    if found:
        return found[1]
    for included in _INCLUDE.findall(text):
        if included.startswith("runs/"):
            target = named_target(root, included)
            if target:
                return target
    return None


def compile_one(run_file: str, target: str, extra: Sequence[str]) -> dict[str, Any]:
    """`python -m xlm_jax.accelerator.compile` for one run file; its JSON report (or the error
    line)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "xlm_jax.accelerator.compile",
                               f"--gin_file={run_file}", "--target", target, "--no_collectives",
                               "--json", out, *extra],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if os.path.exists(out):
            with open(out) as f:
                report = json.load(f)
        elif proc.returncode < 0:  # killed, e.g. by the kernel when the host ran out
            report = {"error": f"killed by signal {-proc.returncode} (host memory?)"}
        else:
            lines = proc.stderr.strip().splitlines()
            report = {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    return {**report, "run_file": run_file, "target": target, "exit": proc.returncode,
            "wall_seconds": round(wall, 1)}


# Slices tried by --smallest, smallest first (chips = jax devices: v4 in megacore mode; a GPU
# "1xNx8" is N nodes of 8).
SLICES = {
    "v4": ["2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8"],
    "v5e": ["2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"],
    "v5p": ["2x2x1", "2x2x2", "2x2x4", "2x4x4", "4x4x4", "4x4x8", "4x8x8"],
    "v6e": ["2x2", "2x4", "4x4", "4x8", "8x8", "8x16", "16x16"],
    "h100": ["1x1x8", "1x2x8", "1x4x8", "1x8x8", "1x16x8", "1x32x8"],
}
FRUGAL = ["--remat", "full", "--mesh", "fsdp=-1"]


def smallest(run_file: str, chip: str) -> dict[str, Any]:
    """The smallest slice of `chip` in SLICES on which `run_file` fits with FRUGAL settings:
    the fitting report with `tried` (every slice compiled and whether it fit), or the last
    report with `fits` False when none does."""
    slices, tried, found = SLICES[chip], [], None
    fits_at: dict[int, dict[str, Any]] = {}

    def attempt(i: int) -> bool:
        r = compile_one(run_file, f"{chip}:{slices[i]}", FRUGAL)
        tried.append(f"{slices[i]}:{'fits' if r.get('fits') else 'no'}")
        fits_at[i] = r
        return bool(r.get("fits"))

    if chip.startswith("v"):  # TPU: a refusal is quick, so smallest first
        found = next((i for i in range(len(slices)) if attempt(i)), None)
    else:  # GPU: every compile is whole, so bisect
        lo, hi = 0, len(slices)
        while lo < hi:
            mid = (lo + hi) // 2
            if attempt(mid):
                hi = mid
            else:
                lo = mid + 1
        found = lo if lo < len(slices) and fits_at.get(lo, {}).get("fits") else None
    report = fits_at[found] if found is not None else fits_at[max(fits_at)]
    return {**report, "chip": chip, "tried": tried}


def smallest_row(r: dict[str, Any]) -> str:
    """One markdown row of a --smallest result."""
    gib = 2**30
    tried = " ".join(r["tried"])
    if not r.get("fits"):
        return (f"| {r['run_file']} | {r['chip']} | none up to {SLICES[r['chip']][-1]} | | "
                f"{tried} |")
    mem = r["memory_per_device_bytes"]["total"]
    return (f"| {r['run_file']} | {r['chip']} | {r['target']} ({r['devices']} chips) | "
            f"{mem / gib:.2f} / {r['device_memory_bytes'] / gib:.2f} | {tried} |")


SMALLEST_HEADER = ("| run file | chip | smallest slice (remat full, fsdp over every chip) | GiB "
                   "per device (total / device) | compiled: slice:fits |\n|---|---|---|---|---|")


def row(r: dict[str, Any]) -> str:
    """One markdown table row of a report."""
    gib = 2**30
    if "memory_per_device_bytes" not in r:
        return f"| {r['run_file']} | {r['target']} | | | | | error | | {r['error'][:160]} |"
    mem, limit = r["memory_per_device_bytes"]["total"], r["device_memory_bytes"]
    mesh = ",".join(f"{k}={v}" for k, v in r["mesh"].items() if v > 1) or "1 device"
    flops = r.get("flops_per_device", {})
    tflop = (f"{flops['ours'] * r['devices'] / 1e12:.0f}" if flops.get("ours") else "")
    fits = "yes" if r["fits"] else "**no**"
    return (f"| {r['run_file']} | {r['target']} | {mesh} | {r['remat']} | {r['accum_steps']} | "
            f"{mem / gib:.2f} / {limit / gib:.2f} | {fits} | {r['compile_seconds']['compile']} | "
            f"{tflop} |")


HEADER = ("| run file | target | mesh | remat | accum | GiB per device (total / device) | fits | "
          "compile s | TFLOP per step (ours) |\n|---|---|---|---|---|---|---|---|---|")


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI (module docstring); 0 when every run file compiles and fits."""
    p = cli_help.Parser(prog="python -m xlm_jax.accelerator.compile.run_table", description=__doc__)
    p.add_argument("--jobs", type=int, default=2, help="compiles at once")
    p.add_argument("--only", default=None, help="a glob over run files, e.g. 'runs/xlme_*'")
    p.add_argument("--out", default=None, help="also write the table here")
    p.add_argument("--json", default=None, help="also write every report here, one JSON line "
                   "each as it comes; a rerun keeps the run files already there")
    p.add_argument("--smallest", action="store_true", help="the smallest slice of each chip "
                   "each run file fits on (module docstring), instead of the named targets")
    p.add_argument("--chips", default=",".join(SLICES), help="chips for --smallest")
    args = p.parse_args(argv)
    root = gin_root()
    files = run_files(root, args.only)
    if args.smallest:
        chips = [c for c in args.chips.split(",") if c]
        unknown = [c for c in chips if c not in SLICES]
        if unknown:
            print(f"error: --chips {args.chips!r}: unknown {unknown}; known: {', '.join(SLICES)}",
                  file=sys.stderr)
            return 2
        t0 = time.perf_counter()
        pairs = [(f, c) for f in files for c in chips]
        with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
            reports = list(pool.map(lambda fc: {**smallest(*fc), "run_file": fc[0]}, pairs))
        wall = time.perf_counter() - t0
        table = "\n".join([SMALLEST_HEADER] + [smallest_row(r) for r in reports])
        table += f"\n\n{len(pairs)} searches in {wall / 60:.1f} min ({args.jobs} at once)\n"
        return _emit(table, reports, args, 0)
    todo = [(f, named_target(root, f)) for f in files]
    missing = [f for f, t in todo if t is None]
    if missing:
        print(f"error: {', '.join(missing)}: no '# compile target:' line (nor in an included "
              "run file)", file=sys.stderr)
        return 2
    done = _done(args.json)
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        reports = list(pool.map(
            lambda ft: done.get(ft[0]) or _kept(compile_one(ft[0], ft[1], []), args.json), todo))
    wall = time.perf_counter() - t0
    table = "\n".join([HEADER] + [row(r) for r in reports])
    table += f"\n\n{len(reports)} run files in {wall / 60:.1f} min ({args.jobs} at once)\n"
    return _emit(table, reports, args, 0 if all(r.get("fits") for r in reports) else 1)


def _done(path: str | None) -> dict[str, dict[str, Any]]:
    """The reports a previous run wrote to `path` (JSON lines), by run file."""
    if not path or not os.path.exists(path):
        return {}
    with open(path) as f:
        reports = [json.loads(line) for line in f if line.strip()]
    # the last report of each run file, unless its process was killed (that one runs again)
    return {r["run_file"]: r for r in reports
            if "run_file" in r and "chip" not in r and r.get("exit", 0) >= 0}


def _kept(report: dict[str, Any], path: str | None) -> dict[str, Any]:
    """Appends `report` to `path` (JSON lines) at once, so that a killed run keeps it."""
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(report) + "\n")
    return report


def _emit(table: str, reports: list[dict[str, Any]], args: argparse.Namespace, code: int) -> int:
    """Prints the table, writes --out and --json; returns `code`."""
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    if args.json and args.smallest:
        with open(args.json, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in reports)
    return code


if __name__ == "__main__":
    sys.exit(main())
