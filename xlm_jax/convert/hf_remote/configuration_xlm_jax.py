"""Configuration of an xlm_jax encoder exported for `transformers` (remote code).

`python -m xlm_jax.convert export-hf` copies this file, unchanged, into every exported
directory whose model is not XLM-R-shaped (pre-LN, the XLM-E gated relative position bias,
language embeddings, ...); `config.json`'s `auto_map` points `AutoConfig` here, so

    AutoModel.from_pretrained(directory, trust_remote_code=True)

builds the model with nothing but torch and transformers installed. The field names follow
XLM-R's `config.json` where the meaning is the same; the others are xlm_jax's own
(`xlm_jax.models.config.ModelConfig` documents each). `xlm_jax_config`, when present, is the
exporting model's whole `ModelConfig` (what `import-hf` restores); this model never reads it.
"""
from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig

LN_STYLES = ("post", "pre")
POSITION_TYPES = ("absolute", "relative", "both")


class XlmJaxConfig(PretrainedConfig):
    """Sizes and switches of an exported xlm_jax encoder.

    Beyond XLM-R's fields:
      padded_vocab_size: rows of the word-embedding table (`vocab_size` rounded up for
        sharding); the rows past `vocab_size` are never looked up and their logits dropped.
      num_languages: rows of the language-embedding table (0: none). A model with one needs
        `lang_ids` [B, T] in `forward`: the 1-based index of each token's language in
        `languages` (0 = padding), as the model was trained.
      languages: the language codes of `lang_ids` 1, 2, ... (None when not recorded).
      ln_style: "post" (XLM-R: LayerNorm after each residual sum) or "pre" (LayerNorm before
        each block, plus a final LayerNorm).
      position_type: "absolute" (a learned table, fairseq's offset of pad_token_id + 1),
        "relative" (XLM-E's gated relative position bias) or "both".
      relative_buckets, relative_max_distance: T5's bidirectional log buckets of the bias.
      share_relative_table: one bucket table for all layers (else one per layer).
    """

    model_type = "xlm_jax"

    def __init__(self, vocab_size: int = 250002, padded_vocab_size: int | None = None,
                 hidden_size: int = 768, num_hidden_layers: int = 12,
                 num_attention_heads: int = 12, intermediate_size: int = 3072,
                 max_position_embeddings: int = 514, type_vocab_size: int = 1,
                 num_languages: int = 0, languages: list[str] | None = None,
                 ln_style: str = "post", position_type: str = "absolute",
                 relative_buckets: int = 32, relative_max_distance: int = 128,
                 share_relative_table: bool = True, hidden_act: str = "gelu",
                 hidden_dropout_prob: float = 0.1, attention_probs_dropout_prob: float = 0.1,
                 layer_norm_eps: float = 1e-5, initializer_range: float = 0.02,
                 pad_token_id: int = 1, bos_token_id: int = 0, eos_token_id: int = 2,
                 **kwargs: Any) -> None:
        kwargs.setdefault("tie_word_embeddings", False)  # the head reads the table itself
        super().__init__(pad_token_id=pad_token_id, bos_token_id=bos_token_id,
                         eos_token_id=eos_token_id, **kwargs)
        if ln_style not in LN_STYLES:
            raise ValueError(f"ln_style={ln_style!r} must be one of {', '.join(LN_STYLES)}")
        if position_type not in POSITION_TYPES:
            raise ValueError(f"position_type={position_type!r} must be one of "
                             f"{', '.join(POSITION_TYPES)}")
        if hidden_act != "gelu":
            raise ValueError(f"hidden_act={hidden_act!r}: only the exact (erf) 'gelu' is used")
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by "
                             f"num_attention_heads={num_attention_heads}")
        self.vocab_size = vocab_size
        self.padded_vocab_size = padded_vocab_size or vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        self.max_position_embeddings = max_position_embeddings
        self.type_vocab_size = type_vocab_size
        self.num_languages = num_languages
        self.languages = languages
        self.ln_style = ln_style
        self.position_type = position_type
        self.relative_buckets = relative_buckets
        self.relative_max_distance = relative_max_distance
        self.share_relative_table = share_relative_table
        self.hidden_act = hidden_act
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
