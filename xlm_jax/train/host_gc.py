"""Python's garbage collector kept off the step loop's critical path.

A training process holds a few hundred thousand long-lived Python objects (jax, flax, gin,
the traced and compiled step, TensorFlow where the data needs it). CPython's oldest-generation
collection walks all of them: on an H200 host one such collection during the timed steps of
`accelerator.bench` took 168 ms (docs/performance.md, "Measured after the changes"), during
which the host dispatched nothing and the GPU, 43.5 ms a step, sat idle for three steps' worth
of time. On the 2-core development machine a full collection of the bench's process takes
0.2-0.5 s.

`FrozenHeap.freeze()` (the loop calls it once the first step has compiled and been
dispatched, when the objects the compile left are alive) collects once and then
`gc.freeze()`s what survived: the collector no longer visits those objects (they are neither
freed nor moved), so a later collection walks only what the steps themselves create. The same
remedy is Python's own advice for long-lived processes (the `gc.freeze` documentation) and
what large trainers do in their own ways (Megatron-LM's `--manual-gc`). On leaving, the
objects go back under the collector (`gc.unfreeze`), so that a process that trains twice (the
tests, a notebook) is left as it was. Our choice, on by default: `loop.train.gc_freeze=False`
turns it off.

CPython 3.12 counts its immortal objects (375 in 3.12.1) in `gc.get_freeze_count()` once a
collection has met them, although nobody froze them; the count this module finds at import is
taken as the interpreter's own, and only a count above it means a caller froze objects.
Objects a caller froze before this module was imported are therefore taken for the
interpreter's and unfrozen with the loop's (the milder mistake: the other one, on 3.12, left
every loop's objects frozen for good in a process that trains again).
"""
from __future__ import annotations

import gc
from typing import Any

# The freeze count before anything of ours: CPython 3.12's immortal objects, 0 on 3.11.
INTERPRETER_FROZEN = gc.get_freeze_count()


def frozen_count() -> int:
    """Objects frozen out of the collector, less the interpreter's own (module docstring)."""
    return max(0, gc.get_freeze_count() - INTERPRETER_FROZEN)


class FrozenHeap:
    """A context for the step loop: `freeze()` freezes the live objects once (collecting
    first); leaving puts them back under the collector unless the caller had frozen objects
    before (those stay frozen, with the ones added here)."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.frozen = 0  # objects frozen by `freeze()`
        self._before = 0

    def __enter__(self) -> FrozenHeap:
        self._before = frozen_count()
        return self

    def freeze(self) -> int:
        """Collects, then freezes every live object (once); returns how many were frozen."""
        if self.enabled and not self.frozen:
            gc.collect()
            gc.freeze()
            self.frozen = max(1, frozen_count() - self._before)
        return self.frozen

    def __exit__(self, *exc: Any) -> None:
        if self.frozen and self._before == 0:
            gc.unfreeze()
