"""Compile targets: TPU slices and GPU nodes named on the command line, their compile-only
devices on this (CPU) host, and the memory one device has.

A target is `CHIP:TOPOLOGY`:
- TPU: a topology name libtpu knows (`v4:2x2x1`, `v5e:4x4`, `v5p:4x4x4`, `v6e:2x2`); its
  devices come from `jax.experimental.topologies.get_topology_desc(platform="tpu")`, which
  needs `libtpu` installed (the `tpu` extra) and no TPU. v4 is built in megacore mode (one
  jax device per chip, as v4 training runs use it); v5p is megacore already; v5e and v6e have
  one TensorCore per chip.
- GPU: `h100:1x1x8`, `h200:1x1x8`, `b200:1x1x8` (the product of the dimensions is the device
  count; a node of 8 GPUs is `1x1x8`, N such nodes `1xNx8`); its devices come from
  `get_topology_desc(platform="cuda", target_config=...)` with the card's description
  shipped beside this file (`gpu_specs/CARD.txtpb`, values from the vendor's specification,
  each cited there). That
  needs the CUDA plugin (`jax-cuda12-plugin`/`jax-cuda12-pjrt`, 180 MB; no CUDA libraries and
  no libcuda: nothing runs).

The memory a device has: for TPU, the compiler's own limit for the topology's chip, read by
compiling a program that cannot fit (XLA:TPU refuses it naming the available HBM: 15.75G on
v5e, 30.75G on a v4 megacore chip, 95.74G on v5p, 31.25G on v6e with libtpu 0.0.42.1); for
GPU, the card's memory from its description times the share jax's allocator may take
(`XLA_PYTHON_CLIENT_MEM_FRACTION`; our launch scripts set 0.9, jax's own default is 0.75).
XLA:GPU does not check a program against the card's memory, so the tool does.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
from collections.abc import Sequence
from typing import Any

TPU_CHIPS = ("v4", "v5e", "v5p", "v6e")
GPU_CARDS = ("h100", "h200", "b200")
SPECS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_specs")
# The share of a GPU's memory a run may use when XLA_PYTHON_CLIENT_MEM_FRACTION is not set:
# launch/slurm_gpu.sbatch's and launch/gke's value (jax's own default is 0.75).
DEFAULT_GPU_MEMORY_FRACTION = 0.9
_TARGET = re.compile(r"(?P<chip>[a-z0-9]+):(?P<topology>[0-9]+(?:x[0-9]+){1,2})")
_HBM = re.compile(r"available HBM \(([0-9.]+)([KMGT])\)")
_UNITS = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


class TargetError(ValueError):
    """A bad --target (or a runtime missing for it): one line naming the flag and value."""


@dataclasses.dataclass(frozen=True)
class Target:
    """A parsed --target: its platform ("tpu" or "cuda"), chip and topology."""

    name: str  # as given, e.g. "v5p:2x2x1"
    platform: str  # "tpu" | "cuda"
    chip: str  # "v5p", "h100", ...
    topology: str  # "2x2x1"

    @property
    def chips(self) -> int:
        """Chips (GPUs) in the topology; one jax device each (v4 in megacore mode)."""
        return math.prod(int(d) for d in self.topology.split("x"))


def parse_target(text: str) -> Target:
    """'v5p:2x2x1' -> Target; a one-line TargetError for anything else."""
    found = _TARGET.fullmatch(text.strip().lower())
    known = ", ".join([f"{c}:AxB[xC]" for c in TPU_CHIPS] + [f"{c}:1x1xN" for c in GPU_CARDS])
    if not found:
        raise TargetError(f"--target {text!r}: expected CHIP:TOPOLOGY, one of {known}")
    chip, topology = found["chip"], found["topology"]
    if chip in TPU_CHIPS:
        return Target(text, "tpu", chip, topology)
    if chip in GPU_CARDS:
        return Target(text, "cuda", chip, topology)
    raise TargetError(f"--target {text!r}: unknown chip {chip!r}; known: {known}")


def prepare_environment(target: Target) -> None:
    """Environment for compile-only devices, set before jax starts: jax itself stays on the
    CPU (`JAX_PLATFORMS=cpu`: nothing runs on the target), libtpu is told it is not on a TPU
    VM (else it prints metadata-server errors) and may load beside another libtpu process
    (tests compile in parallel), and XLA:GPU does not autotune across shards (it would need
    the devices)."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if target.platform == "tpu":
        os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
        os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v5p-8")  # any valid name; only quiets
        os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
        os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    else:
        flags = os.environ.get("XLA_FLAGS", "").split()
        if not any(f.startswith("--xla_gpu_shard_autotuning") for f in flags):
            flags.append("--xla_gpu_shard_autotuning=false")
        os.environ["XLA_FLAGS"] = " ".join(flags)


def runtime_missing(target: Target) -> str | None:
    """Why this host cannot build `target`'s devices (the package that is missing and how to
    install it), or None."""
    if target.platform == "tpu":
        if importlib.util.find_spec("libtpu") is None:
            return ("libtpu is not installed: `pip install -e '.[tpu]' -c constraints/tpu.txt` "
                    "(compile-only TPU devices need it, no TPU)")
        return None
    if not cuda_plugin_installed():
        import jax

        return ("the CUDA plugin is not installed: `pip install jax-cuda12-plugin=="
                f"{jax.__version__}` (compile-only GPUs need only the plugin, no CUDA "
                "libraries; `make test-slow` puts it in .venv/cuda_compile, for PYTHONPATH)")
    return None


def cuda_plugin_installed() -> bool:
    """Whether jax's CUDA 12 plugin (`jax_plugins.xla_cuda12`) is importable here."""
    try:
        return importlib.util.find_spec("jax_plugins.xla_cuda12") is not None
    except ModuleNotFoundError:  # no jax_plugins namespace at all
        return False


def gpu_description(card: str) -> str:
    """The GpuTargetConfig text of `card` shipped with the package."""
    with open(os.path.join(SPECS_DIR, f"{card}.txtpb")) as f:
        return f.read()


def gpu_memory_bytes(card: str) -> int:
    """The card's memory from its description (`device_memory_size`)."""
    found = re.search(r"device_memory_size:\s*([0-9]+)", gpu_description(card))
    assert found, f"gpu_specs/{card}.txtpb has no device_memory_size"
    return int(found[1])


def gpu_memory_fraction() -> float:
    """The share of a GPU's memory jax's allocator may take in the run
    (XLA_PYTHON_CLIENT_MEM_FRACTION, else DEFAULT_GPU_MEMORY_FRACTION)."""
    return float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", DEFAULT_GPU_MEMORY_FRACTION))


def devices(target: Target) -> list[Any]:
    """The target's compile-only devices (raises TargetError where libtpu or the CUDA plugin
    cannot build the topology, naming it)."""
    from jax.experimental import topologies

    try:
        if target.platform == "tpu":
            kw = {"chip_config_name": "megacore"} if target.chip == "v4" else {}
            topo = topologies.get_topology_desc(topology_name=f"{target.chip}:{target.topology}",
                                                platform="tpu", **kw)
        else:
            topo = topologies.get_topology_desc(platform="cuda", topology=target.topology,
                                                target_config=gpu_description(target.chip))
    except Exception as e:  # noqa: BLE001 - the runtime's message, on one line
        reason = " ".join(str(e).split())[:300]
        raise TargetError(f"--target {target.name!r}: the {target.platform} runtime cannot "
                          f"build this topology: {reason}") from None
    return list(topo.devices)


@dataclasses.dataclass(frozen=True)
class DeviceMemory:
    """What one device of the target may hold, and where the figure comes from."""

    bytes: int
    source: str


def device_memory(target: Target, devs: Sequence[Any]) -> DeviceMemory:
    """The memory a program may use on one device of `target` (see the module docstring)."""
    if target.platform == "cuda":
        card, share = gpu_memory_bytes(target.chip), gpu_memory_fraction()
        return DeviceMemory(int(card * share), f"{card / 1e9:.0f} GB card x {share} "
                            "(XLA_PYTHON_CLIENT_MEM_FRACTION) from gpu_specs/"
                            f"{target.chip}.txtpb; checked by this tool")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(devs[:1]), ("d",))
    too_big = jax.jit(lambda: jnp.zeros((2**42,), jnp.int8),
                      out_shardings=NamedSharding(mesh, PartitionSpec()))
    try:
        too_big.trace().lower().compile()
    except Exception as e:  # noqa: BLE001 - the compiler's out-of-memory message
        found = _HBM.search(str(e))
        if found:
            return DeviceMemory(int(float(found[1]) * _UNITS[found[2]]),
                                "the TPU compiler's limit for this chip (XLA:TPU checks it)")
    raise TargetError(f"--target {target.name!r}: could not read the chip's HBM from the "
                      "TPU compiler")
