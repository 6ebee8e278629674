"""Model configuration: one frozen dataclass, named sizes, validated on creation.

Every field has a comment saying what it controls; `get_config("base", dropout_rate=0.0)`
returns a named size with overrides. Sizes follow the papers: `base`/`large` are XLM-R's (and
the XLM-E/InfoXLM base/large widths), `xl` is XLM-E XL's discriminator (XLM-E paper Table 9:
48 layers, d=1536, FFN 6144, 24 heads; XLM-R XL is a different, 2560-wide model), `small` is
the 6-layer model used for quick ablations (ERNIE-M small, paper Table 11) and `tiny` runs on a
CPU in minutes (the demo).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax.numpy as jnp

from xlm_jax.models import kernel_launch

POSITION_TYPES = ("absolute", "relative", "both")
LN_STYLES = ("post", "pre")
LANGUAGE_INITS = ("normal", "zeros")
RELATIVE_INITS = ("normal", "locality")
# "xla": the reference einsum path; "cudnn": cuDNN flash attention on GPU (no bias, no dropout);
# "pallas": the flash-attention kernels that compute the gated relative position bias and
# attention dropout inside (Triton on GPU, Mosaic on TPU, interpreted on CPU); "auto": the best
# of these the platform has (logged at WARNING once). A backend named explicitly that cannot
# serve a call is an error, never a silent fallback (xlm_jax.models.attention_backends).
ATTENTION_BACKENDS = ("xla", "cudnn", "pallas", "auto")
# What each layer keeps for the backward pass (`jax.checkpoint` around every EncoderLayer):
# "none" keeps everything (no recomputation); "full" keeps only the layer's inputs and
# recomputes the rest; "dots_saveable" keeps the matmul outputs (jax.checkpoint_policies)
# and recomputes the element-wise work (norms, GELU, softmax, dropout masks).
REMAT_POLICIES = ("none", "full", "dots_saveable")
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}
# The encoder's parameters with one row per vocabulary entry (`padded_vocab_size` rows): the HF
# converter pads and trims them, and `init_from` copies their first `vocab_size` rows only.
VOCAB_PARAMS = ("embeddings/word_embeddings/embedding", "mlm_head/bias")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Sizes and switches of the encoder (and of VECO's optional cross-attention)."""

    vocab_size: int = 250002  # XLM-R: 250000 SentencePiece pieces + <pad> + <mask>
    # Rows of the embedding table / logits are rounded up to this multiple (1 = exactly
    # vocab_size, as XLM-R). 128 lets the vocab axis split over any tensor axis up to 128 and
    # gives the logits matmul aligned tiles; the extra ids never occur and get -1e9 logits.
    pad_vocab_to_multiple_of: int = 1
    hidden_size: int = 768  # d_model
    num_layers: int = 12  # encoder layers
    num_heads: int = 12  # attention heads; hidden_size must divide evenly
    mlp_dim: int = 3072  # FFN inner size
    max_positions: int = 514  # rows of the absolute position table (fairseq: 512 + pad offset 2)
    pad_id: int = 1  # fairseq/XLM-R <pad>; also the position padding index
    type_vocab_size: int = 1  # XLM-R keeps a token-type table of one row
    num_languages: int = 0  # >0 adds a language embedding table (XLM/ERNIE-M placeholders)
    # Initial language table: "normal" (as every other table) or "zeros", so that a model
    # continued from XLM-R (which has no language table, e.g. ERNIE-M base/large) computes
    # exactly XLM-R's function at step 0 (our choice for those run files).
    language_init: str = "normal"
    dropout_rate: float = 0.1  # hidden dropout (embeddings, attention output, FFN output)
    attention_dropout_rate: float = 0.1  # dropout on attention probabilities
    layer_norm_eps: float = 1e-5  # XLM-R's config.json value (not the BERT 1e-12 default)
    ln_style: str = "post"  # "post" (XLM-R) or "pre" (adds a final LayerNorm)
    position_type: str = "absolute"  # "absolute" (fairseq table) | "relative" (gated bias) | "both"
    relative_buckets: int = 32  # T5-style bidirectional log buckets for the gated bias
    relative_max_distance: int = 128  # distance at which buckets saturate
    share_relative_table: bool = True  # one bucket table for all layers (else one per layer)
    # Initial bucket table: "normal" (N(0, 0.02), as XLM-E's released code) or "locality", a
    # prior towards near tokens: bucket b of head h starts at -2^-h x (b's smallest distance),
    # ALiBi's linear penalty with slopes halving per head (our choice, models/position.py). A
    # small model learns from it which neighbours to read instead of first finding them.
    relative_init: str = "normal"
    cross_attention: bool = False  # VECO: every layer also owns a cross-attention block
    attention_backend: str = "xla"  # "xla" | "cudnn" | "pallas" | "auto" (ATTENTION_BACKENDS)
    # The GPU flash-attention kernels' launch (tiles, Triton warps and stages), as text
    # (models/kernel_launch.py): "" is the measured default (fused_attention.GPU_LAUNCH);
    # `accelerator.kernel_sweep` prints the one it measured best. Only the Triton kernels
    # (pallas/auto on a GPU) read it.
    attention_launch: str = ""
    remat: str = "none"  # per-layer rematerialisation: none | full | dots_saveable (above)
    # Apply the layers with one `nn.scan` (compiled once, whatever the depth) instead of a
    # Python loop (compiled once per layer). The parameters are then stacked under one `layers`
    # subtree with a leading layer axis instead of `layers_0..layers_{N-1}`;
    # `xlm_jax.models.layer_stack` converts between the two, and every loader accepts both.
    # With dropout the bits differ from the loop's (one rng split per layer); the function is
    # the same. Off by default: checkpoints and tools use the per-layer layout.
    scan_layers: bool = False
    dtype: str = "float32"  # compute dtype of activations: float32 | bfloat16 | float16
    param_dtype: str = "float32"  # storage dtype of parameters (keep fp32 for training)
    initializer_range: float = 0.02  # stddev of the normal initialiser (BERT/XLM-R)

    def __post_init__(self) -> None:
        def bad(field: str, value: Any, why: str) -> ValueError:
            return ValueError(f"ModelConfig.{field}={value!r}: {why}")

        for field in ("vocab_size", "hidden_size", "num_layers", "num_heads", "mlp_dim",
                      "max_positions", "type_vocab_size", "relative_buckets",
                      "relative_max_distance", "pad_vocab_to_multiple_of"):
            value = getattr(self, field)
            if not isinstance(value, int) or value <= 0:
                raise bad(field, value, "must be a positive integer")
        if self.hidden_size % self.num_heads:
            raise bad("hidden_size", self.hidden_size,
                      f"must be divisible by num_heads={self.num_heads}")
        if self.num_languages < 0 or self.num_languages == 1:
            raise bad("num_languages", self.num_languages,
                      "must be 0 (no language embeddings) or >= 2 (row 0 is padding, then one "
                      "row per language)")
        if not 0 <= self.pad_id < self.vocab_size:
            raise bad("pad_id", self.pad_id, f"must be in [0, vocab_size={self.vocab_size})")
        if self.position_type in ("absolute", "both") and self.max_positions <= self.pad_id + 1:
            raise bad("max_positions", self.max_positions,
                      f"must exceed pad_id + 1 = {self.pad_id + 1} (fairseq offset)")
        for field in ("dropout_rate", "attention_dropout_rate"):
            value = getattr(self, field)
            if not 0.0 <= value < 1.0:
                raise bad(field, value, "must be in [0, 1)")
        try:
            kernel_launch.parse(self.attention_launch)
        except (ValueError, AttributeError) as e:
            raise bad("attention_launch", self.attention_launch, str(e)) from None
        if not isinstance(self.scan_layers, bool):
            raise bad("scan_layers", self.scan_layers, "must be True or False")
        for field, valid in (("ln_style", LN_STYLES), ("position_type", POSITION_TYPES),
                             ("language_init", LANGUAGE_INITS),
                             ("relative_init", RELATIVE_INITS),
                             ("attention_backend", ATTENTION_BACKENDS),
                             ("remat", REMAT_POLICIES),
                             ("dtype", tuple(DTYPES)), ("param_dtype", tuple(DTYPES))):
            if getattr(self, field) not in valid:
                raise bad(field, getattr(self, field), f"must be one of {', '.join(valid)}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the word-embedding table and width of the MLM logits."""
        m = self.pad_vocab_to_multiple_of
        return -(-self.vocab_size // m) * m

    @property
    def max_sequence_length(self) -> int | None:
        """Longest input the absolute position table admits (None: no absolute table)."""
        if self.position_type == "relative":
            return None
        return self.max_positions - self.pad_id - 1

    @property
    def compute_dtype(self) -> Any:
        return DTYPES[self.dtype]

    @property
    def params_dtype(self) -> Any:
        return DTYPES[self.param_dtype]

    def replace(self, **overrides: Any) -> "ModelConfig":
        unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(self)})
        if unknown:
            raise ValueError(f"unknown ModelConfig field(s): {', '.join(unknown)}")
        return dataclasses.replace(self, **overrides)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SIZES: dict[str, dict[str, Any]] = {
    # A CPU-demo model: trains in minutes on 2 cores.
    "tiny": dict(hidden_size=128, num_layers=4, num_heads=4, mlp_dim=512, vocab_size=8002,
                 max_positions=258),
    # The pod sizes pad XLM-R's 250002 ids to 250112 rows (a multiple of 128), so the vocab
    # axis splits over any tensor axis up to 128; HF import/export add/drop the padding rows.
    "small": dict(hidden_size=768, num_layers=6, num_heads=12, mlp_dim=3072,
                  pad_vocab_to_multiple_of=128),
    "base": dict(hidden_size=768, num_layers=12, num_heads=12, mlp_dim=3072,
                 pad_vocab_to_multiple_of=128),
    "large": dict(hidden_size=1024, num_layers=24, num_heads=16, mlp_dim=4096,
                  pad_vocab_to_multiple_of=128),
    "xl": dict(hidden_size=1536, num_layers=48, num_heads=24, mlp_dim=6144,
               pad_vocab_to_multiple_of=128),
}


def get_config(size: str = "base", **overrides: Any) -> ModelConfig:
    """A named size (`tiny|small|base|large|xl`) with field overrides, validated."""
    if size not in SIZES:
        raise ValueError(f"unknown model size {size!r}; valid sizes: {', '.join(SIZES)}")
    return ModelConfig().replace(**{**SIZES[size], **overrides})
