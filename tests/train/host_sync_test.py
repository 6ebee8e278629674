"""The training loop reads the device only at log, save and eval steps: between them the
metrics stay on the device (one fetch per window), and the losses still cover every step.
(The NaN stop between log steps is in trainer_test.py.)

On a GPU or TPU, jax's transfer guard sees every device-to-host copy and the second test uses
it; on the CPU backend a device buffer is host memory and the guard sees no transfer, so the
first test checks the loop's one fetch point instead."""
import jax
import pytest

from testlib.tiny_run import train_tiny as _train
from xlm_jax.train import actions


def test_metrics_are_fetched_once_per_log_window(tmp_path, monkeypatch):
    fetched = []
    real = actions.read_metrics

    def record(pending, *args):
        fetched.append([step for step, _ in pending])
        return real(pending, *args)

    monkeypatch.setattr(actions, "read_metrics", record)
    result = _train(tmp_path / "run", 8, log_every=4)
    # a loop that read every step's metrics would fetch 8 times, one step each
    assert fetched == [[1, 2, 3, 4], [5, 6, 7, 8]]
    reference = _train(tmp_path / "ref", 8)  # log_every = 1: the host waits for every step
    assert len(result.losses) == 8 and result.losses == reference.losses


@pytest.mark.skipif(jax.default_backend() == "cpu",
                    reason="the transfer guard sees no device-to-host copy on the CPU backend")
def test_no_device_to_host_transfer_between_log_steps(tmp_path):
    class Guard(actions.Action):
        def __call__(self, end, state):  # after step `end.step`, before the next
            level = "allow" if (end.step + 1) % 4 == 0 else "disallow"
            jax.config.update("jax_transfer_guard_device_to_host", level)

    try:
        result = _train(tmp_path / "run", 8, log_every=4, actions=[Guard()])
    finally:
        jax.config.update("jax_transfer_guard_device_to_host", "allow")
    assert len(result.losses) == 8
