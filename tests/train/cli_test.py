"""The training CLI as users run it (subprocesses): exact resume after SIGKILL, two processes
with gloo collectives, TensorBoard output, gin files and the bad-input errors."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.testlib.cli_run import ROOT
from tests.testlib.cli_run import env as _env
from tests.testlib.cli_run import losses as _losses
from tests.testlib.cli_run import params as _params
from tests.testlib.cli_run import run as _run
from tests.testlib.cli_run import state as _state

# gin to each test itself: its registry, bindings and operative config put back after it
# (tests/testlib/gin_state.py; issue 56).
pytestmark = pytest.mark.usefixtures("gin_isolated")

SYNTH = "--gin_file=demo/synthetic.gin"


def _sigkill_resume(tmp_path, gin_file):
    """A 20-step run straight, and one SIGKILLed after its step-10 checkpoint then resumed:
    the losses and every array of the final state are bit-identical. Returns both dirs."""
    straight, killed = str(tmp_path / "straight"), str(tmp_path / "killed")
    r = _run([gin_file, f"--model_dir={straight}"])
    assert r.returncode == 0, r.stderr[-3000:]

    proc = subprocess.Popen([sys.executable, "-m", "xlm_jax.train", gin_file,
                             "--gin_file=tests/testlib/stall_at_10.gin",
                             f"--model_dir={killed}"], cwd=ROOT, env=_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpt10 = os.path.join(killed, "checkpoints", "10", "commit_success.txt")
    deadline = time.time() + 240
    while not os.path.exists(ckpt10) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.5)
    assert os.path.exists(ckpt10), "no step-10 checkpoint appeared"
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(60) == -signal.SIGKILL
    assert max(_losses(killed)) == 10

    r = _run([gin_file, f"--model_dir={killed}"])
    assert r.returncode == 0, r.stderr[-3000:]
    a, b = _losses(straight), _losses(killed)
    assert sorted(a) == sorted(b) == list(range(1, 21))
    assert [a[s] for s in range(1, 21)] == [b[s] for s in range(1, 21)]  # bit-identical
    pa, pb = _params(straight), _params(killed)
    assert pa.keys() == pb.keys()
    for k in pa:
        np.testing.assert_array_equal(pa[k], pb[k], err_msg=k)
    sa, sb = _state(straight), _state(killed)
    assert sa.keys() == sb.keys()
    for k in sa:
        np.testing.assert_array_equal(sa[k], sb[k], err_msg=k)
    return straight, killed, a


def test_every_objective_survives_sigkill_and_resumes_exactly(tmp_path):
    """tests/testlib/objective_mix.gin: MMLM + TLM, a test objective with a head of its own,
    XLM-E (shared generator and RTD head; samples from per-row keys of the step), ERNIE-M
    (BTMLM's pseudo-tokens from the step's parameters, target languages from the step's key),
    VECO (cross-attention) and XLCo (key encoder and queue), all in one run: every array of
    the state after the resume equals the uninterrupted run's."""
    straight, _, losses = _sigkill_resume(tmp_path, "--gin_file=tests/testlib/objective_mix.gin")
    state = _state(straight)
    for module in ("probe_head", "generator", "rtd_head", "xlco"):
        assert any(f"'objectives']['{module}']" in k and "'params'" in k for k in state), module
    assert any("'opt_state'" in k and "probe_head" in k for k in state)  # modules are optimised
    assert any("'obj_state']['xlco']['queue']" in k for k in state)
    assert any("cross_attention" in k for k in state)
    rows = [json.loads(line) for line in open(os.path.join(straight, "metrics.jsonl"))]
    for key in ("camlm/src_loss", "btmlm/pseudo_copy_rate", "veco/cs_xy_loss",
                "mrtd/rtd_recall", "xlco/queue_fill", "probe/loss"):
        assert key in rows[-1], key
    assert len(losses) == 20


def test_a_run_writes_its_losses_flops_and_provenance_to_tensorboard_and_files(tmp_path):
    """What a CLI run leaves besides its checkpoints. (A SIGKILL and its exact resume are
    `test_every_objective_survives_sigkill_and_resumes_exactly` above, every objective at once,
    and tests/train/random_kill_test.py, five random kills of this run file with dropout and
    asynchronous saves; this test ran a third kill of its own until issue 56.)"""
    straight = str(tmp_path / "straight")
    r = _run([SYNTH, f"--model_dir={straight}"])
    assert r.returncode == 0, r.stderr[-3000:]
    a = _losses(straight)
    assert sorted(a) == list(range(1, 21))

    # TensorBoard event files of the real run hold the same losses.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(os.path.join(straight, "train"))
    acc.Reload()
    events = acc.Scalars("loss")
    assert [e.step for e in events] == list(range(1, 21))
    np.testing.assert_allclose([e.value for e in events], [a[s] for s in range(1, 21)], rtol=1e-6)
    for name in ("mmlm/loss", "tlm/loss", "learning_rate", "grad_norm", "tokens_per_sec",
                 "model_tflops_per_sec"):
        assert name in acc.Tags()["scalars"], name
    assert "mfu" not in acc.Tags()["scalars"]  # a CPU has no known peak: no fake 0% MFU
    # model FLOP/s = tokens/s x the run's FLOPs per token (one constant for the whole run)
    ratios = [f.value / t.value for f, t in zip(acc.Scalars("model_tflops_per_sec"),
                                                acc.Scalars("tokens_per_sec"))]
    from xlm_jax import model_dir as md
    from xlm_jax.train import step_flops as flops

    cfg = md.read_config(straight)
    # MMLM + TLM, one row each at length 32 with 6 prediction slots (demo/synthetic.gin)
    np.testing.assert_allclose(ratios, flops.train_flops_per_token(cfg, 32, 6 / 32) / 1e12,
                               rtol=1e-4)

    # The run records what produced it.
    info = json.load(open(os.path.join(straight, "run_info.json")))
    assert info["versions"]["jax"] and "operative" not in info
    assert "loop.train" in open(os.path.join(straight, "operative_config.gin")).read()


def test_two_processes_match_one_process_with_four_devices(tmp_path):
    one = str(tmp_path / "one")
    r = _run([SYNTH, f"--model_dir={one}", "--gin.TRAIN_STEPS=5"], devices=4)
    assert r.returncode == 0, r.stderr[-3000:]
    two = str(tmp_path / "two")
    r = subprocess.run(["bash", "launch/local_multiprocess.sh", "-n", "2", "-d", "2",
                        "-l", str(tmp_path / "logs"), "-t", "300", "--", SYNTH,
                        f"--model_dir={two}", "--gin.TRAIN_STEPS=5"],
                       cwd=ROOT, env=_env(PYTHON=sys.executable), capture_output=True,
                       text=True, timeout=400)
    logs = "".join(open(f).read()[-2000:] for f in glob.glob(str(tmp_path / "logs" / "*")))
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:] + logs
    la, lb = _losses(one), _losses(two)
    assert sorted(la) == sorted(lb) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose([lb[s] for s in la], [la[s] for s in la], atol=1e-5, rtol=0)
    info = json.load(open(os.path.join(two, "run_info.json")))
    assert info["process_count"] == 2 and info["device_count"] == 4


def _error(r):
    assert r.returncode != 0
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, r.stderr[-3000:]
    return lines[0]


def test_unknown_gin_binding_fails_before_compiling(tmp_path):
    r = _run([SYNTH, f"--model_dir={tmp_path}", "--gin.loop.train.no_such_option=3"])
    msg = _error(r)
    assert "no_such_option" in msg
    assert not os.path.exists(tmp_path / "checkpoints")  # nothing was built


def test_missing_required_macro_is_named(tmp_path):
    r = _run(["--gin_file=runs/xlmr_base_mmlm.gin", f"--model_dir={tmp_path}"])
    msg = _error(r)
    assert "required gin macro(s) not set: MONO_TASK, TRAIN_STEPS" in msg
    assert not os.path.exists(tmp_path / "checkpoints")


def test_missing_gin_file_lists_where_it_looked(tmp_path):
    msg = _error(_run(["--gin_file=runs/nope.gin", f"--model_dir={tmp_path}"]))
    assert "runs/nope.gin" in msg and os.path.join(ROOT, "gin_configs", "runs", "nope.gin") in msg


def test_unwritable_model_dir(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    msg = _error(_run([SYNTH, f"--model_dir={blocker}/run"]))
    assert str(blocker) in msg


def test_every_shipped_gin_file_parses():
    import gin

    from xlm_jax.train import gin_utils

    files = sorted(glob.glob(os.path.join(ROOT, "gin_configs", "**", "*.gin"), recursive=True))
    assert len(files) >= 6
    for path in files:
        gin.clear_config()
        gin_utils.parse([path], [], check_required=False)
    gin.clear_config()
    with pytest.raises(ValueError, match="required gin macro.*MONO_TASK, TRAIN_STEPS"):
        gin_utils.parse(["runs/xlmr_base_mmlm.gin"], [])
    gin.clear_config()
