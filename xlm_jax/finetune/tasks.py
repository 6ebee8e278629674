"""What a fine-tuning task is: its data (an XTREME-layout folder read from local files), its
kind (classification, tagging, QA), its labels and metric, and the cross-lingual setting.

Each kind is a record (`FinetuneKind`, looked up with `finetune_kind`): the trainer's
objective name, its metrics, its task head, how its examples become rows and how its
predictions are scored; `run.finetune` calls those fields.

Settings (XTREME, and the four papers' tables):
- "zero_shot": fine-tune on English (`train_languages=("en",)`), test on every language;
- "translate_train_all": fine-tune on the training files of every language the folder has
  (English and the machine-translated ones), test on every language.
Model selection reads the dev sets: English only (`select_on="en"`, the papers' default) or
every language's (`select_on="all"`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gin

from xlm_jax.data import xtreme_readers as readers
from xlm_jax.finetune import evaluate as ev
from xlm_jax.finetune import rows as rows_lib
from xlm_jax.objectives import task_heads as heads

SETTINGS = ("zero_shot", "translate_train_all")
SELECT_ON = ("en", "all")
SOURCES = ("files", "tfds")


# ----------------------------------------------------------------------------- kinds

@dataclasses.dataclass(frozen=True)
class FinetuneKind:
    """One fine-tuning kind.

    objective: the trainer's objective name (its metrics are logged under it).
    metrics: the metrics that score it (`FinetuneTask.metric`).
    head: `(model, name, num_labels) -> Objective`, the task head on the encoder.
    rows: `(task, examples, tokenizer, labels, lang_id, training) -> features.Rows`.
    score: `(task, logits, rows, examples, labels, lang) -> float` (0-100); `lang` is the
      language whose normalisation scores MLQA's own files, else None.
    """

    name: str
    objective: str
    metrics: tuple[str, ...]
    head: Callable[..., Any]
    rows: Callable[..., rows_lib.Rows]
    score: Callable[..., float]


def _qa_rows(task, examples, tokenizer, labels, lang_id, training) -> rows_lib.Rows:
    from xlm_jax.finetune import qa

    f = qa.featurize(examples, tokenizer, max_length=task.max_length,
                     doc_stride=task.doc_stride, max_query_length=task.max_query_length,
                     training=training)
    arrays = {"input_ids": f.input_ids, "start_positions": f.start_positions,
              "end_positions": f.end_positions,
              **rows_lib.lang_id_arrays(f.input_ids, lang_id, tokenizer.pad_id)}
    return rows_lib.Rows(arrays, qa_features=f)


FINETUNE_KINDS: dict[str, FinetuneKind] = {k.name: k for k in (
    FinetuneKind(
        name="classification", objective="classify", metrics=("accuracy",),
        head=heads.SequenceClassification,
        rows=lambda task, exs, tok, labels, lang_id, training: rows_lib.pair_rows(
            exs, tok, task.max_length, labels, lang_id),
        score=lambda task, logits, rows, exs, labels, lang: ev.score_classification(
            logits, rows)),
    FinetuneKind(
        name="tagging", objective="tag", metrics=("f1", "accuracy"),
        head=heads.TokenClassification,
        rows=lambda task, exs, tok, labels, lang_id, training: rows_lib.tagged_rows(
            exs, tok, task.max_length, labels, lang_id),
        score=lambda task, logits, rows, exs, labels, lang: ev.score_tagging(
            logits, rows, exs, labels, task.metric)),
    FinetuneKind(
        name="qa", objective="qa", metrics=("f1", "exact_match"),
        head=lambda model, name, num_labels: heads.SpanExtraction(model, name),
        rows=_qa_rows,
        score=lambda task, logits, rows, exs, labels, lang: ev.score_qa(
            logits, rows, exs, task.metric, lang)),
)}
KINDS = tuple(FINETUNE_KINDS)


def finetune_kind(name: str) -> FinetuneKind:
    """The record of a kind name; a one-line ValueError naming the value and the kinds."""
    if name not in FINETUNE_KINDS:
        raise ValueError(f"FinetuneTask.kind={name!r}: expected one of {', '.join(KINDS)}")
    return FINETUNE_KINDS[name]


@gin.configurable
@dataclasses.dataclass(frozen=True)
class FinetuneTask:
    """One task's data and scoring; validated on creation (a ValueError names the field)."""

    # The XTREME task whose folder layout and format `data_dir` holds: xnli, pawsx, panx,
    # udpos, xquad, mlqa, tydiqa (see xlm_jax.data.xtreme_readers).
    xtreme_task: str = gin.REQUIRED
    # The XTREME download folder (it holds `xnli/`, `pawsx/`, `panx/`, ...), or one written
    # in its layout; with source="tfds", the TFDS data_dir the datasets are prepared in.
    data_dir: str = gin.REQUIRED
    # "files" (the XTREME layout, xlm_jax.data.xtreme_readers) or "tfds" (datasets
    # prepared with `tfds build`, xlm_jax.data.tfds_readers; needs TensorFlow).
    source: str = "files"
    kind: str = "classification"
    # Label strings in index order; empty = the sorted labels of the training files.
    labels: tuple[str, ...] = ()
    # Classification: accuracy; tagging: span "f1" (seqeval, NER) or token "accuracy" (POS);
    # QA: "f1" or "exact_match" (SQuAD v1.1's evaluation).
    metric: str = "accuracy"
    setting: str = "zero_shot"
    # Training languages in the zero-shot setting; translate_train_all reads every language's.
    train_languages: tuple[str, ...] = ("en",)
    # Languages scored on dev and test; empty = every language the test split has.
    eval_languages: tuple[str, ...] = ()
    select_on: str = "en"
    max_length: int = 128
    # QA only: window stride and question length (HF run_squad's defaults).
    doc_stride: int = 128
    max_query_length: int = 64
    # The XTREME tasks whose train / dev splits are read, when not `xtreme_task`'s own (QA
    # trains on SQuAD v1.1, "squad", and selects on its dev set; XQuAD has only a test split).
    train_task: str = ""
    dev_task: str = ""
    # Splits as the folder names them.
    train_split: str = "train"
    dev_split: str = "dev"
    test_split: str = "test"

    def __post_init__(self) -> None:
        kind = finetune_kind(self.kind)
        for field, value, valid in (("setting", self.setting, SETTINGS),
                                    ("select_on", self.select_on, SELECT_ON),
                                    ("source", self.source, SOURCES)):
            if value not in valid:
                raise ValueError(f"FinetuneTask.{field}={value!r}: expected one of "
                                 f"{', '.join(valid)}")
        if self.metric not in kind.metrics:
            raise ValueError(f"FinetuneTask.metric={self.metric!r} does not score a {self.kind} "
                             f"task; expected one of {', '.join(kind.metrics)}")
        if self.max_length < 8:
            raise ValueError(f"FinetuneTask.max_length={self.max_length} must be >= 8")


@dataclasses.dataclass(frozen=True)
class TaskData:
    """The examples of a task by split and language, and its label list."""

    train: dict[str, list[Any]]
    dev: dict[str, list[Any]]
    test: dict[str, list[Any]]
    labels: tuple[str, ...]


def _labels(split: str, where: str, examples: Sequence[Any]) -> list[str]:
    """The label strings of labelled examples; unlabelled ones (XTREME's hidden test labels)
    are an error: a split that is scored needs its labels."""
    if any(getattr(e, "labels", getattr(e, "label", "")) is None for e in examples):
        raise ValueError(f"{where}: the {split} examples have no labels (XTREME's test files "
                         "hide them); point FinetuneTask.test_split/dev_split at a labelled "
                         "split")
    return sorted(readers.label_set(e for e in examples if not hasattr(e, "answers")))


def _reader(task: FinetuneTask):
    if task.source == "tfds":
        from xlm_jax.data import tfds_readers  # TensorFlow: only on this path

        return lambda root, name, split, langs: tfds_readers.read_tfds(name, split, langs, root)
    return readers.read_task


def load(task: FinetuneTask) -> TaskData:
    """Reads the train/dev/test files the task's setting needs, checks that the evaluation
    labels are ones training saw, and fixes the label list."""
    read = _reader(task)
    train_langs = None if task.setting == "translate_train_all" else list(task.train_languages)
    train_task, dev_task = task.train_task or task.xtreme_task, task.dev_task or task.xtreme_task
    train = read(task.data_dir, train_task, task.train_split, train_langs)
    test = read(task.data_dir, task.xtreme_task, task.test_split,
                list(task.eval_languages) or None)
    eval_langs = list(task.eval_languages) or sorted(test)
    dev_langs = ["en"] if task.select_on == "en" else eval_langs
    dev = read(task.data_dir, dev_task, task.dev_split, dev_langs)
    where = f"{task.data_dir} ({train_task} {task.train_split})"
    train_all = [e for rows in train.values() for e in rows]
    train_labels = _labels("train", where, train_all)  # none for QA
    labels = tuple(task.labels) or tuple(train_labels)
    readers.check_label_sets(labels, train_labels, "the task's labels", where)
    for split, data in (("dev", dev), ("test", test)):
        for lang, rows in data.items():
            name = f"{task.data_dir} ({dev_task if split == 'dev' else task.xtreme_task} "
            name += f"{split}, {lang})"
            readers.check_label_sets(labels, _labels(split, name, rows), where, name)
    return TaskData(train=train, dev=dev, test=test, labels=labels)


def split_languages(data: Mapping[str, list[Any]]) -> list[str]:
    """English first, then the others sorted (the papers' column order)."""
    return sorted(data, key=lambda lang: (lang != "en", lang))
