"""Readers for the XTREME fine-tuning datasets, from local files (pure Python: no jax, no TF).

The folder layout is the one `scripts/download_data.sh` + `utils_preprocess.py` of
google-research/xtreme leave under `download/` (`root` below):

* `xnli/{split}-{lang}.tsv`, `pawsx/{split}-{lang}.tsv`: written by `csv.writer(delimiter="\\t")`,
  so CRLF line ends and csv quoting (a field holding `"` is quoted, inner quotes doubled); no
  header. Columns sentence1, sentence2, label; the `test` files lack the label column. XNLI
  labels are `entailment`/`neutral`/`contradiction` (XNLI's `contradictory` is renamed by the
  preprocessing); PAWS-X labels are `0`/`1`. Only `train-en.tsv` exists for training.
* `panx/{split}-{lang}.tsv`, `udpos/{split}-{lang}.tsv`: `token<TAB>label` lines, a blank line
  between sentences; the `test` files hold the token only. The language is in the file name
  (the raw PAN-X files' `en:` token prefix is removed by the preprocessing:
  `strip_lang_prefix=True` reads raw ones). UD-POS labels are UPOS tags.
* `squad/{train,dev}-v1.1.json` (SQuAD v1.1: the English QA training data),
  `xquad/xquad.{lang}.json` (the XQuAD test set), `mlqa/MLQA_V1/{dev,test}/{split}-context-
  {lang}-question-{lang}.json`, `tydiqa/tydiqa-goldp-v1.1-train/tydiqa.goldp.{lang}.train.json`
  and `tydiqa/tydiqa-goldp-v1.1-dev/tydiqa.goldp.{lang}.dev.json` (XTREME's TyDiQA test set).
  All are SQuAD-format JSON. XTREME blanks the test answers of XQuAD, MLQA test and TyDiQA dev
  to `{"text": "", "answer_start": 0}`; such placeholder answers are dropped (`answers == ()`).

Raw formats: `read_tagged(fmt="conll")` (whitespace-separated `token ... label`, `-DOCSTART-`
lines skipped) and `fmt="conllu"` (UD CoNLL-U: 10 tab-separated columns, `#` comments,
multiword-token ranges `1-2` and empty nodes `1.1` skipped, FORM = column 2, UPOS = column 4).

Every input error is a one-line `ValueError` naming the file, and the 1-based line where there
is one (`path:line: message`).
"""
from __future__ import annotations

import csv
import dataclasses
import json
import os
import re
from collections.abc import Iterable, Sequence

XNLI_LABELS = ("contradiction", "entailment", "neutral")
PAWSX_LABELS = ("0", "1")
PANX_LABELS = ("B-LOC", "B-ORG", "B-PER", "I-LOC", "I-ORG", "I-PER", "O")
UPOS_TAGS = ("ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON",
             "PROPN", "PUNCT", "SCONJ", "SYM", "VERB", "X")
TAGGED_FORMATS = ("xtreme", "conll", "conllu")
TASKS = ("xnli", "pawsx", "panx", "udpos", "squad", "xquad", "mlqa", "tydiqa")


# ----------------------------------------------------------------------------- examples

@dataclasses.dataclass(frozen=True)
class PairExample:
    """A sentence pair (XNLI, PAWS-X); `label` is None in unlabeled (test) files."""

    sentence1: str
    sentence2: str
    label: str | None
    lang: str


@dataclasses.dataclass(frozen=True)
class TaggedSentence:
    """One sentence of a tagging file (NER, POS); `labels` is None in unlabeled (test) files."""

    tokens: tuple[str, ...]
    labels: tuple[str, ...] | None
    lang: str


@dataclasses.dataclass(frozen=True)
class Answer:
    """An answer span: `context[start:start + len(text)] == text`."""

    text: str
    start: int


@dataclasses.dataclass(frozen=True)
class QAExample:
    """One SQuAD-format question; `answers` is () for unanswerable or blanked-out questions."""

    id: str
    question: str
    context: str
    answers: tuple[Answer, ...]
    lang: str


# ----------------------------------------------------------------------------- file access

def _fail(path: str, line: int | None, message: str) -> ValueError:
    where = f"{path}:{line}" if line is not None else str(path)
    return ValueError(f"{where}: {message}")


def _short(text: str, limit: int = 60) -> str:
    """repr (so the message stays one line), cut to `limit` characters."""
    return repr(text if len(text) <= limit else text[:limit] + "...")


def _read_text(path: str) -> str:
    """The file decoded as strict UTF-8 (a leading BOM dropped); empty files are errors."""
    with open(path, "rb") as f:
        data = f.read()
    if not data.strip():
        raise _fail(path, None, "file is empty")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise _fail(path, line, f"invalid UTF-8 (byte 0x{data[e.start]:02x}: {e.reason})") from None
    return text[1:] if text.startswith("\ufeff") else text


def _lines(path: str) -> list[tuple[int, str]]:
    """(1-based line number, line without its end). Only `\\n` ends a line (`str.splitlines`
    would also split at U+2028, U+001C, ... which can occur inside tokens)."""
    lines = _read_text(path).split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    return [(i, line[:-1] if line.endswith("\r") else line) for i, line in enumerate(lines, 1)]


def _check_label(path: str, line: int, label: str, allowed: Sequence[str] | None, hint: str = "") -> None:
    if allowed is not None and label not in allowed:
        raise _fail(path, line, f"unknown label {_short(label)} (expected one of {', '.join(allowed)}){hint}")


# ----------------------------------------------------------------------------- pairs (XNLI, PAWS-X)

def read_pair_tsv(path: str, lang: str, labels: Sequence[str] | None = None) -> list[PairExample]:
    """`sentence1<TAB>sentence2[<TAB>label]` rows with csv quoting, no header.

    A file is labeled (3 columns) or not (2 columns, `label=None`), as its first row says; every
    row must then have that many columns. `labels` (e.g. `XNLI_LABELS`) restricts the labels;
    None accepts any. Blank lines are skipped.
    """
    examples: list[PairExample] = []
    width = None
    for lineno, line in _lines(path):
        if not line.strip():
            continue
        try:
            row = next(csv.reader([line], delimiter="\t", strict=True))
        except csv.Error as e:
            raise _fail(path, lineno, f"malformed csv quoting: {e}") from None
        if width is None:
            if len(row) not in (2, 3):
                raise _fail(path, lineno, f"expected 3 tab-separated columns (sentence1, sentence2, "
                                          f"label) or 2 (unlabeled), got {len(row)}")
            width = len(row)
        elif len(row) != width:
            raise _fail(path, lineno, f"expected {width} tab-separated columns like the first row, "
                                      f"got {len(row)}")
        label = None
        if width == 3:
            label = row[2].strip()
            hint = ""
            if label == "contradictory":
                hint = " (XTREME renames XNLI's 'contradictory' to 'contradiction')"
            _check_label(path, lineno, label, labels, hint)
        examples.append(PairExample(row[0], row[1], label, lang))
    if not examples:
        raise _fail(path, None, "no examples found")
    return examples


# ----------------------------------------------------------------------------- tagging (PAN-X, UD-POS)

def read_tagged(path: str, lang: str, fmt: str = "xtreme", labels: Sequence[str] | None = None,
                strip_lang_prefix: bool = False) -> list[TaggedSentence]:
    """Sentences of a tagging file; blank lines separate sentences.

    fmt="xtreme": `token<TAB>label` (or `token` alone in unlabeled files, `labels=None`; the first
      token line decides, mixing is an error). `strip_lang_prefix` removes the `{lang}:` every
      token of a raw PAN-X file starts with.
    fmt="conll": whitespace-separated columns, the first is the token, the last the label;
      `-DOCSTART-` lines are skipped.
    fmt="conllu": UD CoNLL-U; tokens are FORM, labels UPOS (checked against `UPOS_TAGS` unless
      `labels` says otherwise).
    `labels` restricts the label strings (None: any).
    """
    if fmt not in TAGGED_FORMATS:
        raise ValueError(f"unknown tagged format {fmt!r} (expected one of {', '.join(TAGGED_FORMATS)})")
    if fmt == "conllu" and labels is None:
        labels = UPOS_TAGS
    sentences: list[TaggedSentence] = []
    tokens: list[str] = []
    tags: list[str] = []
    labeled = None if fmt == "xtreme" else True

    def flush():
        if tokens:
            sentences.append(TaggedSentence(tuple(tokens), tuple(tags) if labeled else None, lang))
            tokens.clear()
            tags.clear()

    for lineno, line in _lines(path):
        if not line.strip():
            flush()
            continue
        if fmt == "conllu":
            if line.startswith("#"):
                continue
            cols = line.split("\t")
            if len(cols) != 10:
                raise _fail(path, lineno, f"expected 10 tab-separated CoNLL-U columns, got {len(cols)}")
            if "-" in cols[0] or "." in cols[0]:
                continue  # multiword-token range or empty node
            if not cols[0].isdigit():
                raise _fail(path, lineno, f"CoNLL-U ID {_short(cols[0])} is not a word index")
            token, label = cols[1], cols[3]
        elif line.startswith("-DOCSTART-"):
            continue
        elif fmt == "conll":
            cols = line.split()
            if len(cols) < 2:
                raise _fail(path, lineno, f"CoNLL line {_short(line)} has no label column")
            token, label = cols[0], cols[-1]
        else:
            cols = line.split("\t")
            if len(cols) > 2:
                raise _fail(path, lineno, f"expected token<TAB>label, got {len(cols)} tab-separated columns")
            if labeled is None:
                labeled = len(cols) == 2
            if labeled != (len(cols) == 2):
                what = ("no label, but earlier lines have one" if labeled
                        else "a label, but earlier lines do not")
                raise _fail(path, lineno, f"token line has {what}")
            token, label = cols[0], cols[1] if labeled else ""
            if strip_lang_prefix:
                if not token.startswith(lang + ":"):
                    raise _fail(path, lineno, f"token {_short(token)} lacks the language prefix '{lang}:'")
                token = token[len(lang) + 1:]
        if not token:
            raise _fail(path, lineno, "empty token")
        if labeled:
            if not label:
                raise _fail(path, lineno, f"empty label for token {_short(token)}")
            _check_label(path, lineno, label, labels)
        tokens.append(token)
        tags.append(label)
    flush()
    if not sentences:
        raise _fail(path, None, "no sentences found")
    return sentences


# ----------------------------------------------------------------------------- QA (SQuAD format)

def read_squad(path: str, lang: str) -> list[QAExample]:
    """Questions of a SQuAD v1.1-format JSON file (`{"data": [{"paragraphs": [{"context",
    "qas": [{"id", "question", "answers": [{"text", "answer_start"}]}]}]}]}`).

    Every answer must occur at its `answer_start` (a character offset into the context). The
    blanked test answer `{"text": "", "answer_start": 0}` is dropped.
    """
    text = _read_text(path)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise _fail(path, e.lineno, f"invalid JSON: {e.msg} (column {e.colno})") from None

    def need(obj, key, kind, where):
        value = obj.get(key) if isinstance(obj, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise _fail(path, None, f"{where}: missing or non-{kind.__name__} field {key!r}")
        return value

    examples: list[QAExample] = []
    for a, article in enumerate(need(data, "data", list, "top level")):
        for p, par in enumerate(need(article, "paragraphs", list, f"data[{a}]")):
            where = f"data[{a}].paragraphs[{p}]"
            context = need(par, "context", str, where)
            for q, qa in enumerate(need(par, "qas", list, where)):
                qid = need(qa, "id", str, f"{where}.qas[{q}]")
                question = need(qa, "question", str, f"question {qid!r}")
                answers = []
                for ans in need(qa, "answers", list, f"question {qid!r}"):
                    ans_text = need(ans, "text", str, f"question {qid!r}: answer")
                    start = need(ans, "answer_start", int, f"question {qid!r}: answer")
                    if ans_text == "" and start == 0:
                        continue  # XTREME's blanked test answer
                    found = context[start:start + len(ans_text)] if start >= 0 else ""
                    if found != ans_text:
                        raise _fail(path, None, f"question {qid!r}: answer {_short(ans_text)} is not at "
                                                f"answer_start {start} of its context "
                                                f"(found {_short(found)})")
                    answers.append(Answer(ans_text, start))
                examples.append(QAExample(qid, question, context, tuple(answers), lang))
    if not examples:
        raise _fail(path, None, "no questions found")
    return examples


# ----------------------------------------------------------------------------- the XTREME layout

_LANG = r"(?P<lang>[A-Za-z][A-Za-z0-9_]*)"


def _layout(task: str, split: str) -> tuple[str, list[str], str]:
    """(directory below root, file-name regexes in order of preference, the pattern in words)."""
    if task not in TASKS:
        raise ValueError(f"unknown XTREME task {task!r} (expected one of {', '.join(TASKS)})")
    splits = {"squad": ("train", "dev"), "xquad": ("test",), "mlqa": ("dev", "test"),
              "tydiqa": ("train", "dev")}.get(task, ("train", "dev", "test"))
    if split not in splits:
        # XTREME evaluates TyDiQA-GoldP on its dev files (its "test" set); say so.
        hint = ("; XTREME's TyDiQA test set is its goldp dev folder: use split 'dev'"
                if (task, split) == ("tydiqa", "test") else "")
        raise ValueError(f"task {task} has no split {split!r} in the XTREME layout "
                         f"(expected one of {', '.join(splits)}){hint}")
    if task in ("xnli", "pawsx", "panx", "udpos"):
        return task, [rf"{split}-{_LANG}\.tsv"], f"{split}-{{lang}}.tsv"
    if task == "squad":
        return "squad", [rf"{split}-v1\.1\.json"], f"{split}-v1.1.json (language en)"
    if task == "xquad":
        return "xquad", [rf"xquad\.{_LANG}\.json"], "xquad.{lang}.json"
    if task == "mlqa":
        return (os.path.join("mlqa", "MLQA_V1", split),
                [rf"{split}-context-{_LANG}-question-(?P=lang)\.json"],
                f"{split}-context-{{lang}}-question-{{lang}}.json")
    if split == "train":  # the scripts' train_qa.sh names tydiqa.{lang}.train.json: accepted too
        return (os.path.join("tydiqa", "tydiqa-goldp-v1.1-train"),
                [rf"tydiqa\.goldp\.{_LANG}\.train\.json", rf"tydiqa\.{_LANG}\.train\.json"],
                "tydiqa.goldp.{lang}.train.json")
    return (os.path.join("tydiqa", "tydiqa-goldp-v1.1-dev"), [rf"tydiqa\.goldp\.{_LANG}\.dev\.json"],
            "tydiqa.goldp.{lang}.dev.json")


def task_files(root: str, task: str, split: str) -> dict[str, str]:
    """{lang: path} of the task's `split` files under the XTREME download folder `root`
    (sorted by language; {} when the task's directory holds none)."""
    subdir, patterns, _ = _layout(task, split)
    directory = os.path.join(root, subdir)
    if not os.path.isdir(directory):
        raise ValueError(f"no {task} directory {directory} "
                         f"(expected the XTREME download layout under {root})")
    names = sorted(n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n)))
    found: dict[str, str] = {}
    for pattern in patterns:
        for name in names:
            m = re.fullmatch(pattern, name)
            if m:
                lang = m.groupdict().get("lang") or "en"
                found.setdefault(lang, os.path.join(directory, name))
    return dict(sorted(found.items()))


def read_task(root: str, task: str, split: str,
              languages: Iterable[str] | str | None = None) -> dict[str, list]:
    """{lang: examples} of one task split from the XTREME download folder `root`; `languages`
    (a list or a comma-separated string) defaults to every language found."""
    files = task_files(root, task, split)
    subdir, _, pattern = _layout(task, split)
    directory = os.path.join(root, subdir)
    if isinstance(languages, str):
        languages = [lang.strip() for lang in languages.split(",") if lang.strip()]
    wanted = list(files) if languages is None else list(dict.fromkeys(languages))
    if not wanted:
        raise ValueError(f"no {task} {split} files ({pattern}) in {directory}")
    found = ", ".join(files) or "none"
    for lang in wanted:
        if lang not in files:
            raise ValueError(f"no {task} {split} file for language {lang!r} in {directory} "
                             f"(expected {pattern}); languages found: {found}")
    out: dict[str, list] = {}
    for lang in wanted:
        path = files[lang]
        if task in ("xnli", "pawsx"):
            out[lang] = read_pair_tsv(path, lang, XNLI_LABELS if task == "xnli" else PAWSX_LABELS)
        elif task in ("panx", "udpos"):
            out[lang] = read_tagged(path, lang, "xtreme", PANX_LABELS if task == "panx" else UPOS_TAGS)
        else:
            out[lang] = read_squad(path, lang)
    return out


# ----------------------------------------------------------------------------- label sets

def label_set(examples: Iterable[PairExample | TaggedSentence]) -> frozenset[str]:
    """Every label of pair examples or tagged sentences (unlabeled ones contribute nothing)."""
    out: set[str] = set()
    for ex in examples:
        if isinstance(ex, TaggedSentence):
            out.update(ex.labels or ())
        elif ex.label is not None:
            out.add(ex.label)
    return frozenset(out)


def check_label_sets(train_labels: Iterable[str], eval_labels: Iterable[str], train_name: str,
                     eval_name: str) -> None:
    """ValueError when `eval_labels` hold labels `train_labels` lack (a model trained on the one
    could never predict them)."""
    train = set(train_labels)
    missing = sorted(set(eval_labels) - train)
    if missing:
        raise ValueError(f"labels {', '.join(map(repr, missing))} of {eval_name} do not occur in "
                         f"{train_name} (its labels: {', '.join(map(repr, sorted(train))) or 'none'})")
