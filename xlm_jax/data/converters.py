"""seqio FeatureConverters: task features -> the static-shape model features.

Task features (what the preprocessors emit, variable length, int32):
  mono / pair   `input_ids`, `pair_side`, `lang_ids`
  split_pair    `x_*` and `y_*` copies of those three
  mixup_pair    `query_*` and `key_*` copies

Model features (int32, exactly [T]): the five features of `xlm_jax.data.features` —
`input_ids` (pad 1), `positions`, `segment_ids`, `pair_side`, `lang_ids` — with the same
prefixes. seqio's own padding/packing pads with 0 (which is `<s>` here) and finds lengths by
counting non-zero ids, so these converters pad and pack themselves.

  MonolingualConverter  one example per row, padded (pack=True packs short ones instead)
  PairConverter         packs pairs greedily into rows (pack=False: one pair per row)
  SplitPairConverter    x and y rows, each padded (no packing: rows are aligned)
  MixupPairConverter    query and key rows, each padded (no packing: one `<s>` per row)

Each kind's record names its converter (`features.ExampleKind.converter`):
`example_kind(kind).converter(pack=...)` builds one.
"""

from __future__ import annotations

from typing import Mapping

import seqio
import tensorflow as tf

from xlm_jax.data import preprocessors
from xlm_jax.data.features import FEATURES, ExampleKind, example_kind

__all__ = [
    "MonolingualConverter",
    "PairConverter",
    "SplitPairConverter",
    "MixupPairConverter",
    "task_feature_lengths",
]

_Spec = seqio.FeatureConverter.FeatureSpec


def _task_specs(prefixes) -> dict:
    return {p + k: _Spec(dtype=tf.int32) for p in prefixes for k in preprocessors.TOKEN_FEATURES}


def _model_specs(prefixes) -> dict:
    return {p + k: _Spec(dtype=tf.int32) for p in prefixes for k in FEATURES}


class _XlmConverter(seqio.FeatureConverter):
    """Shared logic: pad (or pack) each prefix group of features to its task length."""

    PREFIXES: tuple[str, ...] = ("",)
    # positions / segment ids are ordinary model features here, not seqio packing extras
    PACKING_FEATURE_DTYPES: Mapping[str, tf.dtypes.DType] = {}
    PACKABLE = True

    def __init__(self, pack: bool = False, pack_window: int = 256, **kwargs):
        if pack and not self.PACKABLE:
            raise ValueError(f"{type(self).__name__} cannot pack: its rows must stay aligned")
        if pack_window < 1:
            raise ValueError(f"{type(self).__name__}: pack_window must be >= 1, got {pack_window}")
        self._pack_window = pack_window
        super().__init__(pack=pack, **kwargs)

    def _convert_features(self, ds: tf.data.Dataset,
                          task_feature_lengths: Mapping[str, int]) -> tf.data.Dataset:
        if self.pack:
            (prefix,) = self.PREFIXES
            return preprocessors.pack_dataset(ds, task_feature_lengths[prefix + "input_ids"],
                                              prefix, self._pack_window)

        def convert(ex):
            out = {}
            for p in self.PREFIXES:
                out.update(preprocessors.finalize_unpacked(
                    ex, task_feature_lengths[p + "input_ids"], p))
            return out

        return ds.map(convert, num_parallel_calls=tf.data.AUTOTUNE)

    def get_model_feature_lengths(self, task_feature_lengths: Mapping[str, int]
                                  ) -> Mapping[str, int]:
        return {p + k: task_feature_lengths[p + "input_ids"]
                for p in self.PREFIXES for k in FEATURES}


class MonolingualConverter(_XlmConverter):
    """Full-length monolingual segments: one per row, padded to T (see module docstring)."""

    TASK_FEATURES = _task_specs(example_kind("mono").prefixes)
    MODEL_FEATURES = _model_specs(example_kind("mono").prefixes)


class PairConverter(_XlmConverter):
    """Sentence pairs packed greedily into rows of T (segment_ids 1..k, positions restart)."""

    TASK_FEATURES = _task_specs(example_kind("pair").prefixes)
    MODEL_FEATURES = _model_specs(example_kind("pair").prefixes)

    def __init__(self, pack: bool = True, **kwargs):
        super().__init__(pack=pack, **kwargs)


class SplitPairConverter(_XlmConverter):
    """split_pair examples: aligned `x_*` and `y_*` rows, each padded to its length."""

    PREFIXES = example_kind("split_pair").prefixes
    PACKABLE = False
    TASK_FEATURES = _task_specs(PREFIXES)
    MODEL_FEATURES = _model_specs(PREFIXES)


class MixupPairConverter(_XlmConverter):
    """mixup_pair examples: aligned `query_*` and `key_*` rows, each padded to its length."""

    PREFIXES = example_kind("mixup_pair").prefixes
    PACKABLE = False
    TASK_FEATURES = _task_specs(PREFIXES)
    MODEL_FEATURES = _model_specs(PREFIXES)


def task_feature_lengths(kind: str | ExampleKind, sequence_length: int) -> dict[str, int]:
    """`{task feature: sequence_length}` for every task feature of `kind`."""
    return {p + k: int(sequence_length) for p in example_kind(kind).prefixes
            for k in preprocessors.TOKEN_FEATURES}
