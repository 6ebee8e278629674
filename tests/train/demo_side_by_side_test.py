"""`demo.SideBySide`: the demo's paper run and control train as two child processes at once,
while the demo's own process works (it scores the models that are ready); the terminal gets
each one's echoed lines whole and labelled, each run's log only its own lines; a failing run
stops the other (SIGTERM) and its error is raised, and an error of the demo's own process
stops both. The children are
small python scripts standing in for `python -m xlm_jax.train` (`runner.child_command`
patched): what is tested is the running side by side, not training."""
import io
import os
import sys
import time

import pytest

from xlm_jax import demo
from xlm_jax.league import runner, score

# A stand-in trainer: mode "ok" (default) waits until the other run has started too (one
# after the other, it would wait in vain and fail), then prints progress lines and its end;
# "fail" exits 3 after its progress; "sleep" runs until terminated (SIGTERM: "preempted").
CHILD = r'''
import os, signal, sys, time
model_dir = [a for a in sys.argv if a.startswith("--model_dir=")][0].split("=", 1)[1]
root, name = os.path.split(model_dir)
other = "control" if name == "paper" else "paper"
mode = os.environ.get("SIDE_BY_SIDE_" + name, "ok")
if mode == "sleep":
    def stop(*_):
        print(f"preempted at {name}", flush=True)
        sys.exit(143)
    signal.signal(signal.SIGTERM, stop)
    print("tasks: demo_mono loaded in 0.1 s", flush=True)
    time.sleep(120)
    sys.exit(0)
open(os.path.join(root, "started-" + name), "w").close()
if mode == "ok":
    deadline = time.time() + 30
    while not os.path.exists(os.path.join(root, "started-" + other)):
        if time.time() > deadline:
            print(f"error: {name} trained alone: {other} never started", flush=True)
            sys.exit(4)
        time.sleep(0.02)
for step in range(1, 6):
    print(f"train {step}/5 loss=1.0 " + name * 40, flush=True)
    time.sleep(0.05)
if mode == "fail":
    print(f"error: ValueError: {name} broke", flush=True)
    sys.exit(3)
print(f"done: 5 steps in {name}", flush=True)
'''


@pytest.fixture
def children(monkeypatch, tmp_path):
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    monkeypatch.setattr(runner, "child_command",
                        lambda module, args: [sys.executable, str(script), *args])
    return tmp_path


def _runs(root):
    return {name: (["demo/none.gin"], [], str(root / name)) for name in ("paper", "control")}


def test_both_runs_train_at_once_and_their_lines_stay_whole(children):
    out = io.StringIO()
    with demo.SideBySide(_runs(children), out) as training:
        training.echo.write("scoring: the base, while they train\n")
        seconds = {name: training.wait(name) for name in ("control", "paper")}
    shown = out.getvalue().splitlines()
    assert set(seconds) == {"paper", "control"} and all(s > 0.2 for s in seconds.values())
    for name in ("paper", "control"):
        mine = [line for line in shown if line.startswith(f"  {name}: ")]
        # every line whole: the label, then the child's own text (cut to the echo width)
        assert [line[len(name) + 4:len(name) + 19] for line in mine[:5]] == [
            f"train {k}/5 loss=" for k in range(1, 6)]
        assert all(line == f"  {name}: train {k}/5 loss=1.0 {name * 40}"[:score.ECHO_WIDTH]
                   for k, line in zip(range(1, 6), mine))
        assert mine[5] == f"  {name}: done: 5 steps in {name}"
        assert any(line.startswith(f"{name}: trained in ") for line in shown)
        log = (children / f"{name}_train.log").read_text()
        other = "control" if name == "paper" else "paper"
        assert f"done: 5 steps in {name}" in log and other * 40 not in log
    # side by side: each child waited for the other to start before training (one after the
    # other, the first would have failed after 30 s naming the other)
    assert shown[0] == "scoring: the base, while they train"  # this process's own line, whole


def test_a_failing_run_stops_the_other_and_is_raised(children, monkeypatch):
    monkeypatch.setenv("SIDE_BY_SIDE_paper", "fail")
    monkeypatch.setenv("SIDE_BY_SIDE_control", "sleep")
    t0 = time.time()
    with pytest.raises(score.SubprocessError,
                       match=r"paper training failed with exit code 3: error: ValueError: "
                             r"paper broke"):
        out = io.StringIO()
        with demo.SideBySide(_runs(children), out) as training:
            training.wait("control")  # the control would sleep 120 s: paper's failure stops it
    assert time.time() - t0 < 60  # the sleeping control (120 s) was stopped, not waited for
    control_log = (children / "control_train.log").read_text()
    assert "preempted at control" in control_log  # it got SIGTERM, as a preempted trainer
    assert not any(line.startswith("paper: trained in")
                   for line in out.getvalue().splitlines())
    assert os.path.isfile(children / "paper_train.log")


def test_an_error_of_the_demo_itself_stops_both_runs(children, monkeypatch):
    monkeypatch.setenv("SIDE_BY_SIDE_paper", "sleep")
    monkeypatch.setenv("SIDE_BY_SIDE_control", "sleep")
    t0 = time.time()
    with pytest.raises(FileNotFoundError, match="no such scores"):
        out = io.StringIO()
        with demo.SideBySide(_runs(children), out) as training:
            while any(f"  {n}: tasks: " not in out.getvalue() for n in ("paper", "control")):
                time.sleep(0.05)  # both children running, their SIGTERM handlers set
            raise FileNotFoundError("no such scores")  # as a failed scoring would
    assert time.time() - t0 < 60
    for name in ("paper", "control"):
        assert f"preempted at {name}" in (children / f"{name}_train.log").read_text()
    assert all(proc.poll() is not None for proc in training.procs)
