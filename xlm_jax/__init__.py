"""xlm_jax: cross-lingual Transformer encoder pre-training in JAX/Flax.

`xlm_jax.load_encoder(path)` loads an HF XLM-R or xlm_jax model (imported lazily so that
`import xlm_jax` stays cheap and never imports TensorFlow).

Importing it also applies `_cpu_without_accelerators` (before any CLI imports JAX).
"""
import glob
import importlib.metadata
import importlib.util
import os
from typing import Any

__version__ = "0.2.0"
# Google's PCI vendor id: a TPU chip on this host shows up under it (JAX's own test).
_GOOGLE_PCI_VENDOR = "0x1ae0"


def _cpu_without_accelerators() -> bool:
    """Sets JAX_PLATFORMS=cpu where JAX would end on the CPU anyway, but only after libtpu
    failed to start: libtpu installed (the test suite's environment has it, to compile for
    TPU topologies on the CPU), no TPU chip on the PCI bus, no other PJRT plugin (a GPU one)
    installed, JAX_PLATFORMS and JAX_FORCE_TPU_INIT unset. Without it every CLI and every
    child process on such a machine writes libtpu's failed start (five lines) on stderr and
    waits for it. Compile-only TPU topologies keep working under JAX_PLATFORMS=cpu. Returns
    whether it set the variable; it does nothing once JAX read its configuration."""
    if os.environ.get("JAX_PLATFORMS") or "JAX_FORCE_TPU_INIT" in os.environ:
        return False
    if importlib.util.find_spec("libtpu") is None:
        return False
    for vendor in glob.glob("/sys/bus/pci/devices/*/vendor"):
        try:
            with open(vendor) as f:
                if f.read().strip() == _GOOGLE_PCI_VENDOR:
                    return False
        except OSError:
            continue
    if (importlib.util.find_spec("jax_plugins") is not None
            or any(True for _ in importlib.metadata.entry_points(group="jax_plugins"))):
        return False
    os.environ["JAX_PLATFORMS"] = "cpu"
    return True


_cpu_without_accelerators()


def load_encoder(path: str, step: int | None = None, language_list: list[str] | None = None) -> Any:
    """See `xlm_jax.encoder.load_encoder`."""
    from xlm_jax.encoder import load_encoder as _load

    return _load(path, step=step, language_list=language_list)
