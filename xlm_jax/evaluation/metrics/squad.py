"""Extractive QA scores: SQuAD v1.1 and MLQA exact match and token F1 (0-100).

Re-implements (does not copy) two official evaluation scripts, so that numbers are comparable
with published ones:

* SQuAD v1.1 `evaluate-v1.1.py` (Rajpurkar et al. 2016; mirrored e.g. as XTREME's
  `third_party/evaluate_squad.py`): an answer is normalised by lower-casing, deleting the ASCII
  characters of `string.punctuation`, replacing the whole words a/an/the by a space and
  collapsing whitespace. Exact match compares normalised strings; F1 is the harmonic mean of
  precision and recall of the bag (multiset) of whitespace tokens of the normalised strings,
  0 when no token is shared. Each score is the max over the question's gold answers and is
  averaged over ALL questions of the dataset: a question without a prediction scores 0.
* MLQA `mlqa_evaluation_v1.py` (facebookresearch/MLQA): the same scoring with a per-language
  normalisation: punctuation is every Unicode character whose category starts with "P" plus
  `string.punctuation`; articles are language-specific (`_ARTICLES`); Arabic replaces every
  `ال` by a space; zh is tokenised by "mixed segmentation" (each CJK character of
  U+4E00..U+9FA5 and each punctuation character is one token, other runs are split on
  whitespace), so Chinese F1 is character-level.

Stricter than the official scripts (they ignore or crash on these): a prediction id that is
not a question of the dataset, a non-string prediction, a question without gold answers and a
dataset without questions raise ValueError. The number of unanswered questions is returned
as `missing` (the scripts print one stderr line per question instead).
"""
from __future__ import annotations

import json
import re
import string
import unicodedata
from collections import Counter
from typing import Any, Callable, Mapping

_ASCII_PUNCT = frozenset(string.punctuation)
_EN_ARTICLES = re.compile(r"\b(?:a|an|the)\b")

# MLQA's `remove_articles`: whole words replaced by a space (`\b` is Unicode-aware on str).
# hi and zh have none; ar is handled separately (see `mlqa_normalize_answer`).
_ARTICLES = {
    "en": ("a", "an", "the"),
    "es": ("un", "una", "unos", "unas", "el", "la", "los", "las"),
    "vi": ("của", "là", "cái", "chiếc", "những"),
    "de": ("ein", "eine", "einen", "einem", "eines", "einer", "der", "die", "das", "den",
           "dem", "des"),
}
_ARTICLE_RES = {lang: re.compile(r"\b(?:" + "|".join(words) + r")\b")
                for lang, words in _ARTICLES.items()}
MLQA_LANGUAGES = ("ar", "de", "en", "es", "hi", "vi", "zh")
_MIXED_SEGMENTATION_LANGUAGES = frozenset({"zh"})


def normalize_answer(text: str) -> str:
    """SQuAD v1.1 normalisation: lower, drop ASCII punctuation, drop a/an/the, squash spaces."""
    text = "".join(ch for ch in text.lower() if ch not in _ASCII_PUNCT)
    return " ".join(_EN_ARTICLES.sub(" ", text).split())


def _is_mlqa_punct(ch: str) -> bool:
    """MLQA's PUNCT set: Unicode categories P* plus string.punctuation (which adds $+<=>^`|~)."""
    return ch in _ASCII_PUNCT or unicodedata.category(ch).startswith("P")


def _mixed_segmentation(text: str) -> list[str]:
    """MLQA's zh tokenisation: every CJK char (U+4E00..U+9FA5) or punctuation char is a token;
    the text between such characters is split on whitespace."""
    tokens: list[str] = []
    run: list[str] = []
    for ch in text:
        if "\u4e00" <= ch <= "\u9fa5" or _is_mlqa_punct(ch):
            tokens.extend("".join(run).split())
            run = []
            tokens.append(ch)
        else:
            run.append(ch)
    tokens.extend("".join(run).split())
    return tokens


def _check_language(lang: str) -> None:
    if lang not in MLQA_LANGUAGES:
        raise ValueError(f"unknown MLQA language {lang!r}; valid: {', '.join(MLQA_LANGUAGES)}")


def mlqa_normalize_answer(text: str, lang: str) -> str:
    """MLQA's `normalize_answer(s, lang)`: lower, drop Unicode punctuation, drop the language's
    articles, then re-join the language's tokens with single spaces.

    Arabic follows the official regex `\\sال^|ال` literally: its first branch can never match
    (`^` after three characters), so EVERY `ال` is replaced by a space, also inside a word
    ("المال" -> "م"). Kept as is so that scores match the published MLQA numbers.
    """
    _check_language(lang)
    text = "".join(ch for ch in text.lower() if not _is_mlqa_punct(ch))
    if lang == "ar":
        text = text.replace("ال", " ")
    elif lang in _ARTICLE_RES:
        text = _ARTICLE_RES[lang].sub(" ", text)
    tokens = (_mixed_segmentation(text) if lang in _MIXED_SEGMENTATION_LANGUAGES
              else text.split())
    return " ".join(t for t in tokens if t.strip())


def _token_f1(prediction: list[str], gold: list[str]) -> float:
    """Bag-of-tokens F1 of the official scripts (0 when nothing is shared, even if both empty)."""
    same = sum((Counter(prediction) & Counter(gold)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(gold)
    return 2 * precision * recall / (precision + recall)


def _questions(dataset: Any, gold_name: str) -> list[tuple[str, list[str]]]:
    """(id, gold answer texts) of every question of a SQuAD-format dataset, in file order."""
    articles = dataset["data"] if isinstance(dataset, Mapping) and "data" in dataset else dataset
    out = []
    try:
        for article in articles:
            for paragraph in article["paragraphs"]:
                for qa in paragraph["qas"]:
                    qid = str(qa["id"])
                    answers = [answer["text"] for answer in qa["answers"]]
                    if not all(isinstance(a, str) for a in answers):
                        raise TypeError(f"answer text of question {qid!r}")
                    if not answers:
                        raise ValueError(
                            f"{gold_name}: question {qid!r} has no gold answers (SQuAD v2 "
                            "unanswerable questions are not scored by the v1.1 metric)")
                    out.append((qid, answers))
    except (KeyError, TypeError, IndexError) as e:
        raise ValueError(f"{gold_name}: not a SQuAD-format dataset "
                         f"(data/paragraphs/qas/id/answers/text): bad or missing {e}") from None
    if not out:
        raise ValueError(f"{gold_name}: the dataset has no questions")
    return out


def _evaluate(dataset: Any, predictions: Mapping[str, str], normalize: Callable[[str], str],
              gold_name: str, pred_name: str) -> dict[str, Any]:
    questions = _questions(dataset, gold_name)
    if not isinstance(predictions, Mapping):
        raise ValueError(f"{pred_name}: predictions must be an object {{question id: answer}}")
    predictions = {str(k): v for k, v in predictions.items()}
    unknown = sorted(set(predictions) - {qid for qid, _ in questions})
    if unknown:
        more = f" ({len(unknown)} unknown ids in all)" if len(unknown) > 1 else ""
        raise ValueError(f"{pred_name}: prediction id {unknown[0]!r} is not a question of "
                         f"{gold_name}{more}")
    exact = f1 = 0.0
    missing = 0
    for qid, golds in questions:
        if qid not in predictions:
            missing += 1  # scored 0, as the official scripts do
            continue
        prediction = predictions[qid]
        if not isinstance(prediction, str):
            raise ValueError(f"{pred_name}: the prediction of {qid!r} is not a string")
        pred_norm = normalize(prediction)
        gold_norms = [normalize(g) for g in golds]
        exact += max(float(pred_norm == g) for g in gold_norms)
        f1 += max(_token_f1(pred_norm.split(), g.split()) for g in gold_norms)
    total = len(questions)
    return {"exact_match": 100.0 * exact / total, "f1": 100.0 * f1 / total, "total": total,
            "missing": missing}


def squad_evaluate(dataset: Any, predictions: Mapping[str, str], *, gold_name: str = "dataset",
                   pred_name: str = "predictions") -> dict[str, Any]:
    """SQuAD v1.1 scores: {"exact_match", "f1" (0-100), "total" questions, "missing" answers}.

    `dataset` is the list of articles (the file's "data") or the whole file object;
    `predictions` maps question id -> answer text. The names only label error messages.
    """
    return _evaluate(dataset, predictions, normalize_answer, gold_name, pred_name)


def mlqa_evaluate(dataset: Any, predictions: Mapping[str, str], lang: str, *,
                  gold_name: str = "dataset", pred_name: str = "predictions") -> dict[str, Any]:
    """MLQA scores for answers in language `lang` (one of MLQA_LANGUAGES); same result keys
    and arguments as `squad_evaluate`. An unknown language raises ValueError naming the valid
    ones."""
    _check_language(lang)
    return _evaluate(dataset, predictions, lambda s: mlqa_normalize_answer(s, lang),
                     gold_name, pred_name)


def load_json(path: str) -> Any:
    """The JSON value in `path`; invalid JSON raises ValueError naming the file and line."""
    with open(path, encoding="utf-8") as f:
        try:
            return json.load(f)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: invalid JSON at line {e.lineno}, column {e.colno}: "
                             f"{e.msg}") from None
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def squad_evaluate_files(gold_path: str, pred_path: str) -> dict[str, Any]:
    """`squad_evaluate` of a SQuAD dataset file and a predictions file ({id: text})."""
    return squad_evaluate(load_json(gold_path), load_json(pred_path), gold_name=gold_path,
                          pred_name=pred_path)


def mlqa_evaluate_files(gold_path: str, pred_path: str, lang: str) -> dict[str, Any]:
    """`mlqa_evaluate` of an MLQA dataset file and a predictions file ({id: text})."""
    _check_language(lang)
    return mlqa_evaluate(load_json(gold_path), load_json(pred_path), lang, gold_name=gold_path,
                         pred_name=pred_path)
