"""Sentence embedding and checkpoint loading shared by the evaluation CLIs (Tatoeba
retrieval, BUCC mining, word alignment): one embedding path (`Encoder.embed_layers`, the one
`Encoder.embed` takes), the per-language runs of a model with language embeddings, layer and
`--language_list` parsing, and the checkpoint a `--checkpoint [--step]` pair names.
TensorFlow is never imported; jax only to run a model.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

POOLS = ("mean", "cls")
ENGLISH = "en"  # English (Tatoeba's `.eng` files) as the language list spells it


# ----------------------------------------------------------------------------- files

def read_lines(path: str) -> list[str]:
    """The stripped lines of a local UTF-8 text file (Tatoeba, BUCC, word-alignment inputs);
    a file that is not UTF-8 is a one-line ValueError naming it."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.strip() for line in f.read().splitlines()]
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


# ----------------------------------------------------------------------------- embedding

def uses_languages(encoder: Any) -> bool:
    """Whether `encoder`'s model has language embeddings (then every sentence needs a language)."""
    return getattr(encoder.config, "num_languages", 0) > 0


def embed_layers(encoder: Any, sentences: Sequence[str], layers: Sequence[int], pool: str = "mean",
                 max_length: int | None = None, batch_size: int = 64,
                 lang: str | None = None, layer_norm: str = "none") -> np.ndarray:
    """Pooled sentence vectors of several layers from one forward pass: [len(layers), N, D].

    `encoder.embed_layers` (`xlm_jax.encoder.Encoder`), the one sentence-embedding path that
    `Encoder.embed` takes too; `max_length` None is its default (`DEFAULT_MAX_LENGTH`, capped
    at the model's position table). `lang` is the sentences' language, required by a model
    with language embeddings and ignored otherwise. `layer_norm`: `Encoder.hidden_states`'s.
    """
    return encoder.embed_layers(sentences, layers, pool=pool, max_length=max_length,
                                batch_size=batch_size, lang=lang, layer_norm=layer_norm)


def check_layer(layer: int | str, num_layers: int) -> list[int]:
    """The layers to score for `layer` (an int, or "all"); out of range is a clear error."""
    if layer == "all":
        return list(range(num_layers + 1))
    if isinstance(layer, str):
        if not layer.lstrip("-").isdigit():
            raise ValueError(f"layer={layer!r} must be an integer in [0, {num_layers}] or 'all'")
        layer = int(layer)
    if not 0 <= layer <= num_layers:
        raise ValueError(f"layer={layer} out of range: valid layers are 0..{num_layers} "
                         f"(0 = embeddings, {num_layers} = last) or 'all'")
    return [layer]


def embed_keyed(encoder: Any, keys: Sequence[tuple[str | None, str]], layers: Sequence[int],
                pool: str, max_length: int | None, batch_size: int,
                layer_norm: str = "none") -> np.ndarray:
    """`embed_layers` of (language, sentence) keys, one run per language (None: a model
    without language embeddings, all in one run): [len(layers), len(keys), D]."""
    out = np.zeros((len(layers), len(keys), encoder.config.hidden_size), np.float32)
    by_lang: dict[str | None, list[int]] = {}
    for i, (lang, _) in enumerate(keys):
        by_lang.setdefault(lang, []).append(i)
    for lang, idx in by_lang.items():
        out[:, idx] = embed_layers(encoder, [keys[i][1] for i in idx], layers, pool, max_length,
                                   batch_size, lang=lang, layer_norm=layer_norm)
    return out


# ----------------------------------------------------------------------------- checkpoints

def resolve_step(path: str, step: int | None) -> int | None:
    """The step given, else the newest finished checkpoint of a trainer model_dir that has no
    exported `params/` (what `load_encoder` loads then), else None."""
    if step is not None:
        return step
    from xlm_jax import model_dir as md

    if not md.is_model_dir(path) or md.has_params_dir(path):
        return None
    steps = md.checkpoint_steps(path)
    return steps[-1] if steps else None


def load_checkpoint(path: str, step: int | None = None,
                    language_list: Sequence[str] | None = None) -> Any:
    """`load_encoder(path)`, with `step=` and `language_list=` added only when given."""
    from xlm_jax.encoder import load_encoder

    kwargs: dict[str, Any] = {} if language_list is None else {"language_list": language_list}
    if step is None:
        return load_encoder(path, **kwargs)
    try:
        return load_encoder(path, step=step, **kwargs)
    except TypeError as e:
        if "step" not in str(e):
            raise
        raise ValueError(f"--step {step}: this xlm_jax's load_encoder() takes no step argument; "
                         "point --checkpoint at a model directory instead") from None


def read_language_list(text: str) -> list[str]:
    """`--language_list`: a file with one code per line (blank lines skipped) if `text` names
    one, else comma-separated codes."""
    if os.path.isfile(text):
        from xlm_jax.model_dir import read_language_file

        return read_language_file(text)
    codes = [c.strip() for c in text.split(",") if c.strip()]
    if not codes:
        raise ValueError(f"--language_list {text!r}: no language codes")
    return codes
