"""Tests for xlm_jax.data.sampling against hand-computed alpha-smoothed rates."""

import json
import math
import pathlib
import re

import pytest

from xlm_jax.data import sampling

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_xlmr_alpha_golden():
    # n^0.3: 1e6 -> 10^1.8 = 63.0957, 1e4 -> 10^1.2 = 15.8489, 1e3 -> 10^0.9 = 7.9433;
    # sum 86.8879.
    rates = sampling.smoothed_rates({"en": 1_000_000, "hi": 10_000, "sw": 1_000}, 0.3)
    assert rates == pytest.approx({"en": 0.7261735992, "hi": 0.1824065611, "sw": 0.0914198397},
                                  rel=1e-8)


def test_veco_alpha_golden():
    # sqrt(100) = 10, sqrt(10000) = 100 -> 10/110 and 100/110.
    rates = sampling.smoothed_rates({"a": 100, "b": 10_000}, sampling.ALPHA_VECO)
    assert rates == pytest.approx({"a": 1 / 11, "b": 10 / 11}, rel=1e-12)


def test_infoxlm_alpha_golden():
    # 2000^0.7 = 204.43, 200^0.7 = 40.79, 20^0.7 = 8.14 (sum 253.36).
    rates = sampling.smoothed_rates({"de": 2000, "fr": 200, "sw": 20}, sampling.ALPHA_INFOXLM)
    assert rates == pytest.approx({"de": 0.8068830685, "fr": 0.1609943379, "sw": 0.0321225935},
                                  rel=1e-8)
    assert sampling.ALPHA_XLMR == 0.3 and sampling.ALPHA_XLME == 0.7


def test_alpha_one_is_proportional_and_small_alpha_flattens():
    assert sampling.smoothed_rates({"x": 1, "y": 3, "z": 6}, 1.0) == pytest.approx(
        {"x": 0.1, "y": 0.3, "z": 0.6}, rel=1e-12)
    flat = sampling.smoothed_rates({"x": 1, "y": 1_000_000}, 1e-9)
    assert flat["x"] == pytest.approx(0.5, abs=1e-6)
    # alpha < 1 raises the small language's share above its raw 1e-6.
    assert sampling.smoothed_rates({"x": 1, "y": 1_000_000}, 0.3)["x"] > 1e-3


def test_huge_sizes_do_not_overflow():
    rates = sampling.smoothed_rates({"a": 1e300, "b": 1e300, "c": 1}, 2.0)
    assert rates["a"] == pytest.approx(0.5) and rates["b"] == pytest.approx(0.5)
    assert math.isclose(sum(rates.values()), 1.0)


def test_result_keys_sorted_and_sum_to_one():
    rates = sampling.smoothed_rates({"zh": 5, "ar": 7, "en": 11}, 0.3)
    assert list(rates) == ["ar", "en", "zh"]
    assert math.isclose(sum(rates.values()), 1.0, rel_tol=1e-12)


@pytest.mark.parametrize("alpha", [0, -0.3, float("nan"), float("inf")])
def test_bad_alpha(alpha):
    with pytest.raises(ValueError, match=r"alpha=" + re.escape(repr(alpha))):
        sampling.smoothed_rates({"en": 10}, alpha)


def test_bad_sizes():
    with pytest.raises(ValueError, match="empty"):
        sampling.smoothed_rates({}, 0.3)
    with pytest.raises(ValueError, match=r"'sw'.*got 0"):
        sampling.smoothed_rates({"en": 10, "sw": 0}, 0.3)
    with pytest.raises(ValueError, match=r"'hi'.*got -5"):
        sampling.smoothed_rates({"hi": -5}, 0.3)
    with pytest.raises(ValueError, match=r"'fr'.*got '7'"):
        sampling.smoothed_rates({"fr": "7"}, 0.3)


@pytest.mark.parametrize("code", ["en", "ast", "zh_Hans", "pt_BR", "sr_Latn", "hi_rom"])
def test_valid_language_codes(code):
    assert sampling.validate_language_code(code) == code


@pytest.mark.parametrize("code", ["", "e", "EN", "english", "en-US", "zh_", "es_419", "de ",
                                  "../en", None, 7])
def test_invalid_language_codes(code):
    with pytest.raises(ValueError, match=re.escape(repr(code))):
        sampling.validate_language_code(code)


def test_known_languages():
    assert len(sampling.XLMR_LANGUAGES) == 100
    for lang in ("en", "sw", "zh_Hans", "zh_Hant", "my_zaw", "ur_rom", "tl"):
        assert lang in sampling.XLMR_LANGUAGES
    assert sampling.KNOWN_LANGUAGES == sampling.XLMR_LANGUAGES | sampling.DEMO_LANGUAGES
    for lang in sampling.KNOWN_LANGUAGES:
        sampling.validate_language_code(lang)
    assert "xx" not in sampling.KNOWN_LANGUAGES


def test_demo_languages_match_committed_corpus():
    stats = json.loads((REPO / "tasks" / "demo_data" / "stats.json").read_text())
    corpus_langs = set(stats["mono"]) | set(stats["parallel"]) | set(stats["tatoeba"])
    assert sampling.DEMO_LANGUAGES == corpus_langs

