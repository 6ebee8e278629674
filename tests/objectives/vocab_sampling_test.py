"""Tests for xlm_jax.objectives.vocab_sampling: both samplers draw from softmax(logits).

The oracle is the softmax itself (numpy): a Pearson chi-square test of many draws against it,
at a fixed key (so each run sees the same draws; the bound is far in the tail, a sampler with
a wrong chunk weight or a wrong within-chunk draw lands far above it).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import attention_backends
from xlm_jax.models.heads import PADDED_LOGIT
from xlm_jax.objectives import vocab_sampling

VOCAB, DRAWS = 37, 60_000


def _logits() -> np.ndarray:
    """A vocabulary of 37 (not a multiple of the chunk: a padded last chunk) with ids that can
    never be drawn: a -inf one, a PADDED_LOGIT one, and a whole chunk of them (ids 8-15)."""
    x = np.random.default_rng(0).normal(scale=1.5, size=VOCAB).astype(np.float32)
    x[3] = -np.inf
    x[8:16] = PADDED_LOGIT
    x[30] = PADDED_LOGIT
    return x


def _chi_square(ids: np.ndarray, logits: np.ndarray) -> tuple[float, int]:
    """(Pearson's statistic, degrees of freedom) of the draws against softmax(logits)."""
    p = np.exp(logits.astype(np.float64) - logits.max())
    p /= p.sum()
    counts = np.bincount(ids, minlength=VOCAB)
    live = p > 0
    assert counts[~live].sum() == 0, f"drew impossible ids {np.nonzero(counts * ~live)[0]}"
    expected = p[live] * len(ids)
    return float(np.sum((counts[live] - expected) ** 2 / expected)), int(live.sum() - 1)


@pytest.mark.parametrize("method,chunk", [("gumbel", 8), ("two_level", 8), ("two_level", 5),
                                          ("two_level", 64)])
def test_draws_follow_the_softmax(method, chunk):
    logits = _logits()
    rows = jnp.broadcast_to(jnp.asarray(logits), (DRAWS, VOCAB))
    ids = np.asarray(jax.jit(vocab_sampling.categorical, static_argnums=(2, 3))(
        jax.random.key(7), rows, method, chunk))
    assert ids.shape == (DRAWS,) and ids.dtype == np.int32
    stat, dof = _chi_square(ids, logits)
    # 27 live ids, 26 degrees of freedom: P(chi2 > 70) = 7e-6 for a correct sampler
    assert dof == 26 and stat < 70.0, (method, chunk, stat)


def test_a_wrongly_weighted_chunk_is_caught():
    """The test above can fail: the two-level draw with each chunk chosen uniformly (its
    mass ignored) is far from the softmax."""
    logits = _logits()
    key = jax.random.key(7)
    rows = jnp.broadcast_to(jnp.asarray(logits), (DRAWS, VOCAB))
    flat = np.asarray(vocab_sampling.categorical(key, rows, "two_level", 8))
    original = vocab_sampling.choose_chunk
    try:
        vocab_sampling.choose_chunk = lambda mass, u: original(jnp.where(mass > 0, 1.0, 0.0), u)
        skewed = np.asarray(vocab_sampling.categorical(key, rows, "two_level", 8))
    finally:
        vocab_sampling.choose_chunk = original
    assert _chi_square(flat, logits)[0] < 70.0
    assert _chi_square(skewed, logits)[0] > 1000.0


def test_choose_chunk_is_the_inverse_cdf_and_skips_empty_chunks():
    mass = jnp.asarray([[0.0, 1.0, 0.0, 3.0, 0.0]] * 6)
    u = jnp.asarray([0.0, 0.2499, 0.25, 0.9, 0.99999994, 1.0])  # 1.0: rounding's worst case
    picked = vocab_sampling.choose_chunk(mass, u)
    np.testing.assert_array_equal(np.asarray(picked), [1, 1, 3, 3, 3, 3])


def test_leading_axes_and_per_row_keys_as_xlme_uses_them():
    """[rows, predictions, V] with one key per row under vmap, as the objective draws."""
    logits = jnp.asarray(np.random.default_rng(1).normal(size=(3, 4, VOCAB)), jnp.float32)
    keys = jax.random.split(jax.random.key(0), 3)
    ids = jax.vmap(lambda k, lg: vocab_sampling.categorical(k, lg, "two_level", 8))(keys, logits)
    assert ids.shape == (3, 4) and int(ids.min()) >= 0 and int(ids.max()) < VOCAB
    again = jax.vmap(lambda k, lg: vocab_sampling.categorical(k, lg, "two_level", 8))(keys, logits)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(again))  # a function of the key
    gumbel = jax.vmap(lambda k, lg: jax.random.categorical(k, lg, axis=-1))(keys, logits)
    same = jax.vmap(lambda k, lg: vocab_sampling.categorical(k, lg, "gumbel"))(keys, logits)
    np.testing.assert_array_equal(np.asarray(same), np.asarray(gumbel))  # the old draws


def test_auto_is_two_level_when_lowered_for_a_gpu_and_gumbel_otherwise():
    logits = jnp.asarray(np.random.default_rng(2).normal(size=(5, VOCAB)), jnp.float32)
    key = jax.random.key(3)
    draws = {m: np.asarray(vocab_sampling.categorical(key, logits, m))
             for m in ("gumbel", "two_level")}
    assert (draws["gumbel"] != draws["two_level"]).any()  # the two can be told apart
    for platform, expected in (("cpu", "gumbel"), ("tpu", "gumbel"), ("cuda", "two_level")):
        with attention_backends.lowering_for(platform):
            assert vocab_sampling.resolve("auto") == expected
            got = np.asarray(vocab_sampling.categorical(key, logits, "auto"))
        np.testing.assert_array_equal(got, draws[expected])
    assert vocab_sampling.resolve("two_level") == "two_level"


def test_bad_method_and_chunk_are_one_line_errors():
    with pytest.raises(ValueError, match=r"sampler='top_k' must be one of gumbel, two_level, auto"):
        vocab_sampling.categorical(jax.random.key(0), jnp.zeros((2, 4)), "top_k")
    with pytest.raises(ValueError, match=r"chunk=0 must be >= 1"):
        vocab_sampling.categorical(jax.random.key(0), jnp.zeros((2, 4)), "two_level", 0)
