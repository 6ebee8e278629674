"""SIGKILL at random points of a real CLI run (asynchronous saves, the users' default, and
dropout on), five times, then a last start to the end: the final state equals the
uninterrupted run's bit for bit, and metrics.jsonl holds every step once with the
uninterrupted run's losses."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np

from tests.testlib import cli_run

STEPS = 20
ARGS = ["--gin_file=demo/synthetic.gin",
        "--gin.checkpoints.CheckpointConfig.async_save=True",  # with the donated state
        "--gin.checkpoints.CheckpointConfig.save_every_steps=4",
        # dropout on: its masks come from the step's key, so a resume must rebuild them
        "--gin.loop.model_config.overrides={'vocab_size': 512, 'dropout_rate': 0.1, "
        "'attention_dropout_rate': 0.1, 'num_layers': 2}"]
KILLS = 5
SEED = 20261124


def _rows(model_dir):
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def _checkpoint_dirs(model_dir):
    root = os.path.join(model_dir, "checkpoints")
    return sorted(os.listdir(root), key=lambda d: (len(d), d)) if os.path.isdir(root) else []


def _kill_once(model_dir, target, delay):
    """Starts the run (it resumes from model_dir), waits until its progress line says it
    finished step `target`, then `delay` seconds more (into the next step or a save), and
    SIGKILLs it. Points are steps, not times: a faster machine kills at the same steps.
    Returns what was on disk."""
    proc = subprocess.Popen([sys.executable, "-m", "xlm_jax.train", *ARGS,
                             "--gin_file=tests/testlib/paced.gin",
                             "--gin.hooks.Pace.seconds=0.05", f"--model_dir={model_dir}"],
                            cwd=cli_run.ROOT, env=cli_run.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    reached = threading.Event()

    def watch():  # this process's own progress lines, "train STEP/20 ..."
        for line in proc.stdout:
            m = re.search(r"(\d+)/%d " % STEPS, line)
            if m and int(m.group(1)) >= target:
                reached.set()

    threading.Thread(target=watch, daemon=True).start()
    assert reached.wait(240), f"the run did not reach step {target}"
    time.sleep(delay)
    finished = proc.poll() is not None
    proc.send_signal(signal.SIGKILL)
    proc.wait(60)
    assert finished or proc.returncode == -signal.SIGKILL
    steps = [r["step"] for r in _rows(model_dir) if r.get("split") == "train"]
    dirs = _checkpoint_dirs(model_dir)
    return {"target_step": target, "delay_s": round(delay, 3),
            "last_logged_step": max(steps, default=0),
            "checkpoints": [d for d in dirs if d.isdigit()],
            "unfinished_saves": [d.split(".")[0] for d in dirs if not d.isdigit()],
            "finished": finished}


def test_five_random_sigkills_resume_to_the_uninterrupted_state(tmp_path):
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    r = cli_run.run([*ARGS, f"--model_dir={straight}"])
    assert r.returncode == 0, r.stderr[-3000:]

    rng = np.random.default_rng(SEED)
    points = []
    for _ in range(KILLS):  # a step after the latest checkpoint, and a moment into the next
        latest = max((int(d) for d in _checkpoint_dirs(killed) if d.isdigit()), default=0)
        points.append(_kill_once(killed, int(rng.integers(latest + 1, STEPS)),
                                 float(rng.uniform(0.0, 0.1))))
    print("kill points:", json.dumps(points))
    assert sum(not p["finished"] for p in points) >= 4  # the kills hit a running trainer
    r = cli_run.run([*ARGS, f"--model_dir={killed}"])
    assert r.returncode == 0, r.stderr[-3000:]

    a, b = _rows(straight), _rows(killed)
    train_steps = [row["step"] for row in b if row["split"] == "train"]
    assert train_steps == list(range(1, STEPS + 1))  # none lost, none twice
    assert [row["loss"] for row in a] == [row["loss"] for row in b]  # bit-identical
    sa, sb = cli_run.state(straight), cli_run.state(killed)
    assert sa.keys() == sb.keys() and any("opt_state" in k for k in sa)
    for k in sa:  # parameters, optimizer state, objective state and step
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
