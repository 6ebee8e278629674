"""Scoring a fine-tuned checkpoint: predictions per language and the task's metric.

A checkpoint is the trainer's (`{seed_dir}/checkpoints/STEP`); its parameters are the
encoder and the task head (`params["objectives"]`), read with orbax. Metrics are those of
`xlm_jax.evaluation.metrics` (0-100): accuracy, seqeval span F1 (NER), token accuracy (POS),
SQuAD v1.1 F1 / exact match (QA; MLQA's test sets with MLQA's per-language normalisation).
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np

from xlm_jax import model_dir as md
from xlm_jax.evaluation.metrics import seqeval as seqeval_lib
from xlm_jax.evaluation.metrics import squad as squad_lib
from xlm_jax.finetune import rows as rows_lib
from xlm_jax.objectives import task_heads as heads


def load_params(run_dir: str, step: int) -> Any:
    """`{"encoder", "objectives"}` parameters of the trainer checkpoint `step` of `run_dir`
    (read alone: not the optimiser's moments)."""
    return md.restore_subtree(md.trainer_state_dir(run_dir, step), ("params",))


@functools.lru_cache(maxsize=8)
def _predict_fn(objective: heads._FinetuneObjective):
    if isinstance(objective, heads.SpanExtraction):
        return jax.jit(lambda p, b: objective.span_logits(p, b))
    return jax.jit(lambda p, b: objective.logits(p, b))


def predict(objective: heads._FinetuneObjective, params: Any, rows: rows_lib.Rows,
            batch_size: int) -> Any:
    """Logits of every row in order (numpy; a (start, end) pair of arrays for QA)."""
    fn = _predict_fn(objective)
    inputs = {k: v for k, v in rows.arrays.items() if k in ("input_ids", "lang_ids")}
    outs: list[Any] = []
    for batch, real in rows_lib.eval_batches(inputs, batch_size):
        out = jax.device_get(fn(params, batch))
        outs.append(jax.tree_util.tree_map(lambda x: np.asarray(x)[:real], out))
    return jax.tree_util.tree_map(lambda *xs: np.concatenate(xs), *outs)


def score_classification(logits: np.ndarray, rows: rows_lib.Rows) -> float:
    """Accuracy (%)."""
    return 100.0 * float(np.mean(np.argmax(logits, -1) == rows.arrays["label"]))


def tag_predictions(logits: np.ndarray, rows: rows_lib.Rows, sentences: Sequence[Any],
                    labels: Sequence[str]) -> list[list[str]]:
    """Each word's predicted label (read at its first piece). Words cut by the length limit
    get `labels[0]` (our choice; "O" in the PAN-X label list), so a cut sentence is scored,
    not skipped."""
    preds = []
    for r, sent in enumerate(sentences):
        first = np.flatnonzero(rows.arrays["labels"][r] >= 0)
        ids = np.argmax(logits[r, first], -1)
        words = [labels[i] for i in ids]
        words += [labels[0]] * (len(sent.tokens) - len(words))
        preds.append(words)
    return preds


def score_tagging(logits: np.ndarray, rows: rows_lib.Rows, sentences: Sequence[Any],
                  labels: Sequence[str], metric: str) -> float:
    """Span F1 (seqeval's default IOB semantics) or token accuracy (%)."""
    pred = tag_predictions(logits, rows, sentences, labels)
    gold = [[str(x) for x in s.labels] for s in sentences]
    if metric == "f1":
        return float(seqeval_lib.seqeval_scores(gold, pred)["f1"])
    flat_g = [x for s in gold for x in s]
    flat_p = [x for s in pred for x in s]
    return 100.0 * float(np.mean([g == p for g, p in zip(flat_g, flat_p)]))


def score_qa(logits: tuple[np.ndarray, np.ndarray], rows: rows_lib.Rows, examples: Sequence[Any],
             metric: str, lang: str | None = None) -> float:
    """F1 or exact match (%) of the n-best decoded spans (`finetune.qa.decode`): SQuAD v1.1's
    normalisation, or MLQA's for language `lang` when given (XTREME scores MLQA with MLQA's
    script, the other QA sets with SQuAD's)."""
    from xlm_jax.finetune import qa

    start, end = logits
    preds = qa.decode(examples, rows.qa_features, start, end)
    dataset = [{"paragraphs": [{"context": ex.context, "qas": [
        {"id": ex.id, "question": ex.question,
         "answers": [{"text": a.text, "answer_start": a.start} for a in ex.answers]}]}]}
        for ex in examples]
    if lang is not None:
        return float(squad_lib.mlqa_evaluate(dataset, preds, lang)[metric])
    return float(squad_lib.squad_evaluate(dataset, preds)[metric])
