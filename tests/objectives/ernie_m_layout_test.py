"""ERNIE-M: BTMLM stage 1's row is laid out as CAMLM's row of the same sentence pair, with
placeholders where CAMLM has the target sentence (separators, segments, sides, language ids
and positions), under both settings of `RESTART_TARGET_POSITIONS`; the expectation is written
out by hand here, not computed by the code under test. The run files bind BTMLM's setting to
CAMLM's."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from xlm_jax.models.config import get_config
from xlm_jax.models.transformer import Transformer
from xlm_jax.objectives import ernie_m
from xlm_jax.objectives.ernie_m import BackTranslationMLM, CrossAttentionMLM

V, MASK, BOS, EOS, PAD = 64, 63, 0, 2, 1
NET = Transformer(get_config("tiny", vocab_size=V, num_layers=1, hidden_size=16, num_heads=2,
                             mlp_dim=32, max_positions=16, num_languages=4))
DE, EN = 2, 1  # the row's language and BTMLM's only other target language (en=1, de=2)
ROW_LEN = 12
SOURCE = [BOS, 10, 11, 12, EOS]  # <s> a b c </s>, German
TARGET = [20, 21]  # a two-token English translation: two placeholders at proportion 0.4


@dataclasses.dataclass(frozen=True)
class Layout:
    """One row's token layout: what BTMLM's stage 1 and CAMLM must agree on."""

    input_ids: list[int]
    positions: list[int]
    segment_ids: list[int]
    pair_side: list[int]
    lang_ids: list[int]


def _expected(restart: bool, target: list[int]) -> Layout:
    """`<s> a b c </s></s> t t </s>` with 3 pads, written out token by token."""
    tgt_positions = [0, 1, 2, 3] if restart else [5, 6, 7, 8]
    return Layout(input_ids=SOURCE + [EOS] + target + [EOS] + [PAD] * 3,
                  positions=[0, 1, 2, 3, 4] + tgt_positions + [0] * 3,
                  segment_ids=[1] * 9 + [0] * 3,
                  pair_side=[1] * 5 + [2] * 4 + [0] * 3,
                  lang_ids=[DE] * 5 + [EN] * 4 + [0] * 3)


def _row(ids: list[int], sides: list[int], langs: list[int]) -> dict[str, jax.Array]:
    """One row as the data pipeline gives it (positions 0..n-1 across a pair), padded."""
    n, pad = len(ids), ROW_LEN - len(ids)
    return {"input_ids": jnp.asarray([ids + [PAD] * pad]),
            "positions": jnp.asarray([list(range(n)) + [0] * pad]),
            "segment_ids": jnp.asarray([[1] * n + [0] * pad]),
            "pair_side": jnp.asarray([sides + [0] * pad]),
            "lang_ids": jnp.asarray([langs + [0] * pad])}


def _layout(prepared: dict[str, jax.Array], ids_key: str) -> Layout:
    return Layout(*(np.asarray(prepared[k])[0].tolist()
                    for k in (ids_key, "positions", "segment_ids", "pair_side", "lang_ids")))


def _btmlm(restart: bool) -> dict[str, jax.Array]:
    obj = BackTranslationMLM(NET, languages=["en", "de", "fr"], target_languages=["en", "de"],
                             proportion=0.4, max_predictions=2, restart_positions=restart)
    return obj.prepare(_row(SOURCE, [1] * 5, [DE] * 5), jax.random.PRNGKey(0))


def _camlm(restart: bool) -> dict[str, jax.Array]:
    pair = SOURCE + [EOS] + TARGET + [EOS]
    obj = CrossAttentionMLM(NET, max_predictions=2, restart_positions=restart)
    return obj.prepare(_row(pair, [1] * 5 + [2] * 4, [DE] * 5 + [EN] * 4),
                       jax.random.PRNGKey(0))


@pytest.mark.parametrize("restart", [True, False], ids=["restart", "running_on"])
def test_stage1_row_is_a_camlm_row_with_placeholders_for_the_target(restart):
    stage1 = _btmlm(restart)
    assert _layout(stage1, "stage1_ids") == _expected(restart, [MASK, MASK])
    # the placeholders are read where CAMLM's target tokens stand
    w = np.asarray(stage1["placeholder_weights"])[0] > 0
    np.testing.assert_array_equal(np.asarray(stage1["placeholder_positions"])[0][w], [6, 7])

    camlm = _camlm(restart)
    # CAMLM's prepared row (its own masking aside) has the same layout with the target in it
    got = dataclasses.replace(_layout(camlm, "input_ids"),
                              input_ids=_expected(restart, TARGET).input_ids)
    assert got == _expected(restart, TARGET)
    # ... and stage 1's visibility is that of CAMLM's target pass: the target side sees the
    # sentence and itself, the sentence sees itself
    np.testing.assert_array_equal(
        ernie_m.visibility(stage1, "btmlm_stage1").materialise(),
        ernie_m.visibility(camlm, "camlm_tgt").materialise())


def test_stage2_row_keeps_the_layout_with_the_pseudo_tokens_in_it():
    obj = BackTranslationMLM(NET, languages=["en", "de", "fr"], target_languages=["en", "de"],
                             proportion=0.4, max_predictions=2, restart_positions=True)
    prepared = obj.prepare(_row(SOURCE, [1] * 5, [DE] * 5), jax.random.PRNGKey(0))
    pseudo = ernie_m.PseudoTokens(ids=jnp.asarray([[30, 31, 0, 0]]),
                                  weights=prepared["placeholder_weights"])
    ids = np.asarray(obj.stage2_ids(prepared, pseudo))[0]
    np.testing.assert_array_equal(ids[5:9], [EOS, 30, 31, EOS])
    assert (ids[9:] == PAD).all()


def test_a_cut_sentence_leaves_room_for_the_target_side():
    """A sentence longer than (T - 2) / (1 + proportion) is cut (ending in `</s>`), and the
    row still ends its target side with `</s>` inside T."""
    obj = BackTranslationMLM(NET, languages=["en", "de", "fr"], target_languages=["en", "de"],
                             proportion=0.4, max_predictions=2)
    long = [BOS] + list(range(10, 20)) + [EOS]  # 12 tokens: the whole row
    prepared = obj.prepare(_row(long, [1] * 12, [DE] * 12), jax.random.PRNGKey(0))
    keep = int((ROW_LEN - 2) // 1.4)  # 7
    m = int(np.floor(0.4 * keep + 0.5))  # 3
    ids = np.asarray(prepared["stage1_ids"])[0]
    np.testing.assert_array_equal(ids, long[:keep - 1] + [EOS, EOS] + [MASK] * m + [EOS])
    np.testing.assert_array_equal(np.asarray(prepared["pair_side"])[0],
                                  [1] * keep + [2] * (m + 2))


@pytest.mark.parametrize("run_file", ["runs/ernie_m_base.gin", "league/ernie_m.gin"])
def test_run_files_give_btmlm_the_target_positions_of_camlm(run_file, gin_isolated):
    import gin

    from xlm_jax.train import gin_utils

    gin_utils.parse([run_file], [], check_required=False)
    camlm = gin.query_parameter("camlm/ernie_m.CrossAttentionMLM.restart_positions")
    btmlm = gin.query_parameter("btmlm/ernie_m.BackTranslationMLM.restart_positions")
    restart = gin.query_parameter("%RESTART_TARGET_POSITIONS")
    assert restart is True  # both files restart the target's positions (our choice)
    assert camlm.scoped_selector == btmlm.scoped_selector == "RESTART_TARGET_POSITIONS/gin.macro"
