"""Multi-process start-up: initialise `jax.distributed` when this run is one of several processes.

What: `initialize(coordinator_address, num_processes, process_id, timeout_s=...)` runs before
anything touches a device and picks the first case that applies:
1. explicit: any of the three values is given (the CLI's --coordinator_address, --num_processes,
   --process_id; for launchers jax does not know, e.g. launch/local_multiprocess.sh or a GKE
   JobSet). A value left out is taken from a detected cluster, else it is an error.
2. detected: jax's own cluster detection (SLURM, Open MPI, GKE TPU, Cloud TPU VM, Kubernetes
   Job) finds an environment that says more than one process.
3. otherwise one process, and nothing is initialised: a plain machine, a single SLURM task, a
   single-host TPU VM.
On the CPU platform cross-process collectives use gloo.

Why this way: jax has no public call for "how many processes does this environment say?";
`jax.distributed.initialize()` with no arguments raises on a plain machine and, in a cluster of
one task, starts a coordinator anyway (on SLURM at a port derived from the job id, which two
single-task steps of one job on one node would share). So `detect_cluster` asks jax's cluster
classes themselves (`jax._src.clusters`, the only internal used here), in jax's order, and falls
back to reading the launchers' variables if that module ever moves. On a machine that is no
TPU VM none of them touches the network (the Cloud TPU check is gated on jax having found TPU
chips at import), so a plain start costs microseconds.

Unreachable coordinator: jaxlib's client does not raise when it cannot register with the
coordinator in time, it aborts the whole process (LOG(FATAL)). So a process other than 0 first
opens a plain TCP connection to the coordinator itself, retrying until `timeout_s`, and raises
a one-line `ConnectionError` naming the address; process 0 checks that the coordinator's port
is free (jaxlib sometimes crashes instead of raising when it is not), and jax's own errors
become the same kind of error. Each phase, reaching the coordinator and then registering
all processes with it, is bounded by `timeout_s`. Not caught: process 0 (the coordinator) waiting
for a process that never comes still ends in jaxlib's abort after `timeout_s`, preceded by this
module's line that names the coordinator and the process count; nothing is written before.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

# jax's default too: hosts of a pod start minutes apart (`gcloud ... ssh --worker=all` walks
# the workers, GKE pulls the image on every node, SLURM runs prologs), and the coordinator
# waits for the last one. Shorter kills big runs whose last host is slow to start; longer only
# delays the error of a run that cannot start.
DEFAULT_TIMEOUT_S = 300
_PROBE_INTERVAL_S = 0.5


@dataclasses.dataclass(frozen=True)
class Cluster:
    """What a launcher's environment says about this run."""

    name: str  # jax's name of the environment: "slurm", "ompi", "gketpu", "gcetpu", ...
    num_processes: int
    # Both read only when num_processes > 1 (on Kubernetes the id needs an indexed Job).
    process_id: Callable[[], int | None]  # None: left to jax.distributed.initialize
    coordinator: Callable[[float], str | None]  # timeout_s -> "HOST:PORT"; None: left to jax


def _jax_cluster_envs() -> list[Any]:
    """jax's registered cluster environments in the order `jax.distributed.initialize()` tries
    them, without the opt-in ones (mpi4py). Internal API (`jax._src.clusters`, read on jax
    0.10.2): raises ImportError/AttributeError if it moves, and `detect_cluster` falls back."""
    from jax._src import clusters

    return [env for env in clusters.ClusterEnv._cluster_types
            if not getattr(env, "opt_in_only_method", False)]


def _jax_cluster(env: Any) -> Cluster:
    def coordinator(timeout_s: float) -> str | None:
        # jax lets these two variables override the cluster's address and port.
        if os.environ.get("JAX_COORDINATOR_ADDRESS"):
            return os.environ["JAX_COORDINATOR_ADDRESS"]
        try:
            return env.get_coordinator_address(
                timeout_secs=int(timeout_s),
                override_coordinator_port=os.environ.get("JAX_COORDINATOR_PORT"))
        except TypeError:  # another jax signature: let jax find the address itself
            return None

    return Cluster(getattr(env, "name", "") or env.__name__, int(env.get_process_count()),
                   lambda: int(env.get_process_id()), coordinator)


def _cluster_from_variables() -> Cluster | None:
    """The launchers' own variables, for a jax without `jax._src.clusters`; the process id and
    coordinator are then left to `jax.distributed.initialize()`."""
    env = os.environ
    count = None
    if all(k in env for k in ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS",
                              "SLURM_PROCID", "SLURM_LOCALID")):
        name, count = "slurm", env["SLURM_NTASKS"]
    elif "OMPI_MCA_orte_hnp_uri" in env:
        name, count = "ompi", env.get("OMPI_COMM_WORLD_SIZE")
    elif env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES"):
        hosts = env.get("TPU_PROCESS_ADDRESSES") or env["TPU_WORKER_HOSTNAMES"]
        name = "gketpu"
        count = len(hosts.split(",")) * int(env.get("MEGASCALE_NUM_SLICES") or 1)
    if count is None:
        return None
    return Cluster(name, int(count), lambda: None, lambda timeout_s: None)


def detect_cluster() -> Cluster | None:
    """The cluster environment `jax.distributed.initialize()` would use, or None on a plain
    machine. An environment that is present but cannot say its size (e.g. a Kubernetes pod
    that is not a Job) is reported on stderr and taken as no cluster."""
    try:
        envs = _jax_cluster_envs()
    except (ImportError, AttributeError):
        return _cluster_from_variables()
    for env in envs:
        # Any exception: these checks read files, variables, the Kubernetes API or the GCE
        # metadata server, and a failure of one must not stop a single-process run.
        try:
            if env.is_env_present():
                return _jax_cluster(env)
        except Exception as e:  # noqa: BLE001
            print(f"warning: could not read the {env.__name__} environment "
                  f"({type(e).__name__}: {e}); running as one process unless "
                  "--coordinator_address/--num_processes/--process_id are given",
                  file=sys.stderr, flush=True)
            return None
    return None


@dataclasses.dataclass(frozen=True)
class Plan:
    """How this process joins the run; None fields are left to jax."""

    source: str  # "flags" or the cluster's name
    num_processes: int
    process_id: int | None
    coordinator_address: str | None


def plan(coordinator_address: str | None = None, num_processes: int | None = None,
         process_id: int | None = None, timeout_s: float = DEFAULT_TIMEOUT_S) -> Plan | None:
    """The Plan for these explicit values (None = not given) and the environment, or None for a
    single-process run."""
    flags = {"--coordinator_address": coordinator_address, "--num_processes": num_processes,
             "--process_id": process_id}
    given = [flag for flag, v in flags.items() if v is not None]
    cluster = None if len(given) == len(flags) else detect_cluster()
    if not given and (cluster is None or cluster.num_processes <= 1):
        return None
    if cluster is not None:  # what was not given comes from the environment
        try:
            if num_processes is None:
                num_processes = cluster.num_processes
            if process_id is None:
                process_id = cluster.process_id()
            if coordinator_address is None:
                coordinator_address = cluster.coordinator(timeout_s)
        except Exception as e:  # noqa: BLE001  (jax's cluster classes raise RuntimeError etc.)
            raise ValueError(f"the {cluster.name} environment says {cluster.num_processes} "
                             f"processes but: {type(e).__name__}: {e}; pass --coordinator_address,"
                             " --num_processes and --process_id") from e
    else:
        missing = [flag for flag, v in flags.items() if v is None]
        if missing:
            raise ValueError(f"{', '.join(given)} given without {', '.join(missing)}: outside a "
                             "cluster that jax detects (SLURM, Open MPI, TPU VM, Kubernetes) a "
                             "multi-process run needs all three")
    if num_processes < 1:
        raise ValueError(f"--num_processes={num_processes} must be >= 1")
    if process_id is not None and not 0 <= process_id < num_processes:
        raise ValueError(f"--process_id={process_id} must be in [0, {num_processes})")
    return Plan("flags" if given else cluster.name, num_processes, process_id,
                coordinator_address)


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"coordinator address {address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def check_port_free(address: str) -> None:
    """ConnectionError if a program on this machine listens on the port of HOST:PORT, where
    process 0 is about to start the coordinator (jaxlib 0.10.2 sometimes segfaults instead of
    raising when it cannot bind)."""
    port = _split(address)[1]
    with socket.socket() as s:
        # like gRPC's own bind: a port in TIME_WAIT is free, one with a listener is not
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", port))
        except OSError as e:
            raise ConnectionError(
                f"process 0 cannot start the jax.distributed coordinator {address}: port {port} "
                f"of this machine is taken ({e.strerror}); another run of the same job? "
                "(JAX_COORDINATOR_PORT or --coordinator_address choose another)") from e


def wait_for_coordinator(address: str, timeout_s: float) -> None:
    """Return once a TCP connection to HOST:PORT succeeds; ConnectionError after `timeout_s`."""
    host, port = _split(address)
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        try:
            with socket.create_connection((host, port), timeout=max(min(left, 5.0), 0.1)):
                return
        except OSError as e:  # refused, unresolvable (not yet in DNS), timed out: retry
            last = e
        if time.monotonic() + _PROBE_INTERVAL_S > deadline:
            raise ConnectionError(
                f"the jax.distributed coordinator at {address} could not be reached within "
                f"{timeout_s:g} s ({type(last).__name__}: {last}); is process 0 running and is "
                "the address right? (--initialization_timeout sets the wait)")
        time.sleep(_PROBE_INTERVAL_S)


def _on_cpu() -> bool:
    import jax

    return (jax.config.jax_platforms in (None, "", "cpu")
            or os.environ.get("JAX_PLATFORMS") == "cpu")


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S
               ) -> Plan | None:
    """Initialise `jax.distributed` per `plan(...)`; returns the Plan, or None when this run is
    a single process (nothing is initialised). Must run before any device is touched."""
    import jax

    if timeout_s <= 0:
        raise ValueError(f"initialization timeout {timeout_s} must be > 0 seconds")
    if jax.distributed.is_initialized():
        return None
    p = plan(coordinator_address, num_processes, process_id, timeout_s)
    if p is None:
        return None
    where = p.coordinator_address or "<found by jax>"
    print(f"multi-process ({p.source}): process {p.process_id if p.process_id is not None else '?'}"
          f" of {p.num_processes}, coordinator {where}, timeout {timeout_s:g} s",
          file=sys.stderr, flush=True)
    if p.process_id == 0 and p.coordinator_address:
        check_port_free(p.coordinator_address)
    elif p.process_id is not None and p.coordinator_address:
        wait_for_coordinator(p.coordinator_address, timeout_s)
    if _on_cpu() and not os.environ.get("JAX_CPU_COLLECTIVES_IMPLEMENTATION"):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    try:
        jax.distributed.initialize(coordinator_address=p.coordinator_address,
                                   num_processes=p.num_processes, process_id=p.process_id,
                                   initialization_timeout=max(int(timeout_s), 1))
    except RuntimeError as e:  # jax.errors.JaxRuntimeError, e.g. the port is taken
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ConnectionError(f"jax.distributed.initialize failed for process {p.process_id} "
                              f"of {p.num_processes} with the coordinator at {where} (timeout "
                              f"{timeout_s:g} s): {first}") from e
    return p
