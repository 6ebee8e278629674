"""Runs every test file alone, each in a pytest process of its own, `--jobs` at a time (the
standard library only): a file that passes only after another file has prepared the process
for it fails here. `make test-isolation` runs it after the whole suite in a shuffled order.

    python -m tests.testlib.each_file --jobs 2 [FILE ...]

Prints one line per file (exit status, seconds, pytest's summary line) as they finish, the
failures again at the end, and exits 1 if any file failed. pytest's exit status 5 (no test
collected) is a failure too: a file that collects nothing tests nothing.
"""
from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_files(root: str = ROOT) -> list[str]:
    """Every `*_test.py` under tests/, relative to the repository, sorted."""
    pattern = os.path.join(root, "tests", "**", "*_test.py")
    return sorted(os.path.relpath(p, root) for p in glob.glob(pattern, recursive=True))


def run_one(path: str, pytest_args: Sequence[str]) -> tuple[str, int, float, str]:
    """(path, exit status, seconds, the last line of pytest's output plus, on failure, the
    lines that name failures)."""
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:xdist",
                           *pytest_args, path], cwd=ROOT, capture_output=True, text=True)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    summary = lines[-1] if lines else "(no output)"
    if proc.returncode:
        named = [ln for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
        summary = "\n    ".join([summary] + named[:20])
    return path, proc.returncode, time.monotonic() - start, summary


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", help="test files (default: all)")
    parser.add_argument("--jobs", type=int, default=2, help="files run at once (default 2)")
    parser.add_argument("--pytest-args", default="",
                        help="extra pytest arguments, one string (e.g. '-m \"not slow\"')")
    args = parser.parse_args(argv)
    files = args.files or test_files()
    extra = args.pytest_args.split()
    failed: list[tuple[str, int, str]] = []
    start = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        futures = [pool.submit(run_one, f, extra) for f in files]
        for n, future in enumerate(as_completed(futures), 1):
            path, code, seconds, summary = future.result()
            print(f"[{n}/{len(files)}] {path}: exit {code}, {seconds:.0f} s: {summary}",
                  flush=True)
            if code:
                failed.append((path, code, summary))
    print(f"{len(files)} files alone in {time.monotonic() - start:.0f} s; "
          f"{len(failed)} failed", flush=True)
    for path, code, summary in sorted(failed):
        print(f"FAILED ALONE {path} (exit {code}): {summary}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
