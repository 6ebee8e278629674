"""Golden tests for xlm_jax.models.masks: expected boolean matrices written out by hand."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models import masks


def _m(rows: str) -> np.ndarray:
    """'110 / 010' -> bool matrix, so expected masks read like pictures."""
    return np.array([[c == "1" for c in r] for r in rows.split()], bool)


def _check(got, *expected_per_example):
    got = np.asarray(got)
    assert got.dtype == bool
    expected = np.stack([e[None] for e in expected_per_example])  # [B, 1, Tq, Tk]
    assert got.shape == expected.shape, (got.shape, expected.shape)
    np.testing.assert_array_equal(got, expected)


def test_padding_mask_self():
    valid = np.array([[1, 1, 0], [1, 0, 0]], bool)
    _check(masks.padding_mask(valid), _m("110 110 000"), _m("100 000 000"))


def test_padding_mask_cross():
    valid_q = np.array([[1, 0]], bool)
    valid_k = np.array([[1, 1, 0]], bool)
    _check(masks.padding_mask(valid_q, valid_k), _m("110 000"))


def test_segment_mask_packing():
    seg = np.array([[1, 1, 2, 0], [3, 3, 3, 3]])
    _check(
        masks.segment_mask(seg),
        _m("1100 1100 0010 0000"),
        _m("1111 1111 1111 1111"),
    )


def test_segment_mask_cross():
    seg_q = np.array([[1, 2]])
    seg_k = np.array([[2, 1, 0]])
    _check(masks.segment_mask(seg_q, seg_k), _m("010 100"))


def test_causal_mask():
    pos = np.array([[0, 1, 2]])
    _check(masks.causal_mask(pos), _m("100 110 111"))
    # cross: queries at positions 1 and 3 against keys at 0..3
    _check(masks.causal_mask(np.array([[1, 3]]), np.array([[0, 1, 2, 3]])), _m("1100 1111"))


def test_packing_plus_causal_combined():
    seg = np.array([[1, 1, 1, 2, 2, 0]])
    pos = np.array([[0, 1, 2, 0, 1, 0]])
    expected = _m("""
        100000
        110000
        111000
        000100
        000110
        000000
        """)
    _check(masks.combine(masks.segment_mask(seg), masks.causal_mask(pos)), expected)
    _check(masks.mask_from_features({"segment_ids": seg, "positions": pos}, "causal"), expected)
    # Without positions the token index is used; within segments that is the same triangle.
    _check(masks.mask_from_features({"segment_ids": seg}, "causal"), expected)


def test_camlm_mask():
    # sides: 1 1 | 2 2 2 | pad
    side = np.array([[1, 1, 2, 2, 2, 0]])
    expected = _m("""
        101110
        011110
        111000
        110100
        110010
        000000
        """)
    _check(masks.camlm_mask(side), expected)


def test_btmlm_stage1_mask():
    # source 1 1 1, placeholders 2 2, pad
    side = np.array([[1, 1, 1, 2, 2, 0]])
    expected = _m("""
        111000
        111000
        111000
        111100
        111010
        000000
        """)
    _check(masks.btmlm_stage1_mask(side), expected)


def test_batch_rows_are_independent():
    sides = np.array([[1, 2, 0], [2, 1, 1]])
    _check(masks.camlm_mask(sides), _m("110 110 000"), _m("111 110 101"))


def test_side_rule_mask_custom_table_cross():
    # 2 sides + pad; side 1 may see side 2 only, side 2 sees everything real.
    allowed = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 1]], bool)
    side_q = np.array([[1, 2]])
    side_k = np.array([[2, 1, 0, 2]])
    _check(masks.side_rule_mask(side_q, side_k, allowed, include_self=False), _m("1001 1101"))


def test_side_rule_mask_include_self_skips_padding():
    allowed = np.zeros((3, 3), bool)
    side = np.array([[1, 0, 2]])
    _check(masks.side_rule_mask(side, side, allowed, include_self=True), _m("100 000 001"))


def test_combine():
    a = jnp.asarray(_m("11 01")[None, None])  # [1, 1, 2, 2]
    b = jnp.asarray(np.array([_m("10 11"), _m("01 11")])[None])  # [1, 2, 2, 2] (per head)
    got = np.asarray(masks.combine(a, None, b))
    np.testing.assert_array_equal(got, np.array([_m("10 01"), _m("01 01")])[None])
    assert masks.combine(None, None) is None
    assert masks.combine() is None
    np.testing.assert_array_equal(np.asarray(masks.combine(None, a)), np.asarray(a))


def test_mask_from_features_bidirectional_with_valid_and_segments():
    valid = np.array([[1, 1, 0]], bool)
    _check(masks.mask_from_features({"valid": valid}), _m("110 110 000"))
    # segment_ids take precedence over valid
    seg = np.array([[1, 2, 2]])
    _check(
        masks.mask_from_features({"segment_ids": seg, "valid": np.ones((1, 3), bool)}),
        _m("100 011 011"),
    )


def test_mask_from_features_camlm_packed_pairs_stay_apart():
    seg = np.array([[1, 1, 1, 2, 2, 2]])
    side = np.array([[1, 1, 2, 1, 2, 2]])
    expected = _m("""
        101000
        011000
        111000
        000111
        000110
        000101
        """)
    _check(masks.mask_from_features({"segment_ids": seg, "pair_side": side}, "camlm"), expected)
    # pair_side alone (no segment ids) would let the two packed pairs see each other:
    alone = np.asarray(masks.mask_from_features({"pair_side": side}, "camlm"))
    assert alone[0, 0, 0, 4]


def test_mask_from_features_btmlm_stage1():
    valid = np.array([[1, 1, 1, 1, 0]], bool)
    side = np.array([[1, 1, 2, 2, 0]])
    _check(
        masks.mask_from_features({"valid": valid, "pair_side": side}, "btmlm_stage1"),
        _m("11000 11000 11100 11010 00000"),
    )


def test_masks_work_under_jit():
    side = jnp.asarray([[1, 1, 2, 2, 2, 0]])
    np.testing.assert_array_equal(
        np.asarray(jax.jit(masks.camlm_mask)(side)), np.asarray(masks.camlm_mask(side))
    )
    feats = {"segment_ids": jnp.asarray([[1, 1, 2, 0]]), "positions": jnp.asarray([[0, 1, 0, 0]])}
    jitted = jax.jit(lambda f: masks.mask_from_features(f, "causal"))(feats)
    _check(jitted, _m("1000 1100 0010 0000"))


# ---------------------------------------------------------------- bad input


def test_include_self_needs_equal_lengths():
    with pytest.raises(ValueError, match=r"include_self=True needs Tq == Tk.*\(1, 2\).*\(1, 3\)"):
        masks.side_rule_mask(
            np.array([[1, 2]]), np.array([[1, 2, 0]]), np.ones((3, 3), bool), include_self=True
        )


def test_side_out_of_range():
    with pytest.raises(ValueError, match=r"side_q values must be in \[0, 3\).*\[1, 3\]"):
        masks.camlm_mask(np.array([[1, 3, 2]]))


def test_allowed_table_not_square():
    with pytest.raises(ValueError, match=r"square.*\(2, 3\)"):
        masks.side_rule_mask(
            np.array([[1]]), np.array([[1]]), np.ones((2, 3), bool), include_self=False
        )


def test_feature_not_2d():
    with pytest.raises(ValueError, match=r"valid_q must be 2-D.*\(3,\)"):
        masks.padding_mask(np.ones(3, bool))


def test_batch_mismatch():
    with pytest.raises(ValueError, match="differ in batch size"):
        masks.segment_mask(np.ones((2, 3), int), np.ones((1, 3), int))


def test_unknown_kind_lists_valid_kinds():
    with pytest.raises(
        ValueError, match=r"'prefix_lm'.*bidirectional.*causal.*camlm.*btmlm_stage1"
    ):
        masks.mask_from_features({"valid": np.ones((1, 2), bool)}, "prefix_lm")


def test_missing_pair_side_named():
    with pytest.raises(ValueError, match=r"'camlm' needs feature 'pair_side'.*\['valid'\]"):
        masks.mask_from_features({"valid": np.ones((1, 2), bool)}, "camlm")


def test_missing_base_feature_named():
    with pytest.raises(ValueError, match=r"'segment_ids' or 'valid'.*\['positions'\]"):
        masks.mask_from_features({"positions": np.zeros((1, 2), int)}, "causal")
