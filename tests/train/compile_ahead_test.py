"""The first step compiled on a thread beside the input's build (`train.compile_ahead`): the
executable compiled for abstract batches is the one the first call runs (no compile at the
call), the run's numbers are those of a compile at the first step, arguments that differ
from the abstract ones are compiled for at the first step, a failed compile is raised where
the loop waits for it, and only the compiling thread's events are counted."""
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from testlib.tiny_run import mlm_objectives
from testlib.tiny_run import train_tiny as _train
from xlm_jax.data.synthetic import synthetic_batches
from xlm_jax.train import compile_ahead as ahead_lib
from xlm_jax.train import compile_cache as cc
from xlm_jax.train import loop
from xlm_jax.train import partitioning
from xlm_jax.train import streams as streams_lib


def _mesh():
    return partitioning.make_mesh(partitioning.MeshConfig(data=-1), jax.devices()[:1])


def _threads():
    return [t for t in threading.enumerate() if t.name == "xlm_jax-compile-ahead"]


def test_the_run_compiled_ahead_equals_the_run_compiled_at_its_first_step(tmp_path):
    ahead = _train(tmp_path / "ahead", 3, objectives=mlm_objectives())
    at_step = _train(tmp_path / "at_step", 3, objectives=mlm_objectives(), compile_ahead=False)
    assert ahead.compiled_ahead and not at_step.compiled_ahead
    # the first call ran the executable compiled before it, both ways
    assert ahead.first_call_compiles == 0 and at_step.first_call_compiles == 0
    assert ahead.step_compile.compiled and at_step.step_compile.compiled
    assert ahead.losses == at_step.losses  # the same executable: bit-equal
    assert _threads() == []


def test_a_stream_object_is_compiled_for_at_its_first_step(tmp_path):
    """A stream object (fine-tuning's kind of stream) may carry features the synthetic batches
    of its kind do not: its run compiles at the first step, for the real batches, and trains
    as the plain stream does."""
    def with_extra(b, t, seed, start):
        for batch in synthetic_batches(b, t, 256, "mono", seed=seed, start_step=start):
            yield {**batch, "extra": np.zeros_like(batch["input_ids"])}

    plain = _train(tmp_path / "plain", 2, objectives=mlm_objectives(pair=False))
    specs = mlm_objectives(pair=False)
    specs["mmlm"] = loop.ObjectiveSpec(specs["mmlm"].factory, task=streams_lib.MemoryStream(
        with_extra, kind="mono", name="memory mono + extra"))
    other = _train(tmp_path / "other", 2, objectives=specs)
    assert plain.compiled_ahead and not other.compiled_ahead
    assert other.first_call_compiles == 0  # compiled for the real batches before the call
    np.testing.assert_allclose(other.losses, plain.losses, rtol=1e-6)


def test_an_executable_compiled_for_abstract_arguments_serves_the_real_call():
    """What the loop relies on (and counts at every run's first call): `jit.lower(abstract)
    .compile()` leaves the executable that a call with arrays of those shapes, dtypes and
    shardings runs; a call with another shape compiles."""
    mesh = _mesh()
    sharding = partitioning.batch_sharding(mesh, 2)
    f = jax.jit(lambda x, y: (x * 2 + y).sum())
    abstract = jax.ShapeDtypeStruct((4, 8), np.int32, sharding=sharding)
    report = cc.compile_timed(f, abstract, abstract, cache_dir=None)
    assert report.compiled
    x = jax.make_array_from_process_local_data(sharding, np.ones((4, 8), np.int32))
    with cc.CompileEvents() as first:
        assert int(f(x, x)) == 96
    assert first.count == 0
    y = jax.make_array_from_process_local_data(sharding, np.ones((4, 16), np.int32))
    with cc.CompileEvents() as other:
        f(y, y)
    assert other.count == 1


def test_counts_are_of_the_compiling_thread_only():
    f = jax.jit(lambda x: jnp.sin(x) * 3)
    g = jax.jit(lambda x: jnp.cos(x) * 5)
    x = jnp.ones((3,))
    with cc.CompileEvents() as here:
        t = threading.Thread(target=lambda: f.lower(x).compile())
        t.start()
        t.join()
    assert here.count == 0
    seen = []
    t = threading.Thread(target=lambda: seen.append(cc.compile_timed(g, x, cache_dir=None)))
    with cc.CompileEvents() as here:
        t.start()
        t.join()
        jax.jit(lambda x: x - 7).lower(x).compile()
    assert here.count == 1 and seen[0].compiled


def test_a_compile_that_fails_on_the_thread_fails_where_the_loop_waits():
    def bad(x, batches, rng):
        raise ValueError("no step for you")

    mesh = _mesh()
    x = jax.ShapeDtypeStruct((2,), np.float32)
    with ahead_lib.CompileAhead() as ahead:
        ahead.start(jax.jit(bad), x, {}, x, mesh, (), cache_dir=None)  # returns at once
        with pytest.raises(ValueError, match="no step for you"):
            ahead.result(jax.jit(bad), x, {}, x, cache_dir=None)
    assert _threads() == []


def test_a_compile_that_failed_for_other_arguments_is_dropped():
    """A step that reads a feature the abstract batches lack fails on the thread; the first
    step's real batches hold it, and the step is compiled for them without the error (the
    same holds for any compile ahead whose arguments turn out other than the first call's)."""
    def step(x, batches, rng):
        return x + batches["label"].sum()

    mesh = _mesh()
    x = jnp.ones((2,))
    with ahead_lib.CompileAhead() as ahead:
        ahead.start(jax.jit(step), x, {}, x, mesh, (), cache_dir=None)
        got = ahead.result(jax.jit(step), x, {"label": jnp.ones((3,))}, x, cache_dir=None)
    assert not got.compiled_ahead and got.compile.compiled
    assert _threads() == []


def test_leaving_by_an_error_waits_for_the_compile():
    """An error while the streams are built leaves the block only once the compile has
    ended: no thread compiles on while the error goes up (and the process exits)."""
    started, release = threading.Event(), threading.Event()

    def slow(x, batches, rng):
        started.set()
        release.wait(10)
        return x + 1

    mesh = _mesh()
    x = jax.ShapeDtypeStruct((2,), np.float32)
    with pytest.raises(RuntimeError, match="the streams failed"):
        with ahead_lib.CompileAhead() as ahead:
            ahead.start(jax.jit(slow), x, {}, x, mesh, (), cache_dir=None)
            started.wait(10)
            assert len(_threads()) == 1
            threading.Timer(0.3, release.set).start()
            raise RuntimeError("the streams failed")
    assert _threads() == []


def test_off_compiles_nothing_ahead():
    mesh = _mesh()
    f = jax.jit(lambda x, b, r: x + 1)
    x = jnp.ones((2,))
    with ahead_lib.CompileAhead(enabled=False) as ahead:
        ahead.start(f, x, {}, x, mesh, (), cache_dir=None)
        assert _threads() == []
        got = ahead.result(f, x, {}, x, cache_dir=None)
    assert not got.compiled_ahead and got.compile.compiled
