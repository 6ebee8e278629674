"""A seeded permutation of `[0, n)` computed index by index, in O(1) memory.

A prepared corpus (`xlm_jax.data.prepared`) is shuffled globally, over all of its records,
not through a buffer: position `i` of epoch `e` reads record `permute(i)` of a permutation
drawn from `(seed, e)`. Materialising that permutation would cost 8 bytes per record on every
host (CC-100 English has hundreds of millions of documents) and a restore would have to
rebuild it; this one is a function of the index. It is the construction grain and
`tf.random.experimental.index_shuffle` use: a keyed Feistel network (a bijection on
`[0, 2^k)`, 2^k the first even power of two >= n) and cycle walking (a value >= n is mapped
again until it falls in `[0, n)`, which keeps the map a bijection of `[0, n)`; fewer than four
rounds of walking are expected since 2^k < 4n). Round keys come from
`numpy.random.SeedSequence(seed words)`; the round function is SplitMix64's finaliser.

Not a cryptographic permutation, and not the same permutation as grain's or TensorFlow's
(our choice: numpy only, so the reader needs no TensorFlow). numpy only.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["IndexShuffle"]

_ROUNDS = 6
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


class IndexShuffle:
    """`self(indices)`: the images of `indices` (ints in `[0, n)`) under a permutation of
    `[0, n)` fixed by `seed_words` (any non-negative ints: a seed, an epoch, a salt)."""

    def __init__(self, n: int, seed_words: Sequence[int]) -> None:
        if n < 1:
            raise ValueError(f"IndexShuffle: n must be >= 1, got {n}")
        self.n = int(n)
        bits = max(2, (self.n - 1).bit_length())
        bits += bits % 2
        self._half = np.uint64(bits // 2)
        self._mask = np.uint64((1 << (bits // 2)) - 1)
        words = [int(w) % 2**32 for w in seed_words] or [0]
        self._keys = np.random.SeedSequence(words).generate_state(_ROUNDS, np.uint64)

    def _round_trip(self, x: np.ndarray) -> np.ndarray:
        left, right = x >> self._half, x & self._mask
        for key in self._keys:
            left, right = right, left ^ (_mix(right ^ key) & self._mask)
        return (left << self._half) | right

    def __call__(self, indices: np.ndarray | Sequence[int] | int) -> np.ndarray:
        x = np.asarray(indices, dtype=np.int64)
        if x.size and (x.min() < 0 or x.max() >= self.n):
            raise ValueError(f"IndexShuffle: indices must be in [0, {self.n})")
        with np.errstate(over="ignore"):
            y = self._round_trip(np.atleast_1d(x).astype(np.uint64))
            walking = y >= self.n
            while walking.any():
                y[walking] = self._round_trip(y[walking])
                walking = y >= self.n
        return y.astype(np.int64).reshape(x.shape)
