"""TensorFlow-free synthetic batches with the exact model-feature layout (numpy only).

For benchmarks and for machines without TensorFlow/seqio (the GPU machines): the batches
have the features, dtypes, shapes and special-token structure of the real converters
(`xlm_jax.data.converters`), with random piece ids:

  mono        `<s> w .. w </s> <pad>..` one segment per row (`segment_rows`)
  pair        rows packed with several `<s> a </s></s> b </s>` pairs (segment_ids 1..k,
              positions restart per pair, pair_side 1/2, a language per side;
              `packed_pair_rows`)
  split_pair  `x_*` and `y_*` rows, each like mono
  mixup_pair  `query_*` and `key_*` rows, each a single pair (`pair_rows`)

Each kind's record (`features.ExampleKind.synthetic_rows`) names the generator of its rows;
an example of several rows draws them one prefix after the other.

Piece ids are uniform in [4, vocab_size - 1): the four specials and the last id (`<mask>` in
the XLM-R layout) never occur. `lang_ids` are in [1, num_languages].
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from xlm_jax.data.features import (BOS_ID, EOS_ID, FEATURES, FIRST_PIECE_ID, PAD_ID,
                                   example_kind)

__all__ = ["synthetic_batch", "synthetic_batches", "segment_rows", "packed_pair_rows",
           "pair_rows"]


def _empty_rows(batch_size: int, seq_len: int) -> dict[str, np.ndarray]:
    out = {k: np.zeros((batch_size, seq_len), np.int32) for k in FEATURES}
    out["input_ids"][:] = PAD_ID
    return out


def _real_lengths(rng: np.random.Generator, batch_size: int, seq_len: int, min_len: int,
                  pad_fraction: float) -> np.ndarray:
    """Per-row number of real tokens; on average ~pad_fraction of a row is padding."""
    max_pad = int(round(2 * pad_fraction * seq_len))
    pads = rng.integers(0, max_pad + 1, size=batch_size) if max_pad > 0 else np.zeros(
        batch_size, np.int64)
    return np.clip(seq_len - pads, min_len, seq_len)


def _pieces(rng: np.random.Generator, n: int, vocab_size: int) -> np.ndarray:
    return rng.integers(FIRST_PIECE_ID, vocab_size - 1, size=n, dtype=np.int64).astype(np.int32)


def _put(out: dict[str, np.ndarray], r: int, start: int, ids: np.ndarray, seg: int,
         sides: np.ndarray, langs: np.ndarray) -> int:
    n = len(ids)
    out["input_ids"][r, start:start + n] = ids
    out["positions"][r, start:start + n] = np.arange(n)
    out["segment_ids"][r, start:start + n] = seg
    out["pair_side"][r, start:start + n] = sides
    out["lang_ids"][r, start:start + n] = langs
    return start + n


def segment_rows(rng, batch_size, seq_len, vocab_size, pad_fraction, num_languages):
    """One `<s> w .. w </s>` segment per row."""
    out = _empty_rows(batch_size, seq_len)
    for r, n in enumerate(_real_lengths(rng, batch_size, seq_len, 3, pad_fraction)):
        ids = np.concatenate([[BOS_ID], _pieces(rng, n - 2, vocab_size), [EOS_ID]])
        lang = rng.integers(1, num_languages + 1)
        _put(out, r, 0, ids, 1, np.ones(n), np.full(n, lang))
    return out


def _pair(rng, length, vocab_size, num_languages, seg):
    """One `<s> a </s></s> b </s>` pair of `length` >= 6 tokens, as `_put` arguments."""
    na = int(rng.integers(1, length - 4))  # first side pieces; second gets length - 4 - na >= 1
    nb = length - 4 - na
    la, lb = rng.integers(1, num_languages + 1, size=2)
    ids = np.concatenate([[BOS_ID], _pieces(rng, na, vocab_size), [EOS_ID, EOS_ID],
                          _pieces(rng, nb, vocab_size), [EOS_ID]])
    sides = np.concatenate([np.full(na + 2, 1), np.full(nb + 2, 2)])
    langs = np.concatenate([np.full(na + 2, la), np.full(nb + 2, lb)])
    return ids, seg, sides, langs


def _pair_rows(rng, batch_size, seq_len, vocab_size, pad_fraction, num_languages, packed):
    """Rows of pairs: several packed pairs per row (`packed`), else one pair filling the row."""
    out = _empty_rows(batch_size, seq_len)
    max_pair = max(6, min(seq_len, 64))
    for r, n in enumerate(_real_lengths(rng, batch_size, seq_len, 6, pad_fraction)):
        if not packed:
            _put(out, r, 0, *_pair(rng, int(n), vocab_size, num_languages, seg=1))
            continue
        start, seg = 0, 1
        while n - start >= 6:
            length = int(rng.integers(6, min(n - start, max_pair) + 1))
            start = _put(out, r, start, *_pair(rng, length, vocab_size, num_languages, seg))
            seg += 1
    return out


def packed_pair_rows(rng, batch_size, seq_len, vocab_size, pad_fraction, num_languages):
    """Several `<s> a </s></s> b </s>` pairs packed into each row."""
    return _pair_rows(rng, batch_size, seq_len, vocab_size, pad_fraction, num_languages, True)


def pair_rows(rng, batch_size, seq_len, vocab_size, pad_fraction, num_languages):
    """One `<s> a </s></s> b </s>` pair per row."""
    return _pair_rows(rng, batch_size, seq_len, vocab_size, pad_fraction, num_languages, False)


def synthetic_batch(batch_size: int, seq_len: int, vocab_size: int, kind: str = "mono",
                    seed: int = 0, pad_fraction: float = 0.1, num_languages: int = 2
                    ) -> dict[str, np.ndarray]:
    """One synthetic batch of `kind` (a name of `features.KINDS`): int32 [B, T] arrays.

    pad_fraction: the mean share of padding per row (0 gives full rows); num_languages: the
    language ids drawn are 1..num_languages. Deterministic for a seed.
    """
    record = example_kind(kind, "synthetic_batch")
    for name, value, low in (("batch_size", batch_size, 1),
                             ("seq_len", seq_len, record.min_length),
                             ("vocab_size", vocab_size, FIRST_PIECE_ID + 2),
                             ("num_languages", num_languages, 1)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"synthetic_batch(kind={kind!r}): {name} must be an int >= {low}, "
                             f"got {value!r}")
    if not 0.0 <= pad_fraction < 1.0:
        raise ValueError(f"synthetic_batch: pad_fraction must be in [0, 1), got {pad_fraction!r}")
    rng = np.random.default_rng(seed)
    rows = record.synthetic_rows.load()
    out = {}
    for prefix in record.prefixes:
        part = rows(rng, batch_size, seq_len, vocab_size, pad_fraction, num_languages)
        out.update({prefix + k: v for k, v in part.items()})
    return out


def synthetic_batches(batch_size: int, seq_len: int, vocab_size: int, kind: str = "mono",
                      seed: int = 0, pad_fraction: float = 0.1, num_languages: int = 2,
                      start_step: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """An endless deterministic stream of `synthetic_batch`es; batch i uses seed (seed, i),
    so `start_step=k` continues exactly where an uninterrupted stream is at step k."""
    step = start_step
    while True:
        yield synthetic_batch(batch_size, seq_len, vocab_size, kind,
                              seed=np.random.SeedSequence([seed, step]).generate_state(1)[0],
                              pad_fraction=pad_fraction, num_languages=num_languages)
        step += 1
