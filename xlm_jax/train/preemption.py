"""Preemption: SIGTERM stops the run at the next step boundary, after a checkpoint.

Cloud schedulers (TPU VMs, GKE, SLURM with `--signal`) send SIGTERM some seconds before they
take the machine away. The trainer then saves a checkpoint at the step it reached, finishes
writing it and returns normally (the CLI exits 0), and the next start resumes from it.

- One process: our own SIGTERM handler sets a flag that the loop reads after each step.
- Several processes: the hosts must stop at the same step, or their collectives and the
  checkpoint would hang. `jax.distributed` starts jax's preemption sync manager, which
  catches SIGTERM on any host and agrees on a step for all of them; orbax asks it
  (`CheckpointManager.reached_preemption`), and we do not install a handler that would
  replace jax's.
"""
from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any


class PreemptionWatch:
    """`reached(step)` is True once the run should save and stop (a context manager)."""

    def __init__(self, reached_sync_point: Callable[[int], bool], process_count: int) -> None:
        self._sync_point = reached_sync_point
        self._multi = process_count > 1
        self._signalled = False
        self._previous: Any = None

    def _handle(self, signum: int, frame: Any) -> None:
        del signum, frame
        self._signalled = True

    def __enter__(self) -> "PreemptionWatch":
        if not self._multi and threading.current_thread() is threading.main_thread():
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._previous is not None:
            signal.signal(signal.SIGTERM, self._previous)
            self._previous = None

    def reached(self, step: int) -> bool:
        """Asked after every step (the multi-process sync point must be asked at each)."""
        if self._multi:
            return bool(self._sync_point(step))
        return self._signalled
