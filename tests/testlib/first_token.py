"""A new objective written from docs/adding_an_objective.md alone, with two loss terms and a
module of its own, and no FLOP formula: the trainer counts its FLOPs from the jaxpr.

`MaskedLMWithFirstToken` (not a paper's objective): term "mlm" is the masked LM over the
masked slots (the encoder's own tied head); term "first_token" predicts each row's first real
token from the `<s>` state through its own head (`params["objectives"]["first_token_head"]`,
d -> V). The loss is the mean of each over its own units (masked slots; rows), the second
weighted `first_token_weight`.
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from xlm_jax.objectives.base import Batch, LossOutput, Metric, Objective, check_kind
from xlm_jax.objectives.masking import MaskingConfig, mask_tokens
from xlm_jax.objectives.mlm import encoder_kwargs, masked_lm_sums

HEAD = "first_token_head"


class FirstTokenHead(nn.Module):
    """Dense d -> vocabulary, its output axis named "vocab" (a standard logical axis)."""

    hidden_size: int
    vocab_size: int

    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        kernel = self.param("kernel", nn.with_logical_partitioning(
            nn.initializers.normal(0.02), ("embed", "vocab")), (self.hidden_size, self.vocab_size))
        return h.astype(jnp.float32) @ kernel


class MaskedLMWithFirstToken(Objective):
    """Masked LM + first-token prediction from `<s>`; see the module docstring."""

    def __init__(self, model: Any, name: str = "mlm_first", kind: str = "mono",
                 max_predictions: int = 4, first_token_weight: float = 1.0):
        self.model, self.name = model, name
        self.term_weights = {"mlm": 1.0, "first_token": first_token_weight}
        self.kind = check_kind(f"MaskedLMWithFirstToken(name={name!r})", kind, ("mono",))
        cfg = model.config  # XLM-R layout: <mask> is the vocabulary's last id
        self.masking = MaskingConfig(max_predictions=max_predictions, mask_id=cfg.vocab_size - 1,
                                     vocab_size=cfg.vocab_size)

    def modules(self) -> dict[str, nn.Module]:
        cfg = self.model.config
        return {HEAD: FirstTokenHead(cfg.hidden_size, cfg.vocab_size)}

    def example_inputs(self, name: str) -> tuple[Any, ...]:
        return (jnp.zeros((1, self.model.config.hidden_size)),)

    def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
        m = mask_tokens(rng, batch["input_ids"], None, self.masking)
        return {**batch, "input_ids": m.input_ids, "target_positions": m.target_positions,
                "target_ids": m.target_ids, "target_weights": m.target_weights,
                "first_ids": batch["input_ids"][:, 1]}

    def counts(self, prepared: Batch) -> dict[str, jax.Array]:
        return {"mlm": jnp.sum(prepared["target_weights"]),
                "first_token": jnp.float32(prepared["first_ids"].shape[0])}

    def loss(self, params: Any, prepared: Batch, rng: jax.Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        def forward(mdl: Any) -> tuple[jax.Array, jax.Array]:
            h = mdl.encode(prepared["input_ids"], deterministic=deterministic,
                           **encoder_kwargs(prepared, use_lang_ids=False)).last_hidden_state
            return mdl.mlm_logits(h, prepared["target_positions"]), h[:, 0]

        mlm_logits, first_state = self.model.apply(
            {"params": self.encoder_params(params)}, rngs={"dropout": rng}, method=forward)
        mlm_sum, correct = masked_lm_sums(mlm_logits, prepared["target_ids"],
                                          prepared["target_weights"])
        logits = self.modules()[HEAD].apply({"params": self.module_params(params, HEAD)},
                                            first_state)
        logp = jax.nn.log_softmax(logits, axis=-1)
        first_sum = -jnp.sum(jnp.take_along_axis(logp, prepared["first_ids"][:, None], -1))
        return LossOutput(losses={"mlm": mlm_sum, "first_token": first_sum},
                          metrics={"accuracy": Metric(correct,
                                                      jnp.sum(prepared["target_weights"]))})
