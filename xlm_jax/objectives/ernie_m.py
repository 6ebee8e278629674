"""ERNIE-M: cross-attention MLM (CAMLM) and back-translation MLM (BTMLM).

ERNIE-M (Ouyang et al. 2021, "ERNIE-M: Enhanced Multilingual Representation by Aligning
Cross-lingual Semantics with Monolingual Corpora") adds two objectives to MMLM + TLM
(`xlm_jax.objectives.mlm.MaskedLM`); both need the model's language embeddings
(`ModelConfig.num_languages > 0`), which tell the model which language to read or produce.

**CAMLM** (`CrossAttentionMLM`, translation pairs `<s> x </s></s> y </s>`): each side gets its
own masked set (the paper's M_src and M_tgt, drawn separately on the two sides of one
corruption), and a masked token is predicted from the *other* side and its own position only
(paper §3, CAMLM paragraph, Fig. 2); `L_CAMLM = L_CAMLM(src) + L_CAMLM(tgt)`, each a mean over
its side's predictions (the paper writes each side's loss as a sum over its masked set; the
per-side mean is our choice, as every MLM loss here is a mean). Every predicted token is
replaced by `<mask>` (`corruption="mask"`, the default): the paper predicts from "the MASK
symbol of this sentence, which provides the position and language information" (§3, CAMLM
paragraph). `corruption="80_10_10"` (BERT's corruption, our option) leaves the original token
in place for ~10% of the predictions, and since a predicted slot sees itself, those
predictions read their own answer (tests/objectives/answer_leak_test.py). Fig. 2 draws this
visibility as one matrix (each side sees the other side and itself), and the default,
`passes="one"`, applies it in one forward pass. The paper's §4.3 reports ERNIE-M's training
speed as 1.075x that of XLM-R with TLM: with one pass, the trainer's FLOP count makes the
full recipe (MMLM + TLM + CAMLM + BTMLM) 1.12-1.14x MMLM + TLM per token, with two 1.33x, so
one pass is what that cost describes (docs/fidelity.md, "CAMLM passes", has the figures and
the command). In a model deeper than one layer, one pass lets a source token read the other
source tokens in two hops (source -> target at layer l, target -> source at layer l + 1); the
predicted tokens are `<mask>`, so no answer is read (tests/objectives/answer_leak_test.py),
but the context is not only the other side's. `passes="two"` (our option, a stricter reading
of the paragraph's "restore from the other side") runs one pass per predicted side in which
the other side sees only itself (`masks.camlm_pass_mask`), so a source prediction is a
function of the target and its own position at every depth, at twice the encoder compute
(`CrossAttentionMLM.flops_per_example`, and so MFU, count the passes run).

**BTMLM** (`BackTranslationMLM`, monolingual rows), two stages inside one train step
(paper §3, BTMLM paragraph, Fig. 4):
1. the sentence is followed by a target side laid out as CAMLM's `</s> y </s>`: `</s>`
   (with the sentence's own `</s>`, the pair separator `</s></s>`), placeholder `<mask>`
   tokens, `proportion` x the sentence's length of them (paper Fig. 6 tries 5-20%; default
   15%, our choice), and `</s>`; the target side carries a target-language id and CAMLM's
   positions under the same setting (`restart_positions`: counting from 0 at the side's
   first `</s>`, else running on from the sentence's), `pair_side` 2 and the sentence's
   packing segment. The paper's placeholders "indicate the language and position we want to
   predict" and BTMLM builds on what CAMLM learns (§3, BTMLM paragraph): the layout is
   CAMLM's target side, so stage 1 asks the model the question CAMLM trained it on (our
   reading; tests/objectives/ernie_m_layout_test.py). Sentence tokens see the sentence; a
   target-side token sees the sentence and itself (`masks.btmlm_stage1_mask`), so all
   placeholders are filled in one non-autoregressive pass, from the current parameters under
   `stop_gradient`, without dropout; argmax by default (`decoding="sample"` samples at
   `temperature`; the paper gives no rule: our choice), over regular tokens only.
2. the same row with the pseudo-tokens in the placeholders (`<s> x </s></s> y' </s>`, TLM's
   layout), attending bidirectionally, with source tokens masked (80/10/10 as MLM: our
   choice, the paper does not say how the masked source tokens are corrupted; the
   pseudo-tokens are never masked), restores the masked source tokens: `L_BTMLM` is the mean
   CE over those positions (a mean: our choice, as above).
`start_step` > 0 switches BTMLM's loss on only after that many of its updates (its loss and
gradient are 0 before; the passes still run, so the step's shape never changes): the paper
builds BTMLM on the transfer CAMLM learns, but gives no step at which BTMLM starts. 0 (from
the first step) is the default; the run files' value is labelled there.
A row stays `T` long: a sentence longer than `(T - 2) / (1 + proportion)` tokens is cut to
that length (its last kept token becomes `</s>`) to make room for its target side (our
choice; the paper does not say how length is budgeted). The target language of a row is drawn uniformly
among `target_languages` (the languages of the parallel data) other than the row's own; a
list holding only the row's language gives that language (both our choices).

What no source gives is a gin default marked as our choice in `objectives/ernie_m.gin`: mask
rates, loss weights, the decoding rule, the target-language choice, the proportion.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import flax
import jax
import jax.numpy as jnp

from xlm_jax.data.features import EOS_ID, language_index
from xlm_jax.models import flops
from xlm_jax.models import masks as masks_lib
from xlm_jax.models.token_mask import TokenMask
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import (ROW_IDS, Batch, HealthCheck, LossOutput, Metric, Objective,
                                     masked_lm_checks, loss_rising_check)
from xlm_jax.objectives.masking import MaskingConfig, mask_tokens, regular_token_logits
from xlm_jax.objectives.mlm import masked_lm_sums, with_restarted_positions

VISIBILITIES = ("bidirectional", "camlm_src", "camlm_tgt", "camlm_one_pass", "btmlm_stage1")
PASSES = ("two", "one")
# CAMLM's corruption of a predicted token: "mask" (always `<mask>`, ERNIE-M §3, CAMLM
# paragraph) or "80_10_10" (BERT's mask / random / keep, our option; keeps the answer in ~10%
# of the slots)
CORRUPTIONS = ("mask", "80_10_10")
DECODINGS = ("argmax", "sample")
# BTMLM's target side is laid out as CAMLM's `</s> y </s>`: the `</s>` that opens it (with the
# sentence's own `</s>`, the pair separator `</s></s>`) and the one that closes it
TARGET_SIDE_SPECIALS = 2


def visibility(features: Mapping[str, jax.Array], kind: str) -> TokenMask:
    """The attention mask an ERNIE-M pass gives the encoder, described by per-token ids
    (`TokenMask`: fused attention evaluates it per tile; `.materialise()` is [B, 1, T, T]).

    `bidirectional` (MMLM, TLM, BTMLM stage 2): packing segments; `camlm_src` / `camlm_tgt`:
    the CAMLM pass predicting side 1 / side 2; `camlm_one_pass`: Fig. 2's single matrix;
    `btmlm_stage1`: sentence tokens see the sentence, placeholders the sentence and themselves.
    Every kind is AND-ed with the packing segments, so packed pairs never see each other.
    """
    segments = TokenMask.segments(features["segment_ids"])
    if kind == "bidirectional":
        return segments
    tables = {"camlm_src": masks_lib.CAMLM_PASS_ALLOWED[1],
              "camlm_tgt": masks_lib.CAMLM_PASS_ALLOWED[2],
              "camlm_one_pass": masks_lib.CAMLM_ALLOWED,
              "btmlm_stage1": masks_lib.BTMLM_STAGE1_ALLOWED}
    if kind not in tables:
        raise ValueError(f"ernie_m: unknown visibility {kind!r}; expected one of {VISIBILITIES}")
    return segments.side_rule(features["pair_side"], tables[kind], include_self=True)


def _require_languages(owner: str, model: Transformer) -> None:
    if model.config.num_languages <= 0:
        raise ValueError(
            f"{owner} needs a model with language embeddings, but num_languages="
            f"{model.config.num_languages}; set loop.model_config.overrides['num_languages'] "
            "to the language list's size + 1")


def _masking(model: Transformer, mask_prob: float, max_predictions: int,
             corruption: str = "80_10_10") -> MaskingConfig:
    cfg = model.config  # XLM-R layout: <mask> is the last id of the vocabulary
    every_mask = {"mask_token_prob": 1.0, "random_token_prob": 0.0} if corruption == "mask" else {}
    return MaskingConfig(mask_prob=mask_prob, max_predictions=max_predictions,
                         mask_id=cfg.vocab_size - 1, vocab_size=cfg.vocab_size, **every_mask)


def _encode_logits(model: Transformer, enc_params: Any, ids: jax.Array, features: Batch,
                   mask: TokenMask, positions: jax.Array, rng: jax.Array,
                   deterministic: bool) -> jax.Array:
    """MLM logits [B, P, V'] at `positions` of one encoder pass under `mask`."""
    def forward(mdl: Transformer) -> jax.Array:
        h = mdl.encode(ids, positions=features["positions"], attention_mask=mask,
                       segment_ids=features["segment_ids"], lang_ids=features["lang_ids"],
                       deterministic=deterministic, row_ids=features.get(ROW_IDS))
        return mdl.mlm_logits(h.last_hidden_state, positions)

    return model.apply({"params": enc_params}, rngs={"dropout": rng}, method=forward)


class CrossAttentionMLM(Objective):
    """ERNIE-M CAMLM on translation pairs; see the module docstring. Two loss terms, "src" and
    "tgt" (each side's predictions), weight 1 each: L = L(src) + L(tgt) (paper §3, CAMLM
    paragraph; each term a mean over its side, our choice: the paper's terms are sums)."""

    kind = "pair"
    term_weights = {"src": 1.0, "tgt": 1.0}

    def __init__(self, model: Transformer, name: str = "camlm", mask_prob: float = 0.15,
                 max_predictions: int = 20, passes: str = "one", corruption: str = "mask",
                 restart_positions: bool = False):
        owner = f"CrossAttentionMLM(name={name!r})"
        _require_languages(owner, model)
        if passes not in PASSES:
            raise ValueError(f"{owner}: passes={passes!r} must be one of {', '.join(PASSES)}")
        if corruption not in CORRUPTIONS:
            raise ValueError(f"{owner}: corruption={corruption!r} must be one of "
                             f"{', '.join(CORRUPTIONS)}")
        self.model, self.name, self.passes = model, name, passes
        self.masking = _masking(model, mask_prob, max_predictions, corruption)
        # the target side's positions count from 0 (XLM §3.3's TLM); off = running on
        self.restart_positions = bool(restart_positions)

    def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
        """One corruption with a masked set per side; the slots of side 1 come first ([B, P]
        each, so [B, 2P] in all)."""
        batch = with_restarted_positions(batch, self.restart_positions)
        ids, side = batch["input_ids"], batch["pair_side"]
        src_rng, tgt_rng = jax.random.split(rng)
        src = mask_tokens(src_rng, ids, side == 1, self.masking)
        tgt = mask_tokens(tgt_rng, src.input_ids, side == 2, self.masking)  # disjoint sets
        return {**batch, "input_ids": tgt.input_ids,
                "target_positions": jnp.concatenate([src.target_positions,
                                                     tgt.target_positions], axis=1),
                "target_ids": jnp.concatenate([src.target_ids, tgt.target_ids], axis=1),
                "target_weights": jnp.concatenate([src.target_weights, tgt.target_weights],
                                                  axis=1)}

    def counts(self, prepared: Batch) -> dict[str, jax.Array]:
        """Each side's predictions."""
        p, w = self.masking.max_predictions, prepared["target_weights"]
        return {"src": jnp.sum(w[:, :p]), "tgt": jnp.sum(w[:, p:])}

    def side_logits(self, params: Any, prepared: Batch, rng: jax.Array,
                    deterministic: bool = False) -> tuple[jax.Array, jax.Array]:
        """Logits [B, P, V'] at the source slots and at the target slots."""
        p = self.masking.max_predictions
        pos = prepared["target_positions"]
        enc = self.encoder_params(params)
        ids = prepared["input_ids"]
        if self.passes == "one":
            mask = visibility(prepared, "camlm_one_pass")
            logits = _encode_logits(self.model, enc, ids, prepared, mask, pos, rng, deterministic)
            return logits[:, :p], logits[:, p:]
        src_rng, tgt_rng = jax.random.split(rng)
        src = _encode_logits(self.model, enc, ids, prepared, visibility(prepared, "camlm_src"),
                             pos[:, :p], src_rng, deterministic)
        tgt = _encode_logits(self.model, enc, ids, prepared, visibility(prepared, "camlm_tgt"),
                             pos[:, p:], tgt_rng, deterministic)
        return src, tgt

    def loss(self, params: Any, prepared: Batch, rng: jax.Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        p = self.masking.max_predictions
        src_logits, tgt_logits = self.side_logits(params, prepared, rng, deterministic)
        targets, weights = prepared["target_ids"], prepared["target_weights"]
        src_sum, src_ok = masked_lm_sums(src_logits, targets[:, :p], weights[:, :p])
        tgt_sum, tgt_ok = masked_lm_sums(tgt_logits, targets[:, p:], weights[:, p:])
        n_src, n_tgt = jnp.sum(weights[:, :p]), jnp.sum(weights[:, p:])
        metrics = {"accuracy": Metric(src_ok + tgt_ok, n_src + n_tgt),
                   "src_accuracy": Metric(src_ok, n_src), "tgt_accuracy": Metric(tgt_ok, n_tgt)}
        return LossOutput(losses={"src": src_sum, "tgt": tgt_sum}, metrics=metrics)

    def health_checks(self) -> tuple[HealthCheck, ...]:
        """Its accuracy (both sides) at or below the floor, or not moved from its start
        (`train.health`)."""
        return masked_lm_checks("CAMLM's masked LM")

    def flops_per_example(self, seq_len: int) -> float:
        """One or two differentiated passes and the head at both sides' prediction slots."""
        cfg = self.model.config
        passes = 2 if self.passes == "two" else 1
        return 3.0 * (passes * seq_len * flops.encoder_flops(cfg, seq_len)
                      + 2 * self.masking.max_predictions * flops.head_flops(cfg))


@flax.struct.dataclass
class PseudoTokens:
    """Stage 1's output: ids [B, S] at the placeholder slots, weights [B, S] (1 = real)."""

    ids: jax.Array
    weights: jax.Array


class BackTranslationMLM(Objective):
    """ERNIE-M BTMLM on monolingual rows; see the module docstring."""

    kind = "mono"
    run_arguments = ("languages",)

    def __init__(self, model: Transformer, name: str = "btmlm", *,
                 languages: Sequence[str] | None,
                 target_languages: Sequence[str] = (), proportion: float = 0.15,
                 decoding: str = "argmax", temperature: float = 1.0, mask_prob: float = 0.15,
                 max_predictions: int = 20, start_step: int = 0,
                 train_steps: int | None = None, restart_positions: bool = False):
        """`languages`: the run's `lang_ids` table (the trainer passes it; None for synthetic
        streams, which carry no codes); `target_languages` are resolved in it here.
        `start_step`: BTMLM's loss counts from its `start_step`-th update on (0 = from the
        first); `train_steps`: the run's length, to refuse a start the run never reaches.
        `restart_positions`: the placeholder side's positions count from 0, as CAMLM's target
        side under the same setting (`RESTART_TARGET_POSITIONS` sets both); off = running on."""
        owner = f"BackTranslationMLM(name={name!r})"
        self.owner = owner
        _require_languages(owner, model)
        if not isinstance(start_step, int) or start_step < 0:
            raise ValueError(f"{owner}: start_step={start_step!r} must be an integer >= 0")
        if train_steps is not None and start_step >= train_steps:
            raise ValueError(f"{owner}: start_step={start_step} is beyond the run's length "
                             f"(train_steps={train_steps}): BTMLM would never train")
        self.start_step = start_step
        if isinstance(target_languages, str):
            target_languages = [target_languages]
        self.target_languages = tuple(target_languages)
        if not self.target_languages:
            raise ValueError(f"{owner}: target_languages is empty: BTMLM needs the languages "
                             "of the parallel data to translate into")
        if not (isinstance(proportion, (int, float)) and 0.0 < proportion <= 1.0):
            raise ValueError(f"{owner}: proportion={proportion!r} (pseudo-tokens per source "
                             "token) must be in (0, 1]")
        if decoding not in DECODINGS:
            raise ValueError(f"{owner}: decoding={decoding!r} must be one of "
                             f"{', '.join(DECODINGS)}")
        if not temperature > 0:
            raise ValueError(f"{owner}: temperature={temperature!r} must be > 0")
        self.model, self.name = model, name
        self.proportion, self.decoding, self.temperature = float(proportion), decoding, temperature
        self.masking = _masking(model, mask_prob, max_predictions)
        self.target_ids = self._target_ids(languages)
        self.restart_positions = bool(restart_positions)

    def _target_ids(self, languages: Sequence[str] | None) -> tuple[int, ...]:
        """`target_languages` as `lang_ids` of the run's table. Synthetic streams have no
        codes: there the i-th target is id 1 + i mod (num_languages - 1)."""
        rows = self.model.config.num_languages
        if languages is None:
            return tuple(1 + i % (rows - 1) for i in range(len(self.target_languages)))
        ids = []
        for code in self.target_languages:
            try:
                ids.append(language_index(code, languages))
            except ValueError as e:
                raise ValueError(f"{self.owner}: target_languages has {code!r}: {e}") from None
        return tuple(ids)

    # -- stage inputs ---------------------------------------------------------------------

    def _slots(self, length: int) -> tuple[int, int]:
        """(longest kept sentence, placeholder slots) for rows of `length` tokens: the
        sentence, its placeholders and the target side's two `</s>` fit in the row."""
        keep = int((length - TARGET_SIDE_SPECIALS) // (1.0 + self.proportion))
        return keep, max(1, min(length - 1 - TARGET_SIDE_SPECIALS,
                                math.ceil(self.proportion * keep) + 1))

    def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
        """Cuts and extends every row for the two stages, draws target languages and the
        stage-2 source masking; no parameters involved."""
        ids = batch["input_ids"]
        rows, length = ids.shape
        lang_rng, mask_rng, sample_rng = jax.random.split(rng, 3)
        keep_max, slots = self._slots(length)
        n = jnp.sum((batch["segment_ids"] > 0).astype(jnp.int32), axis=1)
        keep = jnp.minimum(n, keep_max)
        m = jnp.where(keep > 0, jnp.maximum(1, jnp.floor(self.proportion * keep + 0.5)), 0)
        m = jnp.clip(m.astype(jnp.int32), 0, length - TARGET_SIDE_SPECIALS - keep)
        # the target side, as CAMLM's `</s> y </s>`: `</s>`, m placeholders, `</s>`
        side2_len = jnp.where(keep > 0, m + TARGET_SIDE_SPECIALS, 0)
        idx = jnp.arange(length)[None, :]
        src = idx < keep[:, None]
        side2 = (idx >= keep[:, None]) & (idx < (keep + side2_len)[:, None])
        ph = side2 & (idx > keep[:, None]) & (idx <= (keep + m)[:, None])
        pad = self.model.config.pad_id
        source = jnp.where(src, ids, pad)
        cut = (n > keep)[:, None] & (idx == keep[:, None] - 1)
        source = jnp.where(cut, jnp.asarray(EOS_ID, ids.dtype), source)

        # target language: uniform over target_ids other than the row's own language
        own = batch["lang_ids"][:, 0]
        targets = jnp.asarray(self.target_ids, jnp.int32)
        other = targets[None, :] != own[:, None]
        choices = jnp.where(jnp.any(other, axis=1, keepdims=True), other, True)
        pick = jax.random.categorical(lang_rng, jnp.where(choices, 0.0, -jnp.inf), axis=-1)
        target_lang = targets[pick]

        real = src | side2
        features = with_restarted_positions({
            "positions": jnp.where(real, idx, 0).astype(jnp.int32),
            "segment_ids": real.astype(jnp.int32),
            "pair_side": jnp.where(src, 1, jnp.where(side2, 2, 0)).astype(jnp.int32),
            "lang_ids": jnp.where(src, own[:, None],
                                  jnp.where(side2, target_lang[:, None], 0)).astype(jnp.int32)},
            self.restart_positions)
        mask_id = jnp.asarray(self.masking.mask_id, ids.dtype)
        target_side = jnp.where(ph, mask_id, jnp.asarray(EOS_ID, ids.dtype))
        stage1 = jnp.where(side2, target_side, source)
        masked = mask_tokens(mask_rng, source, src, self.masking)
        slot = jnp.arange(slots)[None, :]
        return {**features, "source_ids": source, "stage1_ids": stage1,
                "input_ids": jnp.where(side2, target_side, masked.input_ids),
                "placeholder_positions": jnp.minimum(keep[:, None] + 1 + slot, length - 1
                                                     ).astype(jnp.int32),
                "placeholder_weights": (slot < m[:, None]).astype(jnp.float32),
                "target_language": target_lang,
                "target_positions": masked.target_positions, "target_ids": masked.target_ids,
                "target_weights": masked.target_weights,
                "sample_keys": jax.random.split(sample_rng, rows)}

    def counts(self, prepared: Batch) -> dict[str, jax.Array]:
        """One term, "loss": stage 2's masked source tokens."""
        return {"loss": jnp.sum(prepared["target_weights"])}

    def pseudo_tokens(self, params: Any, prepared: Batch) -> PseudoTokens:
        """Stage 1: the placeholders filled in one pass from the current parameters, under
        stop_gradient and without dropout."""
        enc = jax.lax.stop_gradient(self.encoder_params(params))
        logits = _encode_logits(self.model, enc, prepared["stage1_ids"], prepared,
                                visibility(prepared, "btmlm_stage1"),
                                prepared["placeholder_positions"], jax.random.PRNGKey(0), True)
        logits = regular_token_logits(logits, self.masking)
        if self.decoding == "argmax":
            ids = jnp.argmax(logits, axis=-1)
        else:
            ids = jax.vmap(lambda k, lg: jax.random.categorical(k, lg, axis=-1))(
                prepared["sample_keys"], logits / self.temperature)
        ids = jax.lax.stop_gradient(ids).astype(prepared["input_ids"].dtype)
        return PseudoTokens(ids=ids, weights=prepared["placeholder_weights"])

    def init_state(self, params: Any) -> dict[str, Any]:
        """A count of BTMLM's updates when it starts late (`start_step` > 0); none otherwise."""
        return {"updates": jnp.zeros((), jnp.int32)} if self.start_step else {}

    def after_update(self, params: Any, state: Any, inputs: dict[str, jax.Array]) -> Any:
        return {"updates": state["updates"] + 1} if self.start_step else state

    def stage2_ids(self, prepared: Batch, pseudo: PseudoTokens) -> jax.Array:
        """The stage-2 input: the masked sentence with its pseudo-tokens written in."""
        ids, pos = prepared["input_ids"], prepared["placeholder_positions"]
        rows = jnp.arange(ids.shape[0])[:, None]
        old = jnp.take_along_axis(ids, pos, axis=1)
        return ids.at[rows, pos].set(jnp.where(pseudo.weights > 0, pseudo.ids, old))

    def loss(self, params: Any, prepared: Batch, rng: jax.Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        pseudo = self.pseudo_tokens(params, prepared)
        ids = self.stage2_ids(prepared, pseudo)
        logits = _encode_logits(self.model, self.encoder_params(params), ids, prepared,
                                visibility(prepared, "bidirectional"),
                                prepared["target_positions"], rng, deterministic)
        weights = prepared["target_weights"]
        loss_sum, correct = masked_lm_sums(logits, prepared["target_ids"], weights)
        if self.start_step:  # off (0, no gradient) before its start_step-th update
            loss_sum = loss_sum * (state["updates"] >= self.start_step).astype(loss_sum.dtype)
        # how often a pseudo-token copies a token of its own sentence (a collapse indicator)
        copies = jnp.any(pseudo.ids[:, :, None] == prepared["source_ids"][:, None, :], axis=-1)
        metrics = {"accuracy": Metric(correct, jnp.sum(weights)),
                   "pseudo_copy_rate": Metric(jnp.sum(copies * pseudo.weights),
                                              jnp.sum(pseudo.weights))}
        return LossOutput(losses={"loss": loss_sum}, metrics=metrics)

    def flops_per_example(self, seq_len: int) -> float:
        """Stage 1 forward only (stop_gradient) with the head at the placeholder slots, stage 2
        differentiated with the head at the prediction slots."""
        cfg = self.model.config
        enc, head = seq_len * flops.encoder_flops(cfg, seq_len), flops.head_flops(cfg)
        return (enc + self._slots(seq_len)[1] * head
                + 3.0 * (enc + self.masking.max_predictions * head))

    def health_checks(self) -> tuple[HealthCheck, ...]:
        """Stage 2's accuracy at or below the floor or not moved, and its loss rising, all
        from its `start_step`-th update on (its loss is 0 before)."""
        return (*masked_lm_checks("BTMLM's masked LM", after_updates=self.start_step),
                loss_rising_check(after_updates=self.start_step))
