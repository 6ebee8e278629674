"""A test objective with a module of its own: a small token-classification head.

`TokenProbe` predicts each real token's id modulo `classes` from the encoder's last hidden
states through its own head (`params["objectives"][module]`), and optionally (`tied=True`) adds
`h . word_embedding[c]` for class c, reading an encoder parameter directly as XLM-E's generator
does with the shared embeddings. It is not a paper's objective; it exercises the interface:
own parameters (with an objective-declared logical axis), a read of the encoder's parameters,
gradients into both, and the declaration errors (`rules`, `module`, `shared`, `encoder_param`).
"""
from __future__ import annotations

from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from xlm_jax.models.common import zeros_init
from xlm_jax.objectives.base import Batch, LossOutput, Metric, Objective, check_kind

WORD_EMBEDDINGS = "embeddings/word_embeddings/embedding"


class ProbeHead(nn.Module):
    """Dense d -> classes whose class axis carries the logical name `axis`."""

    hidden_size: int
    classes: int
    axis: str = "probe_classes"

    @nn.compact
    def __call__(self, h: jax.Array) -> jax.Array:
        kernel = self.param("kernel", normal_init_like(("embed", self.axis)),
                            (self.hidden_size, self.classes), jnp.float32)
        bias = self.param("bias", zeros_init((self.axis,)), (self.classes,), jnp.float32)
        return h.astype(jnp.float32) @ kernel + bias


def normal_init_like(names: tuple[str, ...]) -> Any:
    return nn.with_logical_partitioning(nn.initializers.normal(0.02), names)


class TokenProbe(Objective):
    """Token id modulo `classes`, predicted by an objective-owned head; see the module doc."""

    def __init__(self, model: Any, name: str = "probe", kind: str = "mono", classes: int = 8,
                 module: str = "probe_head", axis: str = "probe_classes",
                 rules: tuple[tuple[str, Any], ...] = (("probe_classes", "tensor"),),
                 shared: bool = False, tied: bool = False, encoder_param: str = WORD_EMBEDDINGS):
        self.model, self.name = model, name
        self.kind = check_kind(f"TokenProbe(name={name!r})", kind, ("mono", "pair"))
        self.classes, self.module, self.axis, self.rules = classes, module, axis, tuple(rules)
        self.shared_modules = (module,) if shared else ()
        self.tied, self.param_path = tied, encoder_param
        self.encoder_params_used = (encoder_param,) if tied else ()

    def modules(self) -> dict[str, nn.Module]:
        return {self.module: ProbeHead(self.model.config.hidden_size, self.classes, self.axis)}

    def example_inputs(self, name: str) -> tuple[Any, ...]:
        return (jnp.zeros((1, self.model.config.hidden_size)),)

    def logical_axis_rules(self) -> tuple[tuple[str, Any], ...]:
        return self.rules

    def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
        return dict(batch)

    def _weights(self, batch: Batch) -> jax.Array:
        return (batch["input_ids"] != self.model.config.pad_id).astype(jnp.float32)

    def counts(self, prepared: Batch) -> dict[str, jax.Array]:
        return {"loss": jnp.sum(self._weights(prepared))}

    def loss(self, params: Any, prepared: Batch, rng: jax.Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        lang = ({"lang_ids": prepared["lang_ids"]} if self.model.config.num_languages else {})
        h = self.model.apply({"params": self.encoder_params(params)}, prepared["input_ids"],
                             deterministic=deterministic, rngs={"dropout": rng},
                             method=self.model.encode, **lang).last_hidden_state.astype(
                                 jnp.float32)
        logits = self.modules()[self.module].apply(
            {"params": self.module_params(params, self.module)}, h)
        if self.tied:
            table = self.encoder_param(params, self.param_path)[:self.classes]
            logits = logits + h @ jnp.asarray(table, jnp.float32).T
        target = prepared["input_ids"] % self.classes
        logp = jax.nn.log_softmax(logits, axis=-1)
        nll = -jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
        w = self._weights(prepared)
        correct = jnp.sum((jnp.argmax(logits, -1) == target) * w)
        return LossOutput(losses={"loss": jnp.sum(nll * w)},
                          metrics={"accuracy": Metric(correct, jnp.sum(w))})
