"""Objective health checks (`train.health`) in the real trainer: a tiny run built to learn
nothing logs one WARNING per check it fails (the discriminator that answers 'original'
everywhere, XLCo at chance, masked LMs below the floor), a rising loss warns, a healthy run of
the same objectives warns about nothing, and the run's last line lists what fired; through
`python -m xlm_jax.train` with the thresholds set in gin. Then the checker itself, fed metric
values: each condition on both sides of its threshold, the warm-up, the windows, the gates
(XLCo's full queue, BTMLM's late start, an objective's own steps), once per run. Whether each
objective's checks read metrics it reports: tests/objectives/health_checks_test.py."""
import io
import logging
import math
import statistics

import numpy as np
import pytest

from testlib import cli_run
from testlib.tiny_run import train_tiny as _train
from xlm_jax.data.features import FIRST_PIECE_ID
from xlm_jax.data.synthetic import synthetic_batches
from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import WeightedObjective
from xlm_jax.objectives.ernie_m import BackTranslationMLM
from xlm_jax.objectives.mlm import MaskedLM
from xlm_jax.objectives.task_heads import SequenceClassification
from xlm_jax.objectives.xlco import XLCo
from xlm_jax.objectives.xlme import ReplacedTokenDetection
from xlm_jax.train import actions, evaluators, health, loop, optim, streams

# Checks read steps 11.. and run from step 15 (a rise from step 20): our choice, for speed.
WATCH = health.HealthConfig(warmup_steps=10, window_steps=5)
STEPS = 30
ALPHABET = 8  # the healthy streams' pieces: ids 4..11 only


def _stream(kind, small=True, key_is_query=False, random_from=None, ordered=False):
    """The synthetic stream of `kind`, with every piece mapped into `ALPHABET` ids when
    `small` (what a masked LM learns in a few steps, and what tells the generator's samples
    from the original) until step `random_from` (then uniformly random: a loss that rises);
    `ordered`: each piece is then its position's (mod `ALPHABET`), which a masked LM learns to
    read from the context, its accuracy rising far above its first steps'; with
    `key_is_query` a mixup_pair's key rows are its query rows (XLCo's positive is the query
    itself, masked otherwise)."""
    def batches(global_batch, seq_len, seed, start):
        stream = synthetic_batches(global_batch, seq_len, 256, kind, seed=seed, start_step=start)
        for step, batch in enumerate(stream, start):
            if small and (random_from is None or step < random_from):
                position = np.arange(seq_len)[None, :]
                batch = {k: np.where(v >= FIRST_PIECE_ID, FIRST_PIECE_ID + (
                    position if ordered else v) % ALPHABET, v)
                         if k.endswith("input_ids") else v for k, v in batch.items()}
            if key_is_query:
                batch.update({"key_" + k[6:]: v for k, v in batch.items()
                              if k.startswith("query_")})
            yield batch
    return streams.MemoryStream(batches, kind=kind, name=f"memory {kind}")


def _objectives(mono, pair):
    """MMLM, MRTD and XLCo on the given streams: the same programs for the failing and the
    healthy run (only the data differ). The generator samples at temperature 100, nearly
    uniformly over the vocabulary, so on the healthy stream its replacements are pieces the
    original never has. XLCo scores each query against the step's keys only (no queue, whose
    older keys a short run learns to tell from the new by their age alone), as cosines of
    mean-pooled embeddings (the tiny model's `<s>` states are nearly the same for every row),
    at weight 20: the discriminator pushes every piece it sees replaced one way, which at
    weight 1 makes the rows' embeddings alike faster than XLCo keeps them apart. MMLM at
    weight 5: beside those two, at weight 1 its accuracy on the healthy stream stayed where
    its first steps had it (0.17; the generator's own masked LM reached 0.85), which the
    'unmoved' check rightly reports."""
    def spec(make, task, weight=1.0):
        return loop.ObjectiveSpec(factory=make, task=task, weight=weight)
    return {
        "mmlm": spec(lambda model, name: MaskedLM(model, name=name, max_predictions=6), mono,
                     weight=5.0),
        "mrtd": spec(lambda model, name: ReplacedTokenDetection(
            model, name=name, generator_layers=1, max_predictions=6, temperature=100.0), mono),
        "xlco": spec(lambda model, name: XLCo(
            model, name=name, queue_size=0, in_batch_negatives=True, normalize=True,
            pooling="mean", layer=0, max_predictions=6), pair, weight=20.0)}


def _run(path, objectives, caplog, steps=STEPS):
    """(result, the WARNING messages of the checks, the run's stdout lines)."""
    out = io.StringIO()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=health.logger.name):
        result = _train(path, steps, objectives=objectives, out=out, save_checkpoints=False,
                        optimizer=optim.OptimizerConfig(learning_rate=1e-2, warmup_steps=2,
                                                        total_steps=steps),
                        health=WATCH)
    warned = [r.getMessage() for r in caplog.records if r.name == health.logger.name]
    return result, warned, out.getvalue().splitlines()


def test_a_run_that_learns_nothing_warns_once_per_failed_check_and_lists_them_last(
        tmp_path, caplog):
    """Uniformly random pieces: no masked LM can beat chance, the generator's samples look
    like the originals, so the discriminator learns the prior (answers 'original'
    everywhere), and XLCo's key rows are unrelated to its queries (random keys)."""
    r, warned, lines = _run(tmp_path, _objectives("synthetic:mono", "synthetic:mixup_pair"),
                            caplog)
    fired = [f.metric for f in r.health.fired]
    # the floor and the detector's checks at step 15, the first step a window is full; the
    # masked LMs' accuracy not moved from their first 5 steps, read at the last step
    assert sorted(fired) == ["mmlm/accuracy", "mmlm/accuracy", "mrtd/mlm_accuracy",
                             "mrtd/mlm_accuracy", "mrtd/rtd_accuracy", "mrtd/rtd_precision",
                             "mrtd/rtd_recall", "xlco/accuracy"]
    assert warned == [f.message for f in r.health.fired]  # one WARNING each, never again
    unmoved = [f for f in r.health.fired if "has not moved" in f.message]
    assert [f.metric for f in unmoved] == ["mmlm/accuracy", "mrtd/mlm_accuracy"]
    assert all(f.step == STEPS for f in unmoved)
    assert all(f.step == 15 for f in r.health.fired if f not in unmoved)
    by = {f.metric: f for f in r.health.fired if f not in unmoved}
    assert by["mrtd/rtd_recall"].message == (
        "health check: mrtd/rtd_recall=0.000 after 15 steps (<= 0.01; the mean of its last 5 "
        "steps): the discriminator finds no replaced token (it answers 'original' everywhere: "
        "collapsed); try a larger rtd_weight (lambda) or a smaller generator "
        "(generator_layers)")
    assert by["mrtd/rtd_accuracy"].message.startswith(
        "health check: mrtd/rtd_accuracy=0.8")
    assert "within 0.002 of the majority rate 1 - replaced share, 0.8" in (
        by["mrtd/rtd_accuracy"].message)
    # chance with 8 rows and no queue: 1/8; at chance the accuracy is within 2x of it
    assert by["xlco/accuracy"].value <= 0.25 and "chance 1/(queue_size + rows), 0.125" in (
        by["xlco/accuracy"].message)
    assert by["mmlm/accuracy"].value < 0.02 and "<= the floor 0.02" in (
        by["mmlm/accuracy"].message)
    assert lines[-1] == r.health.summary()
    assert lines[-1].startswith("health: 8 of 11 checks fired: ")
    for metric in fired:
        assert f"{metric}=" in lines[-1]


def test_a_healthy_run_of_the_same_objectives_warns_about_nothing(tmp_path, caplog):
    r, warned, lines = _run(tmp_path, _objectives(_stream("mono", ordered=True), _stream(
        "mixup_pair", small=False, key_is_query=True)), caplog)
    m = r.last_metrics
    # healthy, far from every threshold: what makes this run the other run's control
    assert m["mrtd/rtd_precision"] > 0.5 and m["mrtd/rtd_recall"] > 0.5
    assert m["mrtd/rtd_accuracy"] > 0.95 and m["xlco/accuracy"] > 0.5
    assert m["mmlm/accuracy"] > 0.05 and m["mrtd/mlm_accuracy"] > 0.05
    assert warned == [] and r.health.fired == ()
    assert r.health.ran == r.health.checks == 11  # every check ran, rises included
    assert lines[-1] == "health: none of the 11 checks fired (11 ran)"


def test_a_rising_loss_warns(tmp_path, caplog):
    """MMLM learns the small alphabet, then from step 15 the pieces are random: its loss
    more than doubles between the windows of steps 11-15 and 16-20."""
    specs = {"mmlm": loop.ObjectiveSpec(
        factory=lambda model, name: MaskedLM(model, name=name, max_predictions=6),
        task=_stream("mono", random_from=15))}
    r, warned, _ = _run(tmp_path, specs, caplog, steps=20)
    rise = {f.metric: f for f in r.health.fired}["mmlm/loss"]
    assert rise.step == 20 and rise.message in warned
    assert rise.message.startswith("health check: mmlm/loss=")
    assert "on the 5 steps before" in rise.message and (
        "the loss rises (the updates undo what was learnt); try a lower learning rate "
        "(OptimizerConfig.learning_rate) or a longer warm-up") in rise.message


def test_the_cli_warns_and_its_last_lines_list_the_checks(tmp_path):
    """`python -m xlm_jax.train` on the synthetic demo file (MMLM + TLM on random pieces),
    the thresholds set in gin: the WARNINGs on stderr, the checks' line before `done:`."""
    gin = tmp_path / "health.gin"
    gin.write_text("from __gin__ import dynamic_registration\n"
                   "import xlm_jax.train.loop as loop\n"
                   "import xlm_jax.train.health as health\n"
                   "loop.train.health = @health.HealthConfig()\n"
                   "health.HealthConfig.warmup_steps = 10\n"
                   "health.HealthConfig.window_steps = 5\n")
    model_dir = tmp_path / "run"
    r = cli_run.run(["--gin_file=demo/synthetic.gin", f"--gin_file={gin}",
                     f"--model_dir={model_dir}", "--gin.loop.train.save_checkpoints=False"])
    assert r.returncode == 0, r.stderr[-3000:]
    # (as the logging configuration prints them: "WARNING:xlm_jax.train.health:health ...")
    warned = [line[line.index("health check: "):] for line in r.stderr.splitlines()
              if "WARNING" in line and "health check: " in line]
    assert [w.split("=")[0] for w in warned] == ["health check: mmlm/accuracy",
                                                 "health check: tlm/accuracy"] * 2
    assert all(" after 15 steps (<= the floor 0.02;" in w for w in warned[:2])
    assert all(" after 20 steps (" in w and "has not moved" in w for w in warned[2:])
    lines = r.stdout.splitlines()
    assert lines[-2].startswith("health: 4 of 6 checks fired: mmlm/accuracy=")
    assert "(step 15), tlm/accuracy=" in lines[-2] and "(step 20)" in lines[-2]
    assert lines[-1] == (f"done: 20 steps in {model_dir}; 4 health check(s) fired (the line "
                         "above)")


# ---------------------------------------------------------------- the checker, fed values

CFG = get_config("tiny", vocab_size=64, num_layers=1, hidden_size=32, num_heads=4, mlp_dim=64,
                 max_positions=40, num_languages=3)
NET = Transformer(CFG)


def _monitor(*objectives):
    """A checker of `objectives` with `WATCH`'s thresholds: steps 11.. count, windows of 5."""
    return health.Monitor([WeightedObjective(o) for o in objectives], WATCH, WATCH.warmup(0))


def _feed(monitor, steps, metrics):
    """`metrics` (a dict, or a function of the step) at each of `steps`; the checks that
    fired, by step."""
    fired = {}
    for step in steps:
        monitor.observe(step, metrics(step) if callable(metrics) else metrics)
        for f in monitor.check(step):
            fired.setdefault(step, []).append(f.metric)
    return fired


def _rtd(share, precision, recall):
    """MRTD's metrics at a replaced share of the tokens, a precision and a recall (the
    accuracy they imply: 1 - share (1 + r/p - 2r))."""
    ratio = recall / precision if precision else 0.0
    return {"mrtd/loss": 30.0, "mrtd/mlm_loss": 5.0, "mrtd/mlm_accuracy": 0.1,
            "mrtd/rtd_precision": precision, "mrtd/rtd_recall": recall,
            "mrtd/rtd_accuracy": 1.0 - share * (1.0 + ratio - 2.0 * recall)}


@pytest.mark.parametrize("metrics, fires", [
    (_rtd(0.14, 0.9, 0.5), []),  # a discriminator that detects
    (_rtd(0.14, 0.0, 0.0), ["mrtd/rtd_precision", "mrtd/rtd_recall", "mrtd/rtd_accuracy"]),
    (_rtd(0.14, 0.3, 0.05), ["mrtd/rtd_accuracy"]),  # below the majority rate
    (_rtd(0.14, 0.6, 0.02), ["mrtd/rtd_accuracy"]),  # above it by 0.0009: a hair
    (_rtd(0.14, 0.005, 0.3), ["mrtd/rtd_precision", "mrtd/rtd_accuracy"]),
])
def test_rtd_checks_on_both_sides_of_their_thresholds(metrics, fires):
    rtd = ReplacedTokenDetection(NET, generator_layers=1)
    assert _feed(_monitor(rtd), range(1, 16), metrics) == ({15: fires} if fires else {})


@pytest.mark.parametrize("accuracy, fires", [(0.10, True), (0.12, False), (0.9, False)])
def test_xlco_accuracy_within_a_factor_of_chance_once_the_queue_is_full(accuracy, fires):
    """Queue 16: chance 1/17 = 0.059, fires at or below 2 x chance = 0.118; steps at which
    the queue is not full do not count (steps 1..14 here, after the warm-up of 10)."""
    xlco = XLCo(NET, queue_size=16)

    def metrics(step):
        return {"xlco/loss": 2.5, "xlco/accuracy": accuracy,
                "xlco/queue_fill": 1.0 if step > 14 else 0.5}
    assert _feed(_monitor(xlco), range(1, 25), metrics) == (
        {19: ["xlco/accuracy"]} if fires else {})


def test_in_batch_chance_counts_the_rows_and_warmup_fill_gates_the_rise():
    chance = {c.metric: c for c in XLCo(NET, queue_size=0, in_batch_negatives=True
                                        ).health_checks()}["accuracy"].baseline
    assert chance({"count": 8.0}) == pytest.approx(1 / 8)
    # initial_fill='warmup': the loss is 0 until the queue is full, which is no rise
    xlco = XLCo(NET, queue_size=16, initial_fill="warmup")

    def metrics(step):
        full = step > 14
        return {"xlco/loss": 2.5 if full else 0.0, "xlco/accuracy": 0.9 if full else 0.0,
                "xlco/queue_fill": 1.0 if full else 0.5}
    assert _feed(_monitor(xlco), range(1, 40), metrics) == {}


def test_the_floor_the_warmup_and_once_per_run():
    mlm = MaskedLM(NET)
    m = _monitor(mlm)
    bad = {"mmlm/loss": 4.0, "mmlm/accuracy": 0.01}
    # steps up to the warm-up (10) are not read: good values there do not hide a bad window
    assert _feed(m, range(1, 11), {"mmlm/loss": 4.0, "mmlm/accuracy": 0.5}) == {}
    assert _feed(m, range(11, 40), bad) == {15: ["mmlm/accuracy"]}  # once
    assert [f.message for f in m.report().fired] == [
        "health check: mmlm/accuracy=0.010 after 15 steps (<= the floor 0.02; the mean of its "
        "last 5 steps): the masked LM is right less often than always answering the commonest "
        "token would be (it learns nothing); try a higher learning rate "
        "(OptimizerConfig.learning_rate)"]
    assert _feed(_monitor(mlm), range(1, 40), {"mmlm/loss": 4.0, "mmlm/accuracy": 0.021}) == {}


@pytest.mark.parametrize("later, fires", [(2.21, True), (2.19, False), (1.5, False)])
def test_a_loss_rising_over_the_window(later, fires):
    def metrics(step):
        return {"mmlm/loss": 2.0 if step <= 15 else later, "mmlm/accuracy": 0.3}
    assert _feed(_monitor(MaskedLM(NET)), range(1, 30), metrics) == (
        {20: ["mmlm/loss"]} if fires else {})


def test_an_objective_counts_only_its_own_steps():
    """An objective that runs every other step (VECO's alternation) fills its window at half
    the pace; the other objective's steps do not count."""
    a, b = MaskedLM(NET, name="a"), MaskedLM(NET, name="b")

    def metrics(step):
        name = "a" if step % 2 else "b"
        return {f"{name}/loss": 4.0, f"{name}/accuracy": 0.0 if name == "a" else 0.5}
    # a's 5 steps after the warm-up: 11, 13, 15, 17, 19
    assert _feed(_monitor(a, b), range(1, 40), metrics) == {19: ["a/accuracy"]}


def test_btmlm_is_read_only_from_its_start_step():
    btmlm = BackTranslationMLM(NET, languages=["en", "de", "fr"], target_languages=["de"],
                               start_step=20)

    def metrics(step):
        started = step > 20
        return {"btmlm/loss": 6.0 if started else 0.0,
                "btmlm/accuracy": 0.3 if started else 0.0}
    assert _feed(_monitor(btmlm), range(1, 50), metrics) == {}
    late = _feed(_monitor(btmlm), range(1, 50),
                 lambda s: {"btmlm/loss": 6.0, "btmlm/accuracy": 0.0 if s > 20 else 0.5})
    assert late == {25: ["btmlm/accuracy"]}


def test_which_checks_each_objective_gets():
    def checks(o):
        return [(c.metric, c.condition) for c in health.checks_of(WeightedObjective(o))]
    assert checks(MaskedLM(NET)) == [("accuracy", "below_floor"), ("accuracy", "unmoved"),
                                     ("loss", "rising")]
    # XLM-E watches its generator's loss for a rise: the detection loss may rise legitimately
    assert checks(ReplacedTokenDetection(NET, generator_layers=1)) == [
        ("rtd_precision", "near_zero"), ("rtd_recall", "near_zero"),
        ("rtd_accuracy", "near_baseline"), ("mlm_accuracy", "below_floor"),
        ("mlm_accuracy", "unmoved"), ("mlm_loss", "rising")]
    # an objective that declares nothing (fine-tuning) still has its loss watched
    assert checks(SequenceClassification(NET)) == [("loss", "rising")]


def test_config_defaults_and_errors():
    cfg = health.HealthConfig()
    assert cfg.warmup(10000) == 10000 and cfg.warmup(2) == health.MIN_WARMUP_STEPS == 50
    assert health.HealthConfig(warmup_steps=0).warmup(10000) == 0
    for bad, match in (({"window_steps": 0}, "window_steps=0 must be an integer >= 1"),
                       ({"warmup_steps": -1}, "warmup_steps=-1 must be None or an integer"),
                       ({"chance_factor": math.nan}, "chance_factor=nan must be a number"),
                       ({"accuracy_floor": -0.1}, "accuracy_floor=-0.1 must be a number"),
                       ({"noise_sigmas": math.inf}, "noise_sigmas=inf must be a number")):
        with pytest.raises(ValueError, match=match):
            health.HealthConfig(**bad)


def test_the_action_logs_each_check_once_and_reports_off_when_disabled(caplog):
    objs = [WeightedObjective(MaskedLM(NET))]

    def end(step):
        return actions.StepEnd(step, False, False, False, 0, lambda: None,
                               metrics=[(step, {"mmlm/loss": 4.0, "mmlm/accuracy": 0.0})])
    on = actions.CheckHealth(objs, WATCH, lr_warmup_steps=1000)
    off = actions.CheckHealth(objs, health.HealthConfig(enabled=False), lr_warmup_steps=0)
    assert on.warmup_steps == 10  # the config's, not the learning rate's
    with caplog.at_level(logging.WARNING, logger=health.logger.name):
        for step in range(1, 30):
            on(end(step), None)
            off(end(step), None)
    assert [r.getMessage().split(" after")[0] for r in caplog.records] == [
        "health check: mmlm/accuracy=0.000"]
    assert on.report().summary().startswith("health: 1 of 3 checks fired: mmlm/accuracy=0.000 "
                                            "(step 15)")
    assert off.report().summary() == "health: checks off (HealthConfig.enabled = False)"
    quiet = actions.CheckHealth(objs, WATCH, 0)
    for step in range(1, 13):
        quiet(end(step), None)
    assert quiet.report().summary() == ("health: no check ran (each needs 5 of its "
                                        "objective's steps after step 10)")


# ---------------------------------------------------------------- not moved; evaluators

START = [0.04, 0.06, 0.05, 0.04, 0.06]  # mean 0.05, standard deviation 0.01


@pytest.mark.parametrize("end, fires", [
    ([0.05, 0.07, 0.06, 0.05, 0.07], True),  # +0.010: within 2 x the noise, 0.0126
    ([0.07, 0.09, 0.08, 0.07, 0.09], False),  # +0.030
    ([0.058] * 5, True),  # +0.008 and no spread at the end: the 0.01 floor decides
    ([0.065] * 5, False),  # +0.015
    ([0.03] * 5, True)])  # a fall
def test_an_accuracy_not_moved_from_its_first_window_fires_at_the_last_step(end, fires):
    """Steps 1-5 (inside the warm-up: they count for the start) at `START`, the last 5 at
    `end`; the threshold is the larger of 2 standard errors of the difference (each window's
    from its steps' spread) and a gain of 0.01. Read only at the last step."""
    def metrics(step):
        accuracy = START[step - 1] if step <= 5 else end[(step - 35) % 5]
        return {"mmlm/loss": 4.0, "mmlm/accuracy": accuracy}
    rise = statistics.mean(end) - statistics.mean(START)
    noise = math.hypot(statistics.stdev(START) / math.sqrt(5),
                       statistics.stdev(end) / math.sqrt(5))
    assert (rise <= max(2 * noise, 0.01)) == fires  # the formula, by hand
    m = _monitor(MaskedLM(NET))
    assert _feed(m, range(1, 40), metrics) == {}  # never `final`
    fired = m.check(39, final=True)
    assert [f.metric for f in fired] == (["mmlm/accuracy"] if fires else [])
    if fires:
        shown = f"{noise:.3f}" if noise == 0 or noise >= 1e-3 else f"{noise:.2e}"
        assert fired[0].message == (
            f"health check: mmlm/accuracy={statistics.mean(end):.3f} after 39 steps "
            f"({rise:+.3f} on its first 5 steps' 0.050: not more than 2 x its noise, {shown}, "
            "nor 0.01; the mean of its last 5 steps): the masked LM's accuracy has not moved "
            "from where the run started it (it learns nothing more from this data); try a "
            "higher learning rate (OptimizerConfig.learning_rate), or more steps")


class _Scores(evaluators.Evaluator):
    """A real evaluator of the protocol whose scores are given per step (acc1 and its
    standard error), so the watch is tested on known values."""

    prefix, every, watched = "retrieval", 1, ("acc1",)

    def __init__(self, by_step):
        self.by_step = by_step

    def run(self, state_or_params, step):
        acc1, se = self.by_step[step]
        return {"acc1": acc1, "acc1_se": se, "seconds": 0.1}


class _Writer:
    def __init__(self):
        self.rows = []

    def write_scalars(self, step, values, prefix):
        self.rows.append((step, prefix, dict(values)))


def test_an_evaluator_falling_below_step_0_by_more_than_its_noise_warns_once(caplog):
    """acc1 12.2 +- 1.0 at step 0; a fall to 10.0 +- 1.0 is within 2 x sqrt(2) = 2.83 and
    says nothing; 8.5 +- 1.0 (3.7 below) warns, once; 7.5 later does not warn again."""
    ev = _Scores({0: (12.2, 1.0), 100: (10.0, 1.0), 200: (8.5, 1.0), 300: (7.5, 1.0)})
    checks = actions.CheckHealth([WeightedObjective(MaskedLM(NET))], WATCH, 0, evaluators=[ev])
    evaluate = actions.Evaluate([ev], _Writer(), health=checks)
    with caplog.at_level(logging.WARNING, logger=health.logger.name):
        evaluate.at_start(None)
        for step in (100, 200, 300):
            evaluate(actions.StepEnd(step, False, False, False, 0, lambda: None), None)
    assert [r.getMessage() for r in caplog.records] == [
        "health check: retrieval/acc1=8.500 after 200 steps, below its step-0 value 12.200 by "
        "3.700 (more than 2 x the noise of the difference, 1.414): training moves the encoder "
        "away from what this evaluator measures; try a lower learning rate "
        "(OptimizerConfig.learning_rate), or compare with a control run"]
    report = checks.report()
    assert report.checks == 4 and [f.metric for f in report.fired] == ["retrieval/acc1"]
    assert "retrieval/acc1=8.500 (step 200)" in report.summary()
    # without a step-0 value (no eval_at_start) nothing is watched
    quiet = actions.CheckHealth([], WATCH, 0, evaluators=[ev])
    actions.Evaluate([ev], _Writer(), health=quiet)(
        actions.StepEnd(200, False, False, False, 0, lambda: None), None)
    assert quiet.evaluations.checks == 0 and quiet.evaluations.fired == []


def test_the_trainer_watches_its_evaluators_from_step_0(tmp_path, caplog):
    """Through `loop.train` with eval_at_start: the step-0 scores are the start, a later fall
    beyond the noise is a WARNING and is listed on the run's last line."""
    ev = _Scores({0: (12.2, 1.0), 1: (12.0, 1.0), 2: (11.0, 1.0), 3: (7.5, 1.0), 4: (7.0, 1.0)})
    out = io.StringIO()
    with caplog.at_level(logging.WARNING, logger=health.logger.name):
        r = _train(tmp_path / "run", 4, out=out, save_checkpoints=False, evaluators=[ev],
                   eval_at_start=True, health=WATCH)
    assert [f.metric for f in r.health.fired] == ["retrieval/acc1"]
    assert r.health.fired[0].step == 3 and r.health.fired[0].value == 7.5
    assert [m.getMessage() for m in caplog.records] == [r.health.fired[0].message]
    assert out.getvalue().splitlines()[-1].startswith("health: 1 of ")


def test_a_continued_or_resumed_run_is_not_held_to_moving():
    """From a pre-trained encoder, or resumed mid-way, a masked LM may sit on its plateau:
    the "unmoved" checks are not made (the floor and the rise still are)."""
    def conditions(monitor):
        return sorted(w.check.condition for w in monitor._watches)
    scratch = health.Monitor([WeightedObjective(MaskedLM(NET))], WATCH, 10)
    continued = health.Monitor([WeightedObjective(MaskedLM(NET))], WATCH, 10,
                               from_scratch=False)
    assert conditions(scratch) == ["below_floor", "rising", "unmoved"]
    assert conditions(continued) == ["below_floor", "rising"]
    flat = {"mmlm/loss": 4.0, "mmlm/accuracy": 0.29}
    _feed(continued, range(1, 40), flat)
    assert continued.check(39, final=True) == []
    _feed(scratch, range(1, 40), flat)
    assert [f.metric for f in scratch.check(39, final=True)] == ["mmlm/accuracy"]
