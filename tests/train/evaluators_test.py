"""The evaluator protocol (`train.evaluators`) and the one action that runs it
(`actions.Evaluate`): schedule, metric names, keep-best ranking, gin configuration, the
one-line errors of bad input, and a real `loop.train` running the held-out loss and the
transfer probe (scored again offline on the saved checkpoint)."""
from __future__ import annotations

import contextlib
import io
import json
import os
import re

import gin
import pytest

from testlib.tiny_run import TINY_MODEL, mlm_objectives
from xlm_jax import model_dir as md
from xlm_jax.encoder import load_encoder
from xlm_jax.evaluation import probe
from xlm_jax.train import actions, checkpoints, cli, evaluators, gin_utils, loop, optim

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEMO_DATA = os.path.join(REPO_ROOT, "tasks", "demo_data")
SPM = os.path.join(DEMO_DATA, "spm.model")
MODEL = {**TINY_MODEL, "vocab_size": 8002}  # the demo SentencePiece model's ids


class _Recorder(evaluators.Evaluator):
    """Returns fixed scalars and logs its calls."""

    def __init__(self, prefix, every, values, log, names=None):
        self.prefix, self.every, self.values, self.log, self.names = (
            prefix, every, values, log, names)

    def metric_names(self):
        return self.names

    def run(self, state_or_params, step):
        self.log.append((self.prefix, step, state_or_params))
        return dict(self.values)

    def close(self):
        self.log.append((self.prefix, "close"))


class _Writer:
    def __init__(self):
        self.rows = []

    def write_scalars(self, step, scalars, prefix="train"):
        self.rows.append((step, prefix, dict(scalars)))


def _end(step, saving=False, preempted=False):
    return actions.StepEnd(step, False, preempted, saving, 0, lambda: None)


# ----------------------------------------------------------------------------- the action


def test_held_out_metrics_weigh_every_unit_of_every_batch_alike():
    """HeldOutLoss adds each batch's `EvalSums` and divides once: two batches with 1 and 3
    masked tokens and summed losses 2 and 3 give a loss of 5 / 4, where the mean of the
    per-batch means, (2 / 1 + 3 / 3) / 2 = 1.5, would weigh the one-token batch like the other."""
    import jax

    from xlm_jax.models.config import get_config
    from xlm_jax.models.transformer import Transformer
    from xlm_jax.objectives.base import Metric, WeightedObjective
    from xlm_jax.objectives.mlm import MaskedLM
    from xlm_jax.train.step import EvalSums, eval_report

    obj = MaskedLM(Transformer(get_config("tiny", **TINY_MODEL)), name="mmlm", kind="mono",
                   max_predictions=4)
    first = EvalSums({"loss": 2.0}, {"loss": 1.0}, {"accuracy": Metric(1.0, 1.0)})
    second = EvalSums({"loss": 3.0}, {"loss": 3.0}, {"accuracy": Metric(0.0, 3.0)})
    both = jax.tree_util.tree_map(lambda a, b: a + b, first, second)
    got = eval_report([WeightedObjective(obj)], {"mmlm": both})
    assert got == pytest.approx({"mmlm/loss": 5 / 4, "mmlm/accuracy": 1 / 4, "mmlm/count": 4})

def test_evaluate_runs_the_due_evaluators_in_order_under_their_prefixes():
    log, writer = [], _Writer()
    held = _Recorder("", 2, {"mmlm/loss": 3.0}, log)  # prefix '': the names as returned
    ranked = _Recorder("probe", 3, {"avg": 50.0}, log, names=["avg"])
    action = actions.Evaluate([held, ranked], writer, ranked=ranked)
    scores = {}
    for step in range(1, 7):
        end = _end(step, saving=step in (4, 5), preempted=step == 5)
        if action.due(end):
            action(end, "STATE")
            scores[step] = end.scores
    # every 2 / every 3, the ranked one also at the save of step 4 (not the preemption's at 5)
    assert writer.rows == [(2, "eval", {"mmlm/loss": 3.0}), (3, "eval", {"probe/avg": 50.0}),
                           (4, "eval", {"mmlm/loss": 3.0}), (4, "eval", {"probe/avg": 50.0}),
                           (6, "eval", {"mmlm/loss": 3.0}), (6, "eval", {"probe/avg": 50.0})]
    assert sorted(scores) == [2, 3, 4, 6]
    assert scores[4] == {"mmlm/loss": 3.0, "probe/avg": 50.0}  # what the checkpoint ranks by
    assert {state for _, _, state in log} == {"STATE"}
    action.close()
    assert log[-2:] == [("probe", "close"), ("", "close")]  # reverse order, like actions


def test_keep_best_is_ranked_by_the_evaluator_that_writes_the_metric():
    log = []
    held = _Recorder("", 2, {}, log)  # names unknown before it runs
    ranked = _Recorder("probe", 3, {}, log, names=["avg", "gap", "seconds"])
    best = checkpoints.CheckpointConfig(keep_best=1, best_metric="probe/avg")
    assert evaluators.check_keep_best(best, [held, ranked]) is ranked
    assert evaluators.check_keep_best(checkpoints.CheckpointConfig(), [held]) is None
    with pytest.raises(ValueError, match=r"best_metric='probe/seconds' is not a metric of "
                                         r"loop.train.evaluators \(they write probe/avg, "
                                         r"probe/gap\)"):
        evaluators.check_keep_best(
            checkpoints.CheckpointConfig(keep_best=1, best_metric="probe/seconds"), [ranked])
    with pytest.raises(ValueError, match="but loop.train.evaluators is empty"):
        evaluators.check_keep_best(best, [])


def test_a_save_whose_scores_lack_the_ranked_metric_is_kept_unranked(tmp_path):
    """A preemption save after a held-out eval: the scores hold mmlm/loss but not the
    ranking metric (the ranked evaluator skips preemption saves); orbax would refuse them."""
    import jax.numpy as jnp

    cfg = checkpoints.CheckpointConfig(save_every_steps=1, keep=2, keep_best=1,
                                       best_metric="probe/avg", async_save=False)
    ckpt = checkpoints.Checkpointer(str(tmp_path), cfg)
    saver = actions.SaveCheckpoint(ckpt, True, str(tmp_path), "replay", {}, {})
    for step, scores in ((1, {"probe/avg": 60.0, "mmlm/loss": 3.0}), (2, {"mmlm/loss": 2.0})):
        end = _end(step, saving=True, preempted=step == 2)
        end.scores = scores
        saver(end, {"w": jnp.zeros(2)})
    saver.close()
    assert (tmp_path / "checkpoints" / "1" / "metrics" / "metrics").exists()
    assert not (tmp_path / "checkpoints" / "2" / "metrics").exists()


# ----------------------------------------------------------------------------- bad input

def test_entries_and_settings_that_are_not_evaluators_are_one_line_errors(tmp_path):
    cases = [
        (lambda: evaluators.check_evaluators(["held_out_loss"]),
         r"loop.train.evaluators\[0\]='held_out_loss' is not an evaluator \(it lacks bind"),
        (lambda: evaluators.check_evaluators([
            evaluators.TransferProbe(data_dir=DEMO_DATA), evaluators.TransferProbe(
                data_dir=DEMO_DATA, task="xnli")]),
         r"loop.train.evaluators\[0\] \(TransferProbe\) and \[1\] \(TransferProbe\) both "
         r"write under the prefix 'probe'"),
        (lambda: evaluators.check_evaluators([_Recorder("x", 0, {}, [])]),
         "_Recorder.every=0 is invalid"),
        (lambda: evaluators.TransferProbe(), "TransferProbe.data_dir is not set"),
        (lambda: evaluators.TransferProbe(data_dir=DEMO_DATA, l2=0),
         "TransferProbe.l2=0 is invalid"),
        (lambda: evaluators.TransferProbe(data_dir=DEMO_DATA, task="squad"),
         "TransferProbe.task='squad' is invalid"),
        (lambda: evaluators.HeldOutLoss(num_batches=0), "HeldOutLoss.num_batches=0 is invalid"),
    ]
    for make, match in cases:
        with pytest.raises(ValueError, match=match) as e:
            make()
        assert "\n" not in str(e.value)
    # Another prefix makes two probes fine.
    assert len(evaluators.check_evaluators([
        evaluators.TransferProbe(data_dir=DEMO_DATA),
        evaluators.TransferProbe(data_dir=DEMO_DATA, task="xnli", prefix="xnli_probe")])) == 2


def _parse(text, tmp_path):
    path = tmp_path / "run.gin"
    path.write_text("from __gin__ import dynamic_registration\n"
                    "import xlm_jax.train.loop as loop\n"
                    "import xlm_jax.train.evaluators as evaluators\n" + text)
    gin_utils.parse([str(path)], [], check_required=False)


def test_gin_picks_and_configures_the_evaluators(tmp_path):
    gin.clear_config()
    try:
        _parse("loop.train.evaluators = [@evaluators.HeldOutLoss(), @evaluators.TransferProbe()]\n"
               "evaluators.HeldOutLoss.every = 50\n"
               "evaluators.TransferProbe:\n"
               "  data_dir = 'tasks/demo_data'\n"
               "  every = 200\n"
               "  languages = ['en', 'de']\n", tmp_path)
        refs = gin.query_parameter("loop.train.evaluators")
        held, transfer = (ref.scoped_configurable_fn() for ref in refs)
    finally:
        gin.clear_config()
    assert isinstance(held, evaluators.HeldOutLoss) and held.every == 50
    assert isinstance(transfer, evaluators.TransferProbe) and transfer.every == 200
    assert transfer.languages == ["en", "de"] and transfer.prefix == "probe"


def test_an_unknown_evaluator_name_in_gin_is_one_line_naming_it(tmp_path):
    gin.clear_config()
    try:
        with pytest.raises(Exception) as e:
            _parse("loop.train.evaluators = [@evaluators.HeldOutLos()]\n", tmp_path)
    finally:
        gin.clear_config()
    line = cli.error_line(e.value)
    assert "\n" not in line
    # the file and line, and the module's closest name (gin_utils.dynamic_name_hint)
    assert line.startswith("error: GinConfigError: ") and "run.gin:" in line, line
    assert line.endswith(": no configurable evaluators.HeldOutLos; did you mean "
                         "evaluators.HeldOutLoss?"), line


# ----------------------------------------------------------------------------- the loop

def _train(model_dir, steps, evals, objectives=None, **kw):
    with contextlib.redirect_stdout(io.StringIO()):
        return loop.train(
            str(model_dir), model=loop.model_config("tiny", MODEL),
            objectives=objectives or mlm_objectives(), train_steps=steps, batch_size=8,
            seq_len=32, spm_model=SPM, log_every=100, evaluators=evals,
            optimizer=optim.OptimizerConfig(learning_rate=3e-3, warmup_steps=2, total_steps=20),
            **kw)


def _with_eval_task():
    objectives = mlm_objectives()
    objectives["mmlm"] = loop.ObjectiveSpec(factory=objectives["mmlm"].factory,
                                            task="synthetic:mono", eval_task="synthetic:mono")
    return objectives


def test_loop_runs_held_out_loss_and_the_probe_and_ranks_checkpoints_by_the_probe(tmp_path):
    """Held-out loss every 2 steps, the probe every 3 and, ranking the checkpoints, at the
    saves (2, 4): one record per evaluator under eval/; the probe's step-4 numbers are the
    saved step-4 model's, scored offline."""
    model_dir = tmp_path / "run"
    languages, limits = ["en", "de", "fr"], {"max_train": 60, "max_test": 20}
    _train(model_dir, 4, [evaluators.HeldOutLoss(every=2, num_batches=1),
                          evaluators.TransferProbe(data_dir=DEMO_DATA, every=3,
                                                   languages=languages, **limits)],
           objectives=_with_eval_task(),
           checkpoint=checkpoints.CheckpointConfig(save_every_steps=2, keep=1, keep_best=1,
                                                   best_metric="probe/avg", async_save=False))
    rows = [r for r in map(json.loads, open(model_dir / md.METRICS_FILE)) if r["split"] == "eval"]
    held = {r["step"]: r for r in rows if "mmlm/loss" in r}
    probed = {r["step"]: r for r in rows if "probe/avg" in r}
    assert sorted(held) == [2, 4] and sorted(probed) == [2, 3, 4]
    assert len(rows) == 5  # one record per evaluator and step
    for r in held.values():
        assert 4.0 < r["mmlm/loss"] < 10.0 and "tlm/loss" not in r and "probe/avg" not in r
    for r in probed.values():
        assert set(r) == {"step", "split", "probe/acc_en", "probe/acc_de", "probe/acc_fr",
                          "probe/avg", "probe/avg_se", "probe/gap", "probe/auc_avg",
                          "probe/train_acc", "probe/seconds"}
        assert r["probe/avg"] == pytest.approx((r["probe/acc_de"] + r["probe/acc_fr"]) / 2)
        assert r["probe/gap"] == pytest.approx(r["probe/acc_en"] - r["probe/avg"])

    data = probe.read_probe_data(DEMO_DATA, languages=languages, **limits)
    offline = probe.evaluate(load_encoder(str(model_dir), step=4), data,
                             layer=MODEL["num_layers"]).scalars()
    for k, v in offline.items():
        assert probed[4][f"probe/{k}"] == pytest.approx(v, abs=1e-6), k

    kept = sorted(int(n) for n in os.listdir(model_dir / "checkpoints") if n.isdigit())
    assert 4 in kept and set(kept) <= {2, 4}
    for s in kept:
        saved = json.loads((model_dir / "checkpoints" / str(s) / "metrics" / "metrics").read_text())
        assert saved["probe/avg"] == pytest.approx(probed[s]["probe/avg"])
        assert saved["mmlm/loss"] == pytest.approx(held[s]["mmlm/loss"])  # all of the step's


@pytest.mark.parametrize("case", ["probe_dir", "probe_language", "probe_layer",
                                  "held_out_objective", "held_out_none", "held_out_task",
                                  "not_an_evaluator"])
def test_bad_evaluator_input_fails_in_one_line_before_training(tmp_path, case):
    probe_kw = {"data_dir": DEMO_DATA}
    objectives = _with_eval_task()
    if case == "probe_dir":
        probe_kw["data_dir"] = str(tmp_path / "nowhere")
    elif case == "probe_language":
        probe_kw["languages"] = ["de", "xx"]
    elif case == "probe_layer":
        probe_kw["layer"] = 5
    evals = {"held_out_objective": [evaluators.HeldOutLoss(tasks={"nope": "synthetic:mono"})],
             "held_out_none": [evaluators.HeldOutLoss()],
             "held_out_task": [evaluators.HeldOutLoss(tasks={"mmlm": "no_such_task"})],
             "not_an_evaluator": ["held_out_loss"]}.get(
        case, [evaluators.TransferProbe(**probe_kw)])
    if case == "held_out_none":
        objectives = mlm_objectives()
    expect = {
        "probe_dir": f"TransferProbe.data_dir='{tmp_path / 'nowhere'}': .*not a directory",
        "probe_language": "TransferProbe.data_dir=.*no pawsx test file for language 'xx'",
        "probe_layer": r"TransferProbe.layer=5 out of range: valid layers are 0..1",
        "held_out_objective": r"HeldOutLoss.tasks\['nope'\]: no objective 'nope' in the mixture",
        "held_out_none": "HeldOutLoss: no held-out task",
        "held_out_task": "HeldOutLoss: the held-out task 'no_such_task' of objective 'mmlm': "
                         "unknown task or mixture 'no_such_task'",
        "not_an_evaluator": r"loop.train.evaluators\[0\]='held_out_loss' is not an evaluator",
    }[case]
    model_dir = tmp_path / "run"
    with pytest.raises(ValueError, match=expect) as e:
        _train(model_dir, 2, evals, objectives=objectives)
    assert re.search(expect, str(e.value).splitlines()[0])  # one line (gin adds its own)
    assert not (model_dir / md.METRICS_FILE).exists()  # nothing trained
    assert not (model_dir / "checkpoints" / "2").exists()
