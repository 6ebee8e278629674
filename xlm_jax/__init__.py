"""xlm_jax: cross-lingual Transformer encoder pre-training in JAX/Flax.

`xlm_jax.load_encoder(path)` loads an HF XLM-R or xlm_jax model (imported lazily so that
`import xlm_jax` stays cheap and never imports TensorFlow).
"""
from typing import Any

__version__ = "0.1.0"


def load_encoder(path: str, step: int | None = None, language_list: list[str] | None = None) -> Any:
    """See `xlm_jax.encoder.load_encoder`."""
    from xlm_jax.encoder import load_encoder as _load

    return _load(path, step=step, language_list=language_list)
