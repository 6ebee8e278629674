"""VECO: inner-sequence and cross-sequence masked LM on one variable encoder-decoder.

VECO (Luo et al., "VECO: Variable Encoder-decoder Pre-training for Cross-lingual Understanding
and Generation", arXiv 2010.16046, first version, 2020; published in 2021 as "VECO: Variable and
Flexible Cross-lingual Pre-training for Language Understanding and Generation"; the sections,
tables and equations cited in this library are the 2020 text's) trains one stack whose layers
hold self-attention, an optional cross-attention block and an FFN
(`ModelConfig.cross_attention=True`: the shared encoder owns the cross-attention parameters, so
the checkpoint reassembles into an NLU encoder without them or an NLG encoder-decoder with
them, `xlm_jax.models.reassemble`).

`VariableMLM` reads `split_pair` examples, two aligned rows `x_*` and `y_*` (two adjacent
segments of monolingual text, or a sentence and its translation) and computes, per Eq. 8,

    L = IS(x) + IS(y) + CS(x -> y) + CS(y -> x),

each a mean CE over its masked predictions (Eq. 8 adds the four terms as sums of log
likelihoods; the per-term means are our choice, as every MLM loss here is a mean):
- IS-MLM(x): x, masked, through the stack with bidirectional self-attention and no
  cross-attention; it restores x's masked tokens. Its last layer is X^(N). Same for y.
- CS-MLM(x -> y): y, masked, with *causal* self-attention and cross-attention to
  `stop_gradient(X^(N))` in every layer, restores y's masked tokens; no gradient reaches X^(N)
  through this term (it trains the cross-attention and the y side only). Symmetric for y -> x.
One selection per row is drawn in `prepare` and used by both passes of that row (our choice:
the paper does not say whether IS and CS share masks). The IS pass reads it corrupted 80/10/10
(BERT's corruption, paper §2.2) over regular tokens (never `<s>`/`</s>`: our choice). The CS
pass (`cs_corruption="mask"`, the default) reads every selected token as `<mask>`: our reading
of Eq. 7 and the paper's footnote 3, which departs from §2.2's 80/10/10 for this pass. Its
self-attention is causal *including the position itself* (the slot carries its position), so
an original token left in place by 80/10/10 would let ~10% of the CS predictions read their own
answer, while Eq. 7 conditions on the preceding tokens only ("only attend to the preceding
tokens", §2.2). With all-`<mask>` slots a CS prediction sees the preceding tokens, the `<mask>`
at its own position and the other row, never its answer (tests/objectives/answer_leak_test.py).
`cs_corruption="shared"` feeds the CS pass the IS pass's 80/10/10 ids (§2.2's corruption in
the CS pass too; it leaks). Rates: 15% on monolingual and 25% on bilingual data (paper Table 5):
the gin files build one objective per stream. `max_predictions` must hold every prediction the
rate can make at the row length (`floor(mask_prob * T) + 1`); otherwise `prepare` fails naming
the values instead of dropping predictions.

Monolingual and bilingual batches alternate, each phase at its own batch shape (Table 5's
1024 x 512 and 4096 x 128): `gin_configs/objectives/veco.gin` schedules the monolingual
objective on even steps and the bilingual one with TLM on odd steps (`train/mixture.py`);
equal loss weights within a phase are our choice.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from xlm_jax.models import flops
from xlm_jax.models.token_mask import TokenMask
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import (Batch, HealthCheck, LossOutput, Metric, Objective,
                                     masked_lm_checks)
from xlm_jax.objectives.masking import MaskingConfig, mask_tokens
from xlm_jax.objectives.mlm import encoder_kwargs, masked_lm_sums, side_rows

SIDES = ("x", "y")
TERMS = ("is_x", "is_y", "cs_xy", "cs_yx")  # IS(x), IS(y), CS(x -> y), CS(y -> x)
SIDE_OF = {"is_x": "x", "is_y": "y", "cs_xy": "y", "cs_yx": "x"}  # the row each term restores
# What the CS pass reads at a selected token: "mask" (always `<mask>`: no answer leak; our
# reading of Eq. 7 and footnote 3) or "shared" (the IS pass's 80/10/10 ids, §2.2's corruption)
CS_CORRUPTIONS = ("mask", "shared")


def needed_predictions(mask_prob: float, length: int) -> int:
    """The most predictions `mask_tokens` can make in a row of `length` tokens at `mask_prob`
    (k = floor(p n + u), u < 1, n <= length)."""
    return int(math.floor(mask_prob * length)) + 1


def side_inputs(batch: Mapping[str, jax.Array], side: str, use_lang_ids: bool
                ) -> dict[str, jax.Array]:
    """The encoder's keyword inputs of one row (`x_` or `y_` features, prefix stripped)."""
    prefix = f"{side}_"
    return encoder_kwargs(side_rows(batch, prefix), use_lang_ids)


def causal_self_mask(batch: Mapping[str, jax.Array], side: str) -> TokenMask:
    """A token sees the earlier tokens of its own segment and itself (described per token;
    `.materialise()` is the [B, 1, T, T] array)."""
    return TokenMask.from_features(
        {"segment_ids": batch[f"{side}_segment_ids"], "positions": batch[f"{side}_positions"]},
        "causal")


def cross_mask(batch: Mapping[str, jax.Array], query: str, memory: str) -> TokenMask:
    """Every real token of `query` reads every real token of `memory` ([B, 1, Tq, Tk])."""
    return TokenMask.padding(batch[f"{query}_segment_ids"] > 0,
                             batch[f"{memory}_segment_ids"] > 0)


class VariableMLM(Objective):
    """VECO IS-MLM + CS-MLM on `split_pair` rows (x, y); see the module docstring. Four loss terms
    (`TERMS`), each a mean over its row's masked predictions (our choice; Eq. 8's terms are
    sums), weight 1 each (Eq. 8)."""

    kind = "split_pair"
    term_weights = {t: 1.0 for t in TERMS}

    def __init__(self, model: Transformer, name: str = "veco", mask_prob: float = 0.15,
                 max_predictions: int = 20, use_lang_ids: bool | None = None,
                 cs_corruption: str = "mask"):
        self.owner = f"VariableMLM(name={name!r})"
        if not model.config.cross_attention:
            raise ValueError(f"{self.owner} needs a model with cross-attention blocks "
                             "(loop.model_config.overrides['cross_attention'] = True)")
        if cs_corruption not in CS_CORRUPTIONS:
            raise ValueError(f"{self.owner}: cs_corruption={cs_corruption!r} must be one of "
                             f"{', '.join(CS_CORRUPTIONS)}")
        self.model, self.name, self.cs_corruption = model, name, cs_corruption
        cfg = model.config
        self.masking = MaskingConfig(mask_prob=mask_prob, max_predictions=max_predictions,
                                     mask_id=cfg.vocab_size - 1, vocab_size=cfg.vocab_size)
        self.use_lang_ids = cfg.num_languages > 0 if use_lang_ids is None else use_lang_ids

    def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
        """Masks x and y: one selection each, shared by the IS and CS passes; the CS pass
        reads it all-`<mask>` (`{side}_cs_input_ids`) unless `cs_corruption="shared"`."""
        out = dict(batch)
        for i, side in enumerate(SIDES):
            ids = batch[f"{side}_input_ids"]
            need = needed_predictions(self.masking.mask_prob, ids.shape[1])
            if need > self.masking.max_predictions:
                raise ValueError(
                    f"{self.owner}: mask_prob={self.masking.mask_prob:g} can select up to {need} "
                    f"tokens in a row of {ids.shape[1]}, more than max_predictions="
                    f"{self.masking.max_predictions}; set max_predictions >= {need}")
            m = mask_tokens(jax.random.fold_in(rng, i), ids, None, self.masking)
            cs_ids = (jnp.where(m.selected, jnp.asarray(self.masking.mask_id, ids.dtype), ids)
                      if self.cs_corruption == "mask" else m.input_ids)
            out.update({f"{side}_input_ids": m.input_ids, f"{side}_cs_input_ids": cs_ids,
                        f"{side}_target_positions": m.target_positions,
                        f"{side}_target_ids": m.target_ids,
                        f"{side}_target_weights": m.target_weights})
        return out

    def counts(self, prepared: Batch) -> dict[str, jax.Array]:
        """Each term's predictions: the masked tokens of the row it restores."""
        return {t: jnp.sum(prepared[f"{SIDE_OF[t]}_target_weights"]) for t in TERMS}

    def encode(self, params: Any, prepared: Batch, side: str, rng: jax.Array,
               deterministic: bool, memory: jax.Array | None = None,
               memory_side: str | None = None) -> jax.Array:
        """Last hidden states of one row: IS (bidirectional, no memory) or, with `memory`,
        CS (causal self-attention, cross-attention to `memory`)."""
        kwargs = side_inputs(prepared, side, self.use_lang_ids)
        ids = prepared[f"{side}_input_ids"]
        if memory is not None:
            kwargs.update(attention_mask=causal_self_mask(prepared, side), encoder_states=memory,
                          cross_mask=cross_mask(prepared, side, memory_side))
            ids = prepared.get(f"{side}_cs_input_ids", ids)
        return self.model.apply({"params": self.encoder_params(params)},
                                ids, deterministic=deterministic,
                                rngs={"dropout": rng}, method=Transformer.encode,
                                **kwargs).last_hidden_state

    def _logits(self, params: Any, hidden: jax.Array, positions: jax.Array) -> jax.Array:
        return self.model.apply({"params": self.encoder_params(params)}, hidden, positions,
                                method=Transformer.mlm_logits)

    def term_logits(self, params: Any, prepared: Batch, rng: jax.Array,
                    deterministic: bool = False) -> dict[str, jax.Array]:
        """{term: MLM logits [B, P, V'] at its row's masked positions} for IS(x), IS(y),
        CS(x -> y), CS(y -> x)."""
        rngs = jax.random.split(rng, 4)
        hx = self.encode(params, prepared, "x", rngs[0], deterministic)
        hy = self.encode(params, prepared, "y", rngs[1], deterministic)
        hidden = {"is_x": hx, "is_y": hy,
                  "cs_xy": self.encode(params, prepared, "y", rngs[2], deterministic,
                                       memory=jax.lax.stop_gradient(hx), memory_side="x"),
                  "cs_yx": self.encode(params, prepared, "x", rngs[3], deterministic,
                                       memory=jax.lax.stop_gradient(hy), memory_side="y")}
        return {t: self._logits(params, hidden[t], prepared[f"{SIDE_OF[t]}_target_positions"])
                for t in TERMS}

    def loss(self, params: Any, prepared: Batch, rng: jax.Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        logits = self.term_logits(params, prepared, rng, deterministic)
        sums = {t: masked_lm_sums(logits[t], prepared[f"{SIDE_OF[t]}_target_ids"],
                                  prepared[f"{SIDE_OF[t]}_target_weights"]) for t in TERMS}
        n = {t: jnp.sum(prepared[f"{SIDE_OF[t]}_target_weights"]) for t in TERMS}
        metrics = {"accuracy": Metric(sum(sums[t][1] for t in TERMS), sum(n.values()))}
        metrics.update({f"{t}_accuracy": Metric(sums[t][1], n[t]) for t in TERMS})
        return LossOutput(losses={t: sums[t][0] for t in TERMS}, metrics=metrics)

    def health_checks(self) -> tuple[HealthCheck, ...]:
        """Its accuracy over the four terms' predictions at or below the floor, or not moved
        from its start (`train.health`)."""
        return masked_lm_checks("VECO's masked LM (IS and CS)")

    def flops_per_example(self, seq_len: int) -> float:
        """Two IS passes and two CS passes (with cross-attention over the other row, whose
        stop-gradient memory is differentiated for the key/value weights only), all
        differentiated, and the head at both rows' prediction slots twice."""
        cfg, t = self.model.config, seq_len
        is_pass = t * flops.encoder_flops(cfg, t)
        cs_pass = t * (3.0 * flops.encoder_flops(cfg, t, memory_len=t)
                       - flops.memory_projection_flops(cfg, t, t))
        return (2 * (3.0 * is_pass + cs_pass)
                + 3.0 * 4 * self.masking.max_predictions * flops.head_flops(cfg))
