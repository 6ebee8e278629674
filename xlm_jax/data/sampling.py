"""Alpha-smoothed language sampling rates and language-code checks (no TensorFlow).

Multilingual pre-training draws each language j with probability

    p_j = n_j^alpha / sum_k n_k^alpha,

where n_j is the amount of data in language j (sentences or tokens). alpha < 1 flattens the
distribution so low-resource languages are seen more often than their raw share:
XLM-R uses alpha = 0.3, VECO 0.5, XLM-E and InfoXLM 0.7 (alpha = 1 is proportional sampling).
"""

from __future__ import annotations

import math
import re
from typing import Mapping

__all__ = [
    "ALPHA_XLMR",
    "ALPHA_VECO",
    "ALPHA_XLME",
    "ALPHA_INFOXLM",
    "KNOWN_LANGUAGES",
    "XLMR_LANGUAGES",
    "DEMO_LANGUAGES",
    "smoothed_rates",
    "validate_language_code",
]

ALPHA_XLMR = 0.3
ALPHA_VECO = 0.5
ALPHA_XLME = 0.7
ALPHA_INFOXLM = 0.7

# The 100 languages of XLM-R (Conneau et al. 2020, Table 6) under their CC-100 file codes,
# including the romanised / alternative-script variants CC-100 ships as separate files.
XLMR_LANGUAGES: frozenset[str] = frozenset(
    """
    af am ar as az be bg bn bn_rom br bs ca cs cy da de el en eo es et eu fa fi fr fy ga gd gl
    gu ha he hi hi_rom hr hu hy id is it ja jv ka kk km kn ko ku ky la lo lt lv mg mk ml mn mr
    ms my my_zaw ne nl no om or pa pl ps pt ro ru sa sd si sk sl so sq sr su sv sw ta ta_rom te
    te_rom th tl tr ug uk ur ur_rom uz vi xh yi zh_Hans zh_Hant
    """.split()
)

# The 77 languages of the committed demo corpus (tasks/demo_data, built from the Django and
# Wagtail gettext catalogs by tasks/build_demo_corpus.py; see its stats.json). Codes are
# normalised there: regional variants merge into the base language (pt_BR -> pt, zh_Hans ->
# zh, ...).
DEMO_LANGUAGES: frozenset[str] = frozenset(
    """
    af ar az be bg bn ca ckb cs cy da de dsb dv el en eo es et eu fa fi fr ga gd gl he hi hr hsb
    ht hu hy ia id ig io is it ja ka ko ky lt lv mi mk ml mn mr ms my nb ne nl nn os pl pt ro ru
    sk sl sq sr sv sw tet tg th tk tr ug uk uz vi zh
    """.split()
)

KNOWN_LANGUAGES: frozenset[str] = XLMR_LANGUAGES | DEMO_LANGUAGES

_CODE_RE = re.compile(r"[a-z]{2,3}(_[A-Za-z]+)?")


def validate_language_code(code: str) -> str:
    """Checks that `code` looks like an ISO 639-1/3 code with an optional variant suffix.

    Accepted: two or three lower-case letters, optionally `_` and a region/script/variant
    (`en`, `ast`, `zh_Hans`, `pt_BR`, `sr_Latn`, `hi_rom`). The check is syntactic only; use
    `code in KNOWN_LANGUAGES` to test membership. Returns the code unchanged so it can be used
    inline; raises ValueError naming the bad code otherwise.
    """
    if not isinstance(code, str) or _CODE_RE.fullmatch(code) is None:
        raise ValueError(
            f"invalid language code {code!r}: expected ISO 639-1/3 letters with an optional "
            "'_Variant' suffix, e.g. 'en', 'zh_Hans', 'pt_BR'"
        )
    return code


def smoothed_rates(sizes: Mapping[str, int], alpha: float) -> dict[str, float]:
    """Returns the alpha-smoothed sampling probability p_j = n_j^alpha / sum_k n_k^alpha.

    `sizes` maps a language (or any mixture member) to its data size n_j > 0; the result has the
    same keys, in sorted order, and sums to 1. Raises ValueError for alpha <= 0 (or not finite),
    an empty mapping, or a size that is not a positive number (naming the language).
    """
    if not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise ValueError(f"alpha must be a finite number > 0, got alpha={alpha!r}")
    if not sizes:
        raise ValueError("sizes is empty: need at least one language with a positive size")
    weights: dict[str, float] = {}
    for lang in sorted(sizes):
        n = sizes[lang]
        if isinstance(n, bool) or not isinstance(n, (int, float)) or not math.isfinite(n) or n <= 0:
            raise ValueError(f"size for language {lang!r} must be a positive number, got {n!r}")
        # Work in log space so huge corpora (1e12 tokens) with alpha near 1 cannot overflow.
        weights[lang] = alpha * math.log(n)
    top = max(weights.values())
    exp = {lang: math.exp(w - top) for lang, w in weights.items()}
    total = math.fsum(exp.values())
    return {lang: e / total for lang, e in exp.items()}
