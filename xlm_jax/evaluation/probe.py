"""Zero-shot transfer probe: a logistic-regression head on frozen sentence embeddings.

What: the cheap stand-in for fine-tuning on a cross-lingual sentence-pair task (the demo's
"translation or near miss?", `tasks/build_demo_pawsx.py`, or PAWS-X/XNLI in XTREME's layout).
Each sentence is embedded alone by the frozen encoder (`Encoder.embed_layers`, the path
retrieval takes: one layer's hidden states mean-pooled over real tokens); a pair (u, v) is the
feature vector [u, v, |u - v|, u * v] (InferSent / SentEval's pair features, Conneau et al.
2017); a softmax regression is fitted on the training language's pairs (English) and scored on
every test language: accuracy per language, the mean over the languages other than the
training one (zero-shot transfer) and the gap (training language minus that mean), the figures
the league reports for the fine-tuned task (`xlm_jax.league.score.TransferScore`). For a binary task
the mean ROC AUC of the head's score over the zero-shot languages is reported too (our
choice): on the demo task a model whose translations land nearer their English source than
the near misses do, but not as near as English copies (its positives), ranks the pairs
better than chance while every pair falls on the negative side, where accuracy stays at 50%.

How the head is fitted (our choices; no paper prescribes a probe for these tasks):
- features are standardised with the training pairs' mean and standard deviation, so that one
  regularisation strength suits models of any hidden size and activation scale;
- the loss is the mean cross-entropy plus `l2 / 2 * |W|^2` (the bias is not penalised); with
  l2 > 0 it is strictly convex in W, so the fit has one optimum, which the tests check against
  a Newton-method reference written in numpy;
- it is minimised by optax's L-BFGS (full batch, zero start, a fixed number of iterations), the
  quasi-Newton method scikit-learn's `LogisticRegression` uses by default; there is no closed
  form for logistic regression.

Models with language embeddings embed both sentences of a pair with the language of its file,
as `xlm_jax.finetune` encodes a pair. Files are read with `data.xtreme_readers` (standard
library only); nothing here imports TensorFlow, and jax only to fit the head and run a model.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from xlm_jax.data import xtreme_readers
from xlm_jax.evaluation import embedding

# The sentence-pair tasks of XTREME's layout the probe reads, with their label sets.
PAIR_TASKS: dict[str, tuple[str, ...]] = {"pawsx": xtreme_readers.PAWSX_LABELS,
                                          "xnli": xtreme_readers.XNLI_LABELS}


# ----------------------------------------------------------------------------- data

@dataclasses.dataclass(frozen=True)
class ProbeData:
    """The probe's pairs: the training language's training split and each test language's
    test split (labels as indices into `labels`)."""

    labels: tuple[str, ...]
    train_language: str
    train: list[xtreme_readers.PairExample]
    test: dict[str, list[xtreme_readers.PairExample]]


def read_probe_data(data_dir: str, task: str = "pawsx", train_language: str = "en",
                    languages: Sequence[str] | None = None, train_split: str = "train",
                    test_split: str = "test", max_train: int | None = None,
                    max_test: int | None = None) -> ProbeData:
    """Reads `data_dir/{task}/{split}-{lang}.tsv` (XTREME's layout). `languages`: the test
    languages (None: every language with a test file); the first `max_train` / `max_test`
    pairs of a file are kept (None: all). A missing directory or file, a file without labels
    (XTREME's own test files have none: use `test_split='dev'`) or no test language besides
    the training one is a one-line ValueError naming it."""
    if task not in PAIR_TASKS:
        raise ValueError(f"task={task!r} is not a sentence-pair task of the probe (expected "
                         f"one of {', '.join(PAIR_TASKS)})")
    if not os.path.isdir(data_dir):
        raise ValueError(f"data_dir={data_dir!r}: not a directory (expected the XTREME layout "
                         f"{task}/{{split}}-{{lang}}.tsv below it)")
    train = xtreme_readers.read_task(data_dir, task, train_split, [train_language])
    test = xtreme_readers.read_task(data_dir, task, test_split, languages)
    if not [lang for lang in test if lang != train_language]:
        raise ValueError(f"{task} {test_split}: no test language besides the training language "
                         f"{train_language!r} (languages: {', '.join(test)})")
    parts = [(train_split, train_language, train[train_language][:max_train])]
    parts += [(test_split, lang, exs[:max_test]) for lang, exs in test.items()]
    for split, lang, exs in parts:
        path = os.path.join(data_dir, task, f"{split}-{lang}.tsv")
        if not exs:
            raise ValueError(f"{path}: no sentence pairs")
        if any(ex.label is None for ex in exs):
            raise ValueError(f"{path}: no labels (XTREME's test files have none: score the dev "
                             "split instead)")
    return ProbeData(PAIR_TASKS[task], train_language, parts[0][2],
                     {lang: exs for _, lang, exs in parts[1:]})


# ----------------------------------------------------------------------------- the head

def pair_features(u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """[u, v, |u - v|, u * v] per row: [N, 4 D] from two [N, D] arrays."""
    return np.concatenate([u, v, np.abs(u - v), u * v], axis=-1).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class LinearProbe:
    """A fitted softmax regression over standardised features."""

    w: np.ndarray  # [F, K]
    b: np.ndarray  # [K]
    mean: np.ndarray  # [F] the training features' mean
    scale: np.ndarray  # [F] their standard deviation (1 where it is ~0)

    def logits(self, x: np.ndarray) -> np.ndarray:
        return ((x - self.mean) / self.scale) @ self.w + self.b

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.argmax(self.logits(x), axis=-1)


def regularised_loss(w: Any, b: Any, x: Any, y: Any, l2: float) -> Any:
    """Mean cross-entropy of softmax(x W + b) against integer labels y, plus l2/2 |W|^2."""
    logits = x @ w + b
    ce = optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()
    return ce + 0.5 * l2 * jnp.sum(w * w)


@functools.partial(jax.jit, static_argnames=("num_classes", "steps"))
def _lbfgs(x: jax.Array, y: jax.Array, l2: jax.Array, num_classes: int, steps: int
           ) -> tuple[jax.Array, jax.Array]:
    params = (jnp.zeros((x.shape[1], num_classes), jnp.float32),
              jnp.zeros((num_classes,), jnp.float32))

    def loss(p: tuple[jax.Array, jax.Array]) -> jax.Array:
        return regularised_loss(p[0], p[1], x, y, l2)

    opt = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    def body(_: Any, carry: Any) -> Any:
        p, state = carry
        value, grad = value_and_grad(p, state=state)
        updates, state = opt.update(grad, state, p, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(p, updates), state

    return jax.lax.fori_loop(0, steps, body, (params, opt.init(params)))[0]


def fit(x: np.ndarray, y: np.ndarray, num_classes: int, l2: float = 1e-2,
        steps: int = 100) -> LinearProbe:
    """The softmax regression minimising `regularised_loss` on standardised `x` [N, F] with
    labels `y` [N] in 0..num_classes-1 (`steps` L-BFGS iterations from zero)."""
    if l2 <= 0:
        raise ValueError(f"l2={l2!r} must be > 0 (the probe's loss is then strictly convex)")
    x = np.asarray(x, np.float32)
    mean = x.mean(axis=0)
    scale = x.std(axis=0)
    scale = np.where(scale > 1e-6, scale, 1.0).astype(np.float32)
    w, b = _lbfgs(jnp.asarray((x - mean) / scale), jnp.asarray(y, jnp.int32),
                  jnp.float32(l2), num_classes=num_classes, steps=steps)
    return LinearProbe(np.asarray(w), np.asarray(b), mean, scale)


# ----------------------------------------------------------------------------- evaluation

def roc_auc(scores: np.ndarray, labels: np.ndarray) -> float:
    """P(score of a positive > score of a negative), ties counting half (Mann-Whitney)."""
    pos, neg = scores[labels == 1], scores[labels == 0]
    if not len(pos) or not len(neg):
        return float("nan")
    return float(np.mean((pos[:, None] > neg[None]) + 0.5 * (pos[:, None] == neg[None])))


@dataclasses.dataclass(frozen=True)
class ProbeResult:
    """Accuracies (fractions) of one probe: on the training pairs and per test language;
    for a binary task also each test language's ROC AUC."""

    train_language: str
    train_accuracy: float
    accuracy: dict[str, float]
    auc: dict[str, float] | None = None
    counts: dict[str, int] | None = None  # test pairs per language

    @property
    def standard_error(self) -> float | None:
        """The binomial standard error of `average` (each zero-shot language's accuracy an
        independent proportion over its test pairs; None without `counts`)."""
        if not self.counts:
            return None
        terms = [p * (1.0 - p) / max(self.counts[lang], 1) for lang, p in self.transfer.items()]
        return float(np.sqrt(sum(terms)) / len(terms)) if terms else None

    @property
    def transfer(self) -> dict[str, float]:
        """The test languages other than the training one (zero-shot)."""
        return {k: v for k, v in self.accuracy.items() if k != self.train_language}

    @property
    def average(self) -> float:
        """Mean accuracy over the zero-shot languages."""
        return float(np.mean(list(self.transfer.values())))

    @property
    def gap(self) -> float | None:
        """Training language's test accuracy minus `average` (None: not tested)."""
        own = self.accuracy.get(self.train_language)
        return None if own is None else own - self.average

    @property
    def auc_average(self) -> float | None:
        """Mean ROC AUC over the zero-shot languages (None: not a binary task)."""
        if self.auc is None:
            return None
        return float(np.mean([v for k, v in self.auc.items() if k != self.train_language]))

    def scalars(self) -> dict[str, float]:
        """Percent: `acc_{lang}` per test language, `avg`, `gap` (when the training language
        was tested), `auc_avg` (binary tasks) and `train_acc`."""
        out = {f"acc_{lang}": 100.0 * v for lang, v in self.accuracy.items()}
        out["avg"] = 100.0 * self.average
        if self.standard_error is not None:
            out["avg_se"] = 100.0 * self.standard_error
        if self.gap is not None:
            out["gap"] = 100.0 * self.gap
        if self.auc_average is not None:
            out["auc_avg"] = 100.0 * self.auc_average
        out["train_acc"] = 100.0 * self.train_accuracy
        return out


def _labels(examples: Sequence[xtreme_readers.PairExample], labels: Sequence[str]) -> np.ndarray:
    index = {lab: i for i, lab in enumerate(labels)}
    return np.array([index[ex.label] for ex in examples], np.int32)


def evaluate(encoder: Any, data: ProbeData, layer: int, pool: str = "mean",
             max_length: int | None = None, batch_size: int = 64, l2: float = 1e-2,
             steps: int = 100) -> ProbeResult:
    """Embeds every distinct sentence once (per language for a model with language
    embeddings), fits the head on `data.train` and scores each test language."""
    by_lang = embedding.uses_languages(encoder)
    splits: Mapping[str, list[xtreme_readers.PairExample]] = {"": data.train, **data.test}

    def key(ex: xtreme_readers.PairExample, text: str) -> tuple[str | None, str]:
        return (ex.lang if by_lang else None, text)

    keys = list(dict.fromkeys(key(ex, s) for exs in splits.values() for ex in exs
                              for s in (ex.sentence1, ex.sentence2)))
    vecs = embedding.embed_keyed(encoder, keys, [layer], pool, max_length, batch_size)[0]
    at = {k: i for i, k in enumerate(keys)}

    def features(exs: Sequence[xtreme_readers.PairExample]) -> np.ndarray:
        u = vecs[[at[key(ex, ex.sentence1)] for ex in exs]]
        v = vecs[[at[key(ex, ex.sentence2)] for ex in exs]]
        return pair_features(u, v)

    x, y = features(data.train), _labels(data.train, data.labels)
    head = fit(x, y, len(data.labels), l2=l2, steps=steps)
    accuracy, auc = {}, {}
    for lang, exs in data.test.items():
        logits, labels = head.logits(features(exs)), _labels(exs, data.labels)
        accuracy[lang] = float(np.mean(np.argmax(logits, axis=-1) == labels))
        if len(data.labels) == 2:
            auc[lang] = roc_auc(logits[:, 1] - logits[:, 0], labels)
    return ProbeResult(data.train_language, float(np.mean(head.predict(x) == y)), accuracy,
                       auc if len(data.labels) == 2 else None,
                       {lang: len(exs) for lang, exs in data.test.items()})
