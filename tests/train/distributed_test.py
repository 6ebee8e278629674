"""Multi-process start-up (xlm_jax/train/distributed.py): what each environment says, the
explicit override, an unreachable coordinator, and a 2-process run started the way SLURM starts
it that trains to the same parameters as one process."""
import json
import os
import socket
import time

import numpy as np
import pytest

from testlib import distributed as dl
from xlm_jax.train import distributed

# The tiny demo model, one layer (compiles faster), a non-zero learning rate from step 1.
TRAIN_ARGS = ["--gin_file=demo/synthetic.gin", "--gin.TRAIN_STEPS=4",
              "--gin.optim.OptimizerConfig.warmup_steps=0",
              "--gin.loop.model_config.overrides={'vocab_size': 512, 'dropout_rate': 0.0, "
              "'attention_dropout_rate': 0.0, 'num_layers': 1}"]


@pytest.fixture
def plain_env(monkeypatch):
    """This test process's environment without any launcher's variables."""
    for key in set(os.environ) - set(dl.cpu_env()):
        monkeypatch.delenv(key)
    return monkeypatch


def _set(monkeypatch, env):
    for key, value in env.items():
        monkeypatch.setenv(key, value)


def test_a_plain_machine_is_one_process_and_asks_quickly(plain_env):
    assert distributed.detect_cluster() is None
    assert distributed.plan() is None
    t0 = time.perf_counter()
    for _ in range(100):
        distributed.plan()
    assert (time.perf_counter() - t0) / 100 < 0.01  # no network, no waiting


def test_slurm_says_how_many_processes(plain_env):
    _set(plain_env, dl.slurm_env(job_id=4096 + 17, ntasks=2, procid=1))
    p = distributed.plan(timeout_s=5)
    assert p == distributed.Plan("slurm", 2, 1, f"localhost:{dl.slurm_port(4096 + 17)}")
    # one task of a SLURM job is a single process: no coordinator is started
    _set(plain_env, dl.slurm_env(job_id=4096 + 17, ntasks=1, procid=0))
    assert distributed.detect_cluster().num_processes == 1
    assert distributed.plan() is None


def test_slurm_without_jax_cluster_classes(plain_env):
    """If jax's internal cluster module moves, the launchers' variables still say the count
    (the rest is left to jax.distributed.initialize)."""
    def moved():
        raise ImportError("jax._src.clusters")

    plain_env.setattr(distributed, "_jax_cluster_envs", moved)
    assert distributed.plan() is None
    _set(plain_env, dl.slurm_env(job_id=5, ntasks=4, procid=3))
    assert distributed.plan() == distributed.Plan("slurm", 4, None, None)
    plain_env.setenv("SLURM_NTASKS", "1")
    assert distributed.plan() is None


def test_explicit_flags_override_and_complete_the_environment(plain_env):
    assert distributed.plan("10.0.0.1:1234", 4, 2) == distributed.Plan("flags", 4, 2,
                                                                       "10.0.0.1:1234")
    with pytest.raises(ValueError, match="--coordinator_address given without "
                                         "--num_processes, --process_id"):
        distributed.plan("10.0.0.1:1234")
    with pytest.raises(ValueError, match=r"--process_id=2 must be in \[0, 2\)"):
        distributed.plan("10.0.0.1:1234", 2, 2)
    # under SLURM a coordinator address alone is enough: the rest comes from the job
    _set(plain_env, dl.slurm_env(job_id=9, ntasks=2, procid=0))
    assert distributed.plan("node7:999") == distributed.Plan("flags", 2, 0, "node7:999")


def test_a_cluster_that_cannot_say_its_size_is_reported(plain_env, capsys):
    class Broken:
        name = "k8s"

        @staticmethod
        def is_env_present():
            raise RuntimeError("pod is not part of a Job")

    plain_env.setattr(distributed, "_jax_cluster_envs", lambda: [Broken])
    assert distributed.plan() is None
    assert "could not read the Broken environment" in capsys.readouterr().err


def test_wait_for_coordinator(plain_env):
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        t0 = time.perf_counter()
        distributed.wait_for_coordinator(f"127.0.0.1:{listening.getsockname()[1]}", 5)
        assert time.perf_counter() - t0 < 1
        closed = listening.getsockname()[1]
    t0 = time.perf_counter()
    with pytest.raises(ConnectionError, match=rf"coordinator at 127\.0\.0\.1:{closed} could "
                                              r"not be reached within 1\.5 s"):
        distributed.wait_for_coordinator(f"127.0.0.1:{closed}", 1.5)
    assert 1.0 < time.perf_counter() - t0 < 4


def test_unreachable_coordinator_is_one_line_and_writes_nothing(tmp_path):
    """Task 1 of a SLURM job whose process 0 never started: after the timeout, one line naming
    the coordinator's address and the timeout; the model_dir is not created."""
    job = dl.free_slurm_job_id()
    model_dir = tmp_path / "run"
    proc = dl.start_trainer([*TRAIN_ARGS, f"--model_dir={model_dir}",
                             "--initialization_timeout=2"],
                            dl.slurm_env(job, ntasks=2, procid=1), tmp_path / "log")
    assert proc.wait(120) == 1
    log = (tmp_path / "log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, log[-3000:]
    assert errors[0].startswith("error: ConnectionError: ")
    assert f"localhost:{dl.slurm_port(job)}" in errors[0] and "within 2 s" in errors[0]
    assert not model_dir.exists()


def test_two_slurm_tasks_initialise_by_themselves_and_match_one_process(tmp_path):
    """2 processes x 2 CPU devices started with SLURM's variables only (no coordinator flags)
    train to the same parameters as 1 process x 4 devices (1e-5). The three processes run at
    once: each compiles on one thread."""
    job = dl.free_slurm_job_id()
    one, two = tmp_path / "one", tmp_path / "two"
    procs = [dl.start_trainer([*TRAIN_ARGS, f"--model_dir={two}",
                               "--initialization_timeout=120"],
                              dl.slurm_env(job, ntasks=2, procid=i, devices=2),
                              tmp_path / f"task_{i}.log") for i in range(2)]
    procs.append(dl.start_trainer([*TRAIN_ARGS, f"--model_dir={one}"], dl.cpu_env(4),
                                  tmp_path / "one.log"))
    try:
        codes = [p.wait(400) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    logs = {f.name: f.read_text() for f in tmp_path.glob("*.log")}
    assert codes == [0, 0, 0], {k: v[-2000:] for k, v in logs.items()}
    for i in range(2):
        assert (f"multi-process (slurm): process {i} of 2, coordinator "
                f"localhost:{dl.slurm_port(job)}") in logs[f"task_{i}.log"]
    info = json.loads((two / "run_info.json").read_text())
    assert info["process_count"] == 2 and info["device_count"] == 4
    assert json.loads((one / "run_info.json").read_text())["process_count"] == 1

    a, b = dl.final_state(one), dl.final_state(two)
    params = [k for k in a if k.startswith("['params']")]
    assert len(params) > 10 and a.keys() == b.keys()
    for k in params:
        np.testing.assert_allclose(b[k], a[k], atol=1e-5, rtol=0, err_msg=k)
    assert int(a["['step']"]) == int(b["['step']"]) == 4


def test_coordinator_port_taken_is_one_line(tmp_path):
    """Process 0 cannot start the coordinator because another program holds its port."""
    job = dl.free_slurm_job_id()
    with socket.socket() as other:
        other.bind(("", dl.slurm_port(job)))
        other.listen()
        proc = dl.start_trainer([*TRAIN_ARGS, f"--model_dir={tmp_path / 'run'}"],
                                dl.slurm_env(job, ntasks=2, procid=0), tmp_path / "log")
        assert proc.wait(120) == 1
    log = (tmp_path / "log").read_text()
    errors = [line for line in log.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, log[-3000:]
    port = dl.slurm_port(job)
    assert errors[0].startswith("error: ConnectionError: process 0 cannot start the "
                                f"jax.distributed coordinator localhost:{port}: port {port} of "
                                "this machine is taken"), errors[0]
    assert not (tmp_path / "run").exists()
