"""`league.score.run_logged` with `echo`: what the demo's terminal shows of a training child
(the trainer's progress, phase, health and end lines, labelled and cut to 160 characters)
while the log keeps every line; a failing child is one error naming its last error line."""
import io
import sys

import pytest

from xlm_jax.league import score

CHILD = r'''
import sys
print("tasks: demo_mono loaded in 3.0 s", flush=True)
print("some INFO line of a library", flush=True)
print("step compiled in 12.0 s: compiled anew; set-up took 20.1 s", flush=True)
for step in (25, 50):
    print(f"train {step}/50 loss=4.1 mmlm=3.9 tlm=4.3 " + "x" * 200, flush=True)
print("WARNING:xlm_jax.train.health:health check: mmlm/accuracy=0.010 after 50 steps", file=sys.stderr, flush=True)
print("health: 1 of 3 checks fired: mmlm/accuracy=0.010 (step 50)", flush=True)
print("done: 50 steps in /tmp/run", flush=True)
sys.exit(int(sys.argv[1]))
'''


def test_the_echo_shows_progress_and_phases_and_the_log_keeps_everything(tmp_path):
    log_path = tmp_path / "train.log"
    echo = io.StringIO()
    with open(log_path, "a", encoding="utf-8") as log:
        score.run_logged([sys.executable, "-c", CHILD, "0"], log, "paper training", echo,
                         "paper")
    shown = echo.getvalue().splitlines()
    assert shown[0] == "  paper: tasks: demo_mono loaded in 3.0 s"
    assert shown[1] == "  paper: step compiled in 12.0 s: compiled anew; set-up took 20.1 s"
    assert [line[:30] for line in shown[2:4]] == ["  paper: train 25/50 loss=4.1 ",
                                                  "  paper: train 50/50 loss=4.1 "]
    assert all(len(line) == score.ECHO_WIDTH for line in shown[2:4])  # cut to 160
    assert shown[4:] == ["  paper: health check: mmlm/accuracy=0.010 after 50 steps",
                         "  paper: health: 1 of 3 checks fired: mmlm/accuracy=0.010 (step 50)",
                         "  paper: done: 50 steps in /tmp/run"]
    logged = log_path.read_text()
    assert "some INFO line of a library" in logged and logged.count("\n") == 8
    assert "x" * 200 in logged  # the log keeps whole lines


def test_a_failing_child_names_its_last_error_line(tmp_path):
    child = CHILD.replace('print("done: 50 steps in /tmp/run", flush=True)',
                          'print("error: ValueError: bad corpus /x", flush=True)')
    with open(tmp_path / "train.log", "a", encoding="utf-8") as log, \
            pytest.raises(score.SubprocessError,
                          match=r"paper training failed with exit code 3: error: ValueError: "
                                r"bad corpus /x \(log: .*train.log\)"):
        score.run_logged([sys.executable, "-c", child, "3"], log, "paper training",
                         io.StringIO(), "paper")
