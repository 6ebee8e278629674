"""Modules a test writes into its temporary directory, importable for a block and forgotten
after it.

A tasks module a test writes (`prep_tasks.py`, `my_tasks.py`, ...) is bound to that test's
files when imported. Left in `sys.modules`, the next test that imports the same name gets the
first test's module and reads the first test's corpus, which may be gone by then (issue 56:
a fresh clone failed when `inspect_test` ran before `prepare_test` on one worker). The leak
check (`process_state`, "modules imported from a temporary directory") fails a test that
leaves one imported; `importable` is how a test avoids it.
"""
from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator


def _under(module: object, directory: str) -> bool:
    path = getattr(module, "__file__", None)
    return isinstance(path, str) and os.path.abspath(path).startswith(directory)


@contextlib.contextmanager
def importable(directory: str) -> Iterator[None]:
    """`directory` first on `sys.path` for the block (unless it is there already); after it,
    `sys.path` as before and every module imported from `directory` forgotten (`sys.modules`
    as before the block for those names)."""
    root = os.path.abspath(directory)
    prefix = os.path.join(root, "")  # a sibling folder whose name starts alike is not under it
    before = {name: m for name, m in list(sys.modules.items()) if _under(m, prefix)}
    added = root not in sys.path
    if added:
        sys.path.insert(0, root)
    try:
        yield
    finally:
        if added:
            sys.path.remove(root)
        for name, module in list(sys.modules.items()):
            if _under(module, prefix) and before.get(name) is not module:
                del sys.modules[name]
        sys.modules.update(before)
