"""The step loop runs with the set-up's objects frozen out of Python's collector
(`train.host_gc`): a full collection there stalled an H200's dispatch for 168 ms."""
import gc

from testlib.tiny_run import train_tiny as _train
from xlm_jax.train import actions, host_gc


class _Cycle:
    def __init__(self):
        self.me = self


def test_frozen_heap_collects_freezes_and_puts_back():
    gc.collect()
    garbage = _Cycle()
    del garbage  # a reference cycle: only the collector frees it
    assert gc.get_freeze_count() == 0
    kept = _Cycle()
    with host_gc.frozen_heap() as frozen:
        # the cycle was collected before the freeze, so it is not among the frozen objects;
        # the live one is, and a full collection no longer visits it
        assert frozen > 0 and gc.get_freeze_count() > 0
        assert not any(type(o) is _Cycle and o is not kept for o in gc.get_objects())
        assert gc.is_tracked(kept) and not any(o is kept for o in gc.get_objects(2))
    assert gc.get_freeze_count() == 0
    assert any(o is kept for o in gc.get_objects())
    with host_gc.frozen_heap(enabled=False) as frozen:
        assert frozen == 0 and gc.get_freeze_count() == 0


def test_a_caller_s_own_freeze_is_left_frozen():
    gc.freeze()
    try:
        outer = gc.get_freeze_count()
        with host_gc.frozen_heap():
            assert gc.get_freeze_count() >= outer
        assert gc.get_freeze_count() >= outer > 0
    finally:
        gc.unfreeze()


class _FreezeCount(actions.Action):
    def __init__(self):
        self.seen = []

    def __call__(self, end, state):
        self.seen.append(gc.get_freeze_count())


def test_the_step_loop_runs_frozen_and_leaves_nothing_frozen(tmp_path):
    on, off = _FreezeCount(), _FreezeCount()
    result = _train(tmp_path / "on", 3, actions=[on])
    assert gc.get_freeze_count() == 0
    reference = _train(tmp_path / "off", 3, actions=[off], gc_freeze=False)
    assert len(on.seen) == 3 and min(on.seen) > 10_000  # jax, flax, the model: all frozen
    assert off.seen == [0, 0, 0]
    assert result.losses == reference.losses  # the collector changes no number
