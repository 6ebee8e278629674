"""User-facing encoder API: `load_encoder(path)` -> `Encoder` with hidden states and embeddings.

`path` is an HF XLM-R directory (config.json + model.safetensors or pytorch_model.bin) or an
xlm_jax model directory (`xlm_jax_config.json` + `params/`, or a trainer model_dir), local or
gs:// (read through `xlm_jax.model_dir`). Nothing here
imports TensorFlow: tokenisation uses SentencePiece directly (`xlm_jax.data.vocab.XLMRTokenizer`).

Models with language embeddings (`ModelConfig.num_languages > 0`, XLM/ERNIE-M style) need the
language of every token: `embed(..., lang="de")` maps the code through the encoder's
`language_list` (default: the data registry's, sorted `sampling.KNOWN_LANGUAGES`) to the
`lang_ids` value the training data used (`features.language_index`, 1-based, 0 = padding), and
`hidden_states(..., lang_ids=...)` takes the [B, T] ids directly. The trainer records the list
its tasks were registered with in `{model_dir}/languages.txt`, which `load_encoder` reads; pass
`language_list` for other directories. Models without language embeddings ignore both.
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

from xlm_jax import model_dir as md
from xlm_jax.convert import hf as hf_lib
from xlm_jax.data import language_codes
from xlm_jax.data.features import default_language_list, language_index
from xlm_jax.models.config import ModelConfig
from xlm_jax.models.heads import POOLING, pool as pool_fn
from xlm_jax.models.transformer import Transformer, default_positions

# Tokens per sentence (with <s> and </s>) that `Encoder.embed`/`embed_layers` keep when no
# `max_length` is given, capped at the model's position table; longer sentences are truncated
# (keeping </s>). 128 is what Tatoeba retrieval (`xlm_jax.evaluation.retrieval`, its CLI and so
# the demo's table) has always used: some demo Tatoeba sentences are longer (up to 149 tokens),
# so another value would change the demo's numbers. It also keeps the padded widths, and so
# the evaluation, cheap. Pass `max_length=` (up to `config.max_sequence_length`) for long text.
DEFAULT_MAX_LENGTH = 128
# What `hidden_states(..., layer_norm=)` returns below the last layer of a pre-LN model: its raw
# residual stream ("none", what HF's `output_hidden_states` returns for such a model: only the
# last state has passed the final LayerNorm), or each state through the model's final LayerNorm
# ("final": the states XLCo's `layer_norm="final"` trains at its universal layer). A post-LN
# model's states are normalised in every layer already, so it takes "none" only.
LAYER_NORMS = ("none", "final")


@dataclasses.dataclass
class Encoder:
    """A loaded model: `config`, `params` (numpy/jax tree), and the directory it came from.

    `language_list` is the `lang_ids` table of a model with language embeddings (None = the
    default, `default_language_list()`); unused otherwise.
    """

    config: ModelConfig
    params: Any
    path: str
    language_list: Sequence[str] | None = None

    def __post_init__(self) -> None:
        self._model = Transformer(self.config, with_mlm_head="mlm_head" in self.params)
        self._tokenizer = None

    @functools.cached_property
    def _forward(self):
        """The jitted forward pass to every layer's states; `layer_norm` is static (one
        compilation per value used)."""
        def fn(mdl, ids, m, lang_ids, layer_norm):
            out = mdl.encode(ids, attention_mask=_visibility(m), positions=default_positions(m),
                             lang_ids=lang_ids, return_hidden_states=True)
            states = list(out.hidden_states)
            if layer_norm == "final":  # the last state has passed final_norm already
                states = [mdl.final_norm(h) for h in states[:-1]] + states[-1:]
            return jnp.stack(states)

        return jax.jit(lambda p, i, m, l, layer_norm: self._model.apply(
            {"params": p}, i, m, l, layer_norm, method=fn), static_argnames="layer_norm")

    def check_layer_norm(self, layer_norm: str) -> None:
        """A ValueError naming the value unless this model takes it (`LAYER_NORMS`)."""
        if layer_norm not in LAYER_NORMS:
            raise ValueError(f"layer_norm={layer_norm!r} must be one of {', '.join(LAYER_NORMS)}")
        if layer_norm == "final" and self.config.ln_style != "pre":
            raise ValueError(f"layer_norm='final' is for pre-LN models; {self.path} is "
                             f"{self.config.ln_style}-LN, whose states are normalised already")

    @property
    def has_language_embeddings(self) -> bool:
        return self.config.num_languages > 0

    @property
    def languages(self) -> list[str]:
        """The language list in use: `language_list`, or the default one."""
        if self.language_list is None:
            return default_language_list()
        return list(self.language_list)

    def lang_id(self, lang: str) -> int:
        """The `lang_ids` value of `lang` (ValueError naming it when it is not in `languages`, or
        when its id does not fit the model's table of `num_languages` rows). A file's code is
        mapped to the list's first (`language_codes.to_registry`: XTREME's `ara` -> `ar`)."""
        idx = language_index(language_codes.to_registry(lang, self.languages), self.languages)
        if self.has_language_embeddings and idx >= self.config.num_languages:
            raise ValueError(f"language {lang!r} has lang_ids value {idx} but {self.path} has only "
                             f"num_languages={self.config.num_languages} language embeddings (is "
                             "the language list the one the model was trained with?)")
        return idx

    def lang_ids_for(self, lang: str | None, attention_mask: Any) -> np.ndarray | None:
        """[B, T] `lang_ids` for sentences all in `lang`: its id on real tokens, 0 on padding;
        None for a model without language embeddings (then `lang` is not looked at)."""
        idx = self._model_lang_id(lang)
        if idx is None:
            return None
        return np.where(np.asarray(attention_mask, bool), idx, 0).astype(np.int32)

    def _model_lang_id(self, lang: str | None) -> int | None:
        """`lang_id(lang)` for a model with language embeddings (a missing `lang` is an error),
        None for one without."""
        if not self.has_language_embeddings:
            return None
        if lang is None:
            raise self._no_lang_error()
        return self.lang_id(lang)

    def _no_lang_error(self) -> ValueError:
        return ValueError(f"{self.path} has language embeddings (num_languages="
                          f"{self.config.num_languages}): pass lang= to embed() or lang_ids= to "
                          "hidden_states()")

    def _check_len(self, input_ids: np.ndarray) -> None:
        limit = self.config.max_sequence_length
        if limit is not None and input_ids.shape[-1] > limit:
            raise ValueError(f"sequence length {input_ids.shape[-1]} exceeds the position table "
                             f"of {self.path} (max {limit} tokens)")

    def hidden_states(self, input_ids: Any, attention_mask: Any | None = None,
                      lang_ids: Any | None = None, layer_norm: str = "none") -> np.ndarray:
        """Hidden states of every layer, numpy [num_layers + 1, B, T, D] (0 = embeddings).

        `lang_ids` ([B, T] ints, see `lang_ids_for`) are required by a model with language
        embeddings and ignored by one without (its states do not depend on the language).
        `layer_norm` ("none" or "final", pre-LN models only): see `LAYER_NORMS`.
        """
        self.check_layer_norm(layer_norm)
        input_ids, mask, lang_ids = self._inputs(input_ids, attention_mask, lang_ids)
        return np.asarray(self._forward(self.params, input_ids, mask, lang_ids,
                                        layer_norm=layer_norm))

    def mlm_logits(self, input_ids: Any, attention_mask: Any | None = None,
                   lang_ids: Any | None = None) -> np.ndarray:
        """Vocabulary logits at every position, numpy [B, T, V] (evaluation/parity use);
        `lang_ids` as in `hidden_states`. V is the tokenizer's `vocab_size`: the columns of
        vocabulary padding (`pad_vocab_to_multiple_of`) are dropped."""
        input_ids, mask, lang_ids = self._inputs(input_ids, attention_mask, lang_ids)
        return np.asarray(self._full_logits(self.params, input_ids, mask, lang_ids))

    @functools.cached_property
    def _full_logits(self):
        def fn(mdl, ids, m, lang_ids):
            h = mdl.encode(ids, attention_mask=_visibility(m), positions=default_positions(m),
                           lang_ids=lang_ids)
            return mdl.full_mlm_logits(h.last_hidden_state)[..., :mdl.config.vocab_size]

        return jax.jit(lambda p, i, m, l: self._model.apply({"params": p}, i, m, l, method=fn))

    def _inputs(self, input_ids: Any, attention_mask: Any | None, lang_ids: Any | None
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """int32 ids, a bool [B, T] mask (default: non-pad) and the int32 lang_ids the model
        takes (None without language embeddings), after the length and language checks."""
        input_ids = np.asarray(input_ids, np.int32)
        if attention_mask is None:
            attention_mask = input_ids != self.config.pad_id
        self._check_len(input_ids)
        if not self.has_language_embeddings:
            lang_ids = None
        elif lang_ids is None:
            raise self._no_lang_error()
        else:
            lang_ids = np.asarray(lang_ids, np.int32)
            if lang_ids.shape != input_ids.shape:
                raise ValueError(f"lang_ids shape {lang_ids.shape} differs from input_ids shape "
                                 f"{input_ids.shape}")
        return input_ids, np.asarray(attention_mask, bool), lang_ids

    @property
    def tokenizer(self):
        if self._tokenizer is None:
            spm = md.find_spm(self.path)
            if spm is None:
                looked = ", ".join(os.fspath(md.resolve(self.path) / n) for n in md.SPM_NAMES)
                raise FileNotFoundError(f"no SentencePiece model beside the weights; looked for {looked}")
            from xlm_jax.data.vocab import XLMRTokenizer

            self._tokenizer = XLMRTokenizer(spm)
        return self._tokenizer

    @property
    def default_max_length(self) -> int:
        """`max_length` of `embed`/`embed_layers` when none is given: DEFAULT_MAX_LENGTH, capped
        at the model's position table (`config.max_sequence_length`)."""
        limit = self.config.max_sequence_length
        return DEFAULT_MAX_LENGTH if limit is None else min(DEFAULT_MAX_LENGTH, limit)

    def embed(self, sentences: Sequence[str], layer: int = 8, pool: str = "mean",
              batch_size: int = 32, max_length: int | None = None,
              lang: str | None = None, layer_norm: str = "none") -> np.ndarray:
        """Sentence vectors [N, D] (float32): `layer`'s hidden states pooled by
        `heads.pool` (`mean` over real tokens or `cls`). `layer` counts like `hidden_states`
        (0 = embeddings, num_layers = last). `embed_layers` of one layer: see there for
        `max_length` (default `default_max_length`), batching, `lang` and `layer_norm`."""
        return self.embed_layers(sentences, [layer], pool=pool, max_length=max_length,
                                 batch_size=batch_size, lang=lang, layer_norm=layer_norm)[0]

    def embed_layers(self, sentences: Sequence[str], layers: Sequence[int], pool: str = "mean",
                     max_length: int | None = None, batch_size: int = 32,
                     lang: str | None = None, layer_norm: str = "none") -> np.ndarray:
        """Sentence vectors of several layers from ONE forward pass per batch:
        float32 [len(layers), N, D], each layer's hidden states pooled by `heads.pool`.

        Every sentence is `<s> tokens </s>`, truncated to `max_length` tokens (default
        `default_max_length`; more than the position table is a ValueError). Sentences are
        sorted by length and each batch of `batch_size` rows is padded to a power-of-two width
        (at least 8, at most `max_length`), so few shapes are compiled and little padding is
        computed; padding does not change the real tokens' states (keys are masked, positions
        count real tokens only), and a short last batch is filled with empty sentences so that
        the row count stays fixed. `lang` is the sentences' language code, required by (and
        only used for) a model with language embeddings. `layer_norm`: as in `hidden_states`.
        """
        if isinstance(sentences, str):
            raise TypeError("embed expects a sequence of sentences, got a single str")
        if pool not in POOLING:
            raise ValueError(f"pool={pool!r} is not one of {', '.join(POOLING)}")
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size} must be >= 1")
        layers = [int(layer) for layer in layers]
        if not layers:
            raise ValueError("layers: empty list")
        for layer in layers:
            if not 0 <= layer <= self.config.num_layers:
                raise ValueError(f"layer={layer} out of range [0, {self.config.num_layers}]")
        limit = self.config.max_sequence_length
        if max_length is None:
            max_length = self.default_max_length
        elif limit is not None and max_length > limit:
            raise ValueError(f"max_length={max_length} exceeds the position table of "
                             f"{self.path} (max {limit} tokens)")
        self._model_lang_id(lang)  # a missing or unknown language fails before any work
        self.check_layer_norm(layer_norm)
        n = len(sentences)
        out = np.zeros((len(layers), n, self.config.hidden_size), np.float32)
        if n == 0:
            return out
        tok = self.tokenizer
        lengths = np.array([len(tok.encode(s)) + 2 for s in sentences])  # + <s> and </s>
        order = np.argsort(lengths, kind="stable")
        rows = min(batch_size, _next_pow2(n))  # a fixed batch shape: few compilations
        for start in range(0, n, rows):
            idx = order[start:start + rows]
            width = min(max_length, max(8, _next_pow2(int(lengths[idx].max()))))
            texts = [sentences[i] for i in idx] + [""] * (rows - len(idx))
            ids, mask = tok.encode_batch(texts, width)
            hidden = self.hidden_states(ids, mask, self.lang_ids_for(lang, mask), layer_norm)
            for k, layer in enumerate(layers):
                # heads.pool on the host's numpy arrays, in float32 (states may be bfloat16)
                vecs = pool_fn(hidden[layer].astype(np.float32, copy=False), mask, pool)
                out[k, idx] = np.asarray(vecs)[:len(idx)]
        return out


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _visibility(attention_mask: jax.Array) -> jax.Array:
    """HF-style [B, T] 0/1 mask -> boolean visibility [B, 1, T, T] (keys only, as HF does)."""
    m = attention_mask.astype(bool)
    return jnp.broadcast_to(m[:, None, None, :], (m.shape[0], 1, m.shape[1], m.shape[1]))


def load_encoder(path: str, step: int | None = None,
                 language_list: Sequence[str] | None = None) -> Encoder:
    """Loads an HF XLM-R directory, an xlm_jax model directory, or a trainer model_dir
    (checkpoint `step`, default the latest). `language_list`: see `Encoder`; default the
    `languages.txt` the trainer writes into its model_dir, else the registry's default list.
    `path` may be local or gs:// (`xlm_jax.model_dir.resolve`)."""
    root = md.resolve(path)
    path = os.fspath(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{path}: not a directory")
    if md.is_model_dir(path):
        cfg, params = hf_lib.load_xlm_jax(path, step=step)
    elif hf_lib.is_hf_dir(path):
        cfg, params = hf_lib.load_hf_dir(path)
    else:
        raise FileNotFoundError(
            f"{path}: neither an xlm_jax model ({md.CONFIG_NAME}) nor an HF model "
            f"(config.json + {' or '.join(hf_lib.HF_WEIGHT_NAMES)})")
    params = jax.tree_util.tree_map(jnp.asarray, params)
    if language_list is None:  # the trainer writes the table it trained with
        language_list = md.read_languages(path)
    return Encoder(config=cfg, params=params, path=path,
                   language_list=list(language_list) if language_list is not None else None)
