"""MMLM and TLM (XLM / XLM-R): masked LM on monolingual rows and on concatenated pairs.

Both are the same computation on different streams: MMLM reads monolingual segments, TLM reads
`<s> src </s></s> tgt </s>` rows whose two sides may attend to each other, so the model can
use the translation to restore masked words. Masking is dynamic (80/10/10, on device, per step)
and logits are computed only at the `max_predictions` gathered positions.

Positions of a pair: by default they run on across the pair (0 .. n-1 per packed example), as
fairseq's RoBERTa numbers a concatenated pair (what unilm's InfoXLM TLM feeds it,
`infoxlm/data/tlm_dataset.py`). `restart_positions=True` restarts them at the second sentence
(`pair_side` 2 counts from 0 again), as XLM's TLM does ("we also reset the positional embeddings
of target sentences", XLM §3.3). `restart_target_positions` is the one implementation, shared by
every objective on pair rows (TLM, XLM-E's TRTD, ERNIE-M's CAMLM).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from xlm_jax.data.features import example_kind
from xlm_jax.models import flops
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import (ROW_IDS, Batch, HealthCheck, LossOutput, Metric, Objective,
                                     masked_lm_checks, check_kind)
from xlm_jax.objectives.masking import MaskingConfig, mask_tokens


def masked_lm_sums(logits: jax.Array, target_ids: jax.Array,
                   weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Summed cross-entropy and number of correct predictions over weighted slots.

    nll = logsumexp(logits) - logits[target], the log-softmax at the target, in float32. The
    target's logit is picked with a compare against a vocabulary iota rather than
    `take_along_axis`: the gradient of the latter is a scatter into a zeroed [B, P, V] array,
    which on a GPU cost three extra passes over the 2560 x 250k logits of a base step (a
    broadcast of zeros, the scatter and a select: 5.6 ms of a 135 ms H100 step, read from its
    trace), where the compare fuses into the softmax gradient's one elementwise pass. The
    summed nll has its own gradient (`weighted_nll_sum`), which recomputes the softmax from the
    logits instead of keeping it (see there).
    """
    correct = (jnp.argmax(logits, axis=-1) == target_ids).astype(jnp.float32)
    return weighted_nll_sum(logits, target_ids, weights), jnp.sum(correct * weights)


def _is_target(x: jax.Array, target_ids: jax.Array) -> jax.Array:
    """Booleans of `x`'s shape, true at each slot's target id (a compare against a vocabulary
    iota, see `masked_lm_sums`)."""
    vocab = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)
    return vocab == target_ids[..., None].astype(jnp.int32)


def _nll_parts(logits: jax.Array, target_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(logsumexp, the target's logit) over the last axis, in float32."""
    x = logits.astype(jnp.float32)
    target = jnp.sum(jnp.where(_is_target(x, target_ids), x, 0.0), axis=-1)
    return jax.nn.logsumexp(x, axis=-1), target


@jax.custom_vjp
def weighted_nll_sum(logits: jax.Array, target_ids: jax.Array, weights: jax.Array) -> jax.Array:
    """sum(weights * (logsumexp(logits) - logits[target])), in float32.

    The value is autodiff's; the gradient, softmax(logits) - onehot(target) scaled by the
    weights, is the same formula autodiff derives, but computed from the logits and the saved
    logsumexp ([B, P] floats) in the backward pass. Autodiff keeps exp(logits - max) from the
    forward pass instead, a float32 copy of the logits (2.56 GB at 2,560 masked positions x
    250k ids: written once, read once), where the logits themselves are the vocabulary
    matmul's bfloat16 output, already in memory; recomputing the exponential costs arithmetic
    a memory-bound pass does not notice (the cost model: 8.96 -> 5.12 GB moved a base step,
    docs/performance.md).
    """
    return _weighted_nll_fwd(logits, target_ids, weights)[0]


def _weighted_nll_fwd(logits: jax.Array, target_ids: jax.Array, weights: jax.Array
                      ) -> tuple[jax.Array, tuple[jax.Array, ...]]:
    lse, target = _nll_parts(logits, target_ids)
    return jnp.sum((lse - target) * weights), (logits, target_ids, weights, lse, target)


def _weighted_nll_bwd(res: tuple[jax.Array, ...], g: jax.Array
                      ) -> tuple[jax.Array, None, jax.Array]:
    logits, target_ids, weights, lse, target = res
    x = logits.astype(jnp.float32)
    onehot = _is_target(x, target_ids).astype(jnp.float32)
    scale = (g * weights).astype(jnp.float32)[..., None]
    d_logits = (jnp.exp(x - lse[..., None]) - onehot) * scale
    d_weights = (g * (lse - target)).astype(weights.dtype)
    return d_logits.astype(logits.dtype), None, d_weights


weighted_nll_sum.defvjp(_weighted_nll_fwd, _weighted_nll_bwd)


def encoder_kwargs(batch: Batch, use_lang_ids: bool = True) -> dict[str, Any]:
    """Model inputs that a data batch may carry (packing, positions, language ids, the train
    step's row ids for per-row dropout); without `use_lang_ids` the batch's `lang_ids` are
    left out (a model without a language table)."""
    keys = ("positions", "segment_ids", "token_type_ids", ROW_IDS) + (
        ("lang_ids",) if use_lang_ids else ())
    return {k: batch[k] for k in keys if k in batch}


def restart_target_positions(positions: jax.Array, pair_side: jax.Array) -> jax.Array:
    """`positions` [B, T] with every second-sentence run (`pair_side` 2) counting from 0 again.

    A run starts at a side-2 token whose left neighbour is not side 2 (each packed pair has one);
    its tokens get `position - position of the run's first token`. Linear in T (a running max of
    run starts), so packed rows of any length cost nothing noticeable."""
    idx = jnp.arange(positions.shape[1], dtype=jnp.int32)[None, :]
    tgt = pair_side == 2
    prev = jnp.pad(tgt[:, :-1], ((0, 0), (1, 0)))
    start = jnp.where(tgt & ~prev, idx, -1)
    first = jax.lax.cummax(start, axis=1)  # index of the latest run start at or before t
    offset = jnp.take_along_axis(positions, jnp.maximum(first, 0), axis=1)
    return jnp.where(tgt & (first >= 0), positions - offset, positions).astype(positions.dtype)


def check_restart(owner: str, kind: str, restart_positions: bool) -> bool:
    """`restart_positions` if the rows are pairs; a ValueError naming the setting otherwise."""
    if restart_positions and kind != "pair":
        raise ValueError(f"{owner}: restart_positions=True needs pair rows (kind='pair'), "
                         f"got kind={kind!r}")
    return bool(restart_positions)


def with_restarted_positions(batch: Batch, restart: bool) -> Batch:
    """The batch with `restart_target_positions` applied when `restart`, else unchanged."""
    if not restart:
        return batch
    return {**batch, "positions": restart_target_positions(batch["positions"],
                                                           batch["pair_side"])}


def side_rows(batch: Batch, prefix: str) -> Batch:
    """The features of one row of a two-row example (`prefix` stripped, e.g. "x_") with the
    step's row ids, which carry no prefix (both rows of an example share one id)."""
    rows = {k[len(prefix):]: v for k, v in batch.items() if k.startswith(prefix)}
    if ROW_IDS in batch:
        rows[ROW_IDS] = batch[ROW_IDS]
    return rows


class MaskedLM(Objective):
    """Masked LM on one kind of rows; `name="mmlm", kind="mono"` or `name="tlm", kind="pair"`."""

    def __init__(self, model: Transformer, name: str = "mmlm", kind: str = "mono",
                 mask_prob: float = 0.15, max_predictions: int = 20,
                 use_lang_ids: bool | None = None, restart_positions: bool = False):
        """`restart_positions`: pair rows only; the second sentence's positions count from 0
        (XLM §3.3); off by default (positions run on; see the module docstring)."""
        self.model = model
        kind = check_kind(f"MaskedLM(name={name!r})", kind, ("mono", "pair"))
        self.restart_positions = check_restart(f"MaskedLM(name={name!r})", kind,
                                               restart_positions)
        cfg = model.config
        # XLM-R layout: <mask> is the last id of the vocabulary.
        self.masking = MaskingConfig(mask_prob=mask_prob, max_predictions=max_predictions,
                                     mask_id=cfg.vocab_size - 1, vocab_size=cfg.vocab_size)
        self.name, self.kind = name, kind
        self.use_lang_ids = cfg.num_languages > 0 if use_lang_ids is None else use_lang_ids

    def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
        batch = with_restarted_positions(batch, self.restart_positions)
        m = mask_tokens(rng, batch["input_ids"], None, self.masking)
        return {**batch, "input_ids": m.input_ids, "target_positions": m.target_positions,
                "target_ids": m.target_ids, "target_weights": m.target_weights}

    def counts(self, prepared: Batch) -> dict[str, jax.Array]:
        """One term, "loss": the masked predictions."""
        return {"loss": jnp.sum(prepared["target_weights"])}

    def flops_per_example(self, seq_len: int) -> float:
        """Each row of the example through the encoder with gradient, and the MLM head at
        its `max_predictions` slots (`xlm_jax.models.flops`)."""
        cfg = self.model.config
        rows = len(example_kind(self.kind).prefixes)
        return 3.0 * rows * (seq_len * flops.encoder_flops(cfg, seq_len)
                             + self.masking.max_predictions * flops.head_flops(cfg))

    def loss(self, params: Any, prepared: Batch, rng: jax.Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        kwargs = encoder_kwargs(prepared, self.use_lang_ids)

        def forward(mdl: Transformer) -> jax.Array:
            h = mdl.encode(prepared["input_ids"], deterministic=deterministic, **kwargs)
            return mdl.mlm_logits(h.last_hidden_state, prepared["target_positions"])

        logits = self.model.apply({"params": self.encoder_params(params)}, rngs={"dropout": rng},
                                  method=forward)
        loss_sum, correct = masked_lm_sums(logits, prepared["target_ids"],
                                           prepared["target_weights"])
        count = jnp.sum(prepared["target_weights"])
        return LossOutput(losses={"loss": loss_sum},
                          metrics={"accuracy": Metric(correct, count)})

    def health_checks(self) -> tuple[HealthCheck, ...]:
        """Its accuracy at or below the floor, or not moved from its start (`train.health`)."""
        return masked_lm_checks("the masked LM")
