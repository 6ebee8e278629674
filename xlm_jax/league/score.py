"""What the objective league measures on a trained model directory (`python -m xlm_jax.league`).

- `masked_lm_heldout`: the masked-LM loss and accuracy on held-out text (the Tatoeba-style
  split, which no training file contains), next to the two context-free yardsticks of the same
  targets: the entropy of their unigram distribution (the loss of the best predictor that reads
  no context) and the rate of their most frequent token (the accuracy of the best constant
  guess). A masked LM below the first and above the second uses context. Why not ln V or the
  training loss: the demo's 1 x 64 MLMs sat at ~6.3 nats, far below ln 8002 = 9.0 yet above the
  unigram entropy, predicting "▁" everywhere (docs/NOTES.md, "XLM-E generator, corrected").
- `retrieval_scores`: Tatoeba acc@1 through `xlm_jax.evaluation.retrieval` at every layer.
- `transfer_scores`: the demo transfer task through `python -m xlm_jax.finetune` (a subprocess:
  the fine-tuning trainer's gin state stays out of the caller), English-trained, zero-shot
  accuracy averaged over the other languages and the transfer gap.

Every function here reads a model directory through public entry points (`load_encoder`,
`retrieval.evaluate`, the finetune CLI) and is deterministic for a given directory.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

ENGLISH_FILE = "eng"


@dataclasses.dataclass(frozen=True)
class MaskedLMScore:
    """Held-out masked-LM quality and its context-free yardsticks (nats, rates in [0, 1])."""

    loss: float  # mean cross-entropy at the masked positions
    accuracy: float  # argmax == target at the masked positions
    unigram_entropy: float  # entropy of the held-out tokens' unigram distribution
    most_frequent_rate: float  # share of the held-out tokens equal to the most frequent one
    most_frequent_token: str  # that token's piece
    # The same two yardsticks for a predictor that knows each sentence's language but reads no
    # other context: each language's own unigram distribution (held-out plug-in estimates,
    # weighted by the languages' token counts). In 77 languages, identifying the language alone
    # takes a masked LM far below the global unigram entropy.
    language_unigram_entropy: float
    language_most_frequent_rate: float
    targets: int  # masked positions scored
    tokens: int  # regular tokens the yardsticks are computed over
    sentences: int

    @property
    def uses_context(self) -> bool:
        """Loss below the unigram entropy and accuracy above the most-frequent rate."""
        return self.loss < self.unigram_entropy and self.accuracy > self.most_frequent_rate

    @property
    def beyond_language(self) -> bool:
        """Both yardsticks beaten for a predictor that knows the language too."""
        return (self.loss < self.language_unigram_entropy
                and self.accuracy > self.language_most_frequent_rate)


def heldout_sentences(tatoeba_dir: str, languages: Sequence[str] | None = None
                      ) -> list[tuple[str, str]]:
    """`(language, sentence)` of the held-out split: every language's own side and the English
    side once (the English strings repeat across the files), in a fixed order."""
    from xlm_jax.evaluation import retrieval

    langs = list(languages) if languages else retrieval.find_languages(tatoeba_dir)
    out: list[tuple[str, str]] = []
    english: dict[str, None] = {}
    for lang in langs:
        pair = retrieval.read_pair(tatoeba_dir, lang)
        out += [(lang, s) for s in pair.src if s]
        english.update({s: None for s in pair.eng if s})
    return out + [("en", s) for s in english]


def masked_lm_heldout(model_dir: str, tatoeba_dir: str, seq_len: int,
                      languages: Sequence[str] | None = None, mask_prob: float = 0.15,
                      seed: int = 0, batch_size: int = 64) -> MaskedLMScore:
    """Masks `mask_prob` of the regular tokens of every held-out sentence (at least one; the
    positions drawn by numpy from `seed`, so the targets are the same for every model) with
    `<mask>`, and scores the model's predictions there; rows are `<s> tokens </s>` cut to
    `seq_len` (the training length)."""
    from xlm_jax.encoder import load_encoder

    enc = load_encoder(model_dir)
    tok = enc.tokenizer
    special = {tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id, tok.mask_id}
    pairs = heldout_sentences(tatoeba_dir, languages)
    rng = np.random.default_rng(seed)
    rows, masks, targets, langs = [], [], [], []
    counts: dict[int, int] = {}
    by_lang: dict[str, dict[int, int]] = {}
    for lang, text in pairs:
        ids = [tok.bos_id] + tok.encode(text)[:seq_len - 2] + [tok.eos_id]
        regular = [i for i, t in enumerate(ids) if t not in special]
        if not regular:
            continue
        own = by_lang.setdefault(lang, {})
        for i in regular:
            counts[ids[i]] = counts.get(ids[i], 0) + 1
            own[ids[i]] = own.get(ids[i], 0) + 1
        k = max(1, int(round(mask_prob * len(regular))))
        picked = np.sort(rng.choice(regular, size=k, replace=False))
        row = np.full(seq_len, tok.pad_id, np.int32)
        row[:len(ids)] = ids
        target = np.full(seq_len, -1, np.int32)
        target[picked] = row[picked]
        row[picked] = tok.mask_id
        rows.append(row)
        targets.append(target)
        masks.append((np.arange(seq_len) < len(ids)).astype(np.int32))
        langs.append(lang)
    # Rows sorted by length and each batch cut to a power-of-two width (>= 8): few shapes to
    # compile and little padding; padding changes no real token's prediction.
    lengths = np.array([int(m.sum()) for m in masks])
    order = np.argsort(lengths, kind="stable")
    nll_sum, correct, n = 0.0, 0, 0
    for start in range(0, len(order), batch_size):
        idx = order[start:start + batch_size]
        width = min(seq_len, max(8, 1 << int(lengths[idx].max() - 1).bit_length()))
        ids = np.full((batch_size, width), tok.pad_id, np.int32)  # one row count: few shapes
        mask = np.zeros((batch_size, width), np.int32)
        tgt = np.full((batch_size, width), -1, np.int32)
        for r, i in enumerate(idx):
            ids[r], mask[r], tgt[r] = rows[i][:width], masks[i][:width], targets[i][:width]
        lang_ids = _lang_ids(enc, [langs[i] for i in idx] + ["en"] * (batch_size - len(idx)),
                             mask)
        sel = tgt >= 0
        lg = enc.mlm_logits(ids, mask, lang_ids)[sel].astype(np.float64)
        t = tgt[sel]
        top = lg.max(-1)
        lse = np.log(np.sum(np.exp(lg - top[:, None]), -1)) + top
        nll_sum += float(np.sum(lse - lg[np.arange(len(t)), t]))
        correct += int(np.sum(lg.argmax(-1) == t))
        n += len(t)
    entropy, rate = _unigram(counts)
    total = sum(counts.values())
    lang_entropy = lang_rate = 0.0
    for own in by_lang.values():
        e, r = _unigram(own)
        share = sum(own.values()) / total
        lang_entropy += share * e
        lang_rate += share * r
    top = max(counts, key=lambda i: (counts[i], -i))
    return MaskedLMScore(loss=nll_sum / n, accuracy=correct / n, unigram_entropy=entropy,
                         most_frequent_rate=rate, most_frequent_token=_piece(tok, top),
                         language_unigram_entropy=lang_entropy,
                         language_most_frequent_rate=lang_rate, targets=n, tokens=total,
                         sentences=len(rows))


def _unigram(counts: dict[int, int]) -> tuple[float, float]:
    """(entropy in nats, rate of the most frequent token) of a token count table."""
    p = np.array(list(counts.values()), np.float64)
    p /= p.sum()
    return float(-np.sum(p * np.log(p))), float(p.max())


def _piece(tok: Any, token_id: int) -> str:
    from xlm_jax.data.vocab import fairseq_to_spm

    return tok._sp.id_to_piece(int(fairseq_to_spm(np.asarray([token_id]))[0]))


def _lang_ids(enc: Any, langs: Sequence[str], mask: np.ndarray) -> np.ndarray | None:
    """[B, T] language ids for a model with language embeddings, else None."""
    if not enc.has_language_embeddings:
        return None
    return np.stack([enc.lang_ids_for(lang, m[None])[0] for lang, m in zip(langs, mask)])


@dataclasses.dataclass(frozen=True)
class RetrievalScore:
    """Tatoeba acc@1 (%, mean of both directions over languages) per layer and at the best."""

    acc1: float
    best_layer: int
    per_layer: dict[int, float]


def retrieval_scores(model_dir: str, tatoeba_dir: str,
                     languages: Sequence[str] | None = None) -> RetrievalScore:
    """Every layer's average acc@1 and the best layer's (`retrieval.evaluate`, mean pooling)."""
    from xlm_jax.encoder import load_encoder
    from xlm_jax.evaluation import retrieval

    res = retrieval.evaluate(load_encoder(model_dir), tatoeba_dir, layers="all",
                             languages=list(languages) if languages else None)
    per_layer = {int(k): 100.0 * v for k, v in res.per_layer.items()}
    return RetrievalScore(acc1=per_layer[res.best_layer], best_layer=res.best_layer,
                          per_layer=per_layer)


@dataclasses.dataclass(frozen=True)
class TransferScore:
    """The demo transfer task (accuracy %, means over the fine-tuning seeds)."""

    avg: float  # zero-shot: mean over the languages other than English
    en: float  # English (the training language)
    gap: float  # en - avg
    seeds: int


def transfer_scores(init_from: str, out_dir: str, gin_files: Sequence[str],
                    bindings: Sequence[str], log: Any = None,
                    command: Callable[[list[str]], list[str]] | None = None) -> TransferScore:
    """Fine-tunes `init_from` on the transfer task with `python -m xlm_jax.finetune` into
    `out_dir` (which resumes and caches by itself) and reads its `results.json`.
    `command(args)` makes the command line (default `python -m xlm_jax.finetune ARGS`)."""
    results = os.path.join(out_dir, "results.json")
    if not os.path.isfile(results):
        args = [f"--init_from={init_from}", f"--model_dir={out_dir}",
                *[f"--gin_file={f}" for f in gin_files],
                *[f"--gin_bindings={b}" for b in bindings]]
        cmd = command(args) if command else [sys.executable, "-m", "xlm_jax.finetune", *args]
        run_logged(cmd, log, f"transfer fine-tuning of {init_from}")
    with open(results, encoding="utf-8") as f:
        data = json.load(f)
    means = {lang: v["mean"] for lang, v in data["languages"].items()}
    others = [v for lang, v in means.items() if lang != "en"]
    avg = float(np.mean(others))
    return TransferScore(avg=avg, en=float(means["en"]), gap=float(means["en"]) - avg,
                         seeds=len(data["seeds"]))


class SubprocessError(ChildProcessError):
    """A step of the league run in a subprocess failed; the message names it and its log."""


# The lines of a training child that `run_logged(echo=...)` shows on the terminal: the
# trainer's progress line, its phases (the step's compile, a resume), its health checks and
# its end; everything goes to the log.
ECHOED = re.compile(r"^(train \d+/\d+ |tasks: |step compiled |resumed from |health: |done: |"
                    r"error: |warning: |preempted )|health check: ")
ECHO_WIDTH = 160  # characters of an echoed line, its label included


def run_logged(cmd: Sequence[str], log: Any, what: str, echo: Any = None,
               label: str = "", started: Callable[[subprocess.Popen], None] | None = None
               ) -> None:
    """Runs `cmd` with its output appended to the open file `log` (None: inherited); a non-zero
    exit is a `SubprocessError` naming `what`, the command's last error line and the log.
    `echo` (a stream, with `log`): the child's `ECHOED` lines are also written there as they
    come, each as `  LABEL: LINE` cut to `ECHO_WIDTH` characters, one `write` per line (so
    that two runs echoing into one stream through a lock do not cut each other's lines);
    `started` (with `echo`) is given the child's `Popen` once it runs (to stop it from
    another thread)."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if log is None:
        proc = subprocess.run(list(cmd), env=env)
    elif echo is not None:
        log.flush()
        with subprocess.Popen(list(cmd), env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, encoding="utf-8",
                              errors="replace") as proc:
            if started is not None:
                started(proc)
            for line in proc.stdout:
                log.write(line)
                text = line.rstrip("\n")
                if ECHOED.search(text):
                    if "health check: " in text:
                        text = text[text.index("health check: "):]
                    echo.write(f"  {label or what}: {text}"[:ECHO_WIDTH] + "\n")
                    echo.flush()
        log.flush()
    else:
        log.flush()
        proc = subprocess.run(list(cmd), env=env, stdout=log, stderr=subprocess.STDOUT)
        log.flush()
    if proc.returncode:
        last = _last_error_line(getattr(log, "name", None))
        where = f" (log: {log.name})" if log is not None else ""
        raise SubprocessError(f"{what} failed with exit code {proc.returncode}: {last}{where}")


def _last_error_line(path: str | None) -> str:
    if not path or not os.path.isfile(path):
        return "see its output above"
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f.read().splitlines()[-200:] if line.strip()]
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or ["no output"])[-1]


def write_json_atomic(path: str, value: Any) -> None:
    """JSON written to a temporary name and renamed: a kill leaves the old file or the new
    (`model_dir.write_json`, which writes every file that way)."""
    from xlm_jax import model_dir as md

    md.write_json(path, value)


def read_json(path: str) -> Any | None:
    if not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)
