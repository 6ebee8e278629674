"""The encoder: XLM-R embeddings, post-/pre-LN layers with optional cross-attention, the stack.

One module serves every objective:
- MMLM/TLM and XLCo (the objectives that exist) call `Transformer.encode` with the default
  padding/packing mask, as an ELECTRA discriminator will;
- a visibility pattern of its own (ERNIE-M's CAMLM and BTMLM stage 1, built by
  `xlm_jax.models.masks`) goes in as a boolean `attention_mask`;
- `encoder_states` (and `cross_mask`) run each layer's cross-attention block (VECO's layers,
  `ModelConfig.cross_attention`); without `encoder_states` the same layers run as a plain
  encoder, which is how a VECO model is to be reassembled for NLU. The ERNIE-M and VECO
  objectives themselves are not written yet.

Parameter names follow a fixed tree (`embeddings/...`, `layers_{i}/attention/query/...`) that the
HF converter and the optimiser's weight-decay/LLRD rules rely on. Every parameter carries logical
axis names; `xlm_jax.train.partitioning.standard_logical_axis_rules` maps them onto the mesh.
With `ModelConfig.scan_layers` the layers run as one `nn.scan` and their parameters are stacked
(`layers/attention/query/...` with a leading `layers` axis); `xlm_jax.models.layer_stack` holds
the scan and converts parameters between the two layouts.
"""
from __future__ import annotations

import functools
from typing import Any

import flax
import flax.linen as nn
import jax
import jax.numpy as jnp

from xlm_jax.models import attention as attention_lib
from xlm_jax.models.common import ACTIVATION, ACTIVATION_HEADS, ACTIVATION_MLP
from xlm_jax.models.common import Dropout, bias_gelu, constrain, layer_norm
from xlm_jax.models.common import normal_init as _init
from xlm_jax.models.common import zeros_init as _zeros
from xlm_jax.models import heads as heads_lib
from xlm_jax.models import layer_stack
from xlm_jax.models import masks as masks_lib
from xlm_jax.models.token_mask import TokenMask
from xlm_jax.models import position as position_lib
from xlm_jax.models.config import ModelConfig

Array = jax.Array


@flax.struct.dataclass
class EncoderOutput:
    """What `Transformer.encode` returns.

    last_hidden_state: [B, T, D] output of the last layer (after the final LN for pre-LN).
    hidden_states: tuple of num_layers + 1 arrays [B, T, D] (index 0 = embeddings output) when
      requested, else None.
    """

    last_hidden_state: Array
    hidden_states: tuple[Array, ...] | None = None


def fairseq_position_ids(positions: Array, valid: Array, pad_id: int) -> Array:
    """0-based positions -> rows of the fairseq table: real tokens start at pad_id + 1."""
    return jnp.where(valid, positions + pad_id + 1, pad_id)


def default_positions(valid: Array) -> Array:
    """0-based positions of the real tokens (HF: cumsum(ids != pad) - 1), 0 at padding."""
    return jnp.where(valid, jnp.cumsum(valid.astype(jnp.int32), axis=-1) - 1, 0)


@jax.custom_vjp
def take_rows(table: Array, ids: Array) -> Array:
    """`jnp.take(table, ids, axis=0)` whose table gradient is summed in float32.

    The gradient of a lookup is a scatter-add of the [..., D] cotangent into a zeroed table.
    In bf16 (the compute dtype of the accelerator run files) XLA:GPU adds with bf16 atomics,
    which serialise on the rows many tokens share (padding, punctuation): on an H100 the
    base step's 250k-row scatter took 28 ms of a 135 ms step (jax 0.11.2, read from its
    trace). Summed in float32 the atomics are native, and the sum of many bf16 cotangents is
    rounded once instead of at every add; the forward is unchanged.
    """
    return jnp.take(table, ids, axis=0)


def _take_rows_fwd(table: Array, ids: Array) -> tuple[Array, tuple[Array, Array]]:
    # The table itself is not kept: a zero-size array of its dtype and shape stands for it.
    return jnp.take(table, ids, axis=0), (ids, jnp.zeros((0,) + table.shape, table.dtype))


def _take_rows_bwd(res: tuple[Array, Array], g: Array) -> tuple[Array, None]:
    ids, like = res
    rows, dim = like.shape[1:]
    acc = jnp.zeros((rows, dim), jnp.promote_types(like.dtype, jnp.float32))
    grad = acc.at[ids.reshape(-1)].add(g.reshape(-1, dim).astype(acc.dtype))
    return grad.astype(like.dtype), None


take_rows.defvjp(_take_rows_fwd, _take_rows_bwd)


class Embeddings(nn.Module):
    """Word + fairseq-offset position + token-type (+ language) embeddings, then LN, dropout."""

    config: ModelConfig

    def setup(self) -> None:
        cfg = self.config
        embed = functools.partial(nn.Embed, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype)
        self.word_embeddings = embed(cfg.padded_vocab_size, cfg.hidden_size,
                                     embedding_init=_init(cfg, ("vocab", "embed")))
        if cfg.position_type in ("absolute", "both"):
            self.position_embeddings = embed(cfg.max_positions, cfg.hidden_size,
                                             embedding_init=_init(cfg, ("abspos", "embed")))
        self.token_type_embeddings = embed(cfg.type_vocab_size, cfg.hidden_size,
                                           embedding_init=_init(cfg, ("token_type", "embed")))
        if cfg.num_languages:
            init = (_zeros(("languages", "embed")) if cfg.language_init == "zeros"
                    else _init(cfg, ("languages", "embed")))
            self.lang_embeddings = embed(cfg.num_languages, cfg.hidden_size, embedding_init=init)
        self.LayerNorm = layer_norm(cfg, "LayerNorm")
        self.dropout = Dropout(cfg.dropout_rate)

    def _lookup(self, table: nn.Embed, rows: str, ids: Array) -> Array:
        """`table(ids)` (what `nn.Embed.__call__` computes) with the table's `embed` shards
        gathered first and the result in the activation layout.

        With `embed` on fsdp, XLA otherwise kept the lookup in the table's layout, and the
        gradient, a scatter-add of the [B, T, D] cotangent into the table, could only be
        re-sharded by replicating that cotangent in full on every device ("involuntary full
        rematerialization": the global activation gradient per device). Gathering the weight
        before use and reduce-scattering its gradient is what FSDP does for every weight.
        """
        emb = constrain(jnp.asarray(table.embedding, self.config.compute_dtype), (rows, None))
        if table.num_embeddings == 1:
            out = jnp.broadcast_to(emb, ids.shape + (emb.shape[-1],))
        else:
            out = take_rows(emb, ids)
        return constrain(out, ACTIVATION)

    def __call__(self, input_ids: Array, positions: Array, valid: Array,
                 token_type_ids: Array | None, lang_ids: Array | None,
                 deterministic: bool, row_ids: Array | None = None) -> Array:
        cfg = self.config
        x = self._lookup(self.word_embeddings, "vocab", input_ids)
        if cfg.position_type in ("absolute", "both"):
            x = x + self._lookup(self.position_embeddings, "abspos",
                                 fairseq_position_ids(positions, valid, cfg.pad_id))
        if token_type_ids is None:
            token_type_ids = jnp.zeros_like(input_ids)
        x = x + self._lookup(self.token_type_embeddings, "token_type", token_type_ids)
        if cfg.num_languages:
            if lang_ids is None:
                raise ValueError("this model has language embeddings (num_languages="
                                 f"{cfg.num_languages}) but no lang_ids were given")
            x = x + self._lookup(self.lang_embeddings, "languages", lang_ids)
        x = self.LayerNorm(x)
        x = self.dropout(x, deterministic=deterministic, row_ids=row_ids)
        return constrain(x, ACTIVATION)


class Projection(nn.Module):
    """`x[..., *in] @ kernel[*in, *features] + bias[*features]` over the last `contract` axes.

    What flax's `DenseGeneral` computes, with the same parameter names, shapes and initial
    values, but the kernel is created in its final shape: `DenseGeneral` creates it flat and
    reshapes it, which applies the kernel's logical sharding constraint to the flat array and
    fails (rank mismatch) whenever a mesh is set with `jax.set_mesh`, as the trainer does so
    that activation constraints take effect.
    """

    config: ModelConfig
    features: tuple[int, ...]
    kernel_names: tuple[str, ...]
    bias_names: tuple[str, ...]
    contract: int = 1
    gelu: bool = False  # return `bias_gelu(x @ kernel, bias)`: exact GELU of the projection

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        kernel = self.param("kernel", _init(cfg, self.kernel_names),
                            x.shape[x.ndim - self.contract:] + tuple(self.features),
                            cfg.params_dtype)
        bias = self.param("bias", _zeros(self.bias_names), tuple(self.features), cfg.params_dtype)
        x, kernel, bias = nn.dtypes.promote_dtype(x, kernel, bias, dtype=cfg.compute_dtype)
        dims = ((tuple(range(x.ndim - self.contract, x.ndim)), tuple(range(self.contract))),
                ((), ()))
        y = jax.lax.dot_general(x, kernel, dims)
        return bias_gelu(y, bias) if self.gelu else y + bias


class MultiHeadAttention(nn.Module):
    """Self- or cross-attention: q/k/v projections, optional gated relative bias, output proj."""

    config: ModelConfig
    gated_bias: bool = False  # XLM-E gated relative position bias on this block

    @nn.compact
    def __call__(self, x: Array, kv_input: Array, mask: Array | None,
                 relative_table: "Array | position_lib.RelativeBias | None", deterministic: bool,
                 cache: "LayerCache | None" = None,
                 cache_index: Array | None = None,
                 row_ids: Array | None = None) -> Array | tuple[Array, "LayerCache"]:
        """With `cache` (incremental decoding), `x` holds the new position(s): their keys and
        values are written into the cache at `cache_index`, attention reads the whole cache
        (`mask` hides the positions not written yet), and the updated cache is returned too.
        `row_ids`: per-row dropout masks (`common.keep_mask`)."""
        cfg = self.config
        proj = functools.partial(
            Projection, cfg, (cfg.num_heads, cfg.head_dim), ("embed", "heads", "kv"),
            ("heads", "kv"))
        q = proj(name="query")(x)
        k = proj(name="key")(kv_input)
        v = proj(name="value")(kv_input)
        q, k, v = (constrain(t, ACTIVATION_HEADS) for t in (q, k, v))
        if cache is not None:
            at = (0, cache_index, 0, 0)
            cache = LayerCache(key=jax.lax.dynamic_update_slice(cache.key, k.astype(
                                   cache.key.dtype), at),
                               value=jax.lax.dynamic_update_slice(cache.value, v.astype(
                                   cache.value.dtype), at))
            k, v = cache.key.astype(k.dtype), cache.value.astype(v.dtype)
        bias = relative = None
        if self.gated_bias:
            if relative_table is None:
                raise ValueError("gated relative bias needs the bucket table values")
            # `relative_table` is the raw bias d [B, H, Tq, Tk], or (for the "pallas" backend,
            # which computes the bias in its kernel) a `position.RelativeBias` describing it;
            # the gate returns the same kind, and every backend accepts either.
            gated = position_lib.GatedRelativeBias(
                num_heads=cfg.num_heads, head_dim=cfg.head_dim, name="gated_bias")(q, relative_table)
            if isinstance(gated, position_lib.RelativeBias):
                relative = gated
            else:
                bias = gated
        dropout_rng = None
        if not deterministic and cfg.attention_dropout_rate > 0:
            dropout_rng = self.make_rng("dropout")
        out = attention_lib.dot_product_attention(
            q, k, v, bias=bias, relative=relative, mask=mask, backend=cfg.attention_backend,
            launch=cfg.attention_launch,
            dropout_rate=cfg.attention_dropout_rate, dropout_rng=dropout_rng,
            dropout_row_ids=row_ids, deterministic=deterministic,
            layer="/".join(self.scope.path) if self.scope is not None else self.name)
        out = Projection(cfg, (cfg.hidden_size,), ("heads", "kv", "embed"), ("embed",),
                         contract=2, name="out")(out)
        out = constrain(out, ACTIVATION)
        return out if cache is None else (out, cache)


class MlpBlock(nn.Module):
    """Position-wise FFN: dense -> exact GELU -> dense."""

    config: ModelConfig

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        # The first projection is `nn.Dense`'s computation and parameters (names, shapes,
        # initial values), with the bias and GELU under one gradient (`common.bias_gelu`).
        h = Projection(cfg, (cfg.mlp_dim,), ("embed", "mlp"), ("mlp",), gelu=True,
                       name="intermediate")(x)
        h = constrain(h, ACTIVATION_MLP)
        return nn.Dense(cfg.hidden_size, dtype=cfg.compute_dtype, param_dtype=cfg.params_dtype,
                        kernel_init=_init(cfg, ("mlp", "embed")),
                        bias_init=_zeros(("embed",)), name="output")(h)


class EncoderLayer(nn.Module):
    """Self-attention, optional cross-attention (VECO), FFN; post-LN (XLM-R) or pre-LN."""

    config: ModelConfig

    def _sublayer(self, x: Array, fn: Any, norm: nn.Module, drop: Dropout,
                  deterministic: bool, row_ids: Array | None) -> Array:
        if self.config.ln_style == "pre":
            return x + drop(fn(norm(x)), deterministic=deterministic, row_ids=row_ids)
        return norm(x + drop(fn(x), deterministic=deterministic, row_ids=row_ids))

    @nn.compact
    def __call__(self, x: Array, mask: Array | None, relative_table: Array | None,
                 deterministic: bool, encoder_states: Array | None = None,
                 cross_mask: Array | None = None, cache: "LayerCache | None" = None,
                 cache_index: Array | None = None, row_ids: Array | None = None
                 ) -> Array | tuple[Array, "LayerCache"]:
        cfg = self.config
        # Named as flax names an `nn.Dropout` here, so the dropout keys (and bits) are unchanged.
        drop = Dropout(cfg.dropout_rate, name="Dropout_0")
        gated = cfg.position_type in ("relative", "both")
        attn = MultiHeadAttention(cfg, gated_bias=gated, name="attention")
        new_cache = []

        def self_attention(h: Array) -> Array:
            if cache is None:
                return attn(h, h, mask, relative_table, deterministic, row_ids=row_ids)
            out, updated = attn(h, h, mask, relative_table, deterministic, cache, cache_index)
            new_cache.append(updated)
            return out

        x = self._sublayer(x, self_attention, layer_norm(cfg, "attention_norm"), drop,
                           deterministic, row_ids)
        if cfg.cross_attention:
            cross = MultiHeadAttention(cfg, name="cross_attention")
            cross_norm = layer_norm(cfg, "cross_attention_norm")
            if encoder_states is not None:
                x = self._sublayer(
                    x, lambda h: cross(h, encoder_states, cross_mask, None, deterministic,
                                       row_ids=row_ids),
                    cross_norm, drop, deterministic, row_ids)
            elif self.is_initializing():
                # Create the cross-attention parameters even when initialising encoder-only.
                cross(x, x, None, None, True)
                cross_norm(x)
        elif encoder_states is not None:
            raise ValueError("encoder_states given but the config has cross_attention=False")
        mlp = MlpBlock(cfg, name="mlp")
        x = self._sublayer(x, mlp, layer_norm(cfg, "mlp_norm"), drop, deterministic, row_ids)
        return x if cache is None else (x, new_cache[0])


def _layer_class(remat: str) -> Any:
    """EncoderLayer, or it under `jax.checkpoint` with the policy `remat` names
    (`config.REMAT_POLICIES`); the parameters keep their names and values, so checkpoints
    load either way. `deterministic` (argument 4, counting self) is static."""
    if remat == "none":
        return EncoderLayer
    policy = None if remat == "full" else getattr(jax.checkpoint_policies, remat)
    return nn.remat(EncoderLayer, policy=policy, static_argnums=(4,))


@flax.struct.dataclass
class LayerCache:
    """One layer's self-attention keys and values for incremental decoding, [N, L, H, dh]."""

    key: Array
    value: Array


class Transformer(nn.Module):
    """XLM-R-compatible encoder with a tied MLM head evaluated only at given positions.

    `encode` returns an `EncoderOutput`; `mlm_logits(hidden, positions)` computes the vocabulary
    logits at `positions` [B, P] only, so training never builds a [B, T, V] tensor.
    """

    config: ModelConfig
    with_mlm_head: bool = True

    def setup(self) -> None:
        cfg = self.config
        self.embeddings = Embeddings(cfg)
        if cfg.position_type in ("relative", "both"):
            table = functools.partial(
                position_lib.RelativePositionTable, num_heads=cfg.num_heads,
                num_buckets=cfg.relative_buckets, max_distance=cfg.relative_max_distance,
                table_init=cfg.relative_init)
            if cfg.share_relative_table:
                self.rel_pos = table()
            else:
                self.rel_pos_layers = [table(name=f"rel_pos_{i}") for i in range(cfg.num_layers)]
        if cfg.scan_layers:  # one layer, applied num_layers times by `layer_stack.run_stack`
            self.layers = _layer_class(cfg.remat)(cfg)  # named "layers" (the attribute)
        else:
            self.layers = [_layer_class(cfg.remat)(cfg, name=f"layers_{i}")
                           for i in range(cfg.num_layers)]
        if cfg.ln_style == "pre":
            self.final_norm = layer_norm(cfg, "final_norm")
        if self.with_mlm_head:
            self.mlm_head = heads_lib.MLMHead(cfg)

    def __call__(self, input_ids: Array, **kwargs: Any) -> EncoderOutput:
        out = self.encode(input_ids, **kwargs)
        if self.with_mlm_head and self.is_initializing():
            self.mlm_logits(out.last_hidden_state, jnp.zeros(input_ids.shape[:1] + (1,), jnp.int32))
        return out

    def encode(self, input_ids: Array, *, positions: Array | None = None,
               attention_mask: Array | None = None, segment_ids: Array | None = None,
               token_type_ids: Array | None = None, lang_ids: Array | None = None,
               encoder_states: Array | None = None, cross_mask: Array | None = None,
               deterministic: bool = True, return_hidden_states: bool = False,
               row_ids: Array | None = None) -> EncoderOutput:
        """Runs the stack.

        Args:
          input_ids: [B, T] fairseq ids (pad = config.pad_id).
          positions: [B, T] 0-based positions (restarting per packed example); default: counted
            over the non-pad tokens as XLM-R does.
          attention_mask: bool [B, 1|H, T, T] visibility (True = may attend); default: padding,
            or packing segments when `segment_ids` is given.
          segment_ids: [B, T] packing ids (0 = padding).
          token_type_ids, lang_ids: [B, T] optional extra embeddings.
          encoder_states, cross_mask: VECO cross-attention memory [B, S, D] and bool [B,1,T,S].
          deterministic: disables dropout.
          return_hidden_states: also return every layer's output.
          row_ids: [B] ints; when given, every dropout mask of row b is drawn from a key folded
            with row_ids[b] (`common.keep_mask`), so a row's masks do not depend on the rest of
            its batch. The train step passes each row's index in the step's global batch
            (`objectives.base.ROW_IDS`): gradient accumulation then equals the whole batch
            with dropout on.
        """
        cfg = self.config
        seq_len = input_ids.shape[-1]
        if cfg.max_sequence_length is not None and seq_len > cfg.max_sequence_length:
            raise ValueError(
                f"sequence length {seq_len} exceeds the position table: max_positions="
                f"{cfg.max_positions} admits at most {cfg.max_sequence_length} tokens")
        valid = segment_ids > 0 if segment_ids is not None else input_ids != cfg.pad_id
        if positions is None:
            positions = default_positions(valid)
        if attention_mask is None and cfg.attention_backend != "xla":
            # described per token: fused kernels evaluate it per tile (no [B, 1, T, T] array)
            attention_mask = (TokenMask.segments(segment_ids) if segment_ids is not None
                              else TokenMask.padding(valid))
        elif attention_mask is None:
            attention_mask = (masks_lib.segment_mask(segment_ids) if segment_ids is not None
                              else masks_lib.padding_mask(valid))
        x = self.embeddings(input_ids, positions, valid, token_type_ids, lang_ids, deterministic,
                            row_ids)
        tables = self._relative_tables(positions, positions)
        hidden = [x]
        if cfg.scan_layers:
            x, outputs = layer_stack.run_stack(
                self.layers, x, num_layers=cfg.num_layers, mask=attention_mask,
                **self._stack_tables(tables), deterministic=deterministic,
                encoder_states=encoder_states, cross_mask=cross_mask, row_ids=row_ids,
                keep_outputs=return_hidden_states)
            hidden += list(outputs) if return_hidden_states else [x]
        else:
            for i, layer in enumerate(self.layers):
                x = layer(x, attention_mask, tables[i], deterministic, encoder_states,
                          cross_mask, row_ids=row_ids)
                hidden.append(x)
        if cfg.ln_style == "pre":
            x = self.final_norm(x)
            hidden[-1] = x
        return EncoderOutput(last_hidden_state=x,
                             hidden_states=tuple(hidden) if return_hidden_states else None)

    def _relative_tables(self, positions_q: Array, positions_k: Array) -> list[Array | None]:
        """Each layer's raw relative bias [B, H, Tq, Tk] (the shared table computed once), or
        None per layer for a model without relative positions. With the "pallas" attention
        backend each is a `position.RelativeBias` (table values + positions) instead, which
        the kernel computes block by block rather than materialising."""
        cfg = self.config
        if cfg.position_type not in ("relative", "both"):
            return [None] * cfg.num_layers
        # the "pallas" backend computes the bias in its kernel from a description of it
        describe = cfg.attention_backend in ("pallas", "auto")
        if cfg.share_relative_table:
            return [self.rel_pos(positions_q, positions_k, describe)] * cfg.num_layers
        return [table(positions_q, positions_k, describe) for table in self.rel_pos_layers]

    def _stack_tables(self, tables: list[Any]) -> dict[str, Any]:
        """`_relative_tables` as the scan takes them: the shared table broadcast to every
        layer, per-layer tables stacked (every array leaf gains a leading layer axis, e.g.
        [N, B, H, Tq, Tk]) as a scanned input."""
        per_layer = tables[0] is not None and not self.config.share_relative_table
        if per_layer:
            return {"tables": jax.tree_util.tree_map(lambda *t: jnp.stack(t), *tables),
                    "tables_per_layer": True}
        return {"tables": tables[0], "tables_per_layer": False}

    @staticmethod
    def init_cache(config: ModelConfig, rows: int, max_length: int) -> tuple[LayerCache, ...]:
        """An empty decoding cache: one `LayerCache` of zeros per layer."""
        shape = (rows, max_length, config.num_heads, config.head_dim)
        return tuple(LayerCache(key=jnp.zeros(shape, config.compute_dtype),
                                value=jnp.zeros(shape, config.compute_dtype))
                     for _ in range(config.num_layers))

    def decode_step(self, input_ids: Array, step: Array, cache: tuple[LayerCache, ...], *,
                    encoder_states: Array | None = None, cross_mask: Array | None = None,
                    lang_ids: Array | None = None
                    ) -> tuple[Array, tuple[LayerCache, ...]]:
        """One position of causal decoding with a cache: `input_ids` [N, 1] is the token at
        position `step` (a scalar); it attends to the cached positions 0..step and, with
        `encoder_states` [N, S, D] and `cross_mask` [N, 1, 1, S], to the encoder's output.
        Returns its last hidden state [N, 1, D] and the updated cache: the same computation as
        `encode` over the whole prefix with a causal mask, one token's cost per step."""
        cfg = self.config
        rows, length = cache[0].key.shape[:2]
        positions = jnp.full((rows, 1), step, jnp.int32)
        valid = jnp.ones((rows, 1), bool)
        x = self.embeddings(input_ids, positions, valid, None, lang_ids, True)
        mask = (jnp.arange(length) <= step)[None, None, None, :]
        mask = jnp.broadcast_to(mask, (rows, 1, 1, length))
        keys = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32)[None], (rows, length))
        tables = self._relative_tables(positions, keys)
        new_cache = []
        if cfg.scan_layers:
            # The per-layer caches go in stacked and come out split again, so the cache keeps
            # the loop's layout (a tuple of [N, L, H, dh] arrays, what `decoding` reorders by
            # row); this costs one copy of the cache per step.
            stacked = jax.tree_util.tree_map(lambda *c: jnp.stack(c), *cache)
            x, stacked = layer_stack.run_stack(
                self.layers, x, num_layers=cfg.num_layers, mask=mask,
                **self._stack_tables(tables), deterministic=True,
                encoder_states=encoder_states, cross_mask=cross_mask, cache=stacked,
                cache_index=step)
            new_cache = [jax.tree_util.tree_map(lambda c: c[i], stacked)
                         for i in range(cfg.num_layers)]
        else:
            for i, layer in enumerate(self.layers):
                x, layer_cache = layer(x, mask, tables[i], True, encoder_states, cross_mask,
                                       cache[i], step)
                new_cache.append(layer_cache)
        if cfg.ln_style == "pre":
            x = self.final_norm(x)
        return x, tuple(new_cache)

    def mlm_logits(self, hidden: Array, positions: Array) -> Array:
        """Tied-decoder MLM logits [B, P, V'] (float32) at `positions` [B, P] of `hidden`;
        V' = `config.padded_vocab_size`, the padding ids' logits are -1e9."""
        gathered = jnp.take_along_axis(hidden, positions[..., None], axis=1)
        return self.mlm_head(gathered, self.embeddings.word_embeddings)

    def full_mlm_logits(self, hidden: Array) -> Array:
        """Logits at every position [B, T, V'] — for evaluation/parity only, never in training."""
        return self.mlm_head(hidden, self.embeddings.word_embeddings)
