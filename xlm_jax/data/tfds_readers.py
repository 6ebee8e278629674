"""The XTREME fine-tuning tasks from TFDS datasets prepared in a local TFDS `data_dir`.

`read_tfds(task, split, languages, data_dir)` returns what
`xlm_jax.data.xtreme_readers.read_task` returns for the XTREME download layout:
`{lang: [PairExample | TaggedSentence | QAExample]}`, with the labels spelled the same way, so
fine-tuning can take either source. It only reads: `tfds.builder(name, data_dir=...)` +
`as_dataset`, never `download_and_prepare`. A dataset that is not prepared in `data_dir` is a
one-line ValueError naming the builder, config and data_dir and the `tfds build` command that
prepares it (that command downloads; run it where there is network).

Task -> TFDS builder (tensorflow_datasets 4.9; `{lang}` is the XTREME language code):

  xnli    dev, test: `xnli` (one config; `premise`: Translation of 15 languages, `hypothesis`:
          TranslationVariableLanguages, `label`: ClassLabel entailment/neutral/contradiction);
          train: `xtreme_xnli` (same features; XTREME's machine translations of MultiNLI, its
          `en` side is the English MultiNLI sentence pair, i.e. XTREME's `train-en.tsv`, the
          other 14 languages are the translate-train data).
  pawsx   `paws_x_wiki/{lang}` (de en es fr ja ko zh): train (the en config holds the English
          PAWS train set, the others PAWS-X's translated train set), validation, test;
          `label`: ClassLabel different_meaning/paraphrase -> '0'/'1'.
  panx    `wikiann/{lang}` (176 languages): train, validation, test; `tokens` (the `en:` prefix
          already stripped) and `tags` (ClassLabel of the PAN-X tag strings).
  udpos   `xtreme_pos/xtreme_pos_{lang}` (UD 2.5): train, dev, test; `tokens`, `upos`
          (ClassLabel of the 17 UPOS tags). TFDS 4.9 swaps Tamil and Tagalog (its config `ta`
          reads the UD Tagalog treebank, `tl` the Tamil ones); this reader undoes that, so `ta`
          here is Tamil (config `xtreme_pos_tl`) and `tl` Tagalog (config `xtreme_pos_ta`).
          Preparing it needs the `conllu` package; reading does not.
  squad   `squad/v1.1`: train, validation (language en).
  xquad   `xquad/{lang}`: test (and, besides `en`, XTREME's translate-train, translate-dev and
          translate-test splits).
  mlqa    `mlqa/{lang}`: validation, test (context and question in the same language).
  tydiqa  `tydi_qa/goldp`: train (all nine languages in one split; the language is the prefix
          of the question id, `arabic-...`, as XTREME's preprocessing splits it), the per-
          language dev files `validation-{lang}` (XTREME's TyDiQA test set), and
          `translate-train-{lang}`.

Splits are named as in the XTREME layout (`train`, `dev`, `test`); `validation` is accepted for
`dev`, and the translate splits by their TFDS names. Differences from the XTREME download
layout: TFDS keeps the labels and answers XTREME blanks out of its test files (so `label` /
`answers` are filled there), the examples come in the order TFDS stored them (not the source
files' order), the tydiqa train ids are TFDS's full ids, and TFDS's own cleaning applies
(UD-POS drops tokens whose form or UPOS is `_`). QA answers are checked like
`read_squad` does (`context[start:start + len(text)] == text`).

TensorFlow and tensorflow_datasets are imported inside the functions.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator

from xlm_jax.data.xtreme_readers import (
    PANX_LABELS,
    PAWSX_LABELS,
    UPOS_TAGS,
    XNLI_LABELS,
    Answer,
    PairExample,
    QAExample,
    TaggedSentence,
)

TFDS_TASKS = ("xnli", "pawsx", "panx", "udpos", "squad", "xquad", "mlqa", "tydiqa")

# XTREME's TyDiQA language names (the question-id prefix) -> ISO codes.
TYDIQA_LANGUAGES = {"ar": "arabic", "bn": "bengali", "en": "english", "fi": "finnish",
                    "id": "indonesian", "ko": "korean", "ru": "russian", "sw": "swahili",
                    "te": "telugu"}
XNLI_LANGUAGES = ("ar", "bg", "de", "el", "en", "es", "fr", "hi", "ru", "sw", "th", "tr", "ur",
                  "vi", "zh")
PAWSX_LABEL_NAMES = {"different_meaning": "0", "paraphrase": "1"}
# TFDS's xtreme_pos config language -> the language its data really is (see the docstring).
_UDPOS_SWAPPED = {"ta": "tl", "tl": "ta"}


@dataclasses.dataclass(frozen=True)
class _Source:
    """Where one language of one task split lives in TFDS."""

    builder: str
    config: str | None
    split: str

    @property
    def ref(self) -> str:
        return self.builder if self.config is None else f"{self.builder}/{self.config}"


# task -> {split: (builder, config template, TFDS split template)}; `{lang}` / `{cfg}` are
# filled per language (`{cfg}` is the TFDS config language, different for udpos ta/tl).
_LAYOUT: dict[str, dict[str, tuple[str, str | None, str]]] = {
    "xnli": {"train": ("xtreme_xnli", None, "train"), "dev": ("xnli", None, "validation"),
             "test": ("xnli", None, "test")},
    "pawsx": {s: ("paws_x_wiki", "{cfg}", t) for s, t in
              (("train", "train"), ("dev", "validation"), ("test", "test"))},
    "panx": {s: ("wikiann", "{cfg}", t) for s, t in
             (("train", "train"), ("dev", "validation"), ("test", "test"))},
    "udpos": {s: ("xtreme_pos", "xtreme_pos_{cfg}", s) for s in ("train", "dev", "test")},
    "squad": {"train": ("squad", "v1.1", "train"), "dev": ("squad", "v1.1", "validation")},
    "xquad": {s: ("xquad", "{cfg}", s) for s in
              ("test", "translate-train", "translate-dev", "translate-test")},
    "mlqa": {"dev": ("mlqa", "{cfg}", "validation"), "test": ("mlqa", "{cfg}", "test")},
    "tydiqa": {"train": ("tydi_qa", "goldp", "train"),
               "dev": ("tydi_qa", "goldp", "validation-{lang}"),
               "translate-train": ("tydi_qa", "goldp", "translate-train-{lang}")},
}


def _split_key(task: str, split: str) -> str:
    if task not in _LAYOUT:
        raise ValueError(f"unknown TFDS task {task!r} (expected one of {', '.join(TFDS_TASKS)})")
    splits = _LAYOUT[task]
    key = "dev" if split == "validation" and "dev" in splits else split
    if key not in splits:
        raise ValueError(f"task {task} has no split {split!r} in TFDS "
                         f"(expected one of {', '.join(splits)})")
    return key


def _tfds():
    import tensorflow_datasets as tfds  # lazily: TF is heavy and optional

    return tfds


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0] if text else type(e).__name__


def _config_languages(builder: str) -> tuple[str, ...]:
    """The languages a per-language-config builder has, in XTREME codes."""
    try:
        configs = [c.name for c in _tfds().builder_cls(builder).BUILDER_CONFIGS]
    except Exception as e:  # noqa: BLE001 - a missing builder in this TFDS version
        raise ValueError(f"TFDS has no builder {builder!r} "
                         f"(tensorflow_datasets {_tfds().__version__}): {_one_line(e)}") from None
    if builder == "xtreme_pos":
        configs = [c[len("xtreme_pos_"):] for c in configs if c.startswith("xtreme_pos_")]
        return tuple(sorted(_UDPOS_SWAPPED.get(c, c) for c in configs))
    if builder == "squad":
        return ("en",)
    return tuple(sorted(configs))


def _task_languages(task: str, key: str) -> tuple[str, ...]:
    builder = _LAYOUT[task][key][0]
    if task == "xnli":
        return XNLI_LANGUAGES
    if task == "tydiqa":
        langs = tuple(sorted(TYDIQA_LANGUAGES))
        return tuple(lang for lang in langs if lang != "en") if key == "translate-train" else langs
    langs = _config_languages(builder)
    if task == "xquad" and key != "test":
        langs = tuple(lang for lang in langs if lang != "en")  # no translate splits for en
    return langs


def _source(task: str, key: str, lang: str) -> _Source:
    builder, config, split = _LAYOUT[task][key]
    cfg = _UDPOS_SWAPPED.get(lang, lang) if task == "udpos" else lang
    if config is not None:
        config = config.format(cfg=cfg)
    return _Source(builder, config, split.format(lang=lang))


def _load_builder(src: _Source, data_dir: str | None):
    """The prepared TFDS builder of `src` in `data_dir` (ValueError when it is not prepared)."""
    tfds = _tfds()
    try:
        builder = tfds.builder(src.ref, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001 - DatasetNotFoundError, unknown config, ...
        raise ValueError(f"TFDS cannot make builder {src.ref!r} "
                         f"(tensorflow_datasets {tfds.__version__}): {_one_line(e)}") from None
    if not builder.is_prepared():
        root = str(builder.data_dir_root)
        found = _found_versions(root, src)
        raise ValueError(f"TFDS dataset {src.ref} (version {builder.version}) is not prepared in "
                         f"data_dir {root}{found}: prepare it first (`tfds build {src.ref} "
                         f"--data_dir={root}`, which downloads); read_tfds never downloads")
    if src.split not in builder.info.splits:
        raise ValueError(f"TFDS dataset {src.ref} in {builder.data_dir_root} has no split "
                         f"{src.split!r} (its splits: {', '.join(sorted(builder.info.splits))})")
    return builder


def _found_versions(root: str, src: _Source) -> str:
    directory = os.path.join(root, src.builder, *([src.config] if src.config else []))
    try:
        versions = sorted(n for n in os.listdir(directory) if n[:1].isdigit())
    except OSError:
        return ""
    return f" (versions there: {', '.join(versions)})" if versions else ""


def _prepared_languages(task: str, key: str, data_dir: str | None) -> list[str]:
    """Languages whose per-language config is prepared in `data_dir` (languages=None)."""
    langs = _task_languages(task, key)
    builder = _LAYOUT[task][key][0]
    try:
        probe = _tfds().builder(_source(task, key, langs[0]).ref, data_dir=data_dir)
    except Exception as e:  # noqa: BLE001
        raise ValueError(f"TFDS cannot make builder {builder!r} "
                         f"(tensorflow_datasets {_tfds().__version__}): {_one_line(e)}") from None
    root = str(probe.data_dir_root)
    try:
        present = set(os.listdir(os.path.join(root, builder)))
    except OSError:
        present = set()
    found = []
    for lang in langs:
        src = _source(task, key, lang)
        if src.config in present:
            b = _tfds().builder(src.ref, data_dir=data_dir)
            if b.is_prepared() and src.split in b.info.splits:
                found.append(lang)
    if not found:
        example = _source(task, key, "en" if "en" in langs else langs[0]).ref
        raise ValueError(f"no TFDS {builder} config with a {_LAYOUT[task][key][2]!r} split is "
                         f"prepared in data_dir {root}: prepare the languages you need first "
                         f"(e.g. `tfds build {example} --data_dir={root}`)")
    return found


def _numpy(builder, split: str) -> Iterator[dict]:
    return iter(_tfds().as_numpy(builder.as_dataset(split=split, shuffle_files=False)))


def _text(value) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


class _Labels:
    """A ClassLabel index -> the XTREME label string (None for -1, TFDS's "no label"); a
    name the XTREME task lacks is a ValueError when it occurs (TFDS's UPOS list, e.g., has a
    `_` class that xtreme_pos never emits)."""

    def __init__(self, feature, allowed, src: _Source, rename: dict[str, str] | None = None):
        self.names = [(rename or {}).get(n, n) for n in feature.names]
        self.allowed = tuple(allowed)
        self.src = src

    def __call__(self, index) -> str | None:
        index = int(index)
        if index < 0:
            return None
        name = self.names[index]
        if name not in self.allowed:
            raise ValueError(f"TFDS dataset {self.src.ref} split {self.src.split}: label {name!r} "
                             f"is not an XTREME label (expected one of {', '.join(self.allowed)})")
        return name


# ----------------------------------------------------------------------------- per task

def _read_xnli(builder, src: _Source, langs: list[str]) -> dict[str, list]:
    label_of = _Labels(builder.info.features["label"], XNLI_LABELS, src,
                       {"contradictory": "contradiction"})
    out: dict[str, list] = {lang: [] for lang in langs}
    for ex in _numpy(builder, src.split):
        label = label_of(ex["label"])
        premise = ex["premise"]
        hyp = dict(zip((_text(x) for x in ex["hypothesis"]["language"]),
                       (_text(x) for x in ex["hypothesis"]["translation"])))
        for lang in langs:
            s1 = _text(premise.get(lang, b""))
            s2 = hyp.get(lang)
            if s2 is None or (not s1 and not s2):
                continue  # the pair has no text in this language
            out[lang].append(PairExample(s1, s2, label, lang))
    return out


def _read_pawsx(builder, src: _Source, lang: str) -> list:
    label_of = _Labels(builder.info.features["label"], PAWSX_LABELS, src, PAWSX_LABEL_NAMES)
    return [PairExample(_text(ex["sentence1"]), _text(ex["sentence2"]), label_of(ex["label"]), lang)
            for ex in _numpy(builder, src.split)]


def _read_tagged(builder, src: _Source, lang: str, label_key: str, allowed) -> list:
    label_of = _Labels(builder.info.features[label_key].feature, allowed, src)
    out = []
    for ex in _numpy(builder, src.split):
        tokens = tuple(_text(t) for t in ex["tokens"])
        if not tokens:
            continue
        out.append(TaggedSentence(tokens, tuple(label_of(i) for i in ex[label_key]), lang))
    return out


def _qa_example(ex: dict, src: _Source, lang: str) -> QAExample:
    qid = _text(ex["id"])
    context = _text(ex["context"])
    answers = []
    for text, start in zip(ex["answers"]["text"], ex["answers"]["answer_start"]):
        text, start = _text(text), int(start)
        if text == "" and start == 0:
            continue  # XTREME's blanked test answer
        found = context[start:start + len(text)] if start >= 0 else ""
        if found != text:
            raise ValueError(f"TFDS dataset {src.ref} split {src.split}: question {qid!r}: answer "
                             f"{text[:60]!r} is not at answer_start {start} of its context "
                             f"(found {found[:60]!r})")
        answers.append(Answer(text, start))
    return QAExample(qid, _text(ex["question"]), context, tuple(answers), lang)


def _read_qa(builder, src: _Source, lang: str) -> list:
    return [_qa_example(ex, src, lang) for ex in _numpy(builder, src.split)]


def _read_tydiqa_train(builder, src: _Source, langs: list[str]) -> dict[str, list]:
    iso = {name: code for code, name in TYDIQA_LANGUAGES.items()}
    out: dict[str, list] = {lang: [] for lang in langs}
    for ex in _numpy(builder, src.split):
        qid = _text(ex["id"])
        prefix = qid.split("-")[0]
        if prefix not in iso:
            raise ValueError(f"TFDS dataset {src.ref} split {src.split}: question id {qid!r} does "
                             f"not start with a TyDiQA language name "
                             f"({', '.join(TYDIQA_LANGUAGES.values())})")
        if iso[prefix] in out:
            out[iso[prefix]].append(_qa_example(ex, src, iso[prefix]))
    for lang, examples in out.items():
        if not examples:
            raise ValueError(f"TFDS dataset {src.ref} split {src.split} has no question of "
                             f"language {lang!r} (no id starting with {TYDIQA_LANGUAGES[lang]}-)")
    return out


# ----------------------------------------------------------------------------- entry point

def read_tfds(task: str, split: str, languages: Iterable[str] | str | None = None,
              data_dir: str | None = None) -> dict[str, list]:
    """{lang: examples} of one XTREME task split read from TFDS datasets prepared in `data_dir`
    (None: TFDS's default, `$TFDS_DATA_DIR` or `~/tensorflow_datasets`).

    `languages` (a list or a comma-separated string) defaults to every language of the task
    whose TFDS data is prepared (tasks with one builder for all languages: all of them).
    Examples are `PairExample` (xnli, pawsx), `TaggedSentence` (panx, udpos) or `QAExample`
    (squad, xquad, mlqa, tydiqa), with the label strings of `xtreme_readers`.
    """
    key = _split_key(task, split)
    if data_dir is not None:
        data_dir = os.fspath(data_dir)
    if isinstance(languages, str):
        languages = [lang.strip() for lang in languages.split(",") if lang.strip()]
    known = _task_languages(task, key)
    if languages is None:
        single = task in ("xnli", "tydiqa")
        wanted = list(known) if single else _prepared_languages(task, key, data_dir)
    else:
        wanted = list(dict.fromkeys(languages))
        if not wanted:
            raise ValueError(f"no languages given for task {task} {split}")
    for lang in wanted:
        if lang not in known:
            raise ValueError(f"unknown language {lang!r} for task {task} split {split} in TFDS "
                             f"{_LAYOUT[task][key][0]} (expected one of {', '.join(known)})")

    if task == "xnli" or (task == "tydiqa" and key == "train"):
        src = _source(task, key, wanted[0])
        builder = _load_builder(src, data_dir)
        reader = _read_xnli if task == "xnli" else _read_tydiqa_train
        return reader(builder, src, wanted)

    out: dict[str, list] = {}
    for lang in wanted:
        src = _source(task, key, lang)
        builder = _load_builder(src, data_dir)
        if task == "pawsx":
            out[lang] = _read_pawsx(builder, src, lang)
        elif task == "panx":
            out[lang] = _read_tagged(builder, src, lang, "tags", PANX_LABELS)
        elif task == "udpos":
            out[lang] = _read_tagged(builder, src, lang, "upos", UPOS_TAGS)
        else:
            out[lang] = _read_qa(builder, src, lang)
    return out
