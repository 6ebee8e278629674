"""Starting trainer processes the way cluster launchers do, for the multi-process tests: an
environment without any launcher's variables, SLURM's variables for one task of a job, a job id
whose coordinator port is free, and the arrays of a run's final checkpoint."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from typing import Any

import numpy as np

from tests.testlib.xla_flags import FAST_COMPILE, xla_flags

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Variables by which jax (or xlm_jax.train.distributed) recognises a cluster: a test run
# inside a SLURM job or a Kubernetes pod must not make its trainer subprocesses join that job.
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "TPU_", "MEGASCALE_", "JAX_COORDINATOR",
                      "JAX_LOCAL_DEVICE_IDS", "KUBERNETES_SERVICE_HOST", "JOB_COMPLETION_INDEX")
# jax's SlurmCluster: coordinator port = SLURM_JOB_ID % 2**12 + (65535 - 2**12 + 1)
_SLURM_PORT_BASE = 65535 - 2**12 + 1


def cpu_env(devices: int = 1, **extra: str) -> dict[str, str]:
    """This process's environment without launcher variables, on the CPU platform with
    `devices` host devices, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_LAUNCHER_PREFIXES)}
    env.update({"XLA_FLAGS": xla_flags(devices), "XLA_FLAGS_EXTRA": FAST_COMPILE,
                "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "2"})
    env.update(extra)
    return env


def slurm_env(job_id: int, ntasks: int, procid: int, devices: int = 1) -> dict[str, str]:
    """`cpu_env` plus what `srun` sets for task `procid` of `ntasks`, all on this one node."""
    return cpu_env(devices, SLURM_JOB_ID=str(job_id), SLURM_JOBID=str(job_id),
                   SLURM_NTASKS=str(ntasks), SLURM_NPROCS=str(ntasks),
                   SLURM_PROCID=str(procid), SLURM_LOCALID=str(procid), SLURM_NODEID="0",
                   SLURM_STEP_ID="0", SLURM_STEP_NUM_NODES="1", SLURM_STEP_NUM_TASKS=str(ntasks),
                   SLURM_STEP_NODELIST="localhost", SLURM_JOB_NODELIST="localhost",
                   SLURM_NODELIST="localhost", SLURM_NNODES="1")


def slurm_port(job_id: int) -> int:
    return job_id % 2**12 + _SLURM_PORT_BASE


def free_slurm_job_id() -> int:
    """A SLURM job id whose coordinator port (as jax derives it) nobody listens on now."""
    for offset in range(2**12):
        port = _SLURM_PORT_BASE + (os.getpid() + offset) % 2**12
        with socket.socket() as s:
            try:
                s.bind(("", port))
            except OSError:
                continue
        return 7 * 2**12 + port - _SLURM_PORT_BASE  # a realistic-looking id with that port
    raise RuntimeError("no free port in SLURM's coordinator range")


def start_trainer(args: list[str], env: dict[str, str], log_path: Any) -> subprocess.Popen:
    """`python -m xlm_jax.train ARGS` in the repository root, output to `log_path`."""
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-m", "xlm_jax.train", *args], cwd=ROOT,
                                env=env, stdout=log, stderr=subprocess.STDOUT)


def final_state(model_dir: Any) -> dict[str, np.ndarray]:
    """Every array of the newest trainer checkpoint of `model_dir`, by path, read onto one
    device (whatever the devices and processes that wrote it)."""
    import jax
    import orbax.checkpoint as ocp

    from xlm_jax import model_dir as md

    path = md.trainer_state_dir(str(model_dir))
    one = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with ocp.StandardCheckpointer() as ckptr:
        target = jax.tree_util.tree_map(
            lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=one),
            ckptr.metadata(path).item_metadata)
        state = ckptr.restore(path, target)
    return {jax.tree_util.keystr(p): np.asarray(v) for p, v in
            jax.tree_util.tree_flatten_with_path(state)[0]}
