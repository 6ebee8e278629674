"""Trainer actions for tests run through the CLI (bound in gin files as
`loop.train.actions = [@hooks.StallAt()]`; see `xlm_jax.train.actions`)."""
from __future__ import annotations

import time

from xlm_jax.train import actions


class StallAt(actions.Action):
    """After step `at` and its checkpoint are written, sleep forever: the process is parked
    at a known point for a test to SIGKILL it."""

    def __init__(self, at: int = 10):
        self.at = at

    def __call__(self, end: actions.StepEnd, state: object) -> None:
        if end.step == self.at:
            end.wait_for_checkpoints()
            while True:
                time.sleep(60)


class Pace(actions.Action):
    """Sleeps after every step: a tiny run lasts long enough for a test to signal it while
    it trains (the signal then arrives at a step the test does not choose)."""

    def __init__(self, seconds: float = 0.3):
        self.seconds = seconds

    def __call__(self, end: actions.StepEnd, state: object) -> None:
        time.sleep(self.seconds)
