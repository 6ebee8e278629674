"""The first train step compiled on a thread of its own while the input pipelines are built.

A run's set-up builds its input streams and compiles its step, and neither needs the other:
the step compiles against the batches' shapes, dtypes and shardings, which the objectives'
kinds and the run's batch sizes fix (`setup.batch_specs` gives them), not against their
values. The streams of seqio mixtures are slow to build: every Task traces about a dozen
tf.data functions, ~0.2 s a Task on a 2-core CPU, so the demo's 77-language mixtures take
15-20 s each and a CC-100 mixture of 100 languages alike, plus the first batches. XLA's
compile, the larger part of a step's compile (12 s of the demo's 15 s on that CPU; 93 of
XLM-E base's 108 s on an H200), runs without Python's GIL, so on a second thread it takes
little from the pipelines' Python where a core is free. The loop therefore starts the
compile before it builds the streams (`start`), reads the first batches, and only then waits
for it (`result`); it does so where every stream is named (a seqio task or mixture, or a
synthetic stream), whose batches hold the features of their kinds, and not for stream
objects (fine-tuning's, with labels). Where every core is busy already (the demo's two runs
side by side on two cores) there is nothing to gain, and nothing is lost either
(docs/performance.md).

Exactly what the loop compiled before, or it says so: the compile is of the step's own
`jax.jit`, for the initial state's shapes, dtypes, weak types and shardings, the run's rng and
the abstract batches; the jit keeps the executable, so the first call runs it (the loop counts
the backend compiles of that call: 0). `result` compares the first call's arguments with
those compiled for (the real batches against the abstract ones, the state after the prefill
against the initial one); where they differ it compiles for the real ones as before and the
report says `compiled_ahead=False`: the compile ahead is dropped, also when it failed (a step
that reads a feature the abstract batches lack cannot be traced on them). Before device work
of its own ahead of the first step (XLCo's prefill, an eval at start, the initial save) the
loop waits for the compile: XLA's GPU autotuning times kernels on the device, which that
work would disturb. A failure of the compile of the very arguments of the first call is
raised by `result`, where the loop would have compiled; a failure while the streams are
built waits for the compile to end (a thread cannot be stopped, and the process must not
exit under a compiling XLA) and is then raised as it is: errors are the same, only later by
at most the compile's time.

What runs on the thread gets the run's trace-time context again (`partitioning.activate`:
the mesh and logical-axis rules, which jax and flax keep per thread); jax's config and gin's
bindings are process-wide. `loop.train.compile_ahead = False` compiles at the first step,
after the streams, as before.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax

from xlm_jax.train import compile_cache
from xlm_jax.train import partitioning


@dataclasses.dataclass(frozen=True)
class AheadReport:
    """The first step's compile, and whether the one made ahead was the one used."""

    compile: compile_cache.CompileReport  # the compile the first call runs
    compiled_ahead: bool  # made beside the streams' build (False: at the first step)
    waited_seconds: float  # how long the first step waited for it (0 when not ahead)


def _specs(*trees: Any) -> Any:
    """What a compile is for: each leaf's shape, dtype, weak type and sharding, by path."""
    return [(path, tuple(v.shape), str(v.dtype), bool(getattr(v, "weak_type", False)),
             v.sharding) for tree in trees
            for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]]


class CompileAhead:
    """Context manager of the loop: `start` the step's compile on a thread; `result` at the
    first step. Leaving the block (also by an exception) waits for the thread."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._thread: threading.Thread | None = None
        self._abstract: Any = None
        self._report: compile_cache.CompileReport | None = None
        self._error: BaseException | None = None

    def __enter__(self) -> "CompileAhead":
        return self

    def __exit__(self, *exc: Any) -> None:
        self._join()

    def start(self, step_fn: Any, state: Any, batches: Mapping[str, Mapping[str, Any]],
              rng: Any, mesh: jax.sharding.Mesh, rules: partitioning.Rules,
              cache_dir: str | None) -> None:
        """Compiles `step_fn(state, batches, rng)` on a thread; `batches` abstract
        (`jax.ShapeDtypeStruct`s with shardings), `state` and `rng` the run's own arrays. The
        thread gets the state as `jax.ShapeDtypeStruct`s (shape, dtype, weak type, sharding):
        the loop may donate its arrays (the prefill) while the compile runs. `rng` is never
        donated."""
        if not self.enabled:
            return
        state = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=a.sharding,
                                           weak_type=a.weak_type), state)
        self._abstract = _specs(state, batches, rng)

        def run() -> None:
            try:
                with partitioning.activate(mesh, rules):
                    self._report = compile_cache.compile_timed(step_fn, state, batches, rng,
                                                               cache_dir=cache_dir)
            except BaseException as e:  # raised in the loop's thread by `result`
                self._error = e

        self._thread = threading.Thread(target=run, name="xlm_jax-compile-ahead", daemon=True)
        self._thread.start()

    def result(self, step_fn: Any, state: Any, batches: Mapping[str, Mapping[str, Any]],
               rng: Any, cache_dir: str | None) -> AheadReport:
        """The first step's compile, for the real `batches`: the one made ahead when they match
        what it was made for, else a compile now (inside the loop's `partitioning.activate`)."""
        t0 = time.perf_counter()
        self._join()
        waited = time.perf_counter() - t0
        error, self._error = self._error, None
        if self._abstract is not None and self._abstract == _specs(state, batches, rng):
            if error is not None:  # the compile of these very arguments failed
                raise error
            return AheadReport(self._report, True, waited)
        # not started, or for other arguments (batches with features the synthetic ones of
        # their kind lack, which an objective may not even trace without): dropped, also when
        # it failed, and compiled for the real arguments, as without
        return AheadReport(compile_cache.compile_timed(step_fn, state, batches, rng,
                                                       cache_dir=cache_dir), False, 0.0)

    def wait(self) -> None:
        """Waits for the compile (its result or error stays for `result`): the loop calls it
        before device work of its own before the first step (the prefill, an eval at start, the
        initial save), so that nothing runs on the device while the compile does (on a GPU,
        XLA's autotuning times kernels on it)."""
        self._join()

    def _join(self) -> None:
        if self._thread is not None:
            self._thread.join()
            self._thread = None
