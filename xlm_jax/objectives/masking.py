"""Dynamic 80/10/10 token masking on device, with static shapes.

What: `mask_tokens(rng, input_ids, eligible, cfg)` picks, per row, k positions uniformly
among the eligible tokens, corrupts them BERT-style (80% -> <mask>, 10% -> a random
regular token, 10% unchanged) and returns the corrupted ids plus the gathered
prediction targets `[B, P]` with P = `max_predictions`.

Why this way: masking inside the jitted step (RoBERTa/XLM-R "dynamic masking") gives a
fresh mask every epoch for free, and a fixed P keeps every shape static so the MLM
head runs on P gathered positions instead of all T (a 250k vocabulary at every
position would dominate the FLOPs). k = min(floor(mask_prob * n + u), P) with
u ~ U[0, 1) is fairseq's probabilistic rounding: E[k] = mask_prob * n exactly when P
does not bind. Selection is "random scores + top_k": every subset of size k among the
eligible positions is equally likely (ELECTRA / XLM-E "uniform masking").
Eligible tokens are the regular ones (`default_eligible`: never `<s>`, `</s>`, `<pad>`,
`<unk>` or `<mask>`), and n counts those only. Our choice: fairseq's `MaskTokensDataset`
(XLM-R's released code) selects among every position of the row, `<s>`/`</s>` included, and
sets n to the row length, so at the same mask_prob it predicts slightly more tokens per row.
Pure jax.numpy; jit- and vmap-friendly; no TensorFlow.
"""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
    """Masking rates and the id layout; validated on creation (ValueError names the field)."""

    # Fraction of eligible tokens selected for prediction (15% in BERT/XLM-R; VECO: 25% bilingual).
    mask_prob: float = 0.15
    # P: static number of prediction slots per row; selections beyond it are dropped
    # (e.g. 20 at length 128, 80 at length 512 for 15%).
    max_predictions: int = 20
    # Of the selected tokens: share replaced by mask_id.
    mask_token_prob: float = 0.8
    # Of the selected tokens: share replaced by a uniform random regular id; the rest
    # (1 - mask_token_prob - random_token_prob) keep their original id.
    random_token_prob: float = 0.1
    # The <mask> id (XLM-R: 250001).
    mask_id: int = 250001
    # Vocabulary size of the model (XLM-R: 250002); every id must be < vocab_size.
    vocab_size: int = 250002
    # Ids below this are special (XLM-R: <s>=0, <pad>=1, </s>=2, <unk>=3); random
    # replacements are drawn from [first_regular_id, mask_id).
    first_regular_id: int = 4

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> ValueError:
            return ValueError(
                f"MaskingConfig.{field}={getattr(self, field)!r} is invalid: {why}")

        if not 0.0 < self.mask_prob <= 1.0:
            raise bad("mask_prob", "must be in (0, 1]")
        if not isinstance(self.max_predictions, int) or self.max_predictions < 1:
            raise bad("max_predictions", "must be an integer >= 1")
        if not 0.0 <= self.mask_token_prob <= 1.0:
            raise bad("mask_token_prob", "must be in [0, 1]")
        if not 0.0 <= self.random_token_prob <= 1.0 - self.mask_token_prob + 1e-9:
            raise bad("random_token_prob",
                      f"must be in [0, 1 - mask_token_prob={1.0 - self.mask_token_prob:g}]")
        if not isinstance(self.first_regular_id, int) or self.first_regular_id < 0:
            raise bad("first_regular_id", "must be an integer >= 0")
        if not isinstance(self.mask_id, int) or self.mask_id <= self.first_regular_id:
            raise bad("mask_id", f"must be an integer > first_regular_id={self.first_regular_id} "
                                 "(random replacements are drawn from [first_regular_id, mask_id))")
        if not isinstance(self.vocab_size, int) or self.vocab_size <= self.mask_id:
            raise bad("vocab_size", f"must be an integer > mask_id={self.mask_id}")


@flax.struct.dataclass
class MaskedInputs:
    """Output of `mask_tokens`; B = batch, T = length, P = cfg.max_predictions."""

    input_ids: jax.Array         # [B, T] corrupted ids (same dtype as the input)
    target_positions: jax.Array  # [B, P] int32 positions of the predictions (0 in unused slots)
    target_ids: jax.Array        # [B, P] original ids at those positions (0 in unused slots)
    target_weights: jax.Array    # [B, P] float32, 1 = a real prediction, 0 = an unused slot
    selected: jax.Array          # [B, T] bool, True where a prediction is made


def default_eligible(input_ids: jax.Array, cfg: MaskingConfig) -> jax.Array:
    """Regular tokens: id >= first_regular_id and id != mask_id (so pads/specials never)."""
    return (input_ids >= cfg.first_regular_id) & (input_ids != cfg.mask_id)


def regular_token_logits(logits: jax.Array, cfg: MaskingConfig) -> jax.Array:
    """`logits` [..., V] with every id that is not a regular token (the specials below
    `first_regular_id` and `<mask>`) at `PADDED_LOGIT`, so argmax and sampling pick words only
    (XLM-E's replacements, ERNIE-M's pseudo-tokens)."""
    from xlm_jax.models.heads import PADDED_LOGIT

    vocab = jnp.arange(logits.shape[-1])
    special = (vocab < cfg.first_regular_id) | (vocab == cfg.mask_id)
    return jnp.where(special, PADDED_LOGIT, logits)


def mask_tokens(rng: jax.Array, input_ids: jax.Array, eligible: jax.Array | None,
                cfg: MaskingConfig) -> MaskedInputs:
    """Selects and corrupts tokens for masked-LM training; static shapes throughout.

    Args:
      rng: a PRNG key; the result is a deterministic function of (rng, inputs).
      input_ids: int [B, T].
      eligible: bool [B, T] or None. Narrows the candidates (e.g. one side of a pair);
        it is always intersected with `default_eligible`, so special tokens, pads and
        <mask> are never selected. None = all regular tokens.
      cfg: MaskingConfig.

    Returns:
      MaskedInputs; the predictions of a row sit in its first k slots in ascending
      position order.
    """
    input_ids = jnp.asarray(input_ids)  # numpy batches work outside jit too
    if input_ids.ndim != 2:
        raise ValueError(f"mask_tokens: input_ids must be [batch, length], got shape "
                         f"{tuple(input_ids.shape)}")
    batch, length = input_ids.shape
    num_slots = cfg.max_predictions
    cand = default_eligible(input_ids, cfg)
    if eligible is not None:
        if tuple(eligible.shape) != tuple(input_ids.shape):
            raise ValueError(f"mask_tokens: eligible has shape {tuple(eligible.shape)} but "
                             f"input_ids has {tuple(input_ids.shape)}")
        cand = cand & eligible.astype(bool)

    k_round, k_score, k_kind, k_rand = jax.random.split(rng, 4)
    # How many to predict per row: probabilistic rounding of mask_prob * n.
    n_eligible = jnp.sum(cand, axis=-1).astype(jnp.float32)
    u = jax.random.uniform(k_round, (batch,))
    k = jnp.floor(cfg.mask_prob * n_eligible + u).astype(jnp.int32)
    k = jnp.minimum(k, jnp.minimum(n_eligible.astype(jnp.int32), num_slots))

    # Which: the k highest random scores among the eligible positions. Scores are in
    # [0, 1) for candidates and -1 otherwise, so the top k (k <= n) are all candidates.
    scores = jnp.where(cand, jax.random.uniform(k_score, (batch, length)), -1.0)
    if num_slots <= length:
        _, top_idx = jax.lax.top_k(scores, num_slots)
    else:  # more slots than tokens: every position is a candidate slot, pad the rest.
        _, top_idx = jax.lax.top_k(scores, length)
        top_idx = jnp.pad(top_idx, ((0, 0), (0, num_slots - length)))
    slot = jnp.arange(num_slots, dtype=jnp.int32)[None, :]
    valid = slot < k[:, None]  # [B, P]
    # Sort the chosen positions ascending; unused slots sort last (key = length).
    positions = jnp.sort(jnp.where(valid, top_idx.astype(jnp.int32), length), axis=-1)
    valid = positions < length  # the same count per row, now left-aligned

    original = jnp.take_along_axis(input_ids, jnp.minimum(positions, length - 1), axis=-1)
    # 80 / 10 / 10: one uniform draw per slot decides the replacement kind.
    r = jax.random.uniform(k_kind, (batch, num_slots))
    random_ids = jax.random.randint(k_rand, (batch, num_slots), cfg.first_regular_id,
                                    cfg.mask_id, dtype=jnp.int32).astype(input_ids.dtype)
    replacement = jnp.where(
        r < cfg.mask_token_prob, jnp.asarray(cfg.mask_id, input_ids.dtype),
        jnp.where(r < cfg.mask_token_prob + cfg.random_token_prob, random_ids, original))

    # Scatter back; unused slots point one past the end and are dropped (no collisions).
    rows = jnp.arange(batch)[:, None]
    corrupted = input_ids.at[rows, positions].set(replacement, mode="drop")
    selected = jnp.zeros((batch, length), bool).at[rows, positions].set(True, mode="drop")
    return MaskedInputs(
        input_ids=corrupted,
        target_positions=jnp.where(valid, positions, 0).astype(jnp.int32),
        target_ids=jnp.where(valid, original, 0).astype(input_ids.dtype),
        target_weights=valid.astype(jnp.float32),
        selected=selected,
    )
