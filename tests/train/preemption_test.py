"""SIGTERM (a scheduler's preemption notice) as users meet it: the CLI saves at the step it
reached, exits 0, and the next start resumes from there to the uninterrupted run's state."""
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np

from tests.testlib import cli_run

ARGS = ["--gin_file=demo/synthetic.gin",
        "--gin.checkpoints.CheckpointConfig.async_save=True"]  # the users' default


def _logged_steps(model_dir):
    path = os.path.join(model_dir, "metrics.jsonl")
    return cli_run.losses(model_dir) if os.path.exists(path) else {}


def test_sigterm_saves_the_step_reached_exits_0_and_the_resume_is_exact(tmp_path):
    straight, preempted = str(tmp_path / "straight"), str(tmp_path / "preempted")
    r = cli_run.run([*ARGS, f"--model_dir={straight}"])
    assert r.returncode == 0, r.stderr[-3000:]

    proc = subprocess.Popen([sys.executable, "-m", "xlm_jax.train", *ARGS,
                             "--gin_file=tests/testlib/paced.gin", f"--model_dir={preempted}"],
                            cwd=cli_run.ROOT, env=cli_run.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while max(_logged_steps(preempted), default=0) < 3 and time.time() < deadline:
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr[-3000:]
    stopped = int(re.search(r"preempted: stopped at step (\d+)", stdout).group(1))
    assert 3 <= stopped < 20
    # the checkpoint of the step reached (the periodic ones are at 10 and 20), committed
    steps = sorted(int(d) for d in os.listdir(os.path.join(preempted, "checkpoints"))
                   if d.isdigit())
    assert steps[-1] == stopped
    assert os.path.exists(os.path.join(preempted, "checkpoints", str(stopped),
                                       "commit_success.txt"))
    assert sorted(_logged_steps(preempted)) == list(range(1, stopped + 1))

    r = cli_run.run([*ARGS, f"--model_dir={preempted}"])
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"resumed from {preempted} step {stopped}" in r.stdout
    a, b = cli_run.losses(straight), cli_run.losses(preempted)
    assert sorted(b) == list(range(1, 21))
    assert [a[s] for s in range(1, 21)] == [b[s] for s in range(1, 21)]  # bit-identical
    sa, sb = cli_run.state(straight), cli_run.state(preempted)
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
