"""`loop.train(after_step=...)` hooks for tests run through the CLI (bound in gin files)."""
from __future__ import annotations

import time
from collections.abc import Callable


def stall_at(step: int, wait_for_checkpoints: Callable[[], None], at: int = 10) -> None:
    """After step `at` and its checkpoint are written, sleep forever: the process is parked
    at a known point for a test to SIGKILL it."""
    if step == at:
        wait_for_checkpoints()
        while True:
            time.sleep(60)


def pace(step: int, wait_for_checkpoints: Callable[[], None], seconds: float = 0.3) -> None:
    """Sleeps after every step: a tiny run lasts long enough for a test to signal it while
    it trains (the signal then arrives at a step the test does not choose)."""
    del step, wait_for_checkpoints
    time.sleep(seconds)
