"""Fine-tuning objectives for the XTREME-style tasks: sentence(-pair) classification (XNLI,
PAWS-X), token classification (NER, POS) and extractive QA (SQuAD v1.1 layout: MLQA, XQuAD,
TyDiQA-GoldP).

Each owns its head (`params["objectives"]["<name>_head"]`) and reads one row per example,
`<s> ... </s>` (a pair as `<s> a </s></s> b </s>`), from an in-memory stream that
`xlm_jax.finetune` builds from local files. The heads are those of HF transformers'
`XLMRobertaFor{SequenceClassification, TokenClassification, QuestionAnswering}`, the models
XTREME's baselines fine-tune:
- classification: `<s>`'s last hidden state -> dropout -> dense(d) -> tanh -> dropout ->
  dense(labels);
- tagging: every token's last hidden state -> dropout -> dense(labels); only the first
  sub-word of a word carries a label (`labels` = -1 elsewhere, as XTREME's `utils_tag.py`);
- QA: every token -> dense(2) (start, end logits); loss = mean of the start and end
  cross-entropies, as HF. Padding tokens get a -1e9 logit here (our choice; HF leaves them
  to the learned head), so a span never starts or ends on padding.
Loss units: labelled rows (classification, QA) or labelled tokens (tagging); rows with label -1
(filler rows of a last partial batch) count for nothing.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from xlm_jax.models import flops
from xlm_jax.models.common import Dropout
from xlm_jax.models.common import normal_init as _init
from xlm_jax.models.common import zeros_init as _zeros
from xlm_jax.models.config import ModelConfig
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import ROW_IDS, Batch, LossOutput, Metric, Objective

Array = jax.Array
_PAD_LOGIT = -1e9


class LabelHead(nn.Module):
    """`pooled`: HF's RobertaClassificationHead on `<s>`; else a per-token linear layer."""

    config: ModelConfig
    num_labels: int
    pooled: bool

    @nn.compact
    def __call__(self, hidden: Array, deterministic: bool, row_ids: Array | None = None
                 ) -> Array:
        cfg = self.config
        dense = lambda n, names, name: nn.Dense(  # noqa: E731
            n, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
            kernel_init=_init(cfg, names), bias_init=_zeros(names[1:]), name=name)
        drop = Dropout(cfg.dropout_rate)
        x = hidden[:, 0] if self.pooled else hidden
        x = drop(x, deterministic, row_ids)
        if self.pooled:
            x = jnp.tanh(dense(cfg.hidden_size, ("embed", "embed_proj"), "dense")(x))
            x = drop(x, deterministic, row_ids)
            return dense(self.num_labels, ("embed_proj", "labels"), "out_proj")(x).astype(
                jnp.float32)
        return dense(self.num_labels, ("embed", "labels"), "classifier")(x).astype(jnp.float32)


def cross_entropy_sums(logits: Array, labels: Array) -> tuple[Array, Array, Array]:
    """Summed cross-entropy, correct predictions and count over entries with label >= 0."""
    valid = labels >= 0
    safe = jnp.where(valid, labels, 0)
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, safe[..., None], axis=-1)[..., 0]
    w = valid.astype(jnp.float32)
    correct = (jnp.argmax(logits, axis=-1) == safe).astype(jnp.float32)
    return jnp.sum(nll * w), jnp.sum(correct * w), jnp.sum(w)


class _FinetuneObjective(Objective):
    """Shared by the three: one encoder pass of `input_ids` (+ `lang_ids`) and a head."""

    kind = "mono"
    label_keys: tuple[str, ...] = ()

    def __init__(self, model: Transformer, name: str, num_labels: int):
        if num_labels < 1:
            raise ValueError(f"{type(self).__name__}(name={name!r}): num_labels={num_labels} "
                             "must be >= 1")
        self.model, self.name, self.num_labels = model, name, num_labels
        self.use_lang_ids = model.config.num_languages > 0

    @property
    def head_module(self) -> str:
        return f"{self.name}_head"

    def features(self) -> tuple[str, ...]:
        """The model features it reads (of kind "mono"); its labels (`label_keys`) ride
        beside them in the fine-tuning stream, outside the pre-training feature contract."""
        return ("input_ids",) + (("lang_ids",) if self.use_lang_ids else ())

    def logical_axis_rules(self):
        return (("labels", None),)  # a handful of labels: replicated

    def example_inputs(self, name: str) -> tuple[Any, ...]:
        return (jnp.zeros((1, 1, self.model.config.hidden_size)), True)

    def prepare(self, batch: Batch, rng: Array) -> Batch:
        return batch  # nothing to corrupt

    def counts(self, prepared: Batch) -> dict[str, Array]:
        """One term, "loss": labelled rows or tokens (entries of the first label feature that
        are >= 0)."""
        return {"loss": jnp.sum((prepared[self.label_keys[0]] >= 0).astype(jnp.float32))}

    def hidden(self, params: Any, batch: Batch, rng: Array, deterministic: bool) -> Array:
        kwargs = {ROW_IDS: batch[ROW_IDS]} if ROW_IDS in batch else {}
        if self.use_lang_ids:
            kwargs["lang_ids"] = batch["lang_ids"]
        return self.model.apply({"params": self.encoder_params(params)}, batch["input_ids"],
                                deterministic=deterministic, rngs={"dropout": rng},
                                method=Transformer.encode, **kwargs).last_hidden_state

    def logits(self, params: Any, batch: Batch, rng: Array | None = None,
               deterministic: bool = True) -> Array:
        """The head's float32 logits ([B, labels], [B, T, labels] or [B, T, 2])."""
        rng = jax.random.PRNGKey(0) if rng is None else rng
        enc_rng, head_rng = jax.random.split(rng)
        h = self.hidden(params, batch, enc_rng, deterministic)
        return self.modules()[self.head_module].apply(
            {"params": self.module_params(params, self.head_module)}, h, deterministic,
            batch.get(ROW_IDS), rngs={"dropout": head_rng})

    def flops_per_example(self, seq_len: int) -> float:
        cfg = self.model.config
        return 3.0 * seq_len * flops.encoder_flops(cfg, seq_len)


class _LabelObjective(_FinetuneObjective):
    """A `LabelHead` and cross-entropy against `label_keys[0]` (-1 = no loss)."""

    pooled: bool = True

    def modules(self):
        return {self.head_module: LabelHead(self.model.config, self.num_labels, self.pooled)}

    def loss(self, params: Any, prepared: Batch, rng: Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        logits = self.logits(params, prepared, rng, deterministic)
        nll, correct, count = cross_entropy_sums(logits, prepared[self.label_keys[0]])
        return LossOutput(losses={"loss": nll}, metrics={"accuracy": Metric(correct, count)})


class SequenceClassification(_LabelObjective):
    """XNLI / PAWS-X: one label per row (`label` [B], -1 = no loss)."""

    label_keys = ("label",)
    pooled = True

    def __init__(self, model: Transformer, name: str = "classify", num_labels: int = 3):
        super().__init__(model, name, num_labels)


class TokenClassification(_LabelObjective):
    """NER / POS: `labels` [B, T], the label id at each word's first sub-word, else -1."""

    label_keys = ("labels",)
    pooled = False

    def __init__(self, model: Transformer, name: str = "tag", num_labels: int = 7):
        super().__init__(model, name, num_labels)


class SpanHead(nn.Module):
    """HF's `qa_outputs`: dense(2) on every token -> (start, end) logits [B, T] each."""

    config: ModelConfig

    @nn.compact
    def __call__(self, hidden: Array, deterministic: bool, row_ids: Array | None = None
                 ) -> Array:
        cfg = self.config
        return nn.Dense(2, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                        kernel_init=_init(cfg, ("embed", "labels")),
                        bias_init=_zeros(("labels",)), name="qa_outputs")(hidden).astype(
                            jnp.float32)


class SpanExtraction(_FinetuneObjective):
    """Extractive QA: `start_positions`/`end_positions` [B] token indices (-1 = no loss)."""

    label_keys = ("start_positions", "end_positions")

    def __init__(self, model: Transformer, name: str = "qa"):
        super().__init__(model, name, 2)

    def modules(self):
        return {self.head_module: SpanHead(self.model.config)}

    def span_logits(self, params: Any, batch: Batch, rng: Array | None = None,
                    deterministic: bool = True) -> tuple[Array, Array]:
        """(start, end) logits [B, T], padding at -1e9."""
        out = self.logits(params, batch, rng, deterministic)
        real = batch["input_ids"] != self.model.config.pad_id
        out = jnp.where(real[..., None], out, _PAD_LOGIT)
        return out[..., 0], out[..., 1]

    def loss(self, params: Any, prepared: Batch, rng: Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        start, end = self.span_logits(params, prepared, rng, deterministic)
        s_nll, s_ok, count = cross_entropy_sums(start, prepared["start_positions"])
        e_nll, e_ok, _ = cross_entropy_sums(end, prepared["end_positions"])
        return LossOutput(losses={"loss": (s_nll + e_nll) / 2.0},
                          metrics={"start_accuracy": Metric(s_ok, count),
                                   "end_accuracy": Metric(e_ok, count)})
