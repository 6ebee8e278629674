"""Tests for launch/: shell syntax, the JobSet yaml, XLA flags, the dry runs, the SLURM and TPU VM
scripts' real paths against stand-in srun/gcloud/python3/uv (the TPU VM's python3 a Python 3.10,
as on the stock image), and a real 2-process local run."""
from __future__ import annotations

import importlib.metadata
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
    assert shlex.split(started) == [".venv/bin/python", "-m", "xlm_jax.train", "--gin_file=g.gin",
                                    "--model_dir=gs://b/r", "--gin.NAME='x y'"]
    res = subprocess.run(["bash", os.path.join(LAUNCH, "tpu_vm.sh"), "setup"], capture_output=True,
                         text=True, cwd=REPO_ROOT, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    steps = [shlex.split(line[2:]) for line in res.stdout.splitlines()]
    assert [s[0] for s in steps] == ["tar", "gcloud", "rm", "gcloud"]
    assert steps[1][4] == "scp" and "--worker=all" in steps[1]
    install = next(a for a in steps[3] if a.startswith("--command="))
    assert "python3 -m pip install -q --user --no-warn-script-location -U 'uv'" in install
    assert "uv venv -q --allow-existing --python '3.11' .venv" in install
    # one install, at the pins of the environment the suite runs in (constraints/tpu.txt)
    assert ("pip install -q --python .venv/bin/python -c 'constraints/tpu.txt' "
            "-e '.[data,gcs,tpu]'") in install
    assert "jax[tpu]" not in install
    res = subprocess.run(["bash", os.path.join(LAUNCH, "tpu_vm.sh"), "setup"], capture_output=True,
                         text=True, cwd=REPO_ROOT, env=dict(env, PINS=""), timeout=60)
    unpinned = next(a for a in shlex.split(res.stdout.splitlines()[-1][2:])
                    if a.startswith("--command="))
    assert "pip install -q --python .venv/bin/python -e '.[data,gcs,tpu]'" in unpinned
    res = subprocess.run(["bash", os.path.join(LAUNCH, "tpu_vm.sh"), "run"], capture_output=True,
                         text=True, env=_clean_env(DRY_RUN="1"), timeout=60)
    assert res.returncode != 0 and "TPU_NAME" in res.stderr


# Stand-ins put first on PATH so that the launch scripts' REAL paths (not DRY_RUN) run here:
# each records its argv (and, for the programs the scripts start, cwd and environment).
_RECORDER = f"""#!{sys.executable}
import json, os, sys
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({{"prog": os.path.basename(sys.argv[0]), "argv": sys.argv[1:],
                        "cwd": os.getcwd(), "pid": os.getpid(), "env": dict(os.environ)}}) + "\\n")
"""

# `srun [--options] PROGRAM ARGS...`: record, then run PROGRAM ARGS (one task).
_FAKE_SRUN = _RECORDER + """
cmd = sys.argv[1:]
while cmd[0].startswith("--"):
    cmd = cmd[1:]
os.execvp(cmd[0], cmd)
"""

# `gcloud compute tpus tpu-vm ssh|scp ...` against ONE local worker whose home is $FAKE_HOME:
# scp copies there, ssh runs --command= with bash in it.
_FAKE_GCLOUD = _RECORDER + """
import shutil, subprocess
args = sys.argv[1:]
assert args[:3] == ["compute", "tpus", "tpu-vm"], args
pos = [a for a in args[4:] if not a.startswith("--")]
home = os.environ["FAKE_HOME"]
if args[3] == "scp":
    src, dest = pos
    shutil.copy(src, os.path.join(home, dest.split(":", 1)[1]))
else:
    assert args[3] == "ssh", args
    command = next(a for a in args if a.startswith("--command="))[len("--command="):]
    sys.exit(subprocess.run(["bash", "-c", command], cwd=home,
                            env=dict(os.environ, HOME=home)).returncode)
"""

# The environment's python on the worker: `-m xlm_jax.train` stays up (a training run) until
# killed.
_FAKE_WORKER_PYTHON = _RECORDER + """
if sys.argv[1:3] == ["-m", "xlm_jax.train"]:
    import time
    print("fake trainer up", flush=True)
    time.sleep(120)
"""

# The stock TPU VM image's system python3, a Python 3.10: its pip installs uv for the user (the
# stand-in uv, from $FAKE_UV, into ~/.local/bin) and "installs" a jax spec (an old jax, on
# 3.10), refuses this package as pip does on 3.10 (setup.py's python_requires), and cannot
# import it.
_FAKE_SYSTEM_PYTHON = _RECORDER + """
import shutil
args = sys.argv[1:]
if args in (["--version"], ["-V"]):
    print("Python 3.10.12")
elif args[:3] == ["-m", "pip", "install"] and "--user" in args and args[-1] == "uv":
    bin_dir = os.path.join(os.environ["HOME"], ".local", "bin")
    os.makedirs(bin_dir, exist_ok=True)
    shutil.copy(os.environ["FAKE_UV"], os.path.join(bin_dir, "uv"))
elif args[:3] == ["-m", "pip", "install"] and not any(a.startswith("jax") for a in args):
    sys.exit("ERROR: Package 'xlm-jax' requires a different Python: 3.10.12 not in '>=3.11'")
elif args[:3] != ["-m", "pip", "install"]:  # -c CODE, -m MODULE: xlm_jax is not installed here
    sys.exit("ModuleNotFoundError: No module named 'xlm_jax'")
"""

# uv, as `pip install --user uv` leaves it. `venv --python 3.11 DIR` creates DIR with the
# Python running these tests (>= 3.11, standing in for the one uv would download); `pip install
# --python PY` asks PY its version, failing unless it is >= 3.11, and installs into its
# site-packages: `-e DIR` as a path entry (an editable install), its dependencies as the
# site-packages of the Python running these tests (where jax and the others are); a `-c FILE`
# must exist, as uv refuses a missing constraint file.
_FAKE_UV = _RECORDER + """
import subprocess, sysconfig
args = sys.argv[1:]
opt = lambda name: args[args.index(name) + 1]
if args[0] == "venv":
    if sys.version_info[:2] < tuple(int(v) for v in opt("--python").split(".")):
        sys.exit(f"error: No interpreter found for Python {opt('--python')}")
    target = args[-1]
    if os.path.exists(target) and "--allow-existing" not in args:
        sys.exit(f"error: A virtual environment already exists at: {target}")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", target], check=True)
else:
    assert args[:2] == ["pip", "install"], args
    python = opt("--python")
    version = subprocess.run([python, "--version"], capture_output=True,
                             text=True).stdout.split()[-1]
    if tuple(int(v) for v in version.split(".")[:2]) < (3, 11):
        sys.exit(f"error: the Python at {python} is {version}, and xlm-jax needs >= 3.11")
    site = subprocess.run([python, "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    if "-c" in args and not os.path.isfile(opt("-c")):
        sys.exit(f"error: File not found: `{opt('-c')}`")
    if "-e" in args:
        with open(os.path.join(site, "_xlm_jax_editable.pth"), "w") as f:
            f.write(os.path.abspath(opt("-e").split("[")[0]) + "\\n")
    with open(os.path.join(site, "_dependencies.pth"), "w") as f:
        f.write(sysconfig.get_paths()["purelib"] + "\\n")
"""


def _install(bin_dir, name, text):
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / name
    path.write_text(text)
    path.chmod(0o755)


def _records(path, prog=None):
    if not path.exists():
        return []
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [r for r in rows if prog is None or r["prog"] == prog]


def test_slurm_real_path_runs_srun_with_the_env_and_flags(tmp_path):
    """Without DRY_RUN: srun (a stand-in) gets the argv, and the venv's python the flags and
    environment the script exports (the user's XLA_FLAGS kept, the GPU flags appended)."""
    record = tmp_path / "record.jsonl"
    _install(tmp_path / "bin", "srun", _FAKE_SRUN)
    venv = tmp_path / "venv"
    _install(venv / "bin", "python", _RECORDER)
    (venv / "bin" / "activate").write_text(f'export PATH="{venv}/bin:$PATH"\n')
    flags = ["--gin_file=gin_configs/runs/a b.gin", "--model_dir=/shared/run",
             "--gin.NAME='x y'"]
    env = _clean_env(VENV=str(venv), RECORD=str(record), XLA_FLAGS="--xla_dump_to=/tmp/d",
                     PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}", SLURM_JOB_ID="77")
    res = subprocess.run(["bash", os.path.join(LAUNCH, "slurm_gpu.sbatch"), *flags],
                         capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("slurm_gpu: job 77 on ")
    (srun,) = _records(record, "srun")
    assert srun["argv"] == ["--kill-on-bad-exit=1", "--cpu-bind=none", "python", "-m",
                            "xlm_jax.train", *flags]
    (trainer,) = _records(record, "python")  # the venv's python: the venv was activated
    assert trainer["argv"] == ["-m", "xlm_jax.train", *flags]
    assert trainer["cwd"] == REPO_ROOT
    tenv = trainer["env"]
    xla = tenv["XLA_FLAGS"].split()
    assert xla[0] == "--xla_dump_to=/tmp/d"  # the user's flags are kept, first
    assert len(xla) == 14 and all(f.startswith("--xla_gpu_") for f in xla[1:])
    assert "--xla_gpu_all_reduce_combine_threshold_bytes=1073741824" in xla
    assert {k: tenv.get(k) for k in ("CUDA_DEVICE_MAX_CONNECTIONS",
                                     "XLA_PYTHON_CLIENT_MEM_FRACTION", "NCCL_PROTO",
                                     "TF_FORCE_GPU_ALLOW_GROWTH")} == {
        "CUDA_DEVICE_MAX_CONNECTIONS": "1", "XLA_PYTHON_CLIENT_MEM_FRACTION": "0.9",
        "NCCL_PROTO": "SIMPLE,LL,LL128", "TF_FORCE_GPU_ALLOW_GROWTH": "true"}


def _gone(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            return "\nState:\tZ" in f.read()  # killed, not yet reaped
    except FileNotFoundError:
        return True


def _tpu_worker(tmp_path, script=os.path.join(LAUNCH, "tpu_vm.sh")):
    """A stand-in gcloud (first on PATH) whose one worker is the local directory `worker`, with
    the stock image's python3 (3.10) and its own tail; returns (run `script`, record file,
    worker home). The checkout copied there holds xlm_jax's real `__init__.py`."""
    record, home = tmp_path / "record.jsonl", tmp_path / "worker"
    home.mkdir()
    _install(tmp_path / "bin", "gcloud", _FAKE_GCLOUD)
    _install(tmp_path / "worker_bin", "python3", _FAKE_SYSTEM_PYTHON)
    _install(tmp_path / "uv_wheel", "uv", _FAKE_UV)
    # the worker's `tail -n 100 -F FILE`, without -F (which would follow forever)
    _install(tmp_path / "worker_bin", "tail",
             f'#!/bin/sh\n[ "$3" = -F ] || exit 9\nexec {shutil.which("tail")} -n "$2" "$4"\n')
    path = f"{tmp_path / 'bin'}:{tmp_path / 'worker_bin'}:{os.environ['PATH']}"
    env = _clean_env(TPU_NAME="pod", ZONE="us-central2-b", RECORD=str(record),
                     FAKE_HOME=str(home), FAKE_UV=str(tmp_path / "uv_wheel" / "uv"), PATH=path,
                     TMPDIR=str(tmp_path))
    del env["PYTHONPATH"]  # the worker imports xlm_jax from its own copy, or not at all
    checkout = tmp_path / "checkout"
    for rel in ("xlm_jax/train.py", "setup.py", "constraints/tpu.txt", ".git/HEAD", ".venv/x",
                "m.pyc"):
        (checkout / rel).parent.mkdir(parents=True, exist_ok=True)
        (checkout / rel).write_text(rel)
    shutil.copy(os.path.join(REPO_ROOT, "xlm_jax", "__init__.py"), checkout / "xlm_jax")

    def tpu(*args, popen=False, **kw):
        argv = ["bash", script, *args]
        if popen:
            return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, cwd=checkout, env=dict(env, **kw))
        return subprocess.run(argv, capture_output=True, text=True, cwd=checkout,
                              env=dict(env, **kw), timeout=60)
    return tpu, record, home


def _worker_env():
    env = _clean_env()
    del env["PYTHONPATH"]
    return env


def test_tpu_vm_setup_on_a_python_3_10_image_and_logs(tmp_path):
    """Without DRY_RUN, on a worker whose python3 is 3.10: setup copies the checkout, installs
    uv with that python3 (its only use) and ends with a Python >= 3.11 environment in
    ~/xlm_jax/.venv that imports jax and the copied xlm_jax; setup runs again over it. logs
    follows the trainer's log on worker 0, or on $WORKER."""
    tpu, record, home = _tpu_worker(tmp_path)
    res = tpu("setup")
    assert res.returncode == 0, res.stderr
    # the closing check ran on the worker, in the environment
    words = res.stdout.split()
    assert words[0] == "python" and tuple(int(v) for v in words[1].split(".")[:2]) >= (3, 11)
    assert words[2:4] == ["jax", importlib.metadata.version("jax")]
    assert words[4:6] == ["process", "0"] and words[6] == "devices"
    venv_python = home / "xlm_jax" / ".venv" / "bin" / "python"
    probe = subprocess.run(
        [str(venv_python), "-c", "import sys, xlm_jax; print(sys.version_info >= (3, 11), "
                                 "xlm_jax.__file__)"],
        capture_output=True, text=True, cwd=home, env=_worker_env(), timeout=60)
    assert probe.stdout.split() == ["True", str(home / "xlm_jax" / "xlm_jax" / "__init__.py")]
    # the checkout arrived without .git, .venv and *.pyc; the local archive was removed
    got = sorted(str(p.relative_to(home / "xlm_jax")) for p in (home / "xlm_jax").rglob("*")
                 if p.is_file() and ".venv" not in p.parts and "__pycache__" not in p.parts)
    assert got == ["constraints/tpu.txt", "setup.py", "xlm_jax/__init__.py", "xlm_jax/train.py"]
    assert not (home / "xlm_jax" / ".venv" / "x").exists()
    assert not list(tmp_path.glob("xlm_jax_src.*"))
    (system_python,) = _records(record, "python3")
    assert system_python["argv"] == ["-m", "pip", "install", "-q", "--user",
                                     "--no-warn-script-location", "-U", "uv"]
    uv = _records(record, "uv")
    assert [r["argv"] for r in uv] == [
        ["venv", "-q", "--allow-existing", "--python", "3.11", ".venv"],
        ["pip", "install", "-q", "--python", ".venv/bin/python", "-c", "constraints/tpu.txt",
         "-e", ".[data,gcs,tpu]"]]
    assert {r["cwd"] for r in uv + [system_python]} == {str(home / "xlm_jax")}
    gcloud = [r["argv"] for r in _records(record, "gcloud")]
    assert [a[3] for a in gcloud] == ["scp", "ssh"]
    assert gcloud[0][5] == "pod:xlm_jax_src.tar.gz" and gcloud[1][4] == "pod"
    assert all("--zone=us-central2-b" in a and "--worker=all" in a for a in gcloud)
    res = tpu("setup")  # again, over the environment it made
    assert res.returncode == 0 and res.stdout.split()[:2] == words[:2], res.stderr
    record.unlink()
    (home / "xlm_jax_train.log").write_text("step 1\n")
    for worker, extra in (("0", {}), ("3", {"WORKER": "3"})):
        res = tpu("logs", **extra)
        assert res.returncode == 0, res.stderr
        assert res.stdout == "step 1\n"
        (logs,) = _records(record, "gcloud")
        assert logs["argv"][3:5] == ["ssh", "pod"] and f"--worker={worker}" in logs["argv"]
        assert logs["argv"][-1] == "--command=tail -n 100 -F ~/xlm_jax_train.log"
        record.unlink()


def test_tpu_vm_run_and_stop_on_a_local_stand_in_worker(tmp_path):
    """Without DRY_RUN: run starts the trainer on the worker with the flags intact, records
    ITS pid and lets ssh return; stop kills exactly that process."""
    tpu, record, home = _tpu_worker(tmp_path)
    _install(home / "xlm_jax" / ".venv" / "bin", "python", _FAKE_WORKER_PYTHON)
    flags = ["--gin_file=g.gin", "--model_dir=gs://b/r", "--gin.NAME='x y'", "a b"]
    proc = tpu("run", *flags, popen=True)
    trainer = None
    try:
        assert proc.wait(timeout=60) == 0
        deadline = time.monotonic() + 30
        while not _records(record, "python"):
            assert time.monotonic() < deadline, "the trainer did not start"
            time.sleep(0.1)
        (trainer,) = _records(record, "python")  # the environment's, not the system python3
        assert not _records(record, "python3")
        assert trainer["argv"] == ["-m", "xlm_jax.train", *flags]
        assert trainer["cwd"] == str(home / "xlm_jax")
        pid = int((home / "xlm_jax_train.pid").read_text())
        assert pid == trainer["pid"], "the pid file does not name the trainer"
        # the ssh session's output ends although the trainer runs on
        out, _ = proc.communicate(timeout=10)
        assert out.strip().endswith(f"started pid {pid}, log ~/xlm_jax_train.log")
        while "fake trainer up" not in (home / "xlm_jax_train.log").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.1)
        res = tpu("stop")
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip().endswith(": stopped")
        while not _gone(pid):
            assert time.monotonic() < deadline, f"the trainer (pid {pid}) runs on after stop"
            time.sleep(0.1)
        assert not (home / "xlm_jax_train.pid").exists()
    finally:  # stop what this test started, whatever failed
        leftovers = [int((home / "xlm_jax_train.pid").read_text())] if (
            home / "xlm_jax_train.pid").exists() else []
        for p in leftovers + ([trainer["pid"]] if trainer else []):
            if not _gone(p):
                os.kill(p, 9)
        proc.kill()
        proc.communicate()



def test_tpu_vm_setup_with_the_system_python_fails_on_the_stand_in(tmp_path):
    """The stand-in image catches a setup that installs with the system python3: the same
    script with the environment's python swapped for python3 fails there."""
    text = open(os.path.join(LAUNCH, "tpu_vm.sh")).read()
    assert text.count('VENV_PYTHON=".venv/bin/python"') == 1
    script = tmp_path / "tpu_vm_system_python.sh"
    script.write_text(text.replace('VENV_PYTHON=".venv/bin/python"', 'VENV_PYTHON="python3"'))
    tpu, record, _ = _tpu_worker(tmp_path, script=str(script))
    res = tpu("setup")
    assert res.returncode != 0
    assert "error: the Python at python3 is 3.10.12, and xlm-jax needs >= 3.11" in res.stderr
    assert [r["argv"][0] for r in _records(record, "python3")] == ["-m", "--version"]


def test_tpu_vm_run_refuses_a_worker_without_the_environment(tmp_path):
    tpu, record, home = _tpu_worker(tmp_path)
    (home / "xlm_jax").mkdir()
    res = tpu("run", "--gin_file=g.gin")
    assert res.returncode == 1
    assert res.stderr.strip().endswith(
        ": no ~/xlm_jax/.venv/bin/python, run 'launch/tpu_vm.sh setup' first")
    assert not _records(record, "python3") and not (home / "xlm_jax_train.pid").exists()


def test_tpu_vm_rejects_a_python_older_than_3_11():
    env = _clean_env(DRY_RUN="1", TPU_NAME="pod", ZONE="z", PYTHON_VERSION="3.10")
    res = subprocess.run(["bash", os.path.join(LAUNCH, "tpu_vm.sh"), "setup"],
                         capture_output=True, text=True, env=env, timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr == ("tpu_vm.sh: PYTHON_VERSION must be 3.11 or newer (3.MINOR), "
                          "got '3.10'\n")

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
