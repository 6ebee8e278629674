"""The order in which `make test`'s two workers take the test files: the longest first, in a
random order that keeps that (`weighted_random`).

pytest-xdist's `--dist loadfile` hands each worker one file at a time, in the collection's order
when `--no-loadscope-reorder` is given (by default it puts the files with the most tests first,
which sends the slowest files of this suite, a few long subprocess tests each, to the end,
where one worker runs them while the other has nothing left). Longest-first list scheduling
ends both workers close together. The seconds per file come from a measured run
(`tests/file_seconds.json`); a file that is not in it (a new one) counts as the median file.

Issue 56 made the order random: no test may pass only because another file ran before it, or
fail only because one did (`tests/testlib/leak_check.py` catches the state that makes that
happen; a random order catches what it does not compare). `weighted_random` draws an order in
which file A comes before file B with probability w_A / (w_A + w_B), w the measured seconds
(the Efraimidis-Spirakis weighted permutation): any order can come, and the long files still
come early. Simulated on the measured table (2 workers, 2000 seeds): the makespan is within 2 s
of longest-first's at the 99th percentile, against +45 s for a uniform shuffle, so `make test`
pays nothing for it. `shuffle` (uniform) is for `make test-isolation`, where more pairs of
files meet in both orders and the wall time matters less.

Refresh the table after a change that moves the suite's time a lot: `make test` with
`--file-seconds` (every run prints its 15 slowest files at the end), or from a log (the
standard library only):

    .venv/bin/python -m pytest -q -n 2 --dist loadfile --file-seconds=tests/file_seconds.json
    .venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=0 > durations.log
    python -m tests.testlib.schedule durations.log
"""
from __future__ import annotations

import json
import math
import os
import random
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


ORDERS = ("weighted", "shuffle", "longest", "given")


def weighted_random(files: Sequence[str], seconds: dict[str, float], seed: int) -> list[str]:
    """`files` in a random order where a file's chance to come before another is proportional
    to its measured seconds (unmeasured: the median; 0.1 s at least, so every order can come):
    sorted by exponential clocks `-ln(U) / w`."""
    default = statistics.median(seconds.values()) if seconds else 1.0
    rng = random.Random(seed)
    clocks = {f: -math.log(1.0 - rng.random()) / max(seconds.get(f, default), 0.1)
              for f in sorted(files)}  # the draws by name: the order the files came in is not
    # the same in every process (xdist's workers must collect one order)
    return sorted(files, key=clocks.__getitem__)


def order(files: Sequence[str], seconds: dict[str, float], how: str, seed: int) -> list[str]:
    """The files in the order `how` names (`ORDERS`): `weighted` (`weighted_random`),
    `shuffle` (uniform), `longest` (`longest_first`) or `given` (as collected: the command
    line's order, to run two files one after the other in either order)."""
    if how == "weighted":
        return weighted_random(files, seconds, seed)
    if how == "shuffle":
        out = sorted(files)
        random.Random(seed).shuffle(out)
        return out
    if how == "longest":
        return longest_first(files, seconds)
    if how == "given":
        return list(files)
    raise ValueError(f"file order {how!r}: one of {', '.join(ORDERS)}")


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
    write_table(seconds)
    print(f"{TABLE}: {len(seconds)} files, {sum(seconds.values()):.0f} s")
    return 0


def write_table(seconds: dict[str, float], path: str = TABLE) -> None:
    """{test file: seconds} as JSON, sorted, to a tenth of a second (`file_seconds` reads it)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump({k: round(v, 1) for k, v in sorted(seconds.items())}, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
