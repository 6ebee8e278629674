"""A block of code with gin to itself: everything gin holds for the process (registry,
bindings, operative config, scopes, search paths, ...) put back as it was after the block.

gin's `clear_config()` drops the bindings but not the registry: a class registered under a
test's own name (`gin.external_configurable(cls, module="x")`) stays gin's configurable for
that class, and a later gin file that names it by its module path finds no bindings for it
(issue 56). Parsing a run file registers its configurables (dynamic registration) and adds
search paths; calling a configurable (`loop.train`) records its arguments in the operative
config, which the trainer writes to operative_config.gin. Tests that do any of this run inside
`isolated()` (the `gin_isolated` fixture of tests/conftest.py). What a module's first import
registered inside the block (its `@gin.configurable` decorators) stays: the module stays
imported. The configuration is not cleared on entry: a module fixture may have parsed the
file its tests share.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tests.testlib import process_state


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Runs the block, then puts gin's state back as it was before it."""
    with process_state.restored("gin"):
        yield
