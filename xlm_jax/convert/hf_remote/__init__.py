"""The `transformers` remote code that `export-hf` ships with a model that is not XLM-R-shaped.

`configuration_xlm_jax.py` and `modeling_xlm_jax.py` are copied, unchanged, into the exported
directory (`xlm_jax.convert.remote` writes it); they import torch and transformers only, so
the directory loads with `AutoModel.from_pretrained(dir, trust_remote_code=True)` where
xlm_jax is not installed. This package imports neither: `template_text` reads the files.
"""
from __future__ import annotations

import importlib.resources

CONFIG_FILE = "configuration_xlm_jax.py"
MODELING_FILE = "modeling_xlm_jax.py"
TEMPLATE_FILES = (CONFIG_FILE, MODELING_FILE)


def template_text(name: str) -> str:
    """The source of one of `TEMPLATE_FILES` (from the installed package)."""
    if name not in TEMPLATE_FILES:
        raise ValueError(f"{name!r} is not one of {', '.join(TEMPLATE_FILES)}")
    return importlib.resources.files(__name__).joinpath(name).read_text(encoding="utf-8")
