"""The step loop runs with the objects alive after its first step frozen out of Python's
collector (`train.host_gc`): a full collection there stalled an H200's dispatch for 168 ms."""
import gc

from testlib.tiny_run import train_tiny as _train
from xlm_jax.train import actions, host_gc


class _Cycle:
    def __init__(self):
        self.me = self


def test_freeze_collects_then_freezes_once_and_leaving_puts_back():
    gc.collect()
    assert host_gc.frozen_count() == 0
    kept = _Cycle()
    with host_gc.FrozenHeap() as heap:
        assert host_gc.frozen_count() == 0  # nothing until the loop asks
        garbage = _Cycle()
        del garbage  # a reference cycle: only the collector frees it
        frozen = heap.freeze()
        assert frozen > 0 and host_gc.frozen_count() > 0
        # the cycle was collected before the freeze; the live one is frozen: a full
        # collection no longer visits it
        assert not any(type(o) is _Cycle and o is not kept for o in gc.get_objects())
        assert gc.is_tracked(kept) and not any(o is kept for o in gc.get_objects())
        assert heap.freeze() == frozen  # once
    assert host_gc.frozen_count() == 0
    assert any(o is kept for o in gc.get_objects())
    with host_gc.FrozenHeap(enabled=False) as heap:
        assert heap.freeze() == 0 and host_gc.frozen_count() == 0


def test_a_caller_s_own_freeze_is_left_frozen():
    # Frozen objects stay frozen, but one freed by its reference count leaves the permanent
    # generation and lowers the count: the count is no fixed point (a CI run saw 1 fewer),
    # so the test follows objects, not counts.
    mine = _Cycle()  # frozen by the caller, before the loop's context
    gc.freeze()
    try:
        assert not any(o is mine for o in gc.get_objects())
        with host_gc.FrozenHeap() as heap:
            ours = _Cycle()  # alive when the loop freezes
            assert heap.freeze() > 0
            assert not any(o is mine or o is ours for o in gc.get_objects())
        # the caller had frozen objects: leaving unfreezes nothing, the caller's nor the loop's
        assert not any(o is mine or o is ours for o in gc.get_objects())
        assert host_gc.frozen_count() > 0
    finally:
        gc.unfreeze()
    assert any(o is mine for o in gc.get_objects())


def test_the_interpreter_s_own_frozen_objects_do_not_keep_the_loop_s_frozen(monkeypatch):
    """CPython 3.12 counts its immortal objects as frozen (375 in 3.12.1) once a collection
    has met them; the loop's context took any count above 0 for a caller's freeze and left its
    own objects frozen for good (found on 3.12: 1.4M objects frozen by the time a later test
    ran). Played on any Python by objects frozen before, their count taken as the
    interpreter's, as `host_gc` takes the count it finds at import."""
    gc.collect()
    own = _Cycle()  # stands for the interpreter's immortal objects
    gc.freeze()
    try:
        monkeypatch.setattr(host_gc, "INTERPRETER_FROZEN", gc.get_freeze_count())
        assert host_gc.frozen_count() == 0
        with host_gc.FrozenHeap() as heap:
            ours = _Cycle()  # alive when the loop freezes
            assert heap.freeze() > 0 and host_gc.frozen_count() > 0
            assert not any(o is ours for o in gc.get_objects())
        assert any(o is ours for o in gc.get_objects())  # back under the collector
        assert host_gc.frozen_count() == 0
    finally:
        gc.unfreeze()
    assert any(o is own for o in gc.get_objects())


class _FreezeCount(actions.Action):
    def __init__(self):
        self.seen = []

    def __call__(self, end, state):
        self.seen.append(host_gc.frozen_count())


def test_the_step_loop_runs_frozen_from_its_first_step_and_leaves_nothing_frozen(tmp_path):
    on, off = _FreezeCount(), _FreezeCount()
    result = _train(tmp_path / "on", 3, actions=[on], gc_freeze=True)
    assert host_gc.frozen_count() == 0
    reference = _train(tmp_path / "off", 3, actions=[off], gc_freeze=False)
    assert len(on.seen) == 3 and min(on.seen) > 10_000  # jax, flax, the compiled step
    assert off.seen == [0, 0, 0]
    assert result.losses == reference.losses  # the collector changes no number
