"""What the converters share (`hf` for XLM-R, `remote` for the self-contained format): values
of a parameter tree by '/'-joined path, the shapes a config's model has (both map their
weights onto these paths), and the weight files' reader and writer."""
from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from xlm_jax import model_dir as md
from xlm_jax.models.config import ModelConfig

Params = dict[str, Any]
HF_WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")
HF_SPM_NAME = "sentencepiece.bpe.model"


def set_path(tree: Params, path: str, value: Any) -> None:
    """`tree[a][b][c] = value` for `path` "a/b/c", creating the dicts on the way."""
    *parents, leaf = path.split("/")
    for p in parents:
        tree = tree.setdefault(p, {})
    tree[leaf] = value


def get_path(tree: Mapping[str, Any], path: str) -> Any:
    """`tree[a][b][c]` for `path` "a/b/c"."""
    for p in path.split("/"):
        tree = tree[p]
    return tree


def flatten(tree: Mapping[str, Any]) -> dict[str, Any]:
    """{'/'-joined path: leaf} of a nested parameter dict."""
    import jax

    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(str(getattr(k, "key", k)) for k in path): v for path, v in flat}


def expected_shapes(cfg: ModelConfig, with_mlm_head: bool = True) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of our model for `cfg`, by path (computed without allocating).

    Traced once per (config, head) in a process (`ModelConfig` is frozen): every load checks
    the loaded parameters against these shapes, and each traced the model's init again (20 s
    of the test suite's sampled time; a scoring or export of one model paid it per load)."""
    return dict(_expected_shapes(cfg, with_mlm_head))


@functools.lru_cache(maxsize=32)
def _expected_shapes(cfg: ModelConfig, with_mlm_head: bool) -> tuple[tuple[str, tuple[int, ...]], ...]:
    import flax.linen as nn
    import jax

    from xlm_jax.models.transformer import Transformer

    model = Transformer(cfg, with_mlm_head=with_mlm_head)
    ids = jax.ShapeDtypeStruct((1, 4), np.int32)
    # A model with language embeddings needs lang_ids to create its table.
    lang = (lambda i: {"lang_ids": i}) if cfg.num_languages else (lambda i: {})
    shapes = jax.eval_shape(
        lambda i: nn.meta.unbox(model.init(jax.random.PRNGKey(0), i, **lang(i))), ids)["params"]
    return tuple((path, tuple(v.shape)) for path, v in flatten(shapes).items())


def read_hf_weights(hf_dir: str) -> dict[str, np.ndarray]:
    """Reads `model.safetensors` or `pytorch_model.bin` (torch, `weights_only=True`); local
    files are memory-mapped, gs:// ones read whole."""
    root = md.resolve(hf_dir)
    st = root / "model.safetensors"
    if st.exists():
        from safetensors.numpy import load, load_file

        return load(st.read_bytes()) if md.is_remote(st) else load_file(os.fspath(st))
    binf = root / "pytorch_model.bin"
    if binf.exists():
        import torch

        with binf.open("rb") as f:
            sd = torch.load(f, map_location="cpu", weights_only=True)
        return {k: v.float().numpy() for k, v in sd.items()}
    raise FileNotFoundError(f"{hf_dir}: no weights found (looked for {', '.join(HF_WEIGHT_NAMES)})")


def write_safetensors(path: Any, state: Mapping[str, np.ndarray]) -> None:
    """Writes a state dict (numpy) as safetensors with torch's `format` metadata, locally or
    on gs:// (serialised in memory there)."""
    from safetensors.numpy import save, save_file

    target, meta = md.resolve(path), {"format": "pt"}
    if md.is_remote(target):
        target.write_bytes(save(dict(state), metadata=meta))
    else:
        save_file(dict(state), os.fspath(target), metadata=meta)
