"""Every run file compiled on the target its header names, at its own batch and length.

  python -m xlm_jax.compile.run_table [--jobs 2] [--out table.md] [--only 'runs/xlme_*']

A run file names the slice it was sized for in a header line (our convention):

  # compile target: v5p:4x4x4

and sets the mesh, remat and accumulation that fit it as ordinary gin settings
(`loop.train.mesh`, `loop.model_config.remat`, `loop.train.accum_steps`); a file without the
line takes the one of the run file it includes. For each file this runs `python -m
xlm_jax.compile --target T --no_collectives` (in `--jobs` processes: XLA compiles on one
thread) and prints a markdown table: run file, target, mesh, remat, accumulation, memory per
device against the device's, fits, compile seconds, FLOPs per step. Exit 1 when any file does
not compile or fit.
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
    """`python -m xlm_jax.compile` for one run file; its JSON report (or the error line)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "report.json")
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "xlm_jax.compile", f"--gin_file={run_file}",
                               "--target", target, "--no_collectives", "--json", out, *extra],
                              capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if os.path.exists(out):
            with open(out) as f:
                report = json.load(f)
        else:
            lines = proc.stderr.strip().splitlines()
            report = {"error": lines[-1] if lines else f"exit {proc.returncode}"}
    return {**report, "run_file": run_file, "target": target, "exit": proc.returncode,
            "wall_seconds": round(wall, 1)}


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
    p = cli_help.Parser(prog="python -m xlm_jax.compile.run_table", description=__doc__)
    p.add_argument("--jobs", type=int, default=2, help="compiles at once")
    p.add_argument("--only", default=None, help="a glob over run files, e.g. 'runs/xlme_*'")
    p.add_argument("--out", default=None, help="also write the table here")
    p.add_argument("--json", default=None, help="also write every report here")
    args = p.parse_args(argv)
    root = gin_root()
    files = run_files(root, args.only)
    todo = [(f, named_target(root, f)) for f in files]
    missing = [f for f, t in todo if t is None]
    if missing:
        print(f"error: {', '.join(missing)}: no '# compile target:' line (nor in an included "
              "run file)", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max(1, args.jobs)) as pool:
        reports = list(pool.map(lambda ft: compile_one(ft[0], ft[1], []), todo))
    wall = time.perf_counter() - t0
    table = "\n".join([HEADER] + [row(r) for r in reports])
    table += f"\n\n{len(reports)} run files in {wall / 60:.1f} min ({args.jobs} at once)\n"
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            f.write(table)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=1)
    return 0 if all(r.get("fits") for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
