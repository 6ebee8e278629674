"""Extractive question answering (SQuAD v1.1 style): featurisation and span decoding.

This is the pre/post-processing XTREME uses to fine-tune and evaluate on SQuAD and to test
zero-shot on MLQA, XQuAD and TyDiQA-GoldP (`third_party/run_squad.py`, which calls HF
transformers' `squad_convert_examples_to_features` and `compute_predictions_logits`). Only
numpy and the SentencePiece tokenizer are used; the model itself lives elsewhere.

`featurize` turns examples into fixed-length rows

    <s> question </s> </s> context-window </s> <pad> ...

(the XLM-R/RoBERTa pair layout, HF's MULTI_SEP_TOKENS_TOKENIZERS_SET: 4 added tokens, no
token type ids). A context longer than one row is cut into overlapping windows whose starts
are `doc_stride` tokens apart, as HF's `squad_convert_example_to_features` does. Every context
token keeps its character span in the context (`XLMRTokenizer.encode_with_offsets`), so

  * training labels come straight from the answer's character offsets (the tokens that
    overlap `[start, start + len(text))`), where HF maps whitespace-split words to sub-tokens
    and then searches for a better-matching sub-span (`_improve_answer_span`);
  * `decode` cuts the answer out of the original context (`context[first_start:last_end]`),
    where HF detokenises and re-aligns it by a character heuristic (`get_final_text`);
    the original casing, spacing and characters (no NFKC normalisation) are kept.

`decode` follows HF's `compute_predictions_logits` for SQuAD v1.1: the `n_best` start and end
indices of every window, pairs inside the context with end >= start, length <=
`max_answer_length` and a start token in its max-context window (`_check_is_max_context`),
the best by start + end logit over all windows of an example. Examples are duck-typed: any
object with `.id`, `.question`, `.context` and `.answers` (each with `.text` and `.start`,
the character offset in the context), e.g. `xlm_jax.data.xtreme_readers.QAExample`.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Protocol, Sequence

import numpy as np

__all__ = ["QAFeatures", "featurize", "decode", "window_starts", "max_context_mask"]

# Tokens a row adds around the question and the window: <s> q </s> </s> ctx </s>.
N_SPECIAL = 4


class _Tokenizer(Protocol):
    """What `featurize` needs of a tokenizer (`xlm_jax.data.vocab.XLMRTokenizer` fits)."""

    bos_id: int
    eos_id: int
    pad_id: int

    def encode(self, text: str) -> list[int]: ...

    def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...


@dataclasses.dataclass(frozen=True, eq=False)
class QAFeatures:
    """Model inputs and the bookkeeping `decode` needs, one row per context window.

    input_ids:       [N, T] int32, `<s> question </s></s> window </s>` padded with `<pad>`.
    start_positions: [N] int32, row index of the first answer's first token; 0 (`<s>`) when the
                     answer is not wholly inside this window, or when built with training=False.
    end_positions:   [N] int32, likewise for the answer's last token.
    example_index:   [N] int32, index of the row's example in the `examples` sequence.
    context_spans:   [N, T, 2] int32, [start, end) character span in the context of each
                     context token; -1 for question, special and pad tokens.
    max_context:     [N, T] bool, True where a context token has more context in this window
                     than in any other (HF `_check_is_max_context`); False off the context.
    """

    input_ids: np.ndarray
    start_positions: np.ndarray
    end_positions: np.ndarray
    example_index: np.ndarray
    context_spans: np.ndarray
    max_context: np.ndarray

    @property
    def attention_mask(self) -> np.ndarray:
        """[N, T] int32, 1 on real tokens and 0 on `<pad>` (fairseq id 1, never inside a row)."""
        return (self.input_ids != 1).astype(np.int32)

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])


def window_starts(n_tokens: int, window: int, doc_stride: int) -> list[int]:
    """Start offsets of the context windows of `n_tokens` context tokens.

    Windows start every `doc_stride` tokens and hold up to `window` tokens; the last one is the
    first that reaches the end (HF: `while len(spans) * doc_stride < len(all_doc_tokens)`,
    stopping when the tokenizer reports no overflow). An empty context still gets one
    (empty) window, so that every example has a row and `decode` answers "" for it.
    """
    starts = [0]
    while starts[-1] + window < n_tokens:
        starts.append(starts[-1] + doc_stride)
    return starts


def max_context_mask(starts: Sequence[int], lengths: Sequence[int]) -> list[np.ndarray]:
    """For each window, a bool per token: is this the token's "max context" window?

    HF's `_check_is_max_context`: a token at context position p scores, in each window
    [s, s + len) that holds it, min(p - s, s + len - 1 - p) + 0.01 * len; the first window with
    the highest score wins (strict `>` there; `argmax` keeps the first maximum here).
    """
    n = max((s + ln for s, ln in zip(starts, lengths)), default=0)
    pos = np.arange(n)
    scores = np.full((len(starts), n), -np.inf)
    for w, (s, ln) in enumerate(zip(starts, lengths)):
        inside = slice(s, s + ln)
        scores[w, inside] = np.minimum(pos[inside] - s, s + ln - 1 - pos[inside]) + 0.01 * ln
    best = np.argmax(scores, axis=0) if n else np.zeros(0, np.int64)
    return [best[s : s + ln] == w for w, (s, ln) in enumerate(zip(starts, lengths))]


def _check_settings(max_length: int, doc_stride: int, max_query_length: int) -> int:
    """Validates the lengths; returns the smallest window (a question of max_query_length)."""
    for name, value in (("max_length", max_length), ("doc_stride", doc_stride),
                        ("max_query_length", max_query_length)):
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    window = max_length - max_query_length - N_SPECIAL
    if window < 1:
        raise ValueError(
            f"max_length={max_length} leaves no room for context after max_query_length="
            f"{max_query_length} and {N_SPECIAL} special tokens (need max_length >= "
            f"{max_query_length + N_SPECIAL + 1})")
    if doc_stride > window:
        raise ValueError(
            f"doc_stride={doc_stride} must be <= max_length - max_query_length - {N_SPECIAL} = "
            f"{window}, the shortest window, or context tokens between windows are never seen")
    return window


def _answer_token_span(example: Any, spans: list[tuple[int, int]]) -> tuple[int, int]:
    """First/last context token overlapping the first answer's character range.

    An empty token span (k, k) (a lone "▁", see `encode_with_offsets`) counts as overlapping
    when start <= k < end, so a word's leading "▁" piece belongs to the answer.
    """
    if not example.answers:
        raise ValueError(f"example {example.id!r}: training=True needs an answer, it has none")
    answer = example.answers[0]
    a_start, a_end = int(answer.start), int(answer.start) + len(answer.text)
    hits = [i for i, (s, e) in enumerate(spans) if s < a_end and max(e, s + 1) > a_start]
    if not hits:
        raise ValueError(
            f"example {example.id!r}: no context token overlaps the answer {answer.text!r} "
            f"at {a_start}")
    return hits[0], hits[-1]


def _check_answers(example: Any) -> None:
    """Each answer's `.start` must point at its `.text` in the context (reader bugs, such as
    byte offsets or offsets into an unstripped context, surface here, naming the example)."""
    for answer in example.answers:
        text = answer.text if isinstance(answer.text, str) else ""
        try:
            start = operator.index(answer.start)
        except TypeError:
            start = -1
        found = example.context[start : start + len(text)] if start >= 0 else None
        if not text.strip() or found != text:
            raise ValueError(
                f"example {example.id!r}: answer {answer.text!r} is not at character "
                f"{answer.start!r} of the context (found {found!r})")


def featurize(
    examples: Sequence[Any],
    tokenizer: _Tokenizer,
    max_length: int = 384,
    doc_stride: int = 128,
    max_query_length: int = 64,
    training: bool = True,
) -> QAFeatures:
    """Tokenizes QA examples into windows of at most `max_length` tokens (see the module doc).

    Questions are cut to their first `max_query_length` tokens (HF: `truncation=True,
    max_length=max_query_length`). Each window then holds up to `max_length - len(question) - 4`
    context tokens. With `training=True` the first answer is labelled in the windows that
    hold all of its tokens and 0 (`<s>`) elsewhere, as HF does (its out-of-span windows point
    at the CLS token); the windows are kept, not dropped. Raises ValueError for a bad setting
    or an answer whose `.start` does not point at its `.text` (naming the example id).
    """
    _check_settings(max_length, doc_stride, max_query_length)
    bos, eos, pad = tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id
    rows_ids: list[list[int]] = []
    rows_spans: list[np.ndarray] = []
    rows_max: list[np.ndarray] = []
    starts_out: list[int] = []
    ends_out: list[int] = []
    ex_index: list[int] = []
    for ei, ex in enumerate(examples):
        _check_answers(ex)
        q_ids = tokenizer.encode(ex.question)[:max_query_length]
        c_ids, c_spans = tokenizer.encode_with_offsets(ex.context)
        window = max_length - len(q_ids) - N_SPECIAL
        offset = len(q_ids) + 3  # row index of the first context token
        w_starts = window_starts(len(c_ids), window, doc_stride)
        w_lens = [min(window, len(c_ids) - s) for s in w_starts]
        w_max = max_context_mask(w_starts, w_lens)
        tok_span = _answer_token_span(ex, c_spans) if training else None
        for s, ln, is_max in zip(w_starts, w_lens, w_max):
            rows_ids.append([bos, *q_ids, eos, eos, *c_ids[s : s + ln], eos])
            spans = np.full((max_length, 2), -1, np.int32)
            spans[offset : offset + ln] = np.asarray(c_spans[s : s + ln], np.int32).reshape(-1, 2)
            rows_spans.append(spans)
            mask = np.zeros(max_length, bool)
            mask[offset : offset + ln] = is_max
            rows_max.append(mask)
            if tok_span is not None and s <= tok_span[0] and tok_span[1] < s + ln:
                starts_out.append(tok_span[0] - s + offset)
                ends_out.append(tok_span[1] - s + offset)
            else:
                starts_out.append(0)
                ends_out.append(0)
            ex_index.append(ei)
    input_ids = np.full((len(rows_ids), max_length), pad, np.int32)
    for r, ids in enumerate(rows_ids):
        input_ids[r, : len(ids)] = ids
    return QAFeatures(
        input_ids=input_ids,
        start_positions=np.asarray(starts_out, np.int32),
        end_positions=np.asarray(ends_out, np.int32),
        example_index=np.asarray(ex_index, np.int32),
        context_spans=(np.stack(rows_spans) if rows_spans
                       else np.zeros((0, max_length, 2), np.int32)),
        max_context=np.stack(rows_max) if rows_max else np.zeros((0, max_length), bool),
    )


def _top_indices(logits: np.ndarray, n: int) -> np.ndarray:
    """Indices of the `n` largest logits, largest first; ties keep the lower index first (HF
    `_get_best_indexes` sorts with Python's stable sort)."""
    return np.argsort(-logits, kind="stable")[:n]


def decode(
    examples: Sequence[Any],
    features: QAFeatures,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    n_best: int = 20,
    max_answer_length: int = 30,
) -> dict[str, str]:
    """Best answer text per example id, from [N, T] start/end logits of `features`' rows.

    `examples` must be the sequence `features` was built from. Per window: the `n_best`
    start and end indices; a pair is kept when both tokens are context tokens, end >= start,
    end - start + 1 <= `max_answer_length` and the start token has max context in this window.
    The pair with the highest start + end logit over all windows wins (the first one in window,
    start-rank, end-rank order on ties, as HF's stable sort), and its text is
    `context[span[start][0]:span[end][1]]`. Examples with no valid pair get "" (HF writes
    "empty" there).
    """
    for name, value in (("n_best", n_best), ("max_answer_length", max_answer_length)):
        if not isinstance(value, (int, np.integer)) or value < 1:
            raise ValueError(f"{name}={value!r} must be a positive int")
    start_logits = np.asarray(start_logits, np.float64)
    end_logits = np.asarray(end_logits, np.float64)
    shape = features.input_ids.shape
    if start_logits.shape != shape or end_logits.shape != shape:
        raise ValueError(
            f"logits shapes {start_logits.shape} / {end_logits.shape} must equal the features' "
            f"input_ids shape {shape}")
    if len(features) and int(features.example_index.max()) >= len(examples):
        raise ValueError(
            f"features refer to example {int(features.example_index.max())} but only "
            f"{len(examples)} examples were given")
    rows_of: dict[int, list[int]] = {}
    for r, ei in enumerate(features.example_index.tolist()):
        rows_of.setdefault(ei, []).append(r)
    out: dict[str, str] = {}
    for ei, ex in enumerate(examples):
        if ex.id in out:
            raise ValueError(f"duplicate example id {ex.id!r}")
        best: tuple[float, int, int, int] | None = None  # (score, row, start, end)
        for r in rows_of.get(ei, []):
            in_ctx = features.context_spans[r, :, 0] >= 0
            s_idx = _top_indices(start_logits[r], n_best)
            e_idx = _top_indices(end_logits[r], n_best)
            s_mat, e_mat = np.meshgrid(s_idx, e_idx, indexing="ij")  # [start rank, end rank]
            valid = (in_ctx[s_mat] & in_ctx[e_mat] & features.max_context[r][s_mat]
                     & (e_mat >= s_mat) & (e_mat - s_mat < max_answer_length))
            if not valid.any():
                continue
            score = np.where(valid, start_logits[r][s_mat] + end_logits[r][e_mat], -np.inf)
            k = int(np.argmax(score))  # first maximum in (start rank, end rank) order
            if best is None or score.flat[k] > best[0]:
                best = (float(score.flat[k]), r, int(s_mat.flat[k]), int(e_mat.flat[k]))
        if best is None:
            out[ex.id] = ""
        else:
            _, r, s, e = best
            spans = features.context_spans[r]
            out[ex.id] = ex.context[spans[s, 0] : spans[e, 1]]
    return out
