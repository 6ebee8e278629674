"""InfoXLM cross-lingual contrast (XLCo): a momentum key encoder and a queue of negatives.

A translation pair (`kind="split_pair"`: rows x, y) or InfoXLM's two-pair mixup example
(`kind="mixup_pair"`: rows query, key; the mixup construction is stated in the InfoXLM paper's
§3.3 and built as the released unilm code does) gives a query row and a key row. The query is
encoded by the model being trained, the key by an EMA copy of it (the momentum encoder,
MoCo-style); both take the `<s>` hidden state of the "universal" layer `layer` and, with
`projection_dim` > 0, the projection head (paper §3.3; its form, a bias-free linear map, and
its d x d size follow the released code), a module the objective owns
(`params["objectives"][name]`). The loss is InfoNCE against the queue of earlier keys:

    logits = [q . k+, q . queue] / temperature,   loss = cross-entropy with label 0,

with no L2 normalisation (as unilm's code; `normalize=True` gives MoCo's unit vectors).
`in_batch_negatives=True` also scores each query against the other rows' keys of the same
step (as MoCo v3; `queue_size=0` then leaves only those): negatives from the current key
encoder cannot be told from the positive by their age alone, which a short run with a small
queue otherwise learns to do. Facts kept from the reference implementation
(unilm `infoxlm`, criterion `xlco`):
- the key encoder is the EMA `key = m * key + (1 - m) * params` after every optimizer step,
  projection included; it starts as a copy of the parameters (loaded ones for `init_from`);
- the queue is a ring buffer of the keys of all devices (the keys here are the *global*
  batch, so nothing needs gathering), full before the first optimizer step, so that XLCo's
  loss is on from step 1: unilm's InfoXLM task (`infoxlm/src-infoxlm/infoxlm/tasks/infoxlm.py`,
  `prepare_train` -> `fill_queue`) runs the XLCo criterion under `no_grad` on XLCo batches
  until the queue is ready (the pre-fill is also stated in the paper's §3.3). Here (`initial_fill="prefill"`, the
  default) the trainer hands `prefill` the XLCo stream's first queue_size / B batches (B: the
  global batch) before step 1; their keys come from the key encoder at step 0, i.e. the
  initial parameters (the loaded ones for `init_from`), with dropout on as unilm's
  `model.train()`, and the stream continues after them: training starts at batch
  queue_size / B, and the checkpoints' input positions count the fill (our choice: unilm
  fills from a separate unshuffled pass over the XLCo data, queue / B + 100 batches, and its
  training stream starts at the beginning). `initial_fill="warmup"` is this library's former
  behaviour, kept as an option: no fill, and the loss is off (0, accuracy 0) until the first
  training steps have enqueued queue_size keys. Only real rows enter the queue: a padding
  row of a static-shape batch (all `<pad>`, which unilm's variable-size batches never have)
  would otherwise put a key that is no sentence among the negatives (a fill whose batches
  have padding rows leaves the queue short, and the loss waits for the training steps to
  complete it);
- keys enter the queue once per optimizer step, in global row order, after the EMA (they
  were computed by the key encoder before it, as unilm's). Our choice: unilm enqueues inside
  its criterion, once per micro-batch, so under gradient accumulation a step's later
  micro-batches score against its earlier ones' keys; here every micro-batch scores against
  the queue of the step's start, and accumulation equals one step of the whole batch;
- both rows are MLM-masked (`mask_prob`, 80/10/10; no MLM loss on them);
- one direction per example: the data already puts either side first at random;
- dropout is on in both encoders while training (the key encoder runs in training mode under
  `no_grad` there).
The loss unit is a sentence pair; `loop.train.loss_normalization="pooled"` gives unilm's
normalisation by sentences + masked tokens instead of the paper's sum of means.
"""
from __future__ import annotations

from typing import Any

from collections.abc import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from xlm_jax.data.features import PAD_ID, example_kind
from xlm_jax.models import flops
from xlm_jax.models import heads as heads_lib
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import (ENCODER, OBJECTIVES, Batch, HealthCheck, LossOutput, Metric,
                                     Objective, check_kind, loss_rising_check)
from xlm_jax.objectives.masking import MaskingConfig, mask_tokens
from xlm_jax.objectives.mlm import encoder_kwargs, side_rows

# query_/key_ rows (mixup_pair) or x_/y_ rows (split_pair: a sentence, its translation)
KINDS = ("mixup_pair", "split_pair")
QUEUE_AXES = ("queue", "embed_proj")  # logical names of the queue
# The queue is replicated: every query scores every key (131072 x 768 fp32 = 0.4 GB per device
# at base). A run may shard it with loop.train.axis_rule_overrides.
QUEUE_RULES = (("queue", None),)
# how the queue is first filled: before step 1 (unilm's `fill_queue`) or by the first steps
INITIAL_FILLS = ("prefill", "warmup")
LAYER_NORMS = ("final", "none")


class XLCo(Objective):
    """InfoXLM XLCo on a two-row stream; see the module docstring for the computation."""

    def __init__(self, model: Transformer, name: str = "xlco", kind: str = "mixup_pair",
                 layer: int | None = None, projection_dim: int = 0, temperature: float = 0.25,
                 queue_size: int = 131072, momentum: float = 0.999, mask_prob: float = 0.15,
                 max_predictions: int = 20, pooling: str = "cls", normalize: bool = False,
                 in_batch_negatives: bool = False, use_lang_ids: bool | None = None,
                 initial_fill: str = "prefill", layer_norm: str = "final"):
        """
        Args:
          kind: "mixup_pair" (InfoXLM mixup examples, `query_*`/`key_*` rows) or
            "split_pair" (a sentence and its translation, `x_*`/`y_*` rows).
          layer: the hidden state used, 0 = embeddings .. num_layers = last (None); InfoXLM
            uses 8 for base and 12 for large ("universal layer", paper Table 10).
          projection_dim: > 0 adds the bias-free linear projection hidden_size ->
            projection_dim (module `name`, EMA'd into the key encoder); 0 = none. The paper
            has a projection head (§3.3) but gives no dimension; unilm's released code
            projects d -> d.
          temperature: tau of the softmax (0.25 in unilm's released InfoXLM code; the paper
            gives none).
          queue_size: negatives kept (131072, InfoXLM paper Table 10); a multiple of the global
            batch; 0 (no queue) only with `in_batch_negatives`.
          momentum: m of the key encoder's EMA (paper Table 10: 0.999; the released README
            uses 0.9999).
          mask_prob, max_predictions: MLM masking of both rows (0 turns it off).
          pooling: "cls" (`<s>`, InfoXLM) or "mean" (over the row's tokens).
          normalize: L2-normalise queries and keys (MoCo); InfoXLM does not.
          in_batch_negatives: the other rows' keys of the step are negatives too (MoCo v3).
          initial_fill: "prefill" (unilm's `fill_queue`: the queue is filled from the stream's
            first queue_size / B batches before step 1, and the loss is on from step 1) or
            "warmup" (no fill: the loss is 0 until the training steps have filled it).
          layer_norm: what a pre-LN model contrasts at a layer below the last: "final"
            (the encoder's final LayerNorm applied to that layer's residual stream, so the
            state is normalised as every layer's output of the post-LN models the paper
            trains) or "none" (the raw residual stream). Our choice, measured in
            docs/fidelity.md ("XLCo on pre-LN models"); a post-LN model and the last layer
            are unaffected (their states are already normalised).
        """
        cfg = model.config
        kind = check_kind(f"XLCo(name={name!r})", kind, KINDS)
        self.layer = cfg.num_layers if layer is None else layer
        if not 0 <= self.layer <= cfg.num_layers:
            raise ValueError(f"XLCo(name={name!r}): layer={layer} is outside 0..{cfg.num_layers} "
                             f"(the model has {cfg.num_layers} layers)")
        for field, value, ok in (("temperature", temperature, temperature > 0),
                                 ("queue_size", queue_size,
                                  isinstance(queue_size, int)
                                  and (queue_size > 0 or queue_size == 0 and in_batch_negatives)),
                                 ("momentum", momentum, 0.0 <= momentum < 1.0),
                                 ("projection_dim", projection_dim,
                                  isinstance(projection_dim, int) and projection_dim >= 0),
                                 ("mask_prob", mask_prob, 0.0 <= mask_prob < 1.0)):
            if not ok:
                raise ValueError(f"XLCo(name={name!r}): {field}={value!r} is out of range")
        if initial_fill not in INITIAL_FILLS:
            raise ValueError(f"XLCo(name={name!r}): initial_fill={initial_fill!r} must be one of "
                             f"{', '.join(INITIAL_FILLS)}")
        if layer_norm not in LAYER_NORMS:
            raise ValueError(f"XLCo(name={name!r}): layer_norm={layer_norm!r} must be one of "
                             f"{', '.join(LAYER_NORMS)}")
        if pooling not in heads_lib.POOLING:
            raise ValueError(f"XLCo(name={name!r}): pooling={pooling!r} must be one of "
                             f"{', '.join(heads_lib.POOLING)}")
        self.model, self.name, self.kind = model, name, kind
        self.query_prefix, self.key_prefix = example_kind(kind).prefixes
        self.temperature, self.queue_size, self.momentum = temperature, queue_size, momentum
        self.pooling, self.normalize = pooling, normalize
        self.in_batch_negatives = in_batch_negatives
        self.initial_fill = initial_fill
        # the final LayerNorm applies where the state is a pre-LN residual stream
        self.final_norm = (layer_norm == "final" and cfg.ln_style == "pre"
                           and self.layer < cfg.num_layers)
        self.masking = (MaskingConfig(mask_prob=mask_prob, max_predictions=max_predictions,
                                      mask_id=cfg.vocab_size - 1, vocab_size=cfg.vocab_size)
                        if mask_prob > 0 else None)
        self.use_lang_ids = cfg.num_languages > 0 if use_lang_ids is None else use_lang_ids
        self.projection_dim = projection_dim
        self.dim = projection_dim or cfg.hidden_size
        self.projection = (heads_lib.ProjectionHead(cfg, features=projection_dim)
                           if projection_dim else None)

    # -- declarations ---------------------------------------------------------------------

    def modules(self) -> dict[str, nn.Module]:
        return {self.name: self.projection} if self.projection is not None else {}

    def example_inputs(self, name: str) -> tuple[Any, ...]:
        return (jnp.zeros((1, self.model.config.hidden_size), self.model.config.compute_dtype),)

    def logical_axis_rules(self) -> tuple[tuple[str, Any], ...]:
        return QUEUE_RULES if self.queue_size else ()

    def _own_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters XLCo's representation reads: the encoder and its projection."""
        own = {ENCODER: params[ENCODER]}
        if self.projection_dim:
            own[OBJECTIVES] = {self.name: self.module_params(params, self.name)}
        return own

    # -- state ----------------------------------------------------------------------------

    def init_state(self, params: Any) -> dict[str, Any]:
        """Key encoder = a copy of the encoder and projection parameters (boxed params keep
        their sharding), an empty queue."""
        state = {"key_params": jax.tree_util.tree_map(jnp.array, self._own_params(params))}
        if self.queue_size:  # (no empty arrays: orbax cannot save zero-size arrays)
            queue = jnp.zeros((self.queue_size, self.dim), jnp.float32)
            state.update(queue=nn.LogicallyPartitioned(queue, names=QUEUE_AXES),
                         ptr=jnp.zeros((), jnp.int32), filled=jnp.zeros((), jnp.int32))
        return state

    def after_update(self, params: Any, state: dict[str, Any], inputs: dict[str, jax.Array]
                     ) -> dict[str, Any]:
        """EMA of the key encoder, then the keys of the step's real rows (`inputs["valid"]`;
        all rows when absent) into the ring buffer (`_enqueue`)."""
        m = self.momentum
        key_params = jax.tree_util.tree_map(lambda k, p: m * k + (1.0 - m) * p,
                                            state["key_params"], self._own_params(params))
        return {**self._enqueue(state, inputs["keys"], inputs.get("valid")),
                "key_params": key_params}

    def _enqueue(self, state: dict[str, Any], keys: jax.Array, valid: jax.Array | None
                 ) -> dict[str, Any]:
        """`state` with the keys of the real rows (`valid` > 0; all rows when None) in the ring
        buffer, in row order from `ptr`, wrapping at its end; `filled` counts them (up to
        queue_size). Without a queue, `state` as it is."""
        if not self.queue_size:
            return dict(state)
        keys = keys.astype(jnp.float32)
        rows = keys.shape[0]
        if self.queue_size % rows:
            raise ValueError(f"XLCo(name={self.name!r}): queue_size={self.queue_size} is not "
                             f"a multiple of the global batch of {rows} rows; the ring buffer "
                             "takes whole batches")
        valid = jnp.ones((rows,), bool) if valid is None else valid > 0
        # the i-th real row goes to slot ptr + i (mod size); padding rows to no slot (dropped)
        rank = jnp.cumsum(valid.astype(jnp.int32)) - 1
        slot = jnp.where(valid, (state["ptr"] + rank) % self.queue_size, self.queue_size)
        queue = state["queue"].at[slot].set(keys, mode="drop")
        n = jnp.sum(valid.astype(jnp.int32))
        return {**state, "queue": queue, "ptr": (state["ptr"] + n) % self.queue_size,
                "filled": jnp.minimum(state["filled"] + n, self.queue_size)}

    def prefill_batches(self, batch_size: int) -> int:
        """queue_size / batch_size batches fill the queue before step 1 (`initial_fill=
        "prefill"`, unilm's `fill_queue`); none with "warmup" or without a queue."""
        if self.initial_fill != "prefill" or not self.queue_size:
            return 0
        if self.queue_size % batch_size:
            raise ValueError(f"XLCo(name={self.name!r}): queue_size={self.queue_size} is not "
                             f"a multiple of the global batch of {batch_size} rows; the ring "
                             "buffer takes whole batches")
        return self.queue_size // batch_size

    def prefill(self, params: Any, state: dict[str, Any], prepared: Batch, rng: jax.Array
                ) -> dict[str, Any]:
        """One batch of the fill: the keys of its key rows, from the key encoder (at step 0
        the initial parameters) with dropout on and no gradient, into the queue; the key
        encoder is not moved (unilm's fill calls no `update_slow_weight`). `rng` is drawn as
        `loss` draws it, so a key gets the dropout masks it would get there."""
        del params  # the key encoder is the initial encoder here
        _, k_rng = jax.random.split(rng)
        keys = self.represent(state["key_params"], prepared, self.key_prefix, k_rng,
                              deterministic=False)
        return self._enqueue(state, keys, self._valid_rows(prepared))

    # -- loss -----------------------------------------------------------------------------

    def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
        out = dict(batch)
        if self.masking is None:
            return out
        for prefix, r in zip((self.query_prefix, self.key_prefix), jax.random.split(rng)):
            out[prefix + "input_ids"] = mask_tokens(r, batch[prefix + "input_ids"], None,
                                                    self.masking).input_ids
        return out

    def _valid_rows(self, prepared: Batch) -> jax.Array:
        return (prepared[self.query_prefix + "input_ids"][:, 0] != PAD_ID).astype(jnp.float32)

    def counts(self, prepared: Batch) -> dict[str, jax.Array]:
        """One term, "loss": the real (non-padding) query rows."""
        return {"loss": jnp.sum(self._valid_rows(prepared))}

    def represent(self, params: Any, prepared: Batch, prefix: str, rng: jax.Array,
                  deterministic: bool) -> jax.Array:
        """[B, P] sentence vectors of the `prefix` rows: pooled layer `layer`, projected (and
        L2-normalised with `normalize`). `params` is the train state's tree or the key
        encoder's (the same layout, restricted to what XLCo reads)."""
        rows = side_rows(prepared, prefix)
        kwargs = encoder_kwargs(rows, self.use_lang_ids)

        def forward(mdl: Transformer) -> jax.Array:
            out = mdl.encode(rows["input_ids"], deterministic=deterministic,
                             return_hidden_states=True, **kwargs)
            valid = (rows["segment_ids"] > 0 if "segment_ids" in rows
                     else rows["input_ids"] != mdl.config.pad_id)
            state = out.hidden_states[self.layer]
            if self.final_norm:
                state = mdl.final_norm(state)
            return heads_lib.pool(state, valid, self.pooling)

        vec = self.model.apply({"params": params[ENCODER]}, rngs={"dropout": rng},
                               method=forward)
        if self.projection_dim:
            vec = self.projection.apply(
                {"params": self.module_params(params, self.name)}, vec)
        vec = vec.astype(jnp.float32)
        if self.normalize:
            vec = vec / jnp.maximum(jnp.linalg.norm(vec, axis=-1, keepdims=True), 1e-6)
        return vec

    def flops_per_example(self, seq_len: int) -> float:
        """The query row differentiated and the key row forward only (the key encoder), each
        through the layers up to `layer` (the later ones do not reach the loss; XLA drops
        them) and the projection; the scores against the batch and the queue (2 (B + Q) dim
        per row, 2 x: the keys are constants) depend on the batch and are not counted."""
        cfg = self.model.config
        row = seq_len * flops.encoder_flops(cfg, seq_len, layers=self.layer)
        proj = 2 * cfg.hidden_size * self.projection_dim if self.projection_dim else 0
        return 3.0 * (row + proj) + row + proj

    def loss(self, params: Any, prepared: Batch, rng: jax.Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        q_rng, k_rng = jax.random.split(rng)
        q = self.represent(params, prepared, self.query_prefix, q_rng, deterministic)
        k = jax.lax.stop_gradient(
            self.represent(state["key_params"], prepared, self.key_prefix, k_rng, deterministic))
        valid = self._valid_rows(prepared)
        if self.in_batch_negatives:  # positives on the diagonal; padding rows are no negatives
            batch = jnp.where(valid[None, :] > 0, q @ k.T, -1e9)
            label = jnp.arange(q.shape[0])
        else:
            batch = jnp.sum(q * k, axis=-1, keepdims=True)
            label = jnp.zeros(q.shape[0], jnp.int32)
        if self.queue_size:
            batch = jnp.concatenate([batch, q @ jax.lax.stop_gradient(state["queue"]).T], -1)
        logits = batch / self.temperature
        positive = jnp.take_along_axis(logits, label[:, None], axis=-1)[:, 0]
        nll = jax.nn.logsumexp(logits, axis=-1) - positive
        filled = state["filled"] if self.queue_size else 0
        ready = jnp.float32(filled >= self.queue_size)
        loss_sum = jnp.sum(jnp.where(valid > 0, nll, 0.0)) * ready
        # a tie (e.g. collapsed vectors) is not a hit: the positive must beat every negative
        others = jnp.where(jax.nn.one_hot(label, logits.shape[-1]) > 0, -jnp.inf, logits)
        hit = positive > jnp.max(others, axis=-1)
        correct = jnp.sum(hit * valid) * ready
        metrics = {"accuracy": Metric(correct, jnp.sum(valid))}
        if self.queue_size:  # the filled fraction, once per (micro)batch
            metrics["queue_fill"] = Metric(jnp.float32(filled) / self.queue_size, 1.0)
        return LossOutput(losses={"loss": loss_sum}, metrics=metrics,
                          state_inputs={"keys": k, "valid": valid})

    def health_checks(self) -> tuple[HealthCheck, ...]:
        """Accuracy within a factor of chance, 1 / (negatives + 1) with the queue's negatives
        and, with `in_batch_negatives`, the step's other rows (its `count`; under gradient
        accumulation a microbatch has fewer, so chance is higher than this), and the loss
        rising; both from the steps at which the queue is full (`queue_fill` 1: with
        `initial_fill="warmup"` the loss is 0 before)."""

        def chance(m: Mapping[str, float]) -> float:
            others = max(m.get("count", 1.0) - 1.0, 0.0) if self.in_batch_negatives else 0.0
            return 1.0 / (self.queue_size + others + 1.0)

        ready = "queue_fill" if self.queue_size else None
        keys = "queue_size + rows" if self.in_batch_negatives else "queue_size + 1"
        knob = ("a higher learning rate (OptimizerConfig.learning_rate), then whether the key "
                "rows are the query rows' translations" if self.in_batch_negatives else
                "in_batch_negatives=True or a smaller queue_size (fewer, fresher negatives)")
        return (
            HealthCheck("accuracy", "near_chance", baseline=chance, ready=ready, knob=knob,
                        baseline_name=f"chance 1/({keys})",
                        meaning="the positive key wins no more often than a random pick among "
                                "the negatives would (the contrast learns nothing)"),
            loss_rising_check(ready=ready))
