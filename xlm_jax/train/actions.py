"""What a run does between its steps, as actions: logging, the objectives' health checks, the
evaluators (held-out loss, retrieval, the transfer probe, a user's own), checkpoints,
profiling, the operative config, and any action a user adds.

The loop (`loop.train`) calls every action after every step with a `StepEnd` and the state:
`action(end, state)`. Before that it asks each `action.due(end)` whether it needs the step's
metrics on the host; only then does the loop read the device (one transfer for all the steps
since the last read) and check the losses for NaN, so a run that logs every 100 steps waits
for the device every 100 steps (`tests/train/host_sync_test.py`). Actions run in list order:
the evaluators come before the checkpoint, which ranks checkpoints by their scores.

An action of one's own (a job's bookkeeping, an extra eval) is a class with `__call__(end,
state)` and, optionally, `due`, `before` (called before a step is dispatched) and `close`:
`loop.train.actions = [@my_module.MyAction()]` in gin. The base class `Action` gives the
no-op defaults. `metrics` in `StepEnd` are host floats per step; `scores` are the eval
scalars measured at this step, if any evaluator ran (an evaluator of one's own is better an
`Evaluator`: `train.evaluators`).
"""
from __future__ import annotations

import dataclasses
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import flax
import gin
import jax
import numpy as np

from xlm_jax import model_dir as md
from xlm_jax.train import checkpoints as ckpt_lib
from xlm_jax.train import data_state
from xlm_jax.train import evaluators as evaluators_lib
from xlm_jax.train import step_flops as flops_lib
from xlm_jax.train import health as health_lib
from xlm_jax.train import writers as writers_lib
from xlm_jax.train import step as step_lib
from xlm_jax.train.resume import ResumeInfo


@dataclasses.dataclass
class StepEnd:
    """What the loop knows after step `step` (steps done), handed to each action in turn."""

    step: int
    final: bool  # the run's last step: train_steps reached, or preempted
    preempted: bool  # SIGTERM: a checkpoint is written at this step, then the run stops
    saving: bool  # a checkpoint is written at this step
    tokens: int  # the step's non-pad input tokens, all processes
    wait_for_checkpoints: Callable[[], None]
    metrics: list[tuple[int, dict[str, float]]] = dataclasses.field(default_factory=list)
    scores: dict[str, float] | None = None  # the evaluators' scalars, when any ran here


class Action:
    """An action's protocol with no-op defaults (subclassing is optional)."""

    def before(self, step: int) -> None:
        """Called before step index `step` is dispatched."""

    def due(self, end: StepEnd) -> bool:
        """Whether this action needs the host metrics at `end.step`."""
        del end
        return False

    def __call__(self, end: StepEnd, state: Any) -> None:
        del end, state

    def close(self) -> None:
        """Called once after the last step."""


def read_metrics(pending: Sequence[tuple[int, Any]], objs: Sequence[step_lib.WeightedObjective],
                 ckpt: ckpt_lib.Checkpointer, model_dir: str
                 ) -> list[tuple[int, dict[str, float]]]:
    """The one place the loop reads the device: the pending steps' metrics in one transfer.
    A non-finite loss stops the run, naming the objective and the last good checkpoint
    (pending saves are finished first, so nothing written is lost); an objective that did
    not run at a step (`train.mixture`) has no loss there to check."""
    fetched = jax.device_get(list(pending))
    for step, metrics in fetched:
        for o in objs:
            if f"{o.name}/loss" not in metrics:
                continue
            value = float(metrics[f"{o.name}/loss"])
            if not np.isfinite(value):
                ckpt.wait()
                raise FloatingPointError(
                    f"non-finite loss {value} at step {step} in objective '{o.name}'; "
                    f"last good checkpoint: step {ckpt.latest_step()} in {model_dir}")
    return fetched


class LogMetrics(Action):
    """Every `log_every` steps and at the last: the mean of each metric over the steps since
    the last log, throughput (tokens/s, model TFLOP/s, MFU where the chip's peak is known)
    to TensorBoard, metrics.jsonl and the progress display. Keeps what `TrainResult` reports:
    every step's loss, the last logged metrics, every step's token count."""

    def __init__(self, writer: writers_lib.MetricsWriter, progress: writers_lib.Progress,
                 log_every: int, flops_per_token: float):
        self.writer, self.progress = writer, progress
        self.log_every, self.flops_per_token = log_every, flops_per_token
        self.losses: list[float] = []
        self.step_tokens: list[int] = []
        self.last: dict[str, float] = {}
        self._window = writers_lib.WindowMean()
        self._window_tokens, self._window_start = 0, time.perf_counter()

    def due(self, end: StepEnd) -> bool:
        return end.step % self.log_every == 0 or end.final

    def __call__(self, end: StepEnd, state: Any) -> None:
        for _, m in end.metrics:
            self.losses.append(float(m["loss"]))
            self._window.add(m)
        self.step_tokens.append(end.tokens)
        self._window_tokens += end.tokens
        self.progress.note_step(end.step)  # the first step (compiled) starts the ETA's clock
        if not self.due(end):
            return
        elapsed = max(time.perf_counter() - self._window_start, 1e-9)
        last = self._window.pop()
        last["tokens_per_sec"] = self._window_tokens / elapsed
        last["model_tflops_per_sec"] = self.flops_per_token * last["tokens_per_sec"] / 1e12
        mfu = flops_lib.mfu(self.flops_per_token * last["tokens_per_sec"])
        if mfu is not None:  # CPUs and unknown chips have no peak: no MFU
            last["mfu"] = mfu
        self.writer.write_scalars(end.step, last, prefix="train")
        self.progress.update(end.step, last)
        self.last = last
        self._window_tokens, self._window_start = 0, time.perf_counter()


class CheckHealth(Action):
    """The objectives' health checks (`train.health`) on the metrics the loop reads for the
    other actions (log, save and eval steps): it asks for no read of its own, so the checks
    run at the log steps. A check that fires logs one WARNING (process 0) and is not evaluated
    again; `report()` lists them for the run's last line. Off with `HealthConfig.enabled`."""

    def __init__(self, objs: Sequence[step_lib.WeightedObjective], cfg: health_lib.HealthConfig,
                 lr_warmup_steps: int, is_primary: bool = True,
                 evaluators: Sequence[evaluators_lib.Evaluator] = (), from_scratch: bool = True):
        self.cfg, self.is_primary = cfg, is_primary
        self.warmup_steps = cfg.warmup(lr_warmup_steps)
        self.monitor = (health_lib.Monitor(objs, cfg, self.warmup_steps, from_scratch)
                        if cfg.enabled else None)
        watched = [evaluators_lib.full_name(ev, n) for ev in evaluators
                   for n in getattr(ev, "watched", ())]
        self.evaluations = health_lib.EvalWatch(watched, cfg) if cfg.enabled else None

    def _warn(self, fired: Sequence[health_lib.Fired]) -> None:
        for f in fired:
            if self.is_primary:
                health_lib.logger.warning(f.message)

    def __call__(self, end: StepEnd, state: Any) -> None:
        if self.monitor is None or not end.metrics:
            return
        for step, metrics in end.metrics:
            self.monitor.observe(step, metrics)
        self._warn(self.monitor.check(end.step, final=end.final))

    def evaluated(self, step: int, values: Mapping[str, float]) -> None:
        """The evaluators' scalars of `step` (`Evaluate`): step 0's are the start values."""
        if self.evaluations is None:
            return
        if step == 0:
            self.evaluations.start(values)
        else:
            self._warn(self.evaluations.check(step, values))

    def report(self) -> health_lib.HealthReport:
        """What the checks found so far (an empty report when they are off)."""
        if self.monitor is None:
            return health_lib.HealthReport(enabled=False, checks=0, ran=0, fired=(),
                                           warmup_steps=self.warmup_steps,
                                           window_steps=self.cfg.window_steps)
        report = self.monitor.report()
        evals = self.evaluations
        return dataclasses.replace(report, checks=report.checks + evals.checks,
                                   ran=report.ran + evals.ran,
                                   fired=report.fired + tuple(evals.fired))


class Evaluate(Action):
    """The run's one evaluation path: after each step, every evaluator of
    `loop.train.evaluators` that is due (`train.evaluators`: `due(step)`, and at every save
    but a preemption's for the one that ranks checkpoints, `ranked`), in list order; each
    one's scalars go to the writer under `eval/` as `{prefix}/{name}` (one record per
    evaluator), and all of this step's to `end.scores` for the checkpoint that follows."""

    def __init__(self, evaluators: Sequence[evaluators_lib.Evaluator],
                 writer: writers_lib.MetricsWriter,
                 ranked: evaluators_lib.Evaluator | None = None,
                 health: CheckHealth | None = None):
        self.evaluators, self.writer, self.ranked = list(evaluators), writer, ranked
        self.health = health  # told every step's scalars (their fall below step 0's)

    def _due(self, ev: evaluators_lib.Evaluator, end: StepEnd) -> bool:
        return ev.due(end.step) or (ev is self.ranked and end.saving and not end.preempted)

    def due(self, end: StepEnd) -> bool:
        return any(self._due(ev, end) for ev in self.evaluators)

    def at_start(self, state: Any) -> None:
        """Every evaluator on the initial state, written at step 0: the untrained (or loaded,
        `init_from`) model's baseline in the same curves as the trained one's
        (`loop.train.eval_at_start`)."""
        scores: dict[str, float] = {}
        for ev in self.evaluators:
            values = {evaluators_lib.full_name(ev, k): v for k, v in ev.run(state, 0).items()}
            self.writer.write_scalars(0, values, prefix="eval")
            scores.update(values)
        if self.health is not None:
            self.health.evaluated(0, scores)

    def __call__(self, end: StepEnd, state: Any) -> None:
        scores: dict[str, float] = {}
        for ev in self.evaluators:
            if not self._due(ev, end):
                continue
            values = {evaluators_lib.full_name(ev, k): v for k, v in ev.run(state, end.step).items()}
            self.writer.write_scalars(end.step, values, prefix="eval")
            scores.update(values)
        if scores:
            end.scores = scores
            if self.health is not None:
                self.health.evaluated(end.step, scores)

    def close(self) -> None:
        for ev in reversed(self.evaluators):
            ev.close()


class SaveCheckpoint(Action):
    """Every `CheckpointConfig.save_every_steps`, at the last step and at a preemption: the
    state, its `ResumeInfo` (with the fill's batch counts, `train.prefill`) and
    (data_resume 'checkpoint') each seqio stream's position;
    ranked by this step's eval scores when they hold `CheckpointConfig.best_metric`. `save_initial` writes step 0."""

    def __init__(self, ckpt: ckpt_lib.Checkpointer, enabled: bool, model_dir: str,
                 data_resume: str, streams: Mapping[str, Any],
                 built: Mapping[str, data_state.SavedStream],
                 prefill: Mapping[str, int] | None = None, input_shards: int | None = None):
        self.ckpt, self.enabled, self.model_dir = ckpt, enabled, model_dir
        self.data_resume, self.streams, self.built = data_resume, streams, built
        self.prefill = dict(prefill or {})  # the batches the fill before step 1 took
        # the input shards the seqio streams read (`train.streams`; None: one per process)
        self.input_shards = input_shards or jax.process_count()
        self._unsaveable: set[str] = set()

    def will_save(self, step: int, final: bool) -> bool:
        return self.enabled and (self.ckpt.should_save(step) or final)

    def due(self, end: StepEnd) -> bool:
        return end.saving

    def save_initial(self, state: Any) -> None:
        """Step 0, the untrained model (a baseline for evaluations)."""
        if self.enabled:
            self.ckpt.save(0, flax.serialization.to_state_dict(state),
                           extra=ResumeInfo(0, jax.process_count(), prefill=self.prefill,
                                            input_shards=self.input_shards).to_json(),
                           force=True)

    def __call__(self, end: StepEnd, state: Any) -> None:
        if not end.saving:
            return
        positions = {} if self.data_resume != "checkpoint" else data_state.save(
            self.streams, self.built, self.model_dir, end.step, self._unsaveable, sys.stdout)
        resume = ResumeInfo(end.step, jax.process_count(), positions, self.prefill,
                            self.input_shards)
        ranked = end.scores if end.scores and self.ckpt.cfg.best_metric in end.scores else None
        self.ckpt.save(end.step, flax.serialization.to_state_dict(state),
                       extra=resume.to_json(), force=end.final, metrics=ranked)
        if jax.process_index() == 0 and positions:
            data_state.prune(self.model_dir, {*self.ckpt.all_steps(), end.step})

    def close(self) -> None:
        self.ckpt.wait()
        self.ckpt.close()


class Profile(Action):
    """A `jax.profiler` trace of steps `first` .. `first + steps - 1` into `model_dir`
    (TensorBoard's profile plugin reads it there); only process 0 traces."""

    def __init__(self, model_dir: str, first: int, steps: int, train_steps: int):
        self.model_dir, self.first, self.steps = model_dir, first, steps
        self.train_steps = train_steps
        self._tracing = False

    def before(self, step: int) -> None:
        if step == self.first and self.steps > 0 and jax.process_index() == 0:
            jax.profiler.start_trace(self.model_dir)
            self._tracing = True

    def __call__(self, end: StepEnd, state: Any) -> None:
        if self._tracing and end.step in (self.first + self.steps, self.train_steps):
            self.stop()

    def stop(self) -> None:
        if self._tracing:
            jax.profiler.stop_trace()
            self._tracing = False

    def close(self) -> None:
        self.stop()


class WriteOperativeConfig(Action):
    """After the first step: gin's operative config (every value the run used) in
    `model_dir/operative_config.gin`, as t5x writes it."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir

    def __call__(self, end: StepEnd, state: Any) -> None:
        if end.step == 1 and jax.process_index() == 0:
            md.write_operative_config(self.model_dir, gin.operative_config_str())
