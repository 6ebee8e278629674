"""`make pins`: resolves the project's dependencies for each target (`pins.TARGETS`) with pip and
writes `constraints/<target>.txt` (exact pins of the whole resolution) and
`constraints/metadata.json` (every pinned distribution's Requires-Dist, for the offline check
in tests/constraints_test.py).

    python constraints/generate.py                   # keep the current pins, add/drop what setup.py changed
    python constraints/generate.py --upgrade         # everything to the newest release that resolves
    python constraints/generate.py --upgrade NAME... # those distributions to the newest
    python constraints/generate.py --hold FILE       # hold the pins of FILE (e.g. `pip freeze`) instead

Each resolution is `pip install --dry-run --ignore-installed --report`: pip reads the
registries' separate metadata files (PEP 658), so nothing is installed and no large wheel (the
CUDA set is 5.8 GB) is downloaded. What it holds is a constraint file made of
`constraints/base.txt` (the JAX release the project runs on, written by hand: our choice to
move JAX on purpose only) and, unless upgraded, the target's current pins, so that rerunning
changes nothing that setup.py did not change. The three targets resolve in parallel.

pip resolves for the interpreter that runs it, so this runs on Linux x86_64 with CPython 3.11
(what the pins are for); `--platform` would refuse the source-only distributions some of the
dependencies are (crcmod, docopt). The CPU build of torch must be reachable by pip (the
Makefile's torch install takes it from pip's configured indexes); a resolution that picked a
CUDA build of torch for cpu/tpu is refused, as the test extra's torch is the CPU one.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pins  # noqa: E402  pylint: disable=g-import-not-at-top

from packaging.requirements import Requirement  # noqa: E402
from packaging.utils import canonicalize_name  # noqa: E402

REPO_ROOT = os.path.dirname(pins.HERE)
BASE = os.path.join(pins.HERE, "base.txt")
# The targets whose test extra installs torch, which must be the CPU build there.
CPU_TORCH_TARGETS = ("cpu", "tpu")


def _host_error() -> str | None:
    """Why this interpreter cannot resolve for the pinned platform, or None."""
    here = (sys.platform, platform.machine(), sys.implementation.name,
            f"{sys.version_info[0]}.{sys.version_info[1]}")
    want = ("linux", "x86_64", "cpython", pins.PYTHON)
    if here != want:
        return (f"generate.py resolves for the interpreter running it and the pins are for "
                f"{'/'.join(want)}; this is {'/'.join(here)}")
    return None


def _holds(target: str, hold_file: str | None, upgrade: list[str] | None) -> dict[str, str]:
    """The pins one resolution is held to: base.txt over the target's current pins (or
    `hold_file`'s), less the upgraded ones (`upgrade == []`: all but base.txt)."""
    base = pins.read_pins(BASE)
    source = hold_file or pins.pin_path(target)
    held = pins.read_pins(source) if os.path.exists(source) else {}
    if upgrade is not None:
        names = {canonicalize_name(n) for n in upgrade}
        held = {} if not names else {n: v for n, v in held.items() if n not in names}
    held.pop(canonicalize_name(pins.PROJECT), None)
    held.update(base)
    return held


def resolve(target: str, held: dict[str, str], workdir: str) -> dict:
    """pip's installation report for `.[extras]` of `target` under the `held` constraints."""
    constraint = os.path.join(workdir, f"{target}.hold.txt")
    with open(constraint, "w") as f:
        f.write("".join(f"{n}=={v}\n" for n, v in sorted(held.items())))
    report = os.path.join(workdir, f"{target}.report.json")
    cmd = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
           "--disable-pip-version-check", "--report", report, "-c", constraint,
           f".[{','.join(pins.TARGETS[target])}]"]
    res = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    if res.returncode != 0:
        tail = " | ".join(line.strip() for line in res.stderr.strip().splitlines()[-6:])
        raise RuntimeError(f"{target}: pip could not resolve (a held pin may conflict with "
                           f"setup.py: rerun with --upgrade NAME): {tail}")
    with open(report) as f:
        return json.load(f)


def _torch_error(target: str, packages: dict[str, dict[str, list[str]]],
                 found: dict[str, str], env: dict[str, str]) -> str | None:
    """A CUDA build of torch in a target whose torch is the CPU build, or None."""
    version = found.get("torch")
    if target not in CPU_TORCH_TARGETS or version is None:
        return None
    for text in packages["torch"][version]:
        req = Requirement(text)
        if (canonicalize_name(req.name).startswith("nvidia-")
                and (req.marker is None or req.marker.evaluate(dict(env, extra="")))):
            return (f"{target}: pip resolved a CUDA build of torch {version} (it requires "
                    f"{req.name}); make the CPU build reachable to pip and rerun")
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python constraints/generate.py",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--upgrade", nargs="*", default=None, metavar="NAME",
                   help="resolve these distributions (none named: all) to the newest release")
    p.add_argument("--hold", default=None, metavar="FILE",
                   help="hold the name==version lines of FILE instead of the current pins")
    p.add_argument("--targets", nargs="+", default=list(pins.TARGETS), choices=list(pins.TARGETS))
    args = p.parse_args(argv)
    error = _host_error()
    if error:
        print(f"generate.py: error: {error}", file=sys.stderr)
        return 2
    start = time.monotonic()
    env = pins.marker_env(platform.python_version())
    old = pins.load_metadata() if os.path.exists(pins.METADATA) else {"packages": {},
                                                                      "targets": {}}
    with tempfile.TemporaryDirectory() as workdir, \
            concurrent.futures.ThreadPoolExecutor(len(args.targets)) as pool:
        jobs = {t: pool.submit(resolve, t, _holds(t, args.hold, args.upgrade), workdir)
                for t in args.targets}
        try:
            reports = {t: job.result() for t, job in jobs.items()}
        except RuntimeError as e:
            print(f"generate.py: error: {e}", file=sys.stderr)
            return 1
    packages: dict[str, dict[str, list[str]]] = {}
    targets = {t: old["targets"][t] for t in pins.TARGETS
               if t not in args.targets and t in old["targets"]}
    resolved: dict[str, dict[str, str]] = {}
    for target, report in reports.items():
        found = {}
        for item in report["install"]:
            meta = item["metadata"]
            name = canonicalize_name(meta["name"])
            version = meta["version"].split("+", 1)[0]
            if name == canonicalize_name(pins.PROJECT):
                targets[target] = {"extras": list(pins.TARGETS[target]),
                                   "requires": sorted(meta.get("requires_dist", []))}
                continue
            found[name] = version
            packages.setdefault(name, {})[version] = sorted(meta.get("requires_dist", []))
        error = _torch_error(target, packages, found, env)
        if error:
            print(f"generate.py: error: {error}", file=sys.stderr)
            return 1
        resolved[target] = found
    # keep the metadata of the targets not regenerated this time
    for target in set(pins.TARGETS) - set(args.targets):
        if os.path.exists(pins.pin_path(target)):
            for name, version in pins.read_pins(pins.pin_path(target)).items():
                meta = old["packages"].get(name, {}).get(version)
                if meta is not None:
                    packages.setdefault(name, {})[version] = meta
    for target, found in resolved.items():
        problems = pins.check(found, targets[target]["requires"], targets[target]["extras"],
                              packages, env)
        if problems:
            print(f"generate.py: error: {target}: {problems[0]} ({len(problems)} problems)",
                  file=sys.stderr)
            return 1
    for target, found in resolved.items():
        before = pins.read_pins(pins.pin_path(target)) if os.path.exists(
            pins.pin_path(target)) else {}
        pins.write_pins(pins.pin_path(target), target, found)
        changed = sorted(n for n in set(found) | set(before) if found.get(n) != before.get(n))
        print(f"{target}: {len(found)} pins, {len(changed)} changed"
              + (f" ({', '.join(changed[:8])}{', ...' if len(changed) > 8 else ''})"
                 if changed else ""))
    with open(pins.METADATA, "w") as f:
        json.dump({"python_full_version": platform.python_version(),
                   "targets": dict(sorted(targets.items())),
                   "packages": {n: dict(sorted(v.items())) for n, v in sorted(packages.items())}},
                  f, indent=0, sort_keys=False, separators=(",", ":"))
        f.write("\n")
    print(f"generate.py: {len(resolved)} targets in {time.monotonic() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
