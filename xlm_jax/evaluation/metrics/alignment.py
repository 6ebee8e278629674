"""Word-alignment error rate (AER, Och & Ney 2003) of Pharaoh-format alignments.

A file holds one sentence pair per line; a line is whitespace-separated links `i-j` (source
word i aligned to target word j, 0-based or 1-based as long as both files agree). The gold
file may also hold `ipj`: a POSSIBLE link; `i-j` there is SURE. Predictions hold only `i-j`.

With A the predicted links, S the sure and P the possible links (P includes S):

    precision = |A∩P| / |A|      recall = |A∩S| / |S|
    AER = 1 - (|A∩S| + |A∩P|) / (|A| + |S|)

Every count is summed over the corpus before dividing (links are keyed by line), not averaged
per sentence, as in Och & Ney and the usual `aer.py` scripts. A predicted link that is
possible but not sure therefore helps precision (and AER) but never recall. Scores are on a
0-100 scale; a zero precision/recall denominator gives 0.
"""
from __future__ import annotations

import re
from typing import Any, Sequence

_LINK = re.compile(r"(\d+)([-p])(\d+)")
Link = tuple[int, int, int]  # (line index, source index, target index)


def parse_links(line: str, *, allow_possible: bool, name: str = "alignment",
                line_no: int = 1) -> tuple[set[tuple[int, int]], set[tuple[int, int]]]:
    """(sure, possible) links of one Pharaoh line; possible includes sure. A malformed link,
    or `ipj` where `allow_possible` is False, raises ValueError naming file, line and token."""
    sure: set[tuple[int, int]] = set()
    possible: set[tuple[int, int]] = set()
    for token in line.split():
        m = _LINK.fullmatch(token)
        if m is None or (m[2] == "p" and not allow_possible):
            expected = "i-j or ipj" if allow_possible else "i-j (possible links ipj only in gold)"
            raise ValueError(f"{name} line {line_no}: malformed link {token!r}, expected "
                             f"{expected} with non-negative integers")
        link = (int(m[1]), int(m[3]))
        (sure if m[2] == "-" else possible).add(link)
    return sure, possible | sure


def aer_scores(gold_lines: Sequence[str], pred_lines: Sequence[str], *, gold_name: str = "gold",
               pred_name: str = "predictions") -> dict[str, float]:
    """{"aer", "precision", "recall"} (0-100) of predicted against gold Pharaoh lines."""
    if len(gold_lines) != len(pred_lines):
        raise ValueError(f"{gold_name} has {len(gold_lines)} lines but {pred_name} has "
                         f"{len(pred_lines)}: both need one line per sentence pair")
    sure: set[Link] = set()
    possible: set[Link] = set()
    predicted: set[Link] = set()
    for n, (g, p) in enumerate(zip(gold_lines, pred_lines)):
        g_sure, g_possible = parse_links(g, allow_possible=True, name=gold_name, line_no=n + 1)
        a, _ = parse_links(p, allow_possible=False, name=pred_name, line_no=n + 1)
        sure.update((n, i, j) for i, j in g_sure)
        possible.update((n, i, j) for i, j in g_possible)
        predicted.update((n, i, j) for i, j in a)
    if not predicted and not sure:
        raise ValueError(f"AER is undefined: {gold_name} has no sure links and {pred_name} "
                         "has no links")
    a_s, a_p = len(predicted & sure), len(predicted & possible)
    return {
        "aer": 100.0 * (1.0 - (a_s + a_p) / (len(predicted) + len(sure))),
        "precision": 100.0 * a_p / len(predicted) if predicted else 0.0,
        "recall": 100.0 * a_s / len(sure) if sure else 0.0,
    }


def _read_lines(path: str) -> list[str]:
    """The lines of a UTF-8 text file without their line ends (a final newline adds none)."""
    with open(path, encoding="utf-8") as f:
        try:
            return [line.rstrip("\r\n") for line in f]
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def aer_files(gold_path: str, pred_path: str) -> dict[str, float]:
    """`aer_scores` of a gold and a predicted Pharaoh file."""
    return aer_scores(_read_lines(gold_path), _read_lines(pred_path), gold_name=gold_path,
                      pred_name=pred_path)
