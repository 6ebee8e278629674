"""pytest plugin: each test, and each test module with its module fixtures, leaves the process
as it found it, or fails naming what it left behind (`tests/testlib/process_state.py` says
what is compared, and why a module's first import may change it).

A leak is then put back, so that it fails the test that made it and no other. A test that
needs to change process state undoes it itself: `monkeypatch` (setenv, chdir, syspath_prepend,
setattr), `caplog`, the `gin_isolated` fixture for gin, a fixture that unregisters what it
registered. Session fixtures are not checked (they end with the process).
"""
from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.testlib import process_state

HINT = ("undo it in the test: monkeypatch (setenv, chdir, syspath_prepend), the gin_isolated "
        "fixture for gin, a fixture that removes what it registered, "
        "temp_modules.importable for a module written into tmp_path")


def check(what: str) -> Iterator[None]:
    """Opens a watch, runs the test or module, and fails if the state differs after it."""
    watch = process_state.open_watch()
    yield
    process_state.close_watch(watch)
    _, changes = watch.leaks()
    if not changes:
        return
    failed = process_state.put_back(changes)
    lines = process_state.describe(changes)
    if failed:
        lines += ["could not be put back (later tests may fail too):"] + failed
    pytest.fail(f"{what} left the process changed ({HINT}):\n  " + "\n  ".join(lines),
                pytrace=False)


@pytest.fixture(scope="module", autouse=True)
def _module_leaves_the_process_as_it_found_it(request: pytest.FixtureRequest) -> Iterator[None]:
    """Set up before the module's other module fixtures, so it is torn down after them."""
    yield from check(f"module {request.node.nodeid} (its module fixtures)")


@pytest.fixture(autouse=True)
def _test_leaves_the_process_as_it_found_it(request: pytest.FixtureRequest) -> Iterator[None]:
    """Set up before the test's other function fixtures, so `monkeypatch` has undone its
    changes when this one compares."""
    yield from check(request.node.nodeid)
