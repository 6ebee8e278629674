"""The order in which `make test`'s two workers take the test files: the longest first.

pytest-xdist's `--dist loadfile` hands each worker one file at a time, in the collection's order
when `--no-loadscope-reorder` is given (by default it puts the files with the most tests first,
which sends the slowest files of this suite, a few long subprocess tests each, to the end,
where one worker runs them while the other has nothing left). Longest-first list scheduling
ends both workers close together. The seconds per file come from a measured run
(`tests/file_seconds.json`); a file that is not in it (a new one) counts as the median file.

Refresh the table after a change that moves the suite's time a lot (the standard library only):

    .venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=0 > durations.log
    python -m tests.testlib.schedule durations.log
"""
from __future__ import annotations

import json
import os
import re
import statistics
import sys
from collections.abc import Sequence

TABLE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                     "file_seconds.json")
# One row of pytest's `--durations=0` report: "12.34s call     tests/x_test.py::test_y[p]".
DURATION_ROW = re.compile(r"^\s*([\d.]+)s (?:call|setup|teardown)\s+([^:\s]+)::")


def file_seconds(path: str = TABLE) -> dict[str, float]:
    """{test file relative to the repository: measured seconds} ({} when there is no table)."""
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as f:
        return {str(k): float(v) for k, v in json.load(f).items()}


def longest_first(files: Sequence[str], seconds: dict[str, float]) -> list[str]:
    """`files` by measured seconds, longest first; an unmeasured file counts as the median
    measured one; ties keep the given order."""
    default = statistics.median(seconds.values()) if seconds else 0.0
    return sorted(files, key=lambda f: -seconds.get(f, default))


def parse_durations(lines: Sequence[str]) -> dict[str, float]:
    """Seconds per test file summed over the rows of a `--durations=0` report."""
    out: dict[str, float] = {}
    for line in lines:
        m = DURATION_ROW.match(line)
        if m:
            out[m.group(2)] = out.get(m.group(2), 0.0) + float(m.group(1))
    return out


def main(argv: Sequence[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.testlib.schedule DURATIONS_LOG", file=sys.stderr)
        return 2
    with open(argv[0], encoding="utf-8") as f:
        seconds = parse_durations(f.readlines())
    if not seconds:
        print(f"error: {argv[0]}: no `--durations=0` rows", file=sys.stderr)
        return 1
    with open(TABLE, "w", encoding="utf-8") as f:
        json.dump({k: round(v, 1) for k, v in sorted(seconds.items())}, f, indent=1)
        f.write("\n")
    print(f"{TABLE}: {len(seconds)} files, {sum(seconds.values()):.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
