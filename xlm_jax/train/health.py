"""Objective health checks: a warning when an objective's own metrics say it is not learning.

Why: a small run can fail without a sign. An XLM-E discriminator that answers "original"
everywhere logs precision and recall 0 and an accuracy equal to 1 - the replaced share; an
XLCo whose positive key never beats the queue logs an accuracy at chance; both runs end with a
plain `done:` line. Each objective declares what "not learning" looks like in its metrics
(`objectives.base.HealthCheck`, returned by `Objective.health_checks()`); this module holds the
thresholds (`HealthConfig`) and evaluates the checks (`Monitor`) on the metrics the trainer
reads anyway (`train.actions.CheckHealth`: no device read of its own). A check that fires logs
one WARNING naming the metric, its value, what it means and the first knob to try, and is not
evaluated again; the run's last line lists every check that fired (`HealthReport.summary`), and
the CLI's `done:` line after it says how many did.

What the checks read: each check's metric as the mean over a window of `window_steps` of its
objective's steps (an objective of an alternating mixture reports only on its own steps), and
only steps after the warm-up count; a check with a `ready` metric (XLCo's `queue_fill`) counts
only the steps at which it is 1, one with `after_updates` only the objective's steps after that
many updates (BTMLM's late start). The rising-loss check compares the window's mean with the
mean of the `window_steps` before it. Beside the objectives' own checks every objective's
`loss` is watched for a rise, unless the objective declares a rising check of its own (XLM-E
watches its generator's `mlm_loss`: its detection loss may rise while the generator improves).
The checks start afresh when a run resumes (a resumed run may warn again).

Thresholds and warm-up, all our choice (gin: `loop.train.health = @health.HealthConfig()`):
- warm-up: the learning-rate schedule's warm-up (`OptimizerConfig.warmup_steps`), at least 50
  steps (`MIN_WARMUP_STEPS`): before the learning rate reaches its peak an objective may sit at
  its baseline; 50 steps cover the first fast moves of a run without one;
- window: 20 of the objective's steps, so a check first runs at warm-up + 20 (+ 40 for a rise);
- near zero (RTD's precision, recall): at most 0.01;
- near the baseline (RTD's accuracy against its majority rate): within 0.002 above it or below;
- near chance (XLCo's accuracy): at most 2 x chance;
- below the floor (masked LMs' accuracy): at most 0.02. A masked LM that learns nothing
  answers the commonest token, right as often as that token's share of the masked tokens (the
  most-frequent-token rate); that rate is not among the metrics, so an absolute floor stands in
  for it (our proxy): 0.02 is below the commonest piece's share in natural text (about 7% of
  the demo corpus's tokens are "▁", docs/NOTES.md) and far above chance (1 / vocabulary). It
  flags a masked LM that does worse than the unigram answer; one stuck at the unigram answer
  passes (set `accuracy_floor` to the corpus's rate to flag that too). Uniformly random
  synthetic tokens (`synthetic:KIND`) cannot be learnt: a long synthetic run trips it;
- rising loss: the window's mean more than 10% above the window's before;
- unmoved (masked LMs' accuracy), read once, at the run's last step: the last window's mean
  is not above the objective's first window's (its first `window_steps` steps, warm-up or
  not) by more than `noise_sigmas` (2) standard errors of their difference, nor by more than
  `accuracy_gain` (0.01, one point of accuracy); only in a run that starts from scratch (step
  0, no `init_from`): a model continued from a base trained on the same data sits on its
  plateau (`make demo`'s MMLM control stayed at 0.29 over its 240 steps), which is no fault. Each window's standard error is its steps'
  spread (sample standard deviation / sqrt(steps)): it needs no count of predictions, which
  the metrics do not carry for every accuracy (XLM-E's `count` is every token its
  discriminator reads, not its generator's predictions). A model whose first steps already
  learnt the unigram answer, at a short warm-up, counts as started there.
Evaluators (`EvalWatch`, with `loop.train.eval_at_start`): a scalar an evaluator declares
watched (`Evaluator.watched`: `retrieval/acc1`, `probe/avg`), with its standard error beside
it (`..._se`), that falls below its step-0 value by more than `noise_sigmas` standard errors
of the difference (both steps' errors combined; conservative, since the same sentences are
scored at both) logs a WARNING once: training moves the encoder away from what the evaluator
measures (the issue of a retrieval score falling from 12.2% to 7.5% unnoticed).
Non-finite losses are not a health check: they stop the run (`actions.read_metrics`).
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import math
import statistics
from collections.abc import Mapping, Sequence

from xlm_jax.objectives.base import HealthCheck, WeightedObjective, loss_rising_check

logger = logging.getLogger(__name__)

MIN_WARMUP_STEPS = 50  # the default warm-up's least value (our choice; see the docstring)


@dataclasses.dataclass(frozen=True)
class HealthConfig:
    """The checks' thresholds (the module docstring says why these values).

    enabled: run the checks at all.
    warmup_steps: steps whose metrics no check reads; None: the learning rate's warm-up
      (`OptimizerConfig.warmup_steps`), at least `MIN_WARMUP_STEPS`.
    window_steps: the objective's steps a check averages (a rise compares two windows).
    zero_tolerance: "near_zero" fires at or below it.
    baseline_margin: "near_baseline" fires at or below baseline + margin.
    chance_factor: "near_chance" fires at or below factor x chance.
    accuracy_floor: "below_floor" fires at or below it.
    loss_rise: "rising" fires when the window's mean is above the window's before by more than
      this fraction of it.
    noise_sigmas: "unmoved" fires when an accuracy rose by no more than this many standard
      errors of the rise; an evaluator's watched scalar fires when it fell by more than this
      many standard errors of the fall.
    accuracy_gain: "unmoved" also fires when the rise is no more than this.
    """

    enabled: bool = True
    warmup_steps: int | None = None
    window_steps: int = 20
    zero_tolerance: float = 0.01
    baseline_margin: float = 0.002
    chance_factor: float = 2.0
    accuracy_floor: float = 0.02
    loss_rise: float = 0.1
    noise_sigmas: float = 2.0
    accuracy_gain: float = 0.01

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ValueError:
            return ValueError(f"HealthConfig.{field}={getattr(self, field)!r} {why}")

        if self.warmup_steps is not None and not (isinstance(self.warmup_steps, int)
                                                  and self.warmup_steps >= 0):
            raise bad("warmup_steps", "must be None or an integer >= 0")
        if not isinstance(self.window_steps, int) or self.window_steps < 1:
            raise bad("window_steps", "must be an integer >= 1")
        for field in ("zero_tolerance", "baseline_margin", "chance_factor", "accuracy_floor",
                      "loss_rise", "noise_sigmas", "accuracy_gain"):
            value = getattr(self, field)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise bad(field, "must be a number >= 0")

    def warmup(self, lr_warmup_steps: int) -> int:
        """The steps no check reads, for a run whose learning rate warms up over
        `lr_warmup_steps`."""
        if self.warmup_steps is not None:
            return self.warmup_steps
        return max(int(lr_warmup_steps), MIN_WARMUP_STEPS)


@dataclasses.dataclass(frozen=True)
class Fired:
    """A check that fired: where, when, the value read and the WARNING it logged."""

    objective: str
    metric: str  # the full name, `<objective>/<metric>`
    value: float
    step: int
    message: str


@dataclasses.dataclass(frozen=True)
class HealthReport:
    """What the checks found in a run: `summary()` is the run's last line."""

    enabled: bool
    checks: int  # declared, all objectives
    ran: int  # evaluated at least once (a full window after the warm-up)
    fired: tuple[Fired, ...]
    warmup_steps: int
    window_steps: int

    def summary(self) -> str:
        """One line: the checks that fired, else that none did (or none could run)."""
        if not self.enabled:
            return "health: checks off (HealthConfig.enabled = False)"
        if self.fired:
            listed = ", ".join(f"{f.metric}={_fmt(f.value)} (step {f.step})" for f in self.fired)
            return f"health: {len(self.fired)} of {self.checks} checks fired: {listed}"
        if not self.ran:
            return (f"health: no check ran (each needs {self.window_steps} of its objective's "
                    f"steps after step {self.warmup_steps})")
        return f"health: none of the {self.checks} checks fired ({self.ran} ran)"


def checks_of(o: WeightedObjective) -> tuple[HealthCheck, ...]:
    """The objective's declared checks, and the rising `loss` unless it declares a rise."""
    own = tuple(o.objective.health_checks())
    if any(c.condition == "rising" for c in own):
        return own
    return (*own, loss_rising_check())


@dataclasses.dataclass
class _Watch:
    """One check of one objective and its window: the objective's metrics (unprefixed) at each
    step that counts for it, the latest last."""

    objective: str
    check: HealthCheck
    window: collections.deque
    start: collections.deque | None = None  # "unmoved": the objective's first window
    ran: bool = False
    fired: Fired | None = None


def _fmt(value: float) -> str:
    return f"{value:.3f}" if value == 0 or abs(value) >= 1e-3 else f"{value:.2e}"


def _mean(rows: Sequence[Mapping[str, float]], key: str) -> float:
    return sum(r[key] for r in rows) / len(rows)


def _spread_se(rows: Sequence[Mapping[str, float]], key: str) -> float:
    """The standard error of a window's mean of `key` from its steps' spread: the sample
    standard deviation over sqrt(steps) (0 for a window of one step)."""
    values = [r[key] for r in rows]
    return statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0


class Monitor:
    """Evaluates the checks of a run's objectives on its per-step metrics: `observe` each
    step's metrics (`{<objective>/<metric>: value}`, as the train step reports them), then
    `check` returns the checks that fire now (each fires once)."""

    def __init__(self, objs: Sequence[WeightedObjective], cfg: HealthConfig, warmup_steps: int,
                 from_scratch: bool = True):
        """`from_scratch`: the run starts at step 0 without a pre-trained encoder; only then
        are the "unmoved" checks read (see the module docstring)."""
        self.cfg, self.warmup_steps = cfg, warmup_steps
        self._updates = {o.name: 0 for o in objs}
        self._watches: list[_Watch] = []
        self._fired: list[Fired] = []  # in the order they fired
        for o in objs:
            for c in checks_of(o):
                if c.condition == "unmoved" and not from_scratch:
                    continue
                size = cfg.window_steps * (2 if c.condition == "rising" else 1)
                start = (collections.deque(maxlen=cfg.window_steps)
                         if c.condition == "unmoved" else None)
                self._watches.append(_Watch(o.name, c, collections.deque(maxlen=size), start))

    def observe(self, step: int, metrics: Mapping[str, float]) -> None:
        """Adds one step's metrics; an objective without a `loss` there did not run."""
        own: dict[str, dict[str, float]] = {}
        for name in self._updates:
            if f"{name}/loss" not in metrics:
                continue
            self._updates[name] += 1
            prefix = f"{name}/"
            own[name] = {k[len(prefix):]: float(v) for k, v in metrics.items()
                         if k.startswith(prefix)}
        for w in self._watches:
            m = own.get(w.objective)
            c = w.check
            if (m is None or w.fired or c.metric not in m
                    or self._updates[w.objective] <= c.after_updates
                    or (c.ready is not None and m.get(c.ready, 0.0) < 1.0 - 1e-6)):
                continue
            if w.start is not None and len(w.start) < w.start.maxlen:
                w.start.append(m)  # the objective's first window, warm-up or not
            if step > self.warmup_steps:
                w.window.append(m)

    def check(self, step: int, final: bool = False) -> list[Fired]:
        """The checks that fire at `step` on their windows (full ones only); "unmoved" only
        at the run's last step (`final`)."""
        out = []
        for w in self._watches:
            if w.check.condition == "unmoved" and not (
                    final and w.start is not None and len(w.start) == w.start.maxlen):
                continue
            if w.fired is None and len(w.window) == w.window.maxlen:
                found = self._evaluate(w, step)
                if found is not None:
                    w.fired = found
                    out.append(found)
        self._fired.extend(out)
        return out

    def _evaluate(self, w: _Watch, step: int) -> Fired | None:
        """`Fired` if the check holds on its window; marks it as run when it could be read."""
        c, cfg, rows = w.check, self.cfg, list(w.window)
        n = cfg.window_steps
        if c.condition == "rising":
            before, value = _mean(rows[:n], c.metric), _mean(rows[n:], c.metric)
            w.ran = True
            if value - before <= cfg.loss_rise * abs(before):
                return None
            rise = (value - before) / abs(before) if before else math.inf
            test = f"{rise:+.0%} on the {n} steps before, {_fmt(before)}"
        elif c.condition == "unmoved":
            first = list(w.start or ())
            before, value = _mean(first, c.metric), _mean(rows, c.metric)
            noise = math.hypot(_spread_se(first, c.metric), _spread_se(rows, c.metric))
            w.ran = True
            if value - before > max(cfg.noise_sigmas * noise, cfg.accuracy_gain):
                return None
            test = (f"{value - before:+.3f} on its first {n} steps' {_fmt(before)}: not more "
                    f"than {cfg.noise_sigmas:g} x its noise, {_fmt(noise)}, nor "
                    f"{cfg.accuracy_gain:g}")
        else:
            keys = set.intersection(*(set(r) for r in rows))
            means = {k: _mean(rows, k) for k in keys}
            value = means[c.metric]
            base = c.baseline(means) if c.baseline is not None else None
            if c.baseline is not None and base is None:
                return None  # the window gives no reference value
            w.ran = True
            if c.condition == "near_zero":
                hit, test = value <= cfg.zero_tolerance, f"<= {cfg.zero_tolerance:g}"
            elif c.condition == "below_floor":
                hit, test = value <= cfg.accuracy_floor, f"<= the floor {cfg.accuracy_floor:g}"
            elif c.condition == "near_baseline":
                hit = value <= base + cfg.baseline_margin
                test = (f"within {cfg.baseline_margin:g} of {c.baseline_name}, {_fmt(base)}, "
                        "or below")
            else:  # near_chance
                hit = value <= cfg.chance_factor * base
                test = f"<= {cfg.chance_factor:g} x {c.baseline_name}, {_fmt(base)}"
            if not hit:
                return None
        metric = f"{w.objective}/{c.metric}"
        message = (f"health check: {metric}={_fmt(value)} after {step} steps ({test}; the mean "
                   f"of its last {n} steps): {c.meaning}; try {c.knob}")
        return Fired(w.objective, metric, value, step, message)

    def report(self) -> HealthReport:
        """What the checks found so far."""
        return HealthReport(enabled=True, checks=len(self._watches),
                            ran=sum(w.ran for w in self._watches),
                            fired=tuple(self._fired),
                            warmup_steps=self.warmup_steps, window_steps=self.cfg.window_steps)


class EvalWatch:
    """Evaluators' watched scalars against their step-0 values (`loop.train.eval_at_start`):
    `start` with the step-0 scalars, then `check` at each later evaluation; each watched
    scalar that falls below its start by more than `noise_sigmas` standard errors (its
    `NAME_se` beside it, at both steps) fires once. `watched`: the full names
    (`retrieval/acc1`), higher being better."""

    def __init__(self, watched: Sequence[str], cfg: HealthConfig):
        self.watched, self.cfg = tuple(watched), cfg
        self._start: dict[str, tuple[float, float]] = {}
        self._ran: set[str] = set()
        self.fired: list[Fired] = []

    @property
    def checks(self) -> int:
        """The watched scalars that have a start value (those a later evaluation is held to)."""
        return len(self._start)

    @property
    def ran(self) -> int:
        return len(self._ran)

    @staticmethod
    def _estimate(values: Mapping[str, float], name: str) -> tuple[float, float] | None:
        if name not in values or f"{name}_se" not in values:
            return None
        value, se = float(values[name]), float(values[f"{name}_se"])
        return (value, se) if math.isfinite(value) and math.isfinite(se) else None

    def start(self, values: Mapping[str, float]) -> None:
        """The step-0 scalars of every evaluator."""
        for name in self.watched:
            found = self._estimate(values, name)
            if found is not None:
                self._start[name] = found

    def check(self, step: int, values: Mapping[str, float]) -> list[Fired]:
        """The watched scalars among `values` that fire now."""
        out = []
        done = {f.metric for f in self.fired}
        for name, (before, se0) in self._start.items():
            now = self._estimate(values, name)
            if now is None or name in done:
                continue
            self._ran.add(name)
            value, se = now
            noise = math.hypot(se0, se)
            if before - value <= self.cfg.noise_sigmas * noise:
                continue
            message = (f"health check: {name}={_fmt(value)} after {step} steps, below its "
                       f"step-0 value {_fmt(before)} by {_fmt(before - value)} (more than "
                       f"{self.cfg.noise_sigmas:g} x the noise of the difference, "
                       f"{_fmt(noise)}): training moves the encoder away from what this "
                       "evaluator measures; try a lower learning rate "
                       "(OptimizerConfig.learning_rate), or compare with a control run")
            out.append(Fired(name.split("/")[0], name, value, step, message))
        self.fired.extend(out)
        return out
