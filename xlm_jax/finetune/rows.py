"""Fine-tuning examples -> fixed-length numpy rows, and the trainer's stream over them.

Rows are XLM-R's: a sentence pair is `<s> a </s></s> b </s>` (truncated longest-first, as
HF's `truncation=True` does for pairs), a tagged sentence `<s> w1 w2 ... </s>` with each word
tokenised alone (XTREME's `utils_tag.py` tokenises word by word, so a word's pieces never
merge with its neighbour's) and its label on the first piece, -1 on the others. Padding is
`<pad>` (id 1). Nothing here imports jax or TensorFlow.

`epoch_batches` is the training stream: the global batch of step s holds the rows
`s * B .. s * B + B - 1` of an endless sequence of epochs, each a fresh permutation seeded by
(seed, epoch). It is a function of (seed, step) alone, so a resumed run rebuilds it at its
step at once and sees exactly the rows of the uninterrupted one.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

IGNORE = -1


@dataclasses.dataclass(frozen=True)
class Rows:
    """Featurised examples: `arrays` (name -> [N, ...] numpy). Tagging rows label the first
    piece of each word they kept (words past the length limit are cut)."""

    arrays: dict[str, np.ndarray]
    qa_features: Any = None  # QA: the `finetune.qa.QAFeatures` the rows came from

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))


def lang_id_arrays(ids: np.ndarray, lang_id: int | None, pad_id: int) -> dict[str, np.ndarray]:
    """`{"lang_ids": lang_id on real tokens, 0 on padding}`, or {} for a model without
    language embeddings (`lang_id` None)."""
    if lang_id is None:
        return {}
    return {"lang_ids": np.where(ids != pad_id, lang_id, 0).astype(np.int32)}


def pair_rows(examples: Sequence[Any], tokenizer: Any, max_length: int,
              labels: Sequence[str], lang_id: int | None = None) -> Rows:
    """`<s> a </s></s> b </s>` rows of `PairExample`s (`sentence1`, `sentence2`, `label`) with
    `label` the index of the example's label in `labels`."""
    if max_length < 6:
        raise ValueError(f"max_length={max_length} leaves no room for a pair (4 special "
                         "tokens + at least one piece per side)")
    index = {str(lab): i for i, lab in enumerate(labels)}
    ids = np.full((len(examples), max_length), tokenizer.pad_id, np.int32)
    out = np.zeros((len(examples),), np.int32)
    bos, eos = tokenizer.bos_id, tokenizer.eos_id
    for r, ex in enumerate(examples):
        a, b = tokenizer.encode(ex.sentence1), tokenizer.encode(ex.sentence2)
        while len(a) + len(b) > max_length - 4:  # longest first
            (a if len(a) >= len(b) else b).pop()
        row = [bos] + a + [eos, eos] + b + [eos]
        ids[r, :len(row)] = row
        if str(ex.label) not in index:
            raise ValueError(f"label {ex.label!r} of example {r} ({ex.lang}) is not one of "
                             f"the task's labels {list(labels)}")
        out[r] = index[str(ex.label)]
    return Rows({"input_ids": ids, "label": out, **lang_id_arrays(ids, lang_id, tokenizer.pad_id)})


def tagged_rows(sentences: Sequence[Any], tokenizer: Any, max_length: int,
                labels: Sequence[str], lang_id: int | None = None) -> Rows:
    """`<s> pieces </s>` rows of `TaggedSentence`s (`tokens`, `labels`): `labels` [N, T] holds
    each word's label index at its first piece and -1 elsewhere; a word with no piece (text
    SentencePiece drops entirely) is given `<unk>`. Words that do not fit are cut."""
    index = {str(lab): i for i, lab in enumerate(labels)}
    ids = np.full((len(sentences), max_length), tokenizer.pad_id, np.int32)
    tags = np.full((len(sentences), max_length), IGNORE, np.int32)
    for r, sent in enumerate(sentences):
        row, first = [tokenizer.bos_id], []
        for word, lab in zip(sent.tokens, sent.labels):
            pieces = tokenizer.encode(word) or [tokenizer.unk_id]
            if len(row) + len(pieces) > max_length - 1:
                break
            if str(lab) not in index:
                raise ValueError(f"label {lab!r} in sentence {r} ({sent.lang}) is not one of "
                                 f"the task's labels {list(labels)}")
            first.append((len(row), index[str(lab)]))
            row += pieces
        row.append(tokenizer.eos_id)
        ids[r, :len(row)] = row
        for pos, lab in first:
            tags[r, pos] = lab
    return Rows({"input_ids": ids, "labels": tags, **lang_id_arrays(ids, lang_id, tokenizer.pad_id)})


def epoch_batches(arrays: Mapping[str, np.ndarray], global_batch: int, seed: int,
                  start_step: int) -> Iterator[dict[str, np.ndarray]]:
    """Endless global batches from step `start_step` on; see the module docstring."""
    n = len(next(iter(arrays.values())))
    if n == 0:
        raise ValueError("no training rows")
    perms: dict[int, np.ndarray] = {}

    def perm(epoch: int) -> np.ndarray:
        if epoch not in perms:
            if len(perms) > 2:  # the epochs of one batch at most: drop the older ones
                perms.clear()
            perms[epoch] = np.random.default_rng([seed, epoch]).permutation(n)
        return perms[epoch]

    step = start_step
    while True:
        g = np.arange(step * global_batch, (step + 1) * global_batch, dtype=np.int64)
        epochs, within = g // n, g % n
        rows = np.empty_like(within)
        for e in np.unique(epochs):
            sel = epochs == e
            rows[sel] = perm(int(e))[within[sel]]
        yield {k: v[rows] for k, v in arrays.items()}
        step += 1


def eval_batches(arrays: Mapping[str, np.ndarray], batch_size: int
                 ) -> Iterator[tuple[dict[str, np.ndarray], int]]:
    """`(batch, real rows)` in order; the last batch is filled with copies of row 0 so that
    every batch has one shape (one compilation)."""
    n = len(next(iter(arrays.values())))
    for start in range(0, n, batch_size):
        idx = np.arange(start, min(start + batch_size, n))
        real = len(idx)
        idx = np.concatenate([idx, np.zeros(batch_size - real, np.int64)])
        yield {k: v[idx] for k, v in arrays.items()}, real
