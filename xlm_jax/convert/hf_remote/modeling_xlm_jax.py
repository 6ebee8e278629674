"""PyTorch version of an xlm_jax encoder, for `transformers` (remote code).

`python -m xlm_jax.convert export-hf` copies this file, unchanged, into every exported
directory whose model is not XLM-R-shaped; `config.json`'s `auto_map` points `AutoModel`
(`XlmJaxModel`) and `AutoModelForMaskedLM` (`XlmJaxForMaskedLM`) here. It needs torch and
transformers only, not xlm_jax.

The computation is `xlm_jax.models.transformer.Transformer.encode` written again in torch:
- embeddings: word + absolute position (fairseq rows: real tokens from pad_token_id + 1,
  padding at pad_token_id) + token type (+ language), then LayerNorm and dropout;
- each layer: self-attention with an optional XLM-E gated relative position bias, then an FFN
  (dense, exact GELU, dense), each wrapped post-LN (`LN(x + f(x))`, XLM-R) or pre-LN
  (`x + f(LN(x))`, with a final LayerNorm after the last layer);
- the gated bias (XLM-E §3.3): a learned [buckets, heads] table read at T5's bidirectional
  log bucket of `key_pos - query_pos` gives `d`; per head h and query i the gates
  `g_u = sigmoid(q_i . u_h)`, `g_r = sigmoid(q_i . v_h)` scale it to
  `d * (1 + g_u + (1 - g_u) * w_h * g_r)`, added to the attention logits;
- positions count the real tokens of `attention_mask` (0, 1, ...); keys outside
  `attention_mask` get no attention weight, and a query row with no visible key outputs 0.

Parameter names mirror the xlm_jax parameter tree (`layers.3.attention.query.weight` is
`layers_3/attention/query/kernel`), so the exporter and `import-hf` map them one to one.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers.modeling_outputs import BaseModelOutput, MaskedLMOutput

from .configuration_xlm_jax import XlmJaxConfig

# The finite stand-in for -inf on masked logits that xlm_jax's attention uses.
MASK_VALUE = -1e30


def relative_position_bucket(relative_position: torch.Tensor, num_buckets: int,
                             max_distance: int) -> torch.Tensor:
    """T5's bidirectional bucket of `key_pos - query_pos`: half the buckets for keys at or
    before the query, half for keys after it; within a half, distances below num_buckets // 4
    get one bucket each, larger ones log-spaced up to `max_distance`, then the last bucket.
    Computed in float32, as xlm_jax does, so the bucket boundaries agree."""
    half = num_buckets // 2
    max_exact = half // 2
    ret = (relative_position > 0).long() * half
    n = relative_position.abs()
    n_f = n.clamp(min=1).to(torch.float32)
    large = max_exact + (torch.log(n_f / max_exact) / math.log(max_distance / max_exact)
                         * (half - max_exact)).long()
    large = large.clamp(max=half - 1)
    return ret + torch.where(n < max_exact, n, large)


class RelativePositionTable(nn.Module):
    """The learned per-bucket, per-head raw bias `d`: [B, H, Tq, Tk] from positions."""

    def __init__(self, config: XlmJaxConfig) -> None:
        super().__init__()
        self.num_buckets = config.relative_buckets
        self.max_distance = config.relative_max_distance
        self.rel_embedding = nn.Parameter(
            torch.zeros(config.relative_buckets, config.num_attention_heads))

    def forward(self, positions_q: torch.Tensor, positions_k: torch.Tensor) -> torch.Tensor:
        rel = positions_k[:, None, :] - positions_q[:, :, None]  # [B, Tq, Tk]
        buckets = relative_position_bucket(rel, self.num_buckets, self.max_distance)
        return self.rel_embedding[buckets].permute(0, 3, 1, 2)  # [B, H, Tq, Tk]


class GatedBias(nn.Module):
    """XLM-E's per-layer gate on the raw relative bias (one `u`, `v`, `w` per head)."""

    def __init__(self, config: XlmJaxConfig) -> None:
        super().__init__()
        heads = config.num_attention_heads
        head_dim = config.hidden_size // heads
        self.gate_u = nn.Parameter(torch.zeros(heads, head_dim))
        self.gate_v = nn.Parameter(torch.zeros(heads, head_dim))
        self.gate_w = nn.Parameter(torch.ones(heads))

    def forward(self, q: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
        """Gated bias [B, H, Tq, Tk] (float32) from queries [B, Tq, H, Dh] and d."""
        q = q.float()
        g_u = torch.sigmoid(torch.einsum("bqhd,hd->bhq", q, self.gate_u.float()))
        g_r = torch.sigmoid(torch.einsum("bqhd,hd->bhq", q, self.gate_v.float()))
        factor = 1.0 + g_u + (1.0 - g_u) * self.gate_w.float()[None, :, None] * g_r
        return d.float() * factor[..., None]


class Embeddings(nn.Module):
    """Word + absolute position + token type (+ language) embeddings, LayerNorm, dropout."""

    def __init__(self, config: XlmJaxConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.pad_id = config.pad_token_id
        self.word_embeddings = nn.Embedding(config.padded_vocab_size, d)
        self.position_embeddings = (nn.Embedding(config.max_position_embeddings, d)
                                    if config.position_type in ("absolute", "both") else None)
        self.token_type_embeddings = nn.Embedding(config.type_vocab_size, d)
        self.lang_embeddings = (nn.Embedding(config.num_languages, d)
                                if config.num_languages else None)
        self.LayerNorm = nn.LayerNorm(d, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                token_type_ids: torch.Tensor | None, lang_ids: torch.Tensor | None
                ) -> torch.Tensor:
        x = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            # fairseq rows: real tokens from pad_id + 1; tokens with the pad id at row pad_id
            rows = torch.where(input_ids != self.pad_id, positions + self.pad_id + 1,
                               torch.full_like(positions, self.pad_id))
            x = x + self.position_embeddings(rows)
        if token_type_ids is None:
            token_type_ids = torch.zeros_like(input_ids)
        x = x + self.token_type_embeddings(token_type_ids)
        if self.lang_embeddings is not None:
            if lang_ids is None:
                raise ValueError(
                    f"this model has language embeddings ({self.lang_embeddings.num_embeddings} "
                    "rows): pass lang_ids [B, T], each token's 1-based index in "
                    "config.languages (0 = padding)")
            x = x + self.lang_embeddings(lang_ids)
        return self.dropout(self.LayerNorm(x))


class Attention(nn.Module):
    """Multi-head self-attention with the optional gated relative bias."""

    def __init__(self, config: XlmJaxConfig, gated: bool) -> None:
        super().__init__()
        d = config.hidden_size
        self.heads = config.num_attention_heads
        self.head_dim = d // self.heads
        self.query, self.key, self.value = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.out = nn.Linear(d, d)
        self.gated_bias = GatedBias(config) if gated else None
        self.dropout = nn.Dropout(config.attention_probs_dropout_prob)

    def forward(self, x: torch.Tensor, visible: torch.Tensor,
                relative: torch.Tensor | None) -> torch.Tensor:
        """x [B, T, D]; visible bool [B, 1, 1, T] (keys that may be attended to); relative:
        the raw bias d [B, H, T, T] of this layer, or None."""
        b, t, _ = x.shape
        q, k, v = (proj(x).view(b, t, self.heads, self.head_dim)
                   for proj in (self.query, self.key, self.value))
        logits = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(self.head_dim)
        if self.gated_bias is not None:
            logits = logits + self.gated_bias(q, relative)
        logits = logits.masked_fill(~visible, MASK_VALUE)
        probs = torch.softmax(logits, dim=-1)
        probs = probs * visible.any(dim=-1, keepdim=True)  # rows with no visible key: 0
        probs = self.dropout(probs)
        out = torch.einsum("bhqk,bkhd->bqhd", probs.to(v.dtype), v)
        return self.out(out.reshape(b, t, self.heads * self.head_dim))


class Mlp(nn.Module):
    """Position-wise FFN: dense, exact GELU, dense."""

    def __init__(self, config: XlmJaxConfig) -> None:
        super().__init__()
        self.intermediate = nn.Linear(config.hidden_size, config.intermediate_size)
        self.output = nn.Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.output(F.gelu(self.intermediate(x)))


class Layer(nn.Module):
    """Self-attention and FFN, each post-LN (`LN(x + f(x))`) or pre-LN (`x + f(LN(x))`)."""

    def __init__(self, config: XlmJaxConfig) -> None:
        super().__init__()
        self.pre_ln = config.ln_style == "pre"
        self.attention = Attention(config, gated=config.position_type in ("relative", "both"))
        self.attention_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.mlp = Mlp(config)
        self.mlp_norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def _sublayer(self, x: torch.Tensor, fn, norm: nn.LayerNorm) -> torch.Tensor:
        if self.pre_ln:
            return x + self.dropout(fn(norm(x)))
        return norm(x + self.dropout(fn(x)))

    def forward(self, x: torch.Tensor, visible: torch.Tensor,
                relative: torch.Tensor | None) -> torch.Tensor:
        x = self._sublayer(x, lambda h: self.attention(h, visible, relative), self.attention_norm)
        return self._sublayer(x, self.mlp, self.mlp_norm)


class XlmJaxPreTrainedModel(PreTrainedModel):
    """Weight initialisation and the config class (weights normally come from the export)."""

    config_class = XlmJaxConfig
    base_model_prefix = "model"

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, nn.Linear):
            module.weight.normal_(0.0, std)
            module.bias.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.normal_(0.0, std)
        elif isinstance(module, nn.LayerNorm):
            module.weight.fill_(1.0)
            module.bias.zero_()
        elif isinstance(module, RelativePositionTable):
            module.rel_embedding.normal_(0.0, 0.02)
        elif isinstance(module, GatedBias):
            module.gate_u.normal_(0.0, 0.02)
            module.gate_v.normal_(0.0, 0.02)
            module.gate_w.fill_(1.0)
        elif isinstance(module, LMHead):
            module.bias.zero_()


class XlmJaxModel(XlmJaxPreTrainedModel):
    """The encoder; `forward` returns `BaseModelOutput` whose `hidden_states` (with
    `output_hidden_states=True`) are the embeddings' output (0) and every layer's (1..L), the
    last after the final LayerNorm for a pre-LN model, as xlm_jax's `Encoder.hidden_states`."""

    # the MLM head's weights, when the directory holds XlmJaxForMaskedLM's
    _keys_to_ignore_on_load_unexpected = [r"^lm_head\."]

    def __init__(self, config: XlmJaxConfig) -> None:
        super().__init__(config)
        self.embeddings = Embeddings(config)
        self.rel_pos = self.rel_pos_layers = None
        if config.position_type in ("relative", "both"):
            if config.share_relative_table:
                self.rel_pos = RelativePositionTable(config)
            else:
                self.rel_pos_layers = nn.ModuleList(
                    RelativePositionTable(config) for _ in range(config.num_hidden_layers))
        self.layers = nn.ModuleList(Layer(config) for _ in range(config.num_hidden_layers))
        self.final_norm = (nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
                           if config.ln_style == "pre" else None)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Embedding) -> None:
        self.embeddings.word_embeddings = value

    def _relative(self, positions: torch.Tensor) -> list[torch.Tensor | None]:
        """Each layer's raw relative bias (the shared table's computed once), or Nones."""
        if self.rel_pos is not None:
            return [self.rel_pos(positions, positions)] * len(self.layers)
        if self.rel_pos_layers is not None:
            return [table(positions, positions) for table in self.rel_pos_layers]
        return [None] * len(self.layers)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                lang_ids: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                output_attentions: bool | None = None) -> BaseModelOutput | tuple:
        """Encodes `input_ids` [B, T].

        attention_mask: [B, T], 1 = a real token (default: `input_ids != pad_token_id`); the
          positions count its ones. token_type_ids: [B, T] (default 0). lang_ids: [B, T],
          required by a model with language embeddings (`config.num_languages > 0`): each
          token's 1-based index in `config.languages`, 0 on padding.
        """
        if output_attentions:
            raise ValueError("output_attentions is not supported by this model")
        cfg = self.config
        if output_hidden_states is None:
            output_hidden_states = cfg.output_hidden_states
        if return_dict is None:
            return_dict = getattr(cfg, "return_dict", True)
        if attention_mask is None:
            attention_mask = input_ids != cfg.pad_token_id
        mask = attention_mask.bool()
        limit = cfg.max_position_embeddings - cfg.pad_token_id - 1
        if cfg.position_type != "relative" and input_ids.shape[-1] > limit:
            raise ValueError(f"sequence length {input_ids.shape[-1]} exceeds the position "
                             f"table: max_position_embeddings={cfg.max_position_embeddings} "
                             f"admits at most {limit} tokens")
        positions = torch.where(mask, mask.long().cumsum(-1) - 1, torch.zeros_like(input_ids))
        visible = mask[:, None, None, :]
        x = self.embeddings(input_ids, positions, token_type_ids, lang_ids)
        hidden = [x]
        for layer, relative in zip(self.layers, self._relative(positions)):
            x = layer(x, visible, relative)
            hidden.append(x)
        if self.final_norm is not None:
            x = self.final_norm(x)
            hidden[-1] = x
        states = tuple(hidden) if output_hidden_states else None
        if not return_dict:
            return (x,) + ((states,) if states is not None else ())
        return BaseModelOutput(last_hidden_state=x, hidden_states=states)


class LMHead(nn.Module):
    """Masked-LM head: dense, exact GELU, LayerNorm, then the word embeddings (tied) + bias."""

    def __init__(self, config: XlmJaxConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(config.padded_vocab_size))

    def forward(self, x: torch.Tensor, word_embeddings: torch.Tensor) -> torch.Tensor:
        x = self.LayerNorm(F.gelu(self.dense(x)))
        return F.linear(x, word_embeddings) + self.bias


class XlmJaxForMaskedLM(XlmJaxPreTrainedModel):
    """The encoder with its masked-LM head; logits are [B, T, vocab_size] (the columns of
    vocabulary padding, `padded_vocab_size`, dropped)."""

    def __init__(self, config: XlmJaxConfig) -> None:
        super().__init__(config)
        self.model = XlmJaxModel(config)
        self.lm_head = LMHead(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.model.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None,
                lang_ids: torch.Tensor | None = None, labels: torch.Tensor | None = None,
                output_hidden_states: bool | None = None, return_dict: bool | None = None,
                output_attentions: bool | None = None) -> MaskedLMOutput | tuple:
        """`XlmJaxModel.forward`'s inputs; `labels` [B, T] (-100 = no loss) add the mean
        cross-entropy as `loss`."""
        out = self.model(input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                         lang_ids=lang_ids, output_hidden_states=output_hidden_states,
                         return_dict=True, output_attentions=output_attentions)
        logits = self.lm_head(out.last_hidden_state, self.model.embeddings.word_embeddings.weight)
        logits = logits[..., :self.config.vocab_size]
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   labels.reshape(-1), ignore_index=-100)
        if return_dict is False:
            rest = (logits,) + ((out.hidden_states,) if out.hidden_states is not None else ())
            return ((loss,) + rest) if loss is not None else rest
        return MaskedLMOutput(loss=loss, logits=logits, hidden_states=out.hidden_states)
