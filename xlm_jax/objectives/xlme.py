"""XLM-E: multilingual and translation replaced-token detection (MRTD, TRTD).

ELECTRA-style pre-training (Chi et al. 2022, "XLM-E: Cross-lingual Language Model
Pre-training via ELECTRA"): a small generator fills masked positions, the discriminator (the
shared encoder, the model that is kept) tells for every token whether it was replaced.

One `ReplacedTokenDetection` objective per stream: `kind="mono"` is MRTD (with the generator's
MLM), `kind="pair"` is TRTD on `<s> x </s></s> y </s>` rows (with the generator's TLM; masks
are drawn over both sides by one selection of `mask_prob` over the pair's regular tokens: our
choice, where the paper's §3.1 names separate masked sets for e and f). Per objective

    L = L_gen + lambda * L_rtd,   L_gen = mean CE at the masked positions,
                                  L_rtd = mean BCE over every non-pad token,

so MRTD + TRTD in one mixture is `L_MLM + L_TLM + lambda (L_MRTD + L_TRTD)` with lambda = 50
(paper §4.1), each term a *mean* (ELECTRA's convention, our choice): the paper's Eqs. 1 and 3
write L_MRTD and L_TRTD as sums over the positions, which at the same lambda would weigh the
detection loss by the number of tokens rather than 1. Both objectives declare the modules
`generator` and `rtd_head` as shared: one generator and one head serve both streams.

- Masking (paper §2/§3.1: uniform selection, selected tokens replaced by [MASK]): every
  selected token becomes `<mask>` (no 80/10/10); the rate is not given by the paper (gin
  default 15%, our choice). Selection never picks `<s>`/`</s>` and the rate counts regular
  tokens only (`masking.mask_tokens`; our choice: fairseq selects specials too and counts every
  token).
- Generator: an encoder owned by the objective (`params["objectives"]["generator"]`) with the
  discriminator's width by default and fewer layers (paper: 4/6/8 for Base/Large/XL, Tables
  8-9). What it shares with the discriminator (read from the encoder's parameters, so both
  losses train it) is `embedding_sharing`: "tokens" (default; our choice, the XLM-E paper does
  not say) shares the token embedding table only, and the generator's position, type and
  language tables and its embedding LayerNorm are its own; "all" shares the whole embedding
  block (token, position, type and language tables and the embedding LayerNorm), as ELECTRA
  does, and needs the generator at the discriminator's width and with its position table
  (otherwise a one-line error names the setting). A narrower generator ("tokens" only) reads
  the table through a learned projection `embedding_projection` [d_disc, d_gen]. ELECTRA
  instead projects the embedding block's *output*; for the word term the two agree
  (`table[id] @ P = (table @ P)[id]`), but ELECTRA's position/type terms and LayerNorm act at
  d_disc before the projection, and it never multiplies the whole table (ours costs
  V x d_disc x d_gen FLOPs per step). Not done because the encoder takes token ids, not
  embeddings (`Transformer.encode`): an embeddings input would be a model change. The
  generator's layers and its MLM head (decoder tied to the shared table) are its own. Its
  position type follows the discriminator's unless set (whether XLM-E's generator has the
  gated bias is not stated: our choice).
- Gated relative bias (paper §3.3; `xlm_jax.models.position`): one bucket table for all layers
  (`ModelConfig.share_relative_table=True`, WavLM's layout; our choice, the paper does not say)
  with per-layer gates.
- Replacement: a token sampled from the generator's softmax at temperature 1 over the
  regular tokens (special ids excluded: our choice, see `forward`; ELECTRA samples over the
  whole vocabulary), with no gradient through
  the sample (it is an integer; the discriminator loss reaches the generator
  only through the shared embeddings). Samples use per-row keys drawn in `prepare`, so
  gradient accumulation sees the same samples as one large step. `sampler` says how:
  "gumbel" (`jax.random.categorical`, the default), "two_level" (the same distribution
  from a chunk's Gumbel noise, about 490 times fewer random draws) or "auto" (two_level when
  lowered for a GPU, gumbel elsewhere; `objectives/vocab_sampling.py`).
- Labels: a position is "replaced" iff the token the discriminator sees differs from the
  original. A sampled token equal to the original therefore counts as original, ELECTRA's
  convention; XLM-E's text ("predict whether each token is replaced") does not settle this
  case, so this is the reading we chose.
- Loss terms (`term_weights`): "mlm", the generator's CE summed over the masked predictions,
  weight 1; "rtd", the discriminator's BCE summed over the non-pad tokens, weight lambda.
  `counts` gives their units in the global batch (masked predictions, tokens), so the trainer's
  `L_gen + lambda L_rtd` is exact with and without accumulation. Metrics: the generator's
  `mlm_accuracy`; the discriminator's per-token `rtd_accuracy`, `rtd_precision` and
  `rtd_recall` on replaced tokens; `replaced_fraction`, the masked positions whose sample
  differs from the original (the trainer adds `mlm_loss` and `rtd_loss`, the terms' means).
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from xlm_jax.models import flops
from xlm_jax.models import heads as heads_lib
from xlm_jax.models.common import normal_init
from xlm_jax.models.config import POSITION_TYPES, ModelConfig
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives.base import (Batch, HealthCheck, LossOutput, Metric, Objective,
                                     masked_lm_checks, check_kind, loss_rising_check)
from xlm_jax.objectives import vocab_sampling
from xlm_jax.objectives.masking import MaskingConfig, mask_tokens, regular_token_logits
from xlm_jax.objectives.mlm import (check_restart, encoder_kwargs, masked_lm_sums,
                                    with_restarted_positions)

WORD_EMBEDDINGS = "embeddings/word_embeddings/embedding"
EMBEDDINGS = "embeddings"  # the discriminator's whole embedding block
PROJECTION = "embedding_projection"  # generator param [d_disc, d_gen] when it is narrower
GENERATOR_AXIS_RULES = (("embed_gen", None),)  # the projection's generator-width axis
# What the generator shares with the discriminator: the token table ("tokens") or the whole
# embedding block ("all", ELECTRA's sharing); see the module docstring.
EMBEDDING_SHARING = ("tokens", "all")
# Generator depth per discriminator size (XLM-E paper Tables 8-9: Base 4, Large 6, XL 8).
GENERATOR_LAYERS = {"base": 4, "large": 6, "xl": 8}


def generator_config(disc: ModelConfig, num_layers: int, hidden_size: int | None = None,
                     num_heads: int | None = None, mlp_dim: int | None = None,
                     position_type: str | None = None, owner: str = "xlme") -> ModelConfig:
    """The generator's `ModelConfig`: the discriminator's, with the given depth and width.

    Defaults keep the discriminator's width, head size and FFN ratio. A generator deeper or
    wider than the discriminator is an error naming the setting (the generator is meant to be
    the smaller model; a stronger one makes the detection task unlearnable, ELECTRA §3.2).
    """
    def bad(field: str, value: Any, why: str) -> ValueError:
        return ValueError(f"{owner}: generator_{field}={value!r} {why}")

    if not isinstance(num_layers, int) or num_layers < 1:
        raise bad("layers", num_layers, "must be a positive integer")
    if num_layers > disc.num_layers:
        raise bad("layers", num_layers,
                  f"is deeper than the discriminator ({disc.num_layers} layers)")
    hidden = hidden_size or disc.hidden_size
    if hidden > disc.hidden_size:
        raise bad("hidden_size", hidden,
                  f"is wider than the discriminator (hidden_size={disc.hidden_size})")
    heads = num_heads or max(1, disc.num_heads * hidden // disc.hidden_size)
    mlp = mlp_dim or disc.mlp_dim * hidden // disc.hidden_size
    ptype = position_type or disc.position_type
    if ptype not in POSITION_TYPES:
        raise bad("position_type", ptype, f"must be one of {', '.join(POSITION_TYPES)}")
    return disc.replace(num_layers=num_layers, hidden_size=hidden, num_heads=heads, mlp_dim=mlp,
                        position_type=ptype, cross_attention=False)


@flax.struct.dataclass
class RTDForward:
    """Everything one XLM-E forward computes, for the loss and for tests.

    gen_logits [B, P, V'] at the masked positions; sampled [B, P] the generator's samples;
    disc_ids [B, T] what the discriminator reads; labels [B, T] 1 = replaced; rtd_logits
    [B, T]; valid [B, T] non-pad tokens; mlm_sum, mlm_correct, rtd_sum: summed terms.
    """

    gen_logits: jax.Array
    sampled: jax.Array
    disc_ids: jax.Array
    labels: jax.Array
    rtd_logits: jax.Array
    valid: jax.Array
    mlm_sum: jax.Array
    mlm_correct: jax.Array
    rtd_sum: jax.Array


def replaced_ids(original: jax.Array, positions: jax.Array, sampled: jax.Array,
                 weights: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(ids the discriminator reads, replaced labels): `original` with `sampled` written at the
    real prediction slots (`weights` > 0); a position is replaced iff its id changed, so a
    sample equal to the original is labelled original."""
    rows = jnp.arange(original.shape[0])[:, None]
    keep = jnp.take_along_axis(original, positions, axis=1)
    new = jnp.where(weights > 0, sampled.astype(original.dtype), keep)
    ids = original.at[rows, positions].set(new)
    return ids, (ids != original).astype(jnp.float32)


def sigmoid_bce(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """Elementwise binary cross-entropy of sigmoid(logits) against 0/1 labels (stable form)."""
    return jax.nn.softplus(logits) - labels * logits


class ReplacedTokenDetection(Objective):
    """XLM-E MRTD (`kind="mono"`) or TRTD (`kind="pair"`); see the module docstring."""

    def __init__(self, model: Transformer, name: str = "mrtd", kind: str = "mono",
                 generator_layers: int = 4, generator_hidden_size: int | None = None,
                 generator_num_heads: int | None = None, generator_mlp_dim: int | None = None,
                 generator_position_type: str | None = None, rtd_weight: float = 50.0,
                 mask_prob: float = 0.15, max_predictions: int = 20,
                 temperature: float = 1.0, generator_module: str = "generator",
                 rtd_module: str = "rtd_head", use_lang_ids: bool | None = None,
                 restart_positions: bool = False, embedding_sharing: str = "tokens",
                 sampler: str = "gumbel"):
        owner = f"ReplacedTokenDetection(name={name!r})"
        self.model, self.name = model, name
        self.kind = check_kind(owner, kind, ("mono", "pair"))
        # TRTD: the second sentence's positions count from 0 (XLM §3.3); off = running on
        self.restart_positions = check_restart(owner, self.kind, restart_positions)
        disc = model.config
        self.gen_config = generator_config(disc, generator_layers, generator_hidden_size,
                                           generator_num_heads, generator_mlp_dim,
                                           generator_position_type, owner)
        if not (isinstance(rtd_weight, (int, float)) and rtd_weight >= 0):
            raise ValueError(f"{owner}: rtd_weight={rtd_weight!r} (lambda) must be >= 0")
        if not temperature > 0:
            raise ValueError(f"{owner}: temperature={temperature!r} must be > 0")
        self.rtd_weight, self.temperature = float(rtd_weight), float(temperature)
        # how replacements are drawn (objectives/vocab_sampling.py)
        self.sampler = vocab_sampling.check_sampler(sampler, owner)
        self.term_weights = {"mlm": 1.0, "rtd": self.rtd_weight}  # paper §4.1: lambda = 50
        # uniform selection, every selected token -> <mask> (paper §2); rate: our choice
        self.masking = MaskingConfig(mask_prob=mask_prob, max_predictions=max_predictions,
                                     mask_token_prob=1.0, random_token_prob=0.0,
                                     mask_id=disc.vocab_size - 1, vocab_size=disc.vocab_size)
        self.generator_module, self.rtd_module = generator_module, rtd_module
        self.shared_modules = (generator_module, rtd_module)
        self.embedding_sharing = self._check_sharing(owner, embedding_sharing)
        self.encoder_params_used = ((EMBEDDINGS,) if self.embedding_sharing == "all"
                                    else (WORD_EMBEDDINGS,))
        self.use_lang_ids = disc.num_languages > 0 if use_lang_ids is None else use_lang_ids
        self.generator = Transformer(self.gen_config)
        self.rtd_head = heads_lib.RTDHead(disc)

    def _check_sharing(self, owner: str, mode: str) -> str:
        """`mode` if the generator can share that much of the embedding block, else a
        ValueError naming the setting."""
        if mode not in EMBEDDING_SHARING:
            raise ValueError(f"{owner}: embedding_sharing={mode!r} must be one of "
                             f"{', '.join(EMBEDDING_SHARING)}")
        disc, gen = self.model.config, self.gen_config
        if mode == "all" and gen.hidden_size != disc.hidden_size:
            raise ValueError(
                f"{owner}: embedding_sharing='all' needs the generator at the discriminator's "
                f"width, but generator_hidden_size={gen.hidden_size} and hidden_size="
                f"{disc.hidden_size}; use embedding_sharing='tokens' for a narrower generator")
        absolute = ("absolute", "both")
        if mode == "all" and (gen.position_type in absolute) != (disc.position_type in absolute):
            raise ValueError(
                f"{owner}: embedding_sharing='all' shares the position table, but "
                f"generator_position_type={gen.position_type!r} and the discriminator's "
                f"position_type={disc.position_type!r} differ in having one")
        return mode

    # -- declarations ---------------------------------------------------------------------

    def modules(self) -> dict[str, nn.Module]:
        return {self.generator_module: self.generator, self.rtd_module: self.rtd_head}

    def logical_axis_rules(self) -> tuple[tuple[str, Any], ...]:
        return GENERATOR_AXIS_RULES if self._narrow else ()

    @property
    def _narrow(self) -> bool:
        return self.gen_config.hidden_size != self.model.config.hidden_size

    def init_modules(self, rng: jax.Array) -> dict[str, Any]:
        """The generator's parameters without a word-embedding table (or, sharing "all", any
        embedding parameter) of its own: it reads the discriminator's; plus the projection
        when it is narrower; the RTD head's."""
        g_rng, p_rng, h_rng = jax.random.split(rng, 3)
        cfg = self.gen_config
        ids = jnp.ones((1, 8), jnp.int32)
        kw = {"lang_ids": jnp.zeros((1, 8), jnp.int32)} if cfg.num_languages else {}
        gen = dict(self.generator.init(g_rng, ids, **kw)["params"])
        if self.embedding_sharing == "all":
            del gen["embeddings"]
        else:
            gen["embeddings"] = {k: v for k, v in gen["embeddings"].items()
                                 if k != "word_embeddings"}
        if self._narrow:
            init = normal_init(cfg, ("embed", "embed_gen"))
            gen[PROJECTION] = init(p_rng, (self.model.config.hidden_size, cfg.hidden_size),
                                   cfg.params_dtype)
        head = self.rtd_head.init(h_rng, jnp.zeros((1, 1, self.model.config.hidden_size),
                                                   self.model.config.compute_dtype))["params"]
        return {self.generator_module: gen, self.rtd_module: head}

    # -- the computation ------------------------------------------------------------------

    def prepare(self, batch: Batch, rng: jax.Array) -> Batch:
        """Masks the global batch and draws one sampling key per row."""
        mask_rng, sample_rng = jax.random.split(rng)
        batch = with_restarted_positions(batch, self.restart_positions)
        ids = batch["input_ids"]
        m = mask_tokens(mask_rng, ids, None, self.masking)
        return {**batch, "original_ids": ids, "input_ids": m.input_ids,
                "target_positions": m.target_positions, "target_ids": m.target_ids,
                "target_weights": m.target_weights,
                "sample_keys": jax.random.split(sample_rng, ids.shape[0])}

    def _tokens(self, prepared: Batch) -> jax.Array:
        """[B, T] 1 at the non-pad tokens, the discriminator's units."""
        return (prepared["original_ids"] != self.model.config.pad_id).astype(jnp.float32)

    def counts(self, prepared: Batch) -> dict[str, jax.Array]:
        """"mlm": the masked predictions; "rtd": the non-pad tokens."""
        return {"mlm": jnp.sum(prepared["target_weights"]),
                "rtd": jnp.sum(self._tokens(prepared))}

    def _generator_params(self, params: Mapping[str, Any]) -> dict[str, Any]:
        own = dict(self.module_params(params, self.generator_module))
        if self.embedding_sharing == "all":
            return {**own, "embeddings": self.encoder_param(params, EMBEDDINGS)}
        table = self.encoder_param(params, WORD_EMBEDDINGS)
        if PROJECTION in own:
            table = jnp.asarray(table, jnp.float32) @ jnp.asarray(own.pop(PROJECTION),
                                                                  jnp.float32)
        own["embeddings"] = {**own["embeddings"], "word_embeddings": {"embedding": table}}
        return own

    def forward(self, params: Mapping[str, Any], prepared: Batch, rng: jax.Array,
                deterministic: bool = False) -> RTDForward:
        """Generator MLM at the masked positions, sampling, discriminator RTD on every token."""
        kwargs = encoder_kwargs(prepared, self.use_lang_ids)
        gen_rng, disc_rng = jax.random.split(rng)
        positions, targets = prepared["target_positions"], prepared["target_ids"]
        weights = prepared["target_weights"]

        def generate(mdl: Transformer) -> jax.Array:
            h = mdl.encode(prepared["input_ids"], deterministic=deterministic, **kwargs)
            return mdl.mlm_logits(h.last_hidden_state, positions)

        gen_logits = self.generator.apply({"params": self._generator_params(params)},
                                          rngs={"dropout": gen_rng}, method=generate)
        mlm_sum, mlm_correct = masked_lm_sums(gen_logits, targets, weights)
        # Replacements are regular tokens: a sampled <pad> would turn the position into padding
        # for the discriminator (the encoder derives padding from the ids), and <s>, </s>,
        # <unk>, <mask> never stand for a word (our choice; the paper does not say).
        logits = regular_token_logits(jax.lax.stop_gradient(gen_logits) / self.temperature,
                                      self.masking)
        sampled = jax.vmap(lambda k, lg: vocab_sampling.categorical(k, lg, self.sampler))(
            prepared["sample_keys"], logits)
        original = prepared["original_ids"]
        disc_ids, labels = replaced_ids(original, positions, sampled, weights)
        hidden = self.model.apply({"params": self.encoder_params(params)}, disc_ids,
                                  deterministic=deterministic, rngs={"dropout": disc_rng},
                                  method=Transformer.encode, **kwargs).last_hidden_state
        rtd_logits = self.rtd_head.apply({"params": self.module_params(params, self.rtd_module)},
                                         hidden)
        valid = self._tokens(prepared)
        rtd_sum = jnp.sum(sigmoid_bce(rtd_logits, labels) * valid)
        return RTDForward(gen_logits=gen_logits, sampled=sampled, disc_ids=disc_ids,
                          labels=labels, rtd_logits=rtd_logits, valid=valid, mlm_sum=mlm_sum,
                          mlm_correct=mlm_correct, rtd_sum=rtd_sum)

    def loss(self, params: Any, prepared: Batch, rng: jax.Array, state: Any,
             deterministic: bool = False) -> LossOutput:
        f = self.forward(params, prepared, rng, deterministic)
        predicted = (f.rtd_logits > 0).astype(jnp.float32) * f.valid
        labels = f.labels * f.valid
        masked, tokens = jnp.sum(prepared["target_weights"]), jnp.sum(f.valid)
        true_pos = jnp.sum(predicted * labels)
        metrics = {
            "mlm_accuracy": Metric(f.mlm_correct, masked),
            # replaced among the masked predictions (the rest were sampled back as original)
            "replaced_fraction": Metric(jnp.sum(labels), masked),
            "rtd_accuracy": Metric(jnp.sum((predicted == labels) * f.valid), tokens),
            "rtd_precision": Metric(true_pos, jnp.sum(predicted)),
            "rtd_recall": Metric(true_pos, jnp.sum(labels))}
        return LossOutput(losses={"mlm": f.mlm_sum, "rtd": f.rtd_sum}, metrics=metrics)

    def flops_per_example(self, seq_len: int) -> float:
        """Generator (MLM at the prediction slots) and discriminator (every token, RTD head),
        both differentiated. A narrower generator's table projection (V x d x d_gen per step,
        independent of the batch) is not counted."""
        d = self.model.config.hidden_size
        slots = self.masking.max_predictions
        gen = seq_len * flops.encoder_flops(self.gen_config, seq_len) + slots * flops.head_flops(
            self.gen_config)
        disc = seq_len * (flops.encoder_flops(self.model.config, seq_len) + 2 * (d * d + d))
        return 3.0 * (gen + disc)

    def health_checks(self) -> tuple[HealthCheck, ...]:
        """The discriminator collapsed (precision or recall ~0, or accuracy within a hair of
        the majority rate, answering 'original' everywhere), the generator's masked LM at the
        floor, and the generator's loss rising. The rise watched is `mlm_loss`, not `loss`:
        the detection loss may rise while the generator improves (its samples get harder to
        tell), so the total's rise says nothing by itself."""

        def majority_rate(m: Mapping[str, float]) -> float | None:
            """1 - s, the accuracy of answering 'original' everywhere, with s the replaced
            share of the tokens: accuracy a = 1 - s (1 + r/p - 2r) at precision p and recall
            r. Without a true positive (p = 0) this is a (1 - s counts the false positives
            too), a bound below the rate, which the accuracy cannot beat either."""
            a, p, r = m["rtd_accuracy"], m["rtd_precision"], m["rtd_recall"]
            denom = 1.0 + (r / p if p > 0 else 0.0) - 2.0 * r
            return 1.0 - (1.0 - a) / denom if denom > 0 else None

        knob = "a larger rtd_weight (lambda) or a smaller generator (generator_layers)"
        collapsed = "(it answers 'original' everywhere: collapsed)"
        return (
            HealthCheck("rtd_precision", "near_zero", knob=knob,
                        meaning=f"the discriminator's 'replaced' answers are all wrong "
                                f"{collapsed}"),
            HealthCheck("rtd_recall", "near_zero", knob=knob,
                        meaning=f"the discriminator finds no replaced token {collapsed}"),
            HealthCheck("rtd_accuracy", "near_baseline", knob=knob, baseline=majority_rate,
                        baseline_name="the majority rate 1 - replaced share",
                        meaning="the discriminator does no better than answering 'original' "
                                "everywhere"),
            *masked_lm_checks("the generator's masked LM", "mlm_accuracy"),
            loss_rising_check("mlm_loss", "the generator's loss"))
