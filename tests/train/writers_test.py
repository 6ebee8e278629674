"""Tests for xlm_jax.train.writers: TensorBoard events read back by TensorBoard, JSONL, Progress."""
from __future__ import annotations

import io
import itertools
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing import event_accumulator

from xlm_jax.train import writers


def _read_tb(logdir):
    acc = event_accumulator.EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_scalars_round_trip_through_tensorboard_and_jsonl(tmp_path):
    losses = [5.25, 4.5, 3.875, 3.0625]
    with writers.MetricsWriter(str(tmp_path), out=io.StringIO()) as w:
        for i, loss in enumerate(losses):
            # numpy scalars (what device_get gives) and python floats are both accepted.
            w.write_scalars(10 * (i + 1), {"loss": np.float32(loss), "lr": 1e-4 * (i + 1)})
        w.write_scalars(40, {"loss": 2.5, "accuracy": 0.75}, prefix="eval")

    train = _read_tb(tmp_path / "train")
    assert sorted(train) == ["loss", "lr"]
    assert [s for s, _ in train["loss"]] == [10, 20, 30, 40]
    np.testing.assert_allclose([v for _, v in train["loss"]], losses, rtol=1e-7)
    np.testing.assert_allclose([v for _, v in train["lr"]], [1e-4, 2e-4, 3e-4, 4e-4], rtol=1e-6)
    assert _read_tb(tmp_path / "eval") == {"loss": [(40, 2.5)], "accuracy": [(40, 0.75)]}

    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 5
    assert lines[0] == {"step": 10, "split": "train", "loss": 5.25, "lr": 1e-4}
    assert lines[-1] == {"step": 40, "split": "eval", "loss": 2.5, "accuracy": 0.75}


def test_jsonl_appends_across_writers_and_eval_is_echoed(tmp_path):
    out = io.StringIO()
    w = writers.MetricsWriter(str(tmp_path), out=out)
    w.write_scalars(1, {"loss": 1.0})
    w.close()
    w.close()  # idempotent
    w2 = writers.MetricsWriter(str(tmp_path), out=out)  # a restart appends
    w2.write_scalars(2, {"xnli_acc": 0.8125}, prefix="eval")
    w2.close()
    steps = [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    assert out.getvalue() == "[eval] step 2: xnli_acc=0.8125\n"
    with pytest.raises(RuntimeError, match="closed"):
        w2.write_scalars(3, {"loss": 1.0})


def test_non_primary_writes_nothing(tmp_path):
    out = io.StringIO()
    model_dir = tmp_path / "run"
    w = writers.MetricsWriter(str(model_dir), is_primary=False, out=out)
    w.write_scalars(1, {"loss": 1.0})
    w.write_scalars(1, {"acc": 1.0}, prefix="eval")
    w.close()
    p = writers.Progress(10, out=out, log_every=1, is_primary=False)
    p.update(10, {"loss": 1.0})
    p.close()
    assert not model_dir.exists()
    assert out.getvalue() == ""


def test_bad_values_and_dirs_name_the_problem(tmp_path):
    w = writers.MetricsWriter(str(tmp_path / "ok"), out=io.StringIO())
    with pytest.raises(ValueError, match=r"metric 'loss': value 'high' is not a scalar number"):
        w.write_scalars(1, {"loss": "high"})
    with pytest.raises(ValueError, match=r"metric 'v': value .* is not a scalar number"):
        w.write_scalars(1, {"v": np.ones(3)})
    with pytest.raises(ValueError, match=r"prefix '../x' must be a plain directory name"):
        w.write_scalars(1, {"loss": 1.0}, prefix="../x")
    w.close()
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(OSError, match=r"metrics: cannot write to model_dir '.*file/run'"):
        writers.MetricsWriter(str(blocker / "run"))


class _Stream(io.StringIO):
    def __init__(self, tty):
        super().__init__()
        self._tty = tty

    def isatty(self):
        return self._tty


def test_progress_plain_lines_every_n_steps():
    out = _Stream(tty=False)
    p = writers.Progress(25, out=out, log_every=10)
    for step in range(1, 26):
        p.note_step(step)
        p.update(step, {"loss": 2.0})
    p.close()
    lines = out.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines] == ["10/25", "20/25", "25/25"]
    assert all(ln.startswith("train ") and "step/s" in ln and "loss=2" in ln for ln in lines)
    assert "\r" not in out.getvalue()


def test_progress_bar_rewrites_one_line_on_a_tty():
    out = _Stream(tty=True)
    p = writers.Progress(4, out=out, min_interval_s=0.0)
    for step in range(1, 5):
        p.update(step, {"loss": 1.5})
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 4 and text.endswith("\n") and text.count("\n") == 1
    assert "[####################] train 4/4" in text and "[#####...............] train 1/4" in text


def test_progress_bar_fits_the_terminal_and_shows_the_loss_first(monkeypatch):
    """On a 60-column terminal each rewrite is cut to 59 characters so the line never wraps
    (a wrapped line cannot be rewritten with \\r), and the loss comes first so the cut keeps
    it."""
    monkeypatch.setenv("COLUMNS", "60")  # shutil.get_terminal_size reads it first
    scalars = {f"objective{i}/loss": 0.5 for i in range(12)} | {"loss": 3.25}
    out = _Stream(tty=True)
    p = writers.Progress(4, out=out, min_interval_s=0.0)
    for step in range(1, 5):
        p.update(step, scalars)
    p.close()
    drawn = [seg.replace("\x1b[K", "") for seg in out.getvalue().split("\r")[1:]]
    assert len(drawn) == 4 and all(len(seg.rstrip("\n")) == 59 for seg in drawn), drawn
    assert all(" train " in seg and " loss=3.25 " in seg for seg in drawn)


def test_a_log_line_is_short_and_names_each_objectives_loss():
    """A log line: step, loss, each objective's loss (`name=`), tokens/s, steps/s, ETA; no
    other metric (they are in TensorBoard and metrics.jsonl); at most MAX_LINE characters,
    the objectives that do not fit counted as +N."""
    scalars = {"loss": 52.125, "mrtd/loss": 50.5, "mrtd/rtd_loss": 0.98, "mrtd/accuracy": 0.9,
               "trtd/loss": 1.625, "grad_norm": 3.0, "learning_rate": 1e-4,
               "tokens_per_sec": 12345.0, "model_tflops_per_sec": 0.1}
    log = _Stream(tty=False)
    writers.Progress(4, out=log, log_every=4).update(4, scalars)
    line = log.getvalue().rstrip("\n")
    assert line == "train 4/4 loss=52.12 mrtd=50.5 trtd=1.625 12.3k tok/s eta ?", line
    many = {"loss": 1.0} | {f"objective_{i:02d}/loss": 1.2345 for i in range(20)}
    log = _Stream(tty=False)
    writers.Progress(100000, out=log, log_every=1).update(99999, many)
    line = log.getvalue().rstrip("\n")
    assert len(line) <= writers.MAX_LINE < len(line) + len(" objective_00=1.234")
    shown = line.count("objective_")
    assert shown >= 3 and line.endswith(f"+{20 - shown} eta ?"), line


def test_eta_counts_recent_steps_only_from_the_first_finished_step():
    """The first step (compile) takes 100 s, then each step 1 s: steps/s and the ETA are
    measured from the end of step 1 over the recent log points (the trainer reports at its
    log steps), so at step 10 the ETA of the 90 steps left is 90 s (a running average from
    the start would say ~1000 s); after a slowdown to 2 s per step from step 21 the window
    holds only slow steps once RATE_WINDOW log points have passed."""
    now = [0.0]
    out = _Stream(tty=False)
    p = writers.Progress(100, out=out, log_every=10, clock=lambda: now[0])
    now[0] = 100.0
    p.note_step(1)
    for step in range(2, 101):
        now[0] += 1.0 if step <= 20 else 2.0
        p.note_step(step)
        if step % 10 == 0:
            p.update(step, {"loss": 1.0})
    lines = out.getvalue().splitlines()
    assert lines[0] == "train 10/100 loss=1 1.00 step/s eta 0:01:30", lines[0]
    assert lines[1].endswith("1.00 step/s eta 0:01:20")
    assert "0.50 step/s" not in lines[3]  # step 40: the window still holds fast steps
    # step 90: the window's 8 points are steps 20..90, all 2 s apart
    assert lines[-2].endswith("0.50 step/s eta 0:00:20"), lines[-2]


def test_core_modules_do_not_load_tensorflow(tmp_path):
    """optim, checkpoints, metrics (writing an event file) and masking stay TF-free."""
    code = ("import sys\n"
            "from xlm_jax.train import writers, optim, checkpoints\n"
            "from xlm_jax.objectives import masking\n"
            f"w = writers.MetricsWriter({str(tmp_path)!r}); w.write_scalars(1, {{'a': 1.0}})\n"
            "w.close()\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'tensorflow'))\n")
    repo_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=repo_root)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[]"
    assert list((tmp_path / "train").glob("events.out.tfevents.*"))


def test_a_resumed_writer_drops_the_steps_after_its_checkpoint_once_each(tmp_path):
    """A run killed at step 5 after its step-3 checkpoint logged steps 4-5; the resumed run
    trains them again. Every step must be in metrics.jsonl and in TensorBoard once, with the
    resumed run's values."""
    with writers.MetricsWriter(str(tmp_path), out=None) as w:
        for step in range(1, 6):
            w.write_scalars(step, {"loss": 10.0 + step})
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write("not json\n")  # a line the reader cannot parse is kept, not lost
    with writers.MetricsWriter(str(tmp_path), out=None, resume_step=3) as w:
        for step in range(4, 7):
            w.write_scalars(step, {"loss": 20.0 + step})
    lines = open(tmp_path / "metrics.jsonl").read().splitlines()
    rows = [json.loads(line) for line in lines if line != "not json"]
    assert [(r["step"], r["loss"]) for r in rows] == [(1, 11.0), (2, 12.0), (3, 13.0),
                                                      (4, 24.0), (5, 25.0), (6, 26.0)]
    assert "not json" in lines
    assert _read_tb(tmp_path / "train")["loss"] == [(1, 11.0), (2, 12.0), (3, 13.0),
                                                     (4, 24.0), (5, 25.0), (6, 26.0)]


def _log_life(model_dir, first, last, resume_step=None, base=0.0, evals=()):
    """One process's writer: train `loss`/`lr` at steps first..last (values base + step) and
    eval `acc` at the steps of `evals`, as a run killed after step `last` logs them."""
    with writers.MetricsWriter(str(model_dir), out=None, resume_step=resume_step) as w:
        for step in range(first, last + 1):
            w.write_scalars(step, {"loss": base + step, "lr": base + step / 10})
            if step in evals:
                w.write_scalars(step, {"acc": base + step / 100}, prefix="eval")


def _jsonl_view(model_dir):
    rows = [json.loads(x) for x in (model_dir / "metrics.jsonl").read_text().splitlines()]
    view = {}
    for r in rows:
        for k, v in r.items():
            if k not in ("step", "split"):
                view.setdefault(f"{r['split']}/{k}", []).append((r["step"], v))
    return view


@pytest.mark.parametrize("counter_start", [0, 9])
def test_kill_and_resume_keeps_each_step_once_with_the_resumed_values(tmp_path, monkeypatch,
                                                                        counter_start):
    """Life 1 logs steps 1-8 (eval at 4 and 8) and is killed; its last checkpoint was step 5.
    Life 2 resumes at 5, logs 6-7 and is killed before its step-8 eval; life 3 resumes at 6
    (its checkpoint) and runs to 10 (eval at 8, 10). TensorBoard's EventAccumulator (purging
    orphaned data, its default) and metrics.jsonl hold every tag's steps once, with the values
    of the life that logged them last: eval's step 8 of life 1 is gone although no later life
    wrote eval before life 3's step 8. All lives in one second and one process, with the file
    counter crossing 9 -> 10 (`counter_start` 9): the names must still sort by life."""
    monkeypatch.setattr(writers, "_file_counter", itertools.count(counter_start))
    _log_life(tmp_path, 1, 8, evals=(4, 8))
    _log_life(tmp_path, 6, 7, resume_step=5, base=100.0)
    _log_life(tmp_path, 7, 10, resume_step=6, base=200.0, evals=(8, 10))
    life = {s: 0.0 for s in range(1, 6)} | {6: 100.0} | {s: 200.0 for s in range(7, 11)}
    expected = {"train/loss": [(s, life[s] + s) for s in range(1, 11)],
                "train/lr": [(s, life[s] + s / 10) for s in range(1, 11)],
                "eval/acc": [(s, life[s] + s / 100) for s in (4, 8, 10)]}
    tb = {f"{split}/{tag}": points for split in ("train", "eval")
          for tag, points in _read_tb(tmp_path / split).items()}
    assert sorted(tb) == sorted(expected)
    for tag, points in expected.items():
        assert [s for s, _ in tb[tag]] == [s for s, _ in points], tag
        np.testing.assert_allclose([v for _, v in tb[tag]], [v for _, v in points], rtol=1e-6)
    assert _jsonl_view(tmp_path) == expected
    names = sorted(p.name for p in (tmp_path / "train").iterdir())
    assert len(names) == 3 and len({n.split(".")[3] for n in names}) == 3  # seconds differ


def test_a_resume_purges_a_split_the_resumed_run_never_writes(tmp_path):
    """The killed run evaluated at step 6 after its step-4 checkpoint; the resumed run stops
    (again) before its next eval: TensorBoard already shows no eval at step 6."""
    _log_life(tmp_path, 1, 6, evals=(2, 6))
    _log_life(tmp_path, 5, 5, resume_step=4, base=100.0)
    assert _read_tb(tmp_path / "eval") == {"acc": [(2, pytest.approx(0.02))]}
    assert [s for s, _ in _read_tb(tmp_path / "train")["loss"]] == [1, 2, 3, 4, 5]
    assert _jsonl_view(tmp_path)["eval/acc"] == [(2, 0.02)]


def test_a_fresh_writer_writes_no_purge_and_creates_no_split(tmp_path):
    _log_life(tmp_path, 1, 3, evals=(3,))
    _log_life(tmp_path, 4, 5)  # no resume_step: appends, eval/ untouched
    assert len(list((tmp_path / "eval").iterdir())) == 1
    assert [s for s, _ in _read_tb(tmp_path / "train")["loss"]] == [1, 2, 3, 4, 5]
