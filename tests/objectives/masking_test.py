"""Tests for xlm_jax.objectives.masking: rates, 80/10/10, specials, targets, jit, determinism."""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.objectives import masking

PAD, BOS, EOS, UNK = 1, 0, 2, 3
MASK = 999
CFG = masking.MaskingConfig(mask_prob=0.15, max_predictions=40, mask_id=MASK, vocab_size=1000,
                            first_regular_id=4)
# Compiled once per shape; eager dispatch of every op is far slower on CPU.
_mask = jax.jit(masking.mask_tokens, static_argnums=3)


def _batch(batch=256, length=128, seed=0):
    """XLM-R-like rows: <s> tokens </s> then pads, varying lengths, a few <unk> and <mask>."""
    rng = np.random.default_rng(seed)
    ids = np.full((batch, length), PAD, np.int32)
    for b in range(batch):
        n = int(rng.integers(8, length + 1))
        row = rng.integers(4, MASK, n).astype(np.int32)
        row[0], row[n - 1] = BOS, EOS
        row[rng.integers(1, n - 1, 2)] = UNK
        row[rng.integers(1, n - 1, 1)] = MASK  # an existing <mask> is never a target
        ids[b, :n] = row
    return ids


def _check_consistency(ids, out, cfg=CFG):
    """The structural invariants every output must satisfy."""
    ids = np.asarray(ids)
    pos = np.asarray(out.target_positions)
    tid = np.asarray(out.target_ids)
    w = np.asarray(out.target_weights)
    sel = np.asarray(out.selected)
    corrupted = np.asarray(out.input_ids)
    assert pos.shape == tid.shape == w.shape == (ids.shape[0], cfg.max_predictions)
    assert pos.dtype == np.int32 and w.dtype == np.float32 and sel.dtype == bool
    for b in range(ids.shape[0]):
        k = int(w[b].sum())
        assert np.all(w[b, :k] == 1) and np.all(w[b, k:] == 0)  # predictions left-aligned
        assert np.all(pos[b, k:] == 0) and np.all(tid[b, k:] == 0)
        assert np.all(np.diff(pos[b, :k]) > 0)  # ascending, no duplicates
        assert set(pos[b, :k].tolist()) == set(np.flatnonzero(sel[b]).tolist())
        np.testing.assert_array_equal(tid[b, :k], ids[b, pos[b, :k]])  # targets = originals
    np.testing.assert_array_equal(corrupted[~sel], ids[~sel])  # nothing else touched


def test_selection_rate_is_mask_prob_over_eligible():
    ids = _batch()
    out = _mask(jax.random.PRNGKey(0), jnp.asarray(ids), None, CFG)
    _check_consistency(ids, out)
    eligible = (ids >= 4) & (ids != MASK)
    sel = np.asarray(out.selected)
    rate = sel.sum() / eligible.sum()
    assert abs(rate - 0.15) < 0.01, rate
    # Per row: k = floor(0.15 n + u), i.e. floor or ceil of 0.15 n (P=40 never binds here).
    n = eligible.sum(1)
    k = sel.sum(1)
    assert np.all((k == np.floor(0.15 * n)) | (k == np.ceil(0.15 * n)))
    assert k.max() < CFG.max_predictions
    # Probabilistic rounding is unbiased: E[k] = 0.15 n (plain floor would be ~0.5 low per row).
    assert abs(np.mean(k - 0.15 * n)) < 0.1


def test_max_predictions_caps_the_count():
    cfg = masking.MaskingConfig(mask_prob=0.5, max_predictions=5, mask_id=MASK, vocab_size=1000)
    ids = _batch(64, 64, seed=1)
    out = _mask(jax.random.PRNGKey(1), jnp.asarray(ids), None, cfg)
    _check_consistency(ids, out, cfg)
    n = ((ids >= 4) & (ids != MASK)).sum(1)
    k = np.asarray(out.selected).sum(1)
    want_lo = np.minimum(np.floor(0.5 * n), 5)
    want_hi = np.minimum(np.ceil(0.5 * n), 5)
    assert np.all((k == want_lo) | (k == want_hi))
    assert k.max() == 5 and np.sum(0.5 * n >= 5) > 50  # the cap binds in most rows


def test_80_10_10_split():
    ids = _batch(512, 128, seed=2)
    out = _mask(jax.random.PRNGKey(2), jnp.asarray(ids), None, CFG)
    sel = np.asarray(out.selected)
    new = np.asarray(out.input_ids)[sel]
    old = ids[sel]
    n = sel.sum()
    masked = np.mean(new == MASK)
    kept = np.mean(new == old)
    random = np.mean((new != MASK) & (new != old))
    # A random draw equal to the original counts as "kept": 1/995 of 10%, negligible.
    assert abs(masked - 0.8) < 0.02 and abs(kept - 0.1) < 0.02 and abs(random - 0.1) < 0.02, (
        n, masked, kept, random)
    rnd_ids = new[(new != MASK) & (new != old)]
    assert rnd_ids.min() >= 4 and rnd_ids.max() < MASK  # random ids are regular ids only
    assert len(np.unique(rnd_ids)) > 200  # spread over the vocabulary


def test_specials_pads_and_mask_never_selected():
    ids = _batch(seed=3)
    out = _mask(jax.random.PRNGKey(3), jnp.asarray(ids), None, CFG)
    sel = np.asarray(out.selected)
    assert sel.any()
    assert not sel[ids < 4].any() and not sel[ids == MASK].any()
    corrupted = np.asarray(out.input_ids)
    np.testing.assert_array_equal(corrupted[ids < 4], ids[ids < 4])
    # An explicit `eligible` narrows the choice and still cannot re-admit specials.
    first_half = np.zeros_like(ids, bool)
    first_half[:, :40] = True
    out2 = _mask(jax.random.PRNGKey(3), jnp.asarray(ids), jnp.asarray(first_half),
                               CFG)
    sel2 = np.asarray(out2.selected)
    assert sel2.any() and not sel2[:, 40:].any() and not sel2[ids < 4].any()
    _check_consistency(ids, out2)


def test_rows_without_eligible_tokens_get_no_predictions():
    ids = np.full((3, 16), PAD, np.int32)
    ids[1, :4] = [BOS, 10, 11, EOS]
    out = _mask(jax.random.PRNGKey(0), jnp.asarray(ids), None, CFG)
    _check_consistency(ids, out)
    assert np.asarray(out.target_weights)[[0, 2]].sum() == 0


def test_selection_is_uniform_over_eligible_positions():
    ids = np.full((1, 32), PAD, np.int32)
    ids[0, :22] = np.arange(100, 122)
    ids[0, 0], ids[0, 21] = BOS, EOS  # 20 eligible tokens at positions 1..20
    draws = jax.jit(jax.vmap(
        lambda k: masking.mask_tokens(k, jnp.asarray(ids), None, CFG).selected[0]))(
        jax.random.split(jax.random.PRNGKey(4), 4000))
    counts = np.asarray(draws).sum(0)
    assert counts[0] == 0 and counts[21:].sum() == 0
    expected = 4000 * 3 / 20  # k = 3 always (0.15 * 20 = 3 exactly)
    chi2 = float(np.sum((counts[1:21] - expected) ** 2 / expected))
    assert chi2 < 45, (chi2, counts)  # chi-square(19) 99.9th percentile is 43.8


def test_jit_matches_eager():
    ids = jnp.asarray(_batch(8, 32, seed=5))
    key = jax.random.PRNGKey(5)
    eager = masking.mask_tokens(key, ids, None, CFG)
    jitted = jax.jit(masking.mask_tokens, static_argnums=3)(key, ids, None, CFG)
    for a, b in zip(jax.tree_util.tree_leaves(eager), jax.tree_util.tree_leaves(jitted)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert jax.tree_util.tree_leaves(jitted)[0].shape == (8, 32)


def test_deterministic_for_a_given_rng():
    ids = jnp.asarray(_batch(16, 64, seed=6))
    a = _mask(jax.random.PRNGKey(7), ids, None, CFG)
    b = _mask(jax.random.PRNGKey(7), ids, None, CFG)
    c = _mask(jax.random.PRNGKey(8), ids, None, CFG)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert not np.array_equal(np.asarray(a.selected), np.asarray(c.selected))


def test_more_slots_than_tokens():
    cfg = masking.MaskingConfig(mask_prob=1.0, max_predictions=12, mask_id=MASK, vocab_size=1000)
    ids = np.array([[BOS, 5, 6, 7, EOS, PAD, PAD, PAD]], np.int32)
    out = _mask(jax.random.PRNGKey(0), jnp.asarray(ids), None, cfg)
    _check_consistency(ids, out, cfg)
    np.testing.assert_array_equal(np.asarray(out.target_positions)[0, :4], [1, 2, 3, 0])
    assert float(out.target_weights.sum()) == 3


@pytest.mark.parametrize("kwargs, field", [
    ({"mask_prob": 0.0}, "mask_prob"),
    ({"max_predictions": 0}, "max_predictions"),
    ({"mask_token_prob": 1.2}, "mask_token_prob"),
    ({"random_token_prob": 0.3}, "random_token_prob"),
    ({"mask_id": 3}, "mask_id"),
    ({"vocab_size": 250001}, "vocab_size"),
    ({"first_regular_id": -1}, "first_regular_id"),
])
def test_config_validation(kwargs, field):
    with pytest.raises(ValueError, match=rf"MaskingConfig\.{field}=") as e:
        masking.MaskingConfig(**kwargs)
    assert "\n" not in str(e.value)
    assert repr(kwargs[field]) in str(e.value)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match=r"input_ids must be \[batch, length\], got shape \(5,\)"):
        masking.mask_tokens(jax.random.PRNGKey(0), jnp.ones((5,), jnp.int32), None, CFG)
    with pytest.raises(ValueError, match=r"eligible has shape \(2, 3\) but input_ids has \(2, 4\)"):
        masking.mask_tokens(jax.random.PRNGKey(0), jnp.ones((2, 4), jnp.int32),
                            jnp.ones((2, 3), bool), CFG)


def test_xlmr_defaults():
    cfg = masking.MaskingConfig()
    assert (cfg.mask_id, cfg.vocab_size, cfg.first_regular_id) == (250001, 250002, 4)
    assert math.isclose(1 - cfg.mask_token_prob - cfg.random_token_prob, 0.1)
