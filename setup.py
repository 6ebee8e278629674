"""xlm_jax: cross-lingual Transformer encoder pre-training in JAX/Flax (t5x-style).

The core (models, objectives, train, bench) needs only JAX and friends; TensorFlow and
seqio are the `data` extra, because machines with accelerators often have no TensorFlow.
"""
from setuptools import find_packages, setup

CORE = [
    "jax>=0.4.35",
    "flax>=0.10.0",
    "optax>=0.2.3",
    "orbax-checkpoint>=0.10.0",
    "gin-config>=0.5.0",
    "sentencepiece>=0.2.0",
    "numpy>=1.26",
    "absl-py>=1.4",
    "safetensors>=0.4",
    "tensorboard>=2.15",  # pure-python event writer/reader; no TensorFlow needed
    "matplotlib>=3.7",
    "sacrebleu>=2.3",  # translation scores (xlm_jax.evaluation.translation)
]
EXTRAS = {
    "data": [
        "seqio>=0.0.19",
        "tensorflow>=2.15",
        "tensorflow-datasets>=4.9",
        "tensorflow-text>=2.15",
    ],
    "test": [
        "pytest>=7.4",
        "pytest-xdist>=3.5",  # `make test` runs the suite on two workers
        "torch>=2.1",
        "transformers>=4.40",
        "pyyaml>=6.0",
    ],
    "gpu": ["jax[cuda12]>=0.4.35"],
}

setup(
    name="xlm_jax",
    version="0.1.0",
    description="Cross-lingual Transformer encoder pre-training (XLM-R, XLM-E, InfoXLM, ERNIE-M, VECO) in JAX/Flax",
    packages=find_packages(include=["xlm_jax", "xlm_jax.*"]),
    python_requires=">=3.10",
    install_requires=CORE,
    extras_require=EXTRAS,
    license="Apache-2.0",
)
