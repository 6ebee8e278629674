"""Tests for launch/: shell syntax, the JobSet yaml, XLA flags, and a real 2-process local run."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import textwrap
import time

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = os.path.join(REPO_ROOT, "launch")
SCRIPTS = ["tpu_vm.sh", "slurm_gpu.sbatch", "local_multiprocess.sh"]

# A stand-in for `python -m xlm_jax.train`: takes the three coordinator flags the launcher
# appends, joins the distributed runtime and does one cross-process reduction.
PROBE = textwrap.dedent("""
    import argparse, json, os, sys
    p = argparse.ArgumentParser()
    p.add_argument("--out"); p.add_argument("--coordinator_address")
    p.add_argument("--num_processes", type=int); p.add_argument("--process_id", type=int)
    a = p.parse_args()
    if a.process_id == int(os.environ.get("PROBE_FAIL_PROCESS", "-1")):
        print("probe: failing on purpose"); sys.exit(3)
    import jax, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    jax.distributed.initialize(a.coordinator_address, a.num_processes, a.process_id)
    mesh = Mesh(np.array(jax.devices()), ("data",))
    local = np.full((jax.local_device_count(), 3), jax.process_index() + 1, np.float32)
    x = jax.make_array_from_process_local_data(NamedSharding(mesh, P("data")), local)
    total = jax.jit(lambda v: v.sum(), out_shardings=NamedSharding(mesh, P()))(x)
    json.dump({"process_index": jax.process_index(), "process_count": jax.process_count(),
               "device_count": jax.device_count(), "local": jax.local_device_count(),
               "sum": float(total.addressable_data(0)),
               "collectives": jax.config.jax_cpu_collectives_implementation},
              open(os.path.join(a.out, f"p{a.process_id}.json"), "w"))
    jax.distributed.shutdown()
""")


def _clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAX_PLATFORMS")}
    env.update(PYTHONPATH=REPO_ROOT, **extra)
    return env


@pytest.mark.parametrize("script", SCRIPTS)
def test_bash_syntax(script):
    res = subprocess.run(["bash", "-n", os.path.join(LAUNCH, script)], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert os.access(os.path.join(LAUNCH, script), os.R_OK)


def test_jobset_yaml():
    yaml = pytest.importorskip("yaml")
    with open(os.path.join(LAUNCH, "gke", "jobset.yaml")) as f:
        doc = yaml.safe_load(f)
    assert doc["apiVersion"].startswith("jobset.x-k8s.io/") and doc["kind"] == "JobSet"
    (job,) = doc["spec"]["replicatedJobs"]
    spec = job["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    (container,) = spec["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    # The process count must agree with the number of pods.
    assert int(env["NUM_PROCESSES"]["value"]) == spec["parallelism"] == spec["completions"]
    assert "job-completion-index" in env["PROCESS_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
    # The coordinator is pod 0 of this replicated job, addressed by its JobSet DNS name.
    assert env["COORDINATOR_ADDRESS"]["value"] == (
        f"$(JOBSET_NAME)-{job['name']}-0-0.$(JOBSET_NAME):"
        f"{container['ports'][0]['containerPort']}")
    script = container["args"][0]
    assert "python -m xlm_jax.train" in script
    for flag in ("--coordinator_address=", "--num_processes=", "--process_id=",
                 "--gin_file=", "--model_dir="):
        assert flag in script
    _assert_xla_flags_accepted(env["XLA_FLAGS"]["value"])


def _assert_xla_flags_accepted(flags: str):
    """An unknown XLA flag aborts every JAX program at start-up; the GPU flags are registered
    in every jaxlib (CPU builds included), so the installed one can vet them."""
    assert "--xla_gpu_enable_latency_hiding_scheduler=true" in flags
    res = subprocess.run(
        [sys.executable, "-c", "import jax.numpy as jnp; print(float(jnp.ones(3).sum()))"],
        capture_output=True, text=True, timeout=120,
        env=_clean_env(XLA_FLAGS=flags, JAX_PLATFORMS="cpu"))
    assert res.returncode == 0 and res.stdout.strip() == "3.0", res.stderr[-1500:]


def test_xla_flag_check_can_fail():
    with pytest.raises(AssertionError):
        _assert_xla_flags_accepted(
            "--xla_gpu_enable_latency_hiding_scheduler=true --xla_gpu_no_such_flag=true")


def test_slurm_dry_run_flags_and_command():
    res = subprocess.run(
        ["bash", os.path.join(LAUNCH, "slurm_gpu.sbatch"), "--gin_file=gin_configs/runs/a b.gin",
         "--model_dir=/shared/run", "--gin.train.train_steps=10"],
        capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
        env=_clean_env(DRY_RUN="1", VENV="/nonexistent"))
    assert res.returncode == 0, res.stderr
    lines = dict(line.split("=", 1) for line in res.stdout.splitlines() if "=" in line
                 and not line.startswith("command:"))
    flags = lines["XLA_FLAGS"].split()
    assert len(flags) == 13 and all(f.startswith("--xla_gpu_") for f in flags)
    _assert_xla_flags_accepted(lines["XLA_FLAGS"])
    command = next(line for line in res.stdout.splitlines() if line.startswith("command:"))
    argv = shlex.split(command[len("command:"):])
    assert argv[:2] == ["srun", "--kill-on-bad-exit=1"]
    assert argv[-5:] == ["-m", "xlm_jax.train", "--gin_file=gin_configs/runs/a b.gin",
                         "--model_dir=/shared/run", "--gin.train.train_steps=10"]
    # Without trainer flags it refuses with a one-line hint.
    res = subprocess.run(["bash", os.path.join(LAUNCH, "slurm_gpu.sbatch")], capture_output=True,
                         text=True, env=_clean_env(DRY_RUN="1"), timeout=60)
    assert res.returncode == 2 and "--gin_file=" in res.stderr


def test_tpu_vm_dry_run():
    env = _clean_env(DRY_RUN="1", TPU_NAME="pod", ZONE="us-central2-b", PROJECT="proj")
    res = subprocess.run(["bash", os.path.join(LAUNCH, "tpu_vm.sh"), "run", "--gin_file=g.gin",
                          "--model_dir=gs://b/r", "--gin.NAME='x y'"],
                         capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    (line,) = res.stdout.splitlines()
    argv = shlex.split(line[2:])
    assert argv[:5] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]
    assert "--worker=all" in argv and "--zone=us-central2-b" in argv and "--project=proj" in argv
    remote = next(a for a in argv if a.startswith("--command="))[len("--command="):]
    # The remote shell sees the trainer flags intact (quoted once for it).
    started = remote.split("nohup ", 1)[1].split(" > ", 1)[0]
    assert shlex.split(started) == ["python3", "-m", "xlm_jax.train", "--gin_file=g.gin",
                                    "--model_dir=gs://b/r", "--gin.NAME='x y'"]
    res = subprocess.run(["bash", os.path.join(LAUNCH, "tpu_vm.sh"), "setup"], capture_output=True,
                         text=True, cwd=REPO_ROOT, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    steps = [shlex.split(line[2:]) for line in res.stdout.splitlines()]
    assert [s[0] for s in steps] == ["tar", "gcloud", "rm", "gcloud"]
    assert steps[1][4] == "scp" and "--worker=all" in steps[1]
    install = next(a for a in steps[3] if a.startswith("--command="))
    assert "pip install -q -U 'jax[tpu]'" in install and "pip install -q -e '.[data]'" in install
    res = subprocess.run(["bash", os.path.join(LAUNCH, "tpu_vm.sh"), "run"], capture_output=True,
                         text=True, env=_clean_env(DRY_RUN="1"), timeout=60)
    assert res.returncode != 0 and "TPU_NAME" in res.stderr


def _run_local(tmp_path, n, extra_env=None, timeout=240):
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    out = tmp_path / "out"
    out.mkdir()
    logs = tmp_path / "logs"
    env = _clean_env(LAUNCH_CMD=f"{sys.executable} {probe}", PYTHON=sys.executable,
                     **(extra_env or {}))
    t0 = time.monotonic()
    res = subprocess.run(["bash", os.path.join(LAUNCH, "local_multiprocess.sh"), "-n", str(n),
                          "-d", "2", "-l", str(logs), "-t", "180", "--", f"--out={out}"],
                         capture_output=True, text=True, env=env, timeout=timeout)
    return res, out, logs, time.monotonic() - t0


def test_local_multiprocess_runs_a_cross_process_reduction(tmp_path):
    res, out, logs, _ = _run_local(tmp_path, 2)
    logs_text = "".join(p.read_text()[-1500:] for p in sorted(logs.glob("*.log")))
    assert res.returncode == 0, res.stderr + logs_text
    results = [json.loads((out / f"p{i}.json").read_text()) for i in range(2)]
    for i, r in enumerate(results):
        assert r["process_index"] == i and r["process_count"] == 2
        assert r["device_count"] == 4 and r["local"] == 2
        assert r["collectives"] == "gloo"
        # 2 devices x 3 values x 1 (process 0) + 2 x 3 x 2 (process 1): needs both processes.
        assert r["sum"] == 18.0
    assert sorted(p.name for p in logs.iterdir()) == ["process_0.log", "process_1.log"]


def test_local_multiprocess_fails_fast_when_one_process_fails(tmp_path):
    # Process 1 exits before joining; process 0 would wait for it in initialize() for minutes.
    res, out, logs, elapsed = _run_local(tmp_path, 2, {"PROBE_FAIL_PROCESS": "1"})
    assert res.returncode == 3, (res.stdout, res.stderr)
    assert "process 1 exited with status 3" in res.stderr or "exited with status 3" in res.stderr
    assert "failing on purpose" in (logs / "process_1.log").read_text()
    assert not (out / "p0.json").exists()
    assert elapsed < 120


def test_local_multiprocess_rejects_bad_counts():
    res = subprocess.run(["bash", os.path.join(LAUNCH, "local_multiprocess.sh"), "-n", "zero"],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip() == "local_multiprocess.sh: -n must be a positive integer, got 'zero'"


def test_scripts_are_documented():
    for script in SCRIPTS:
        with open(os.path.join(LAUNCH, script)) as f:
            text = f.read()
        assert text.startswith("#!") and "Usage" in text
    assert shutil.which("bash")
