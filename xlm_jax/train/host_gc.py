"""Python's garbage collector kept off the step loop's critical path.

A training process holds a few hundred thousand long-lived Python objects (jax, flax, gin,
the traced model, TensorFlow where the data needs it). CPython's oldest-generation
collection walks all of them: on an H200 host one such collection during the timed steps
of `accelerator.bench` took 168 ms (docs/performance.md, "Measured after the changes"),
during which the host dispatched nothing and the GPU, 43.5 ms a step, sat idle for three
steps' worth of time. On the 2-core development machine a full collection of the bench's
process takes 0.2-0.5 s.

`frozen_heap()` collects once after set-up and then `gc.freeze()`s what survived: the
collector no longer visits those objects (they are neither freed nor moved), so a later
collection walks only what the steps themselves create. The same remedy is Python's own
advice for long-lived processes (the `gc.freeze` documentation) and what large trainers do
in their own ways (Megatron-LM's `--manual-gc`). On leaving, the objects go back under the
collector (`gc.unfreeze`), so that a process that trains twice (the tests, a notebook) is
left as it was. Our choice, on by default: `loop.train.gc_freeze=False` turns it off.
"""
from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[int]:
    """Collects, then freezes the surviving objects for the block; yields how many are
    frozen (0 when disabled). Objects frozen by the caller before stay frozen after."""
    if not enabled:
        yield 0
        return
    before = gc.get_freeze_count()
    gc.collect()
    gc.freeze()
    try:
        yield gc.get_freeze_count() - before
    finally:
        if before == 0:  # the caller froze nothing: put every object back
            gc.unfreeze()
