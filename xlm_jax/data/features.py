"""The feature contract between data, model and trainer (TensorFlow-free, numpy-free).

The ids, feature names and example kinds shared by the seqio preprocessors and converters,
the synthetic batches, the models and the objectives. Importing this module imports neither
TensorFlow nor seqio (nor any other xlm_jax.data module than `sampling`), so TF-free code
(the synthetic batches, the models, the encoder) can use it on machines without TensorFlow.

Model features (int32, static shape [T] per example, [B, T] per batch):

  input_ids    token ids in the fairseq/XLM-R layout; padding is `PAD_ID` = 1.
  positions    0-based position inside each packed example, restarting for every packed
               example in the row; 0 on padding.
  segment_ids  packing id: 1..k for the k examples packed into the row, 0 on padding.
  pair_side    0 padding, 1 the first sentence of a pair (with its `<s>`/`</s>`), 2 the second;
               monolingual rows are 1 on every real token.
  lang_ids     `language_index(lang, languages)` of the token's language, 0 on padding.

VECO examples carry `x_*` and `y_*` copies of the five features (two adjacent segments, or a
sentence and its translation); InfoXLM XLCo mixup examples carry `query_*` and `key_*`.
The batches themselves come from `xlm_jax.data.pipeline.make_batch_iterator`.
"""

from __future__ import annotations

from typing import Sequence

from xlm_jax.data import sampling

__all__ = [
    "BOS_ID",
    "PAD_ID",
    "EOS_ID",
    "UNK_ID",
    "FIRST_PIECE_ID",
    "FEATURES",
    "KINDS",
    "PREFIXES",
    "default_language_list",
    "feature_names",
    "language_index",
]

# fairseq / XLM-R special ids (see xlm_jax.data.vocab).
BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
FIRST_PIECE_ID = 4

# The five per-token model features, in a fixed order.
FEATURES: tuple[str, ...] = ("input_ids", "positions", "segment_ids", "pair_side", "lang_ids")

# Example kinds and the feature-name prefixes each kind uses.
PREFIXES: dict[str, tuple[str, ...]] = {
    "mono": ("",),  # full-length monolingual segments, one per row
    "pair": ("",),  # `<s> a </s></s> b </s>` pairs, several packed into a row
    "veco": ("x_", "y_"),  # two aligned rows per example (VECO)
    "mixup": ("query_", "key_"),  # two aligned rows per example (InfoXLM XLCo mixup)
}
KINDS: tuple[str, ...] = tuple(PREFIXES)


def _check_kind(kind: str) -> None:
    if kind not in PREFIXES:
        raise ValueError(f"unknown example kind {kind!r}: expected one of {list(KINDS)}")


def feature_names(kind: str) -> tuple[str, ...]:
    """All model feature names of an example kind, e.g. `x_input_ids, ..., y_lang_ids`."""
    _check_kind(kind)
    return tuple(p + f for p in PREFIXES[kind] for f in FEATURES)


def default_language_list() -> list[str]:
    """The default `lang_ids` table: sorted `sampling.KNOWN_LANGUAGES` (pass your own list in
    real runs so that ids stay fixed if the known set grows)."""
    return sorted(sampling.KNOWN_LANGUAGES)


def language_index(lang: str, languages: Sequence[str]) -> int:
    """Returns the `lang_ids` value of `lang`: its 1-based position in `languages`.

    0 is reserved for padding, so a language embedding table needs `len(languages) + 1` rows.
    Raises ValueError naming the language and the list when `lang` is not in it.
    """
    languages = list(languages)
    if len(set(languages)) != len(languages):
        dups = sorted({x for x in languages if languages.count(x) > 1})
        raise ValueError(f"language list has duplicates: {dups}")
    try:
        return languages.index(lang) + 1
    except ValueError:
        shown = languages if len(languages) <= 20 else languages[:20] + ["..."]
        raise ValueError(
            f"language {lang!r} is not in the language list ({len(languages)} languages: "
            f"{', '.join(shown)})"
        ) from None
