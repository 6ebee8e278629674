"""BUCC bitext mining scores: precision, recall and F1 of predicted sentence pairs (0-100).

Gold and prediction files hold one pair per line, `src_id<TAB>tgt_id` (the BUCC 2017/2018
`.gold` layout, which XTREME's BUCC evaluation also reads). Both are compared as SETS of
(src_id, tgt_id) pairs: a duplicated line counts once, order is irrelevant. Blank lines are
skipped; any other line without exactly two non-empty tab-separated fields raises ValueError
naming the file and line. A zero denominator gives 0.
"""
from __future__ import annotations

from typing import Iterable

Pair = tuple[str, str]


def parse_pairs(lines: Iterable[str], name: str = "pairs") -> set[Pair]:
    """The set of (src_id, tgt_id) pairs of `src_id<TAB>tgt_id` lines (blank lines skipped)."""
    pairs = set()
    for line_no, line in enumerate(lines, 1):
        line = line.rstrip("\r\n")
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 2 or not all(fields):
            raise ValueError(f"{name} line {line_no}: expected 'src_id<TAB>tgt_id', "
                             f"got {line!r}")
        pairs.add((fields[0], fields[1]))
    return pairs


def bucc_scores(gold: set[Pair], pred: set[Pair]) -> dict[str, float]:
    """{"precision", "recall", "f1"} (0-100) of predicted pairs against gold pairs."""
    correct = len(gold & pred)
    precision = correct / len(pred) if pred else 0.0
    recall = correct / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": 100.0 * precision, "recall": 100.0 * recall, "f1": 100.0 * f1}


def read_pairs(path: str) -> set[Pair]:
    """`parse_pairs` of a UTF-8 file; errors name the file."""
    with open(path, encoding="utf-8") as f:
        try:
            return parse_pairs(f, name=path)
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def bucc_files(gold_path: str, pred_path: str) -> dict[str, float]:
    """`bucc_scores` of a gold and a predictions file."""
    return bucc_scores(read_pairs(gold_path), read_pairs(pred_path))
