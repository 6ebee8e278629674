"""The suite's file order (tests/testlib/schedule.py): longest first from the measured table,
which names only files that exist, or a random order drawn from a seed that keeps the long
files early; the conftest applies it and prints the seed; the parser that refreshes the
table."""
import glob
import os
import subprocess
import sys

from tests.testlib import schedule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_longest_first_puts_an_unmeasured_file_at_the_median():
    seconds = {"a.py": 1.0, "b.py": 30.0, "c.py": 5.0}
    assert schedule.longest_first(["a.py", "new.py", "c.py", "b.py"], seconds) == [
        "b.py", "new.py", "c.py", "a.py"]  # new.py counts 5.0 and keeps its place before c.py


def test_durations_report_rows_are_summed_per_file():
    report = ["============ slowest durations ============",
              "12.50s call     tests/x_test.py::test_one[p-1]",
              "2.25s setup    tests/x_test.py::test_one[p-1]",
              "0.75s teardown tests/y/z_test.py::test_two",
              "(3 durations < 0.005s hidden.)"]
    assert schedule.parse_durations(report) == {"tests/x_test.py": 14.75,
                                                "tests/y/z_test.py": 0.75}


def test_the_table_names_existing_test_files_and_the_conftest_applies_it(request):
    table = schedule.file_seconds()
    files = {os.path.relpath(p, ROOT)
             for p in glob.glob(os.path.join(ROOT, "tests", "**", "*_test.py"), recursive=True)}
    assert table and set(table) <= files, sorted(set(table) - files)
    # This session's items are grouped by file, in the order its seed draws.
    order = list(dict.fromkeys(os.path.relpath(str(i.path), ROOT)
                               for i in request.session.items))
    how = request.config.getoption("file_order")
    seed = getattr(request.config, "workerinput", {}).get(
        "file_order_seed", request.config.getoption("file_order_seed"))
    assert order == schedule.order(order, table, how, seed)


def test_a_seed_draws_one_order_and_another_seed_another():
    files = [f"f{i}.py" for i in range(40)]
    seconds = {f: float(i + 1) for i, f in enumerate(files)}
    a = schedule.weighted_random(files, seconds, 1)
    assert a == schedule.weighted_random(files, seconds, 1) and sorted(a) == sorted(files)
    assert a != schedule.weighted_random(files, seconds, 2)
    assert schedule.order(files, seconds, "shuffle", 3) == schedule.order(files, seconds,
                                                                           "shuffle", 3)
    assert schedule.order(files, seconds, "given", 3) == files
    assert schedule.order(files, seconds, "longest", 3) == files[::-1]


def test_the_weighted_order_keeps_the_long_files_early_but_not_always_first():
    """A file comes before another with probability w / (w + w'): over 2000 seeds the 40-s file
    precedes the 1-s one about 40/41 of the time, and follows it sometimes."""
    seconds = {"long.py": 40.0, "short.py": 1.0}
    first = [schedule.weighted_random(list(seconds), seconds, s)[0] for s in range(2000)]
    assert 0.95 < first.count("long.py") / 2000 < 0.99


def test_the_seed_is_printed_and_the_same_seed_collects_the_same_order():
    def collect(*args: str) -> list[str]:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:xdist",
             "tests/schedule_test.py", "tests/structure_test.py", "tests/cli_table_test.py",
             *args], cwd=ROOT, capture_output=True, text=True, timeout=120).stdout
        return [line for line in out.splitlines() if "::" in line or "file order" in line]

    first = collect("--file-order=shuffle", "--file-order-seed=7")
    assert "file order: shuffle, seed 7 (the same order again: --file-order=shuffle " \
           "--file-order-seed=7)" in first
    assert first == collect("--file-order=shuffle", "--file-order-seed=7")
    drawn = collect("--file-order=shuffle")
    assert any(line.startswith("file order: shuffle, seed ") for line in drawn)
