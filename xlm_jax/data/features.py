"""The feature contract between data, model and trainer (TensorFlow-free, numpy-free).

The ids, feature names and example kinds shared by the seqio preprocessors and converters,
the synthetic batches, the models and the objectives. Importing this module imports neither
TensorFlow nor seqio (nor any other xlm_jax.data module than `sampling`), so TF-free code
(the synthetic batches, the models, the encoder) can use it on machines without TensorFlow;
the TensorFlow pieces a kind's record names are imported when first used (`Ref`).

Model features (int32, static shape [T] per example, [B, T] per batch):

  input_ids    token ids in the fairseq/XLM-R layout; padding is `PAD_ID` = 1.
  positions    0-based position inside each packed example, restarting for every packed
               example in the row; 0 on padding.
  segment_ids  packing id: 1..k for the k examples packed into the row, 0 on padding.
  pair_side    0 padding, 1 the first sentence of a pair (with its `<s>`/`</s>`), 2 the second;
               monolingual rows are 1 on every real token.
  lang_ids     `language_index(lang, languages)` of the token's language, 0 on padding.

Example kinds (`ExampleKind`, one record per kind, looked up with `example_kind`): what one
example holds, the prefixes its rows' features carry, and the pieces that build it (the
seqio converter, the registry's preprocessors, the synthetic generator). Kinds are named for
what they hold (our choice):

  mono        full-length monolingual segments, one per row
  pair        translation pairs, both sentences in one row `<s> a </s></s> b </s>`, several
              packed per row
  split_pair  the two halves of a pair, each in its own row: `x_*` and `y_*` (a sentence and
              its translation, or two adjacent segments of a document)
  mixup_pair  two rows `query_*` and `key_*`, each a pair of sentences from two corpora, the
              key's the translations of the query's (InfoXLM's XLCo mixup)

`veco` and `mixup`, the names of the last two before, are accepted as aliases of
`split_pair` and `mixup_pair` (users' gin files and task modules name them): they resolve to
the same record, with a warning once per process.
The batches themselves come from `xlm_jax.data.pipeline.make_batch_iterator`.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from typing import Any, Sequence

from xlm_jax.data import sampling

__all__ = [
    "BOS_ID",
    "PAD_ID",
    "EOS_ID",
    "UNK_ID",
    "FIRST_PIECE_ID",
    "FEATURES",
    "KINDS",
    "KIND_ALIASES",
    "EXAMPLE_KINDS",
    "ExampleKind",
    "Ref",
    "example_kind",
    "valid_kinds",
    "default_language_list",
    "feature_names",
    "language_index",
]

logger = logging.getLogger(__name__)

# fairseq / XLM-R special ids (see xlm_jax.data.vocab).
BOS_ID, PAD_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
FIRST_PIECE_ID = 4

# The five per-token model features, in a fixed order.
FEATURES: tuple[str, ...] = ("input_ids", "positions", "segment_ids", "pair_side", "lang_ids")

# ----------------------------------------------------------------------------- example kinds

@dataclasses.dataclass(frozen=True)
class Ref:
    """A module attribute, imported when first used (`"xlm_jax.data.converters:PairConverter"`).

    The records below name their TensorFlow-side pieces this way so that this module stays
    importable without TensorFlow (the models and objectives read it); `tests/data` checks
    that every reference resolves."""

    path: str

    def load(self) -> Any:
        module, _, attr = self.path.partition(":")
        return getattr(importlib.import_module(module), attr)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.load()(*args, **kwargs)


@dataclasses.dataclass(frozen=True)
class ExampleKind:
    """One example kind: what an example holds and what builds it.

    name: what the code, gin files and task registrations call it.
    holds: what one example is, in words.
    prefixes: one per row of an example; a row's features are `prefix + FEATURES`.
    pair_rows: each row holds `<s> a </s></s> b </s>` pairs (at least 6 tokens), else single
      segments `<s> w .. </s>` (at least 3).
    converter: the seqio FeatureConverter class, task features -> model features (TF).
    synthetic_rows: `(rng, batch_size, seq_len, vocab_size, pad_fraction, num_languages) ->
      {feature: [B, T]}`, random rows of one prefix (numpy, `xlm_jax.data.synthetic`).
    from_documents: the seqio preprocessor that cuts a tokenised document stream into
      examples (`registry.register_monolingual`); None: not built from documents.
    from_pairs: `(max_side_length, max_total_length, random_order) -> (tokenize keys,
      preprocessor)` for translation pairs (`registry.register_parallel`); None: not built
      from pairs.
    mixes_corpora: an example joins pairs of two corpora, so one Task draws from all of them
      (needs >= 2) instead of one Task per pair under a Mixture.
    aliases: older names that resolve to this record.
    """

    name: str
    holds: str
    prefixes: tuple[str, ...]
    pair_rows: bool
    converter: Ref
    synthetic_rows: Ref
    from_documents: Ref | None = None
    from_pairs: Ref | None = None
    mixes_corpora: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def features(self) -> tuple[str, ...]:
        """Its model feature names, e.g. `x_input_ids, ..., y_lang_ids`."""
        return tuple(p + f for p in self.prefixes for f in FEATURES)

    @property
    def min_length(self) -> int:
        """The shortest row: `<s> a </s></s> b </s>` or `<s> w </s>`."""
        return 6 if self.pair_rows else 3


_DATA = "xlm_jax.data."
EXAMPLE_KINDS: dict[str, ExampleKind] = {k.name: k for k in (
    ExampleKind(
        name="mono", holds="full-length monolingual segments, one per row (MMLM, MRTD)",
        prefixes=("",), pair_rows=False,
        converter=Ref(_DATA + "converters:MonolingualConverter"),
        synthetic_rows=Ref(_DATA + "synthetic:segment_rows"),
        from_documents=Ref(_DATA + "preprocessors:monolingual_segments")),
    ExampleKind(
        name="pair", holds="translation pairs `<s> a </s></s> b </s>`, several packed per row "
        "(TLM, TRTD, CAMLM)",
        prefixes=("",), pair_rows=True,
        converter=Ref(_DATA + "converters:PairConverter"),
        synthetic_rows=Ref(_DATA + "synthetic:packed_pair_rows"),
        from_pairs=Ref(_DATA + "preprocessors:pair_examples")),
    ExampleKind(
        name="split_pair", holds="a pair's two halves in two aligned rows x, y: a sentence and "
        "its translation, or two adjacent segments (VECO, translation, XLCo without mixup)",
        prefixes=("x_", "y_"), pair_rows=False,
        converter=Ref(_DATA + "converters:SplitPairConverter"),
        synthetic_rows=Ref(_DATA + "synthetic:segment_rows"),
        from_documents=Ref(_DATA + "preprocessors:adjacent_segment_pairs"),
        from_pairs=Ref(_DATA + "preprocessors:split_pair_examples"), aliases=("veco",)),
    ExampleKind(
        name="mixup_pair", holds="rows query, key: sentences of two corpora as one pair, and "
        "their translations (InfoXLM XLCo mixup)",
        prefixes=("query_", "key_"), pair_rows=True,
        converter=Ref(_DATA + "converters:MixupPairConverter"),
        synthetic_rows=Ref(_DATA + "synthetic:pair_rows"),
        from_pairs=Ref(_DATA + "preprocessors:mixup_pair_examples"), mixes_corpora=True,
        aliases=("mixup",)),
)}
KINDS: tuple[str, ...] = tuple(EXAMPLE_KINDS)
KIND_ALIASES: dict[str, str] = {a: k.name for k in EXAMPLE_KINDS.values() for a in k.aliases}
_warned_aliases: set[str] = set()


def valid_kinds(kinds: Sequence[str] = KINDS) -> str:
    """`kinds` for an error message, with the aliases that name them."""
    old = [f"{a} = {n}" for a, n in KIND_ALIASES.items() if n in kinds]
    return ", ".join(kinds) + (f" (old names: {', '.join(old)})" if old else "")


def example_kind(kind: str | ExampleKind, owner: str = "") -> ExampleKind:
    """The record of a kind name (or alias); a one-line ValueError naming the value and the
    valid kinds for anything else. `owner` prefixes the error (`"XLCo(name='xlco')"`)."""
    if isinstance(kind, ExampleKind):
        return kind
    if isinstance(kind, str) and kind in KIND_ALIASES:
        if kind not in _warned_aliases:
            _warned_aliases.add(kind)
            logger.warning("example kind %r is the old name of %r; use %r", kind,
                           KIND_ALIASES[kind], KIND_ALIASES[kind])
        return EXAMPLE_KINDS[KIND_ALIASES[kind]]
    if isinstance(kind, str) and kind in EXAMPLE_KINDS:
        return EXAMPLE_KINDS[kind]
    where = f"{owner}: " if owner else ""
    raise ValueError(f"{where}unknown example kind {kind!r}: expected one of {valid_kinds()}")


def feature_names(kind: str | ExampleKind) -> tuple[str, ...]:
    """All model feature names of an example kind, e.g. `x_input_ids, ..., y_lang_ids`."""
    return example_kind(kind).features


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
