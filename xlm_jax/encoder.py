"""User-facing encoder API: `load_encoder(path)` -> `Encoder` with hidden states and embeddings.

`path` is an HF XLM-R directory (config.json + model.safetensors or pytorch_model.bin) or an
xlm_jax model directory (`xlm_jax_config.json` + `params/`, or a trainer model_dir). Nothing here
imports TensorFlow: tokenisation uses SentencePiece directly (`xlm_jax.data.vocab.XLMRTokenizer`).
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xlm_jax.convert import hf as hf_lib
from xlm_jax.models.config import ModelConfig
from xlm_jax.models.heads import pool as pool_fn
from xlm_jax.models.transformer import Transformer, default_positions


@dataclasses.dataclass
class Encoder:
    """A loaded model: `config`, `params` (numpy/jax tree), and the directory it came from."""

    config: ModelConfig
    params: Any
    path: str

    def __post_init__(self) -> None:
        self._model = Transformer(self.config, with_mlm_head="mlm_head" in self.params)
        self._tokenizer = None

    @functools.cached_property
    def _forward(self):
        model = self._model

        @jax.jit
        def forward(params, input_ids, attention_mask):
            out = model.apply({"params": params}, input_ids, attention_mask=_visibility(attention_mask),
                              positions=default_positions(attention_mask), return_hidden_states=True,
                              method=Transformer.encode)
            return jnp.stack(out.hidden_states)
        return forward

    def _check_len(self, input_ids: np.ndarray) -> None:
        limit = self.config.max_sequence_length
        if limit is not None and input_ids.shape[-1] > limit:
            raise ValueError(f"sequence length {input_ids.shape[-1]} exceeds the position table "
                             f"of {self.path} (max {limit} tokens)")

    def hidden_states(self, input_ids: Any, attention_mask: Any | None = None) -> np.ndarray:
        """Hidden states of every layer, numpy [num_layers + 1, B, T, D] (0 = embeddings)."""
        input_ids, mask = self._inputs(input_ids, attention_mask)
        return np.asarray(self._forward(self.params, input_ids, mask))

    def mlm_logits(self, input_ids: Any, attention_mask: Any | None = None) -> np.ndarray:
        """Vocabulary logits at every position, numpy [B, T, V] (evaluation/parity use)."""
        input_ids, mask = self._inputs(input_ids, attention_mask)
        return np.asarray(self._full_logits(self.params, input_ids, mask))

    @functools.cached_property
    def _full_logits(self):
        def fn(mdl, ids, m):
            h = mdl.encode(ids, attention_mask=_visibility(m), positions=default_positions(m))
            return mdl.full_mlm_logits(h.last_hidden_state)

        return jax.jit(lambda p, i, m: self._model.apply({"params": p}, i, m, method=fn))

    def _inputs(self, input_ids: Any, attention_mask: Any | None) -> tuple[np.ndarray, np.ndarray]:
        """int32 ids and a bool [B, T] mask (default: non-pad), after the length check."""
        input_ids = np.asarray(input_ids, np.int32)
        if attention_mask is None:
            attention_mask = input_ids != self.config.pad_id
        self._check_len(input_ids)
        return input_ids, np.asarray(attention_mask, bool)

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            spm = hf_lib.find_spm(self.path)
            if spm is None:
                looked = ", ".join(os.path.join(self.path, n) for n in hf_lib.SPM_NAMES)
                raise FileNotFoundError(f"no SentencePiece model beside the weights; looked for {looked}")
            from xlm_jax.data.vocab import XLMRTokenizer

            self._tokenizer = XLMRTokenizer(spm)
        return self._tokenizer

    def embed(self, sentences: Sequence[str], layer: int = 8, pool: str = "mean",
              batch_size: int = 32, max_length: int | None = None) -> np.ndarray:
        """Sentence vectors [N, D]: `layer`'s hidden states pooled (`mean` over real tokens or
        `cls`). `layer` counts like `hidden_states` (0 = embeddings, num_layers = last)."""
        if not 0 <= layer <= self.config.num_layers:
            raise ValueError(f"layer={layer} out of range [0, {self.config.num_layers}]")
        tok = self.tokenizer
        max_length = max_length or min(self.config.max_sequence_length or 512, 512)
        out = []
        for start in range(0, len(sentences), batch_size):
            ids, mask = tok.encode_batch(list(sentences[start:start + batch_size]), max_length)
            hidden = self.hidden_states(ids, mask)[layer]
            out.append(np.asarray(pool_fn(jnp.asarray(hidden), jnp.asarray(mask), pool)))
        return np.concatenate(out) if out else np.zeros((0, self.config.hidden_size), np.float32)


def _visibility(attention_mask: jax.Array) -> jax.Array:
    """HF-style [B, T] 0/1 mask -> boolean visibility [B, 1, T, T] (keys only, as HF does)."""
    m = attention_mask.astype(bool)
    return jnp.broadcast_to(m[:, None, None, :], (m.shape[0], 1, m.shape[1], m.shape[1]))


def load_encoder(path: str, step: int | None = None) -> Encoder:
    """Loads an HF XLM-R directory, an xlm_jax model directory, or a trainer model_dir
    (checkpoint `step`, default the latest)."""
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path}: not a directory")
    if hf_lib.is_xlm_jax_dir(path):
        cfg, params = hf_lib.load_xlm_jax(path, step=step)
    elif hf_lib.is_hf_dir(path):
        cfg, params = hf_lib.load_hf_dir(path)
    else:
        raise FileNotFoundError(
            f"{path}: neither an xlm_jax model ({hf_lib.CONFIG_NAME}) nor an HF model "
            f"(config.json + {' or '.join(hf_lib.HF_WEIGHT_NAMES)})")
    params = jax.tree_util.tree_map(jnp.asarray, params)
    return Encoder(config=cfg, params=params, path=os.path.abspath(path))
