"""Translation fine-tuning of an encoder-decoder reassembled from a VECO stack.

VECO (Luo et al. 2021, §3.3 and §5.1) fine-tunes its pre-trained stack for translation as an
encoder (every layer, no cross-attention) and a decoder of n layers taken from the stack with
their cross-attention (§5.1: the last 6 of 24; Table 4 compares the last and the first
layers). `Translation` is that model as an objective of this library's trainer, so fine-tuning
gets the mesh, checkpoints, resume and gin like pre-training:

- the shared encoder (`params["encoder"]`) encodes the source row `x`;
- the objective owns a `decoder` module (a `Transformer` of `decoder_layers` layers with
  cross-attention) whose embeddings and output projection (the MLM head, tied to the word
  embeddings) are the encoder's; its layers start from the pre-trained stack's last (or
  first) layers when the run starts from a checkpoint (`adapt_pretrained`, called after
  `init_from` is loaded), else from random initialisation;
- teacher forcing: the decoder reads the target row `y` shifted right (its `<s>` first) with
  causal self-attention and cross-attention to the encoder's last layer, and predicts every
  next token; the loss is label-smoothed cross-entropy (`label_smoothing`, 0.1 by default:
  our choice, the usual NMT value) over the real vocabulary.

Languages, two ways:
- `language_tokens=[codes]` (VECO's way, and `finetune/veco_translate.gin`'s): each listed
  language has a language-id token, `language_tokens[i]` <-> id `vocab_size + i`, a row of the
  padded vocabulary table beyond the SentencePiece ids (so no vocabulary or pre-trained table
  changes shape; those rows' logits are -1e9, so they are read, never predicted). The token
  replaces the `<s>` that opens the source row (the source language) and the target row (the
  target language): the decoder's first input names the language to produce and decoding
  starts from it. The model needs no language embeddings (VECO has none, App. A). Which ids the
  tokens take, and that they replace `<s>`, is our choice: the paper names no ids.
- `language_tokens=None`: every token carries its language through the model's language
  embeddings (XLM's way, `lang_ids`; needs `num_languages > 0`; `language_init='zeros'`
  keeps a pre-trained stack's function unchanged at step 0).
A language without a token fails when the objective is built (`task_languages`, which the
trainer passes; `token_of` for the test languages of `xlm_jax.translate`). Decoding:
`xlm_jax.translate` (beam search with a cache, `xlm_jax.models.decoding`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from xlm_jax.models import flops
from xlm_jax.models import layer_stack
from xlm_jax.models.token_mask import TokenMask
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import (ENCODER, OBJECTIVES, ROW_IDS, Batch, HealthCheck, LossOutput,
                                     Metric, Objective, accuracy_floor_check)

SHARED = ("embeddings", "mlm_head")  # the decoder reads these from the encoder
TAKE = ("last", "first")


class Translation(Objective):
    """Sequence-to-sequence fine-tuning on `split_pair` rows (x = source, y = target)."""

    kind = "split_pair"
    run_arguments = ("languages", "task_languages")

    def __init__(self, model: Transformer, name: str = "translate", decoder_layers: int = 6,
                 take: str = "last", label_smoothing: float = 0.1,
                 decoder_module: str = "decoder",
                 language_tokens: Sequence[str] | None = None, *,
                 languages: Sequence[str] | None,
                 task_languages: Sequence[str] | None = None):
        """`languages`: the run's `lang_ids` table (the trainer passes it; None for synthetic
        streams, whose `lang_ids` k is `language_tokens[k - 1]`); `task_languages`: the
        languages of the task's rows when known, each of which must have a token."""
        owner = f"Translation(name={name!r})"
        cfg = model.config
        if not isinstance(decoder_layers, int) or not 1 <= decoder_layers <= cfg.num_layers:
            raise ValueError(f"{owner}: decoder_layers={decoder_layers!r} must be in "
                             f"[1, {cfg.num_layers}] (the encoder has {cfg.num_layers} layers)")
        if take not in TAKE:
            raise ValueError(f"{owner}: take={take!r} must be one of {', '.join(TAKE)}")
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"{owner}: label_smoothing={label_smoothing!r} must be in [0, 1)")
        if language_tokens is None:
            if cfg.num_languages <= 0:
                raise ValueError(f"{owner}: without language_tokens the target language is "
                                 f"given by language embeddings, but the model has "
                                 f"num_languages={cfg.num_languages}; set language_tokens or "
                                 f"num_languages")
            self.language_tokens = None
        else:
            codes = [language_tokens] if isinstance(language_tokens, str) else list(language_tokens)
            if not codes or len(set(codes)) != len(codes):
                raise ValueError(f"{owner}: language_tokens={codes!r} must be distinct "
                                 "language codes, at least one")
            room = cfg.padded_vocab_size - cfg.vocab_size
            if len(codes) > room:
                raise ValueError(
                    f"{owner}: language_tokens={codes!r} need {len(codes)} rows after the "
                    f"vocabulary's {cfg.vocab_size} ids but the padded table has {room} "
                    f"(padded_vocab_size={cfg.padded_vocab_size}); raise the model's "
                    f"pad_vocab_to_multiple_of")
            self.language_tokens = tuple(codes)
        self.owner = owner
        self.model, self.name = model, name
        self._token_table = self._tokens_by_lang_id(languages)
        if self.language_tokens is not None:
            for code in task_languages or ():
                try:
                    self.token_of(code)
                except ValueError as e:
                    raise ValueError(f"{e} (the task's rows are in "
                                     f"{', '.join(task_languages)})") from None
        self.take, self.label_smoothing = take, float(label_smoothing)
        self.decoder_module = decoder_module
        self.decoder_config = cfg.replace(num_layers=decoder_layers, cross_attention=True)
        self.decoder = Transformer(self.decoder_config)
        self.encoder_params_used = tuple(SHARED)

    # -- languages ------------------------------------------------------------------------

    def token_of(self, code: str) -> int:
        """The language-id token of `code`; a ValueError naming it when it has none."""
        if self.language_tokens is None:
            raise ValueError(f"{self.owner} marks languages with language embeddings, not "
                             "tokens (language_tokens=None)")
        if code not in self.language_tokens:
            raise ValueError(f"{self.owner}: language {code!r} has no language-id token "
                             f"(language_tokens={list(self.language_tokens)}); add it")
        return self.model.config.vocab_size + self.language_tokens.index(code)

    def _tokens_by_lang_id(self, languages: Sequence[str] | None) -> np.ndarray:
        """`lang_ids` value -> language-id token (-1: none; a listed code missing from the
        run's language list is a ValueError). Synthetic streams (no language list) read
        `lang_ids` k as `language_tokens[k - 1]`."""
        tokens = self.language_tokens or ()
        if languages is None:
            return np.array([-1] + [self.token_of(c) for c in tokens], np.int32)
        missing = [c for c in tokens if c not in languages]
        if missing:
            raise ValueError(f"{self.owner}: language_tokens names {missing[0]!r}, which is not "
                             f"in the tasks' language list")
        return np.array([-1] + [self.token_of(c) if c in tokens else -1 for c in languages],
                        np.int32)

    def first_tokens(self, source_lang: int, target_lang: int, bos_id: int) -> tuple[int, int]:
        """The first token of a source row and the decoder's first input for `lang_ids`
        values `source_lang` and `target_lang`: the language-id tokens, or `<s>` twice."""
        if self.language_tokens is None:
            return bos_id, bos_id
        src, tgt = (int(self._token_table[i]) if 0 < i < len(self._token_table) else -1
                    for i in (source_lang, target_lang))
        if src < 0 or tgt < 0:
            raise ValueError(f"{self.owner}: lang_ids {source_lang if src < 0 else target_lang} "
                             f"has no language-id token (language_tokens="
                             f"{list(self.language_tokens)})")
        return src, tgt

    # -- modules --------------------------------------------------------------------------

    def modules(self) -> dict[str, Any]:
        return {self.decoder_module: self.decoder}

    def init_modules(self, rng: jax.Array) -> dict[str, Any]:
        """The decoder's layers (and position tables); its embeddings and head are the
        encoder's."""
        ids = jnp.ones((1, 4), jnp.int32)
        memory = jnp.zeros((1, 4, self.decoder_config.hidden_size),
                           self.decoder_config.compute_dtype)
        own = dict(self.decoder.init(rng, ids, lang_ids=ids, encoder_states=memory)["params"])
        return {self.decoder_module: {k: v for k, v in own.items() if k not in SHARED}}

    def source_layers(self) -> tuple[int, ...]:
        """The stack layers the decoder's layers start from."""
        n, total = self.decoder_config.num_layers, self.model.config.num_layers
        return tuple(range(total - n, total)) if self.take == "last" else tuple(range(n))

    def adapt_pretrained(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """After `init_from`: decoder layer i <- stack layer `source_layers()[i]` (every block
        the stack has; a stack without cross-attention, e.g. XLM-R, leaves the decoder's
        cross-attention at its initialisation). Either side may be stacked
        (`ModelConfig.scan_layers`): both are read per layer, the decoder is written back in its
        own layout."""
        decoder = layer_stack.unstack_layers(params[OBJECTIVES][self.decoder_module])
        stack = layer_stack.unstack_layers(params[ENCODER])
        for i, src in enumerate(self.source_layers()):
            layer = dict(decoder[f"layers_{i}"])
            layer.update({k: v for k, v in stack[f"layers_{src}"].items() if k in layer})
            decoder[f"layers_{i}"] = layer
        decoder = layer_stack.to_layout(decoder, self.decoder_config.scan_layers)
        return {**params, OBJECTIVES: {**params[OBJECTIVES], self.decoder_module: decoder}}

    def decoder_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The decoder's parameter tree with the encoder's embeddings and MLM head."""
        own = dict(self.module_params(params, self.decoder_module))
        own.update({k: self.encoder_params(params)[k] for k in SHARED})
        return own

    def flops_per_example(self, seq_len: int) -> float:
        """The encoder over the source, the decoder (with cross-attention over the source)
        over the target and the vocabulary projection at every target position, all
        differentiated."""
        t = seq_len
        return 3.0 * t * (flops.encoder_flops(self.model.config.replace(cross_attention=False), t)
                          + flops.encoder_flops(self.decoder_config, t, memory_len=t)
                          + flops.head_flops(self.model.config))

    # -- the computation ------------------------------------------------------------------

    def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
        """With language tokens, the `<s>` opening each source and target row becomes the
        row's language-id token (a row whose language has none keeps `<s>`; the trainer has
        refused such tasks before compiling)."""
        out = dict(batch)
        if self.language_tokens is None:
            return out
        table = jnp.asarray(self._token_table)
        for side in ("x_", "y_"):
            ids, lang = out[side + "input_ids"], out[side + "lang_ids"][:, 0]
            token = table[jnp.clip(lang, 0, table.shape[0] - 1)]
            use = (out[side + "segment_ids"][:, 0] > 0) & (lang < table.shape[0]) & (token >= 0)
            out[side + "input_ids"] = ids.at[:, 0].set(jnp.where(use, token, ids[:, 0]))
        return out

    def _targets(self, prepared: Batch) -> tuple[jax.Array, jax.Array]:
        """Next-token targets [B, T] (y shifted left) and their weights."""
        y, seg = prepared["y_input_ids"], prepared["y_segment_ids"]
        target = jnp.concatenate([y[:, 1:], jnp.full_like(y[:, :1], self.model.config.pad_id)],
                                 axis=1)
        weight = (jnp.concatenate([seg[:, 1:], jnp.zeros_like(seg[:, :1])], axis=1) > 0)
        return target, weight.astype(jnp.float32)

    def counts(self, prepared: Batch) -> dict[str, jax.Array]:
        """One term, "loss": the target tokens predicted."""
        return {"loss": jnp.sum(self._targets(prepared)[1])}

    def encode_source(self, params: Any, prepared: Batch, rng: jax.Array | None = None,
                      deterministic: bool = True) -> jax.Array:
        """The encoder's last hidden states [B, S, D] of the source rows."""
        return self.model.apply(
            {"params": self.encoder_params(params)}, prepared["x_input_ids"],
            positions=prepared["x_positions"], segment_ids=prepared["x_segment_ids"],
            lang_ids=prepared["x_lang_ids"], deterministic=deterministic,
            row_ids=prepared.get(ROW_IDS),
            rngs={"dropout": rng if rng is not None else jax.random.PRNGKey(0)},
            method=Transformer.encode).last_hidden_state

    def decoder_logits(self, params: Any, prepared: Batch, memory: jax.Array,
                       rng: jax.Array | None = None, deterministic: bool = True) -> jax.Array:
        """Teacher-forced logits [B, T, V'] at every target position."""
        y = {k[2:]: v for k, v in prepared.items() if k.startswith("y_")}
        self_mask = TokenMask.from_features(
            {"segment_ids": y["segment_ids"], "positions": y["positions"]}, "causal")
        cross = TokenMask.padding(y["segment_ids"] > 0, prepared["x_segment_ids"] > 0)

        def forward(mdl: Transformer) -> jax.Array:
            h = mdl.encode(y["input_ids"], positions=y["positions"], attention_mask=self_mask,
                           segment_ids=y["segment_ids"], lang_ids=y["lang_ids"],
                           encoder_states=memory, cross_mask=cross,
                           deterministic=deterministic,
                           row_ids=prepared.get(ROW_IDS)).last_hidden_state
            return mdl.full_mlm_logits(h)

        return self.decoder.apply({"params": self.decoder_params(params)},
                                  rngs={"dropout": rng if rng is not None
                                        else jax.random.PRNGKey(0)}, method=forward)

    def loss(self, params: Any, prepared: Batch, rng: jax.Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        enc_rng, dec_rng = jax.random.split(rng)
        memory = self.encode_source(params, prepared, enc_rng, deterministic)
        logits = self.decoder_logits(params, prepared, memory, dec_rng, deterministic)
        target, weight = self._targets(prepared)
        logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
        nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
        vocab = self.model.config.vocab_size  # smoothing over the real ids, not the padding
        smooth = -jnp.mean(logp[..., :vocab], axis=-1)
        eps = self.label_smoothing
        per_token = (1.0 - eps) * nll + eps * smooth
        correct = (jnp.argmax(logits, axis=-1) == target).astype(jnp.float32)
        count = jnp.sum(weight)
        metrics = {"accuracy": Metric(jnp.sum(correct * weight), count),
                   "nll": Metric(jnp.sum(nll * weight), count)}  # without the smoothing
        return LossOutput(losses={"loss": jnp.sum(per_token * weight)}, metrics=metrics)

    def health_checks(self) -> tuple[HealthCheck, ...]:
        """The decoder's token accuracy at or below the floor (`train.health`)."""
        return (accuracy_floor_check("the decoder"),)
