"""The suite's file order (tests/testlib/schedule.py): longest first from the measured table,
which names only files that exist, and the parser that refreshes it."""
import glob
import os

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
    # This session's items are grouped by file, longest measured file first.
    order = list(dict.fromkeys(os.path.relpath(str(i.path), ROOT)
                               for i in request.session.items))
    assert order == schedule.longest_first(order, table)
