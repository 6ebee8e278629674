"""Span-level (chunk) precision, recall and F1 of sequence labels, as seqeval computes them.

Follows seqeval's DEFAULT mode (chakki-works/seqeval, `seqeval/metrics/sequence_labeling.py`:
`get_entities`, `end_of_chunk`, `start_of_chunk`), which is conlleval's lenient chunking and
accepts IOB1, IOB2 and IOBES labels alike. Re-implemented here, not copied:

* a label is `O`, or a prefix B/I/E/S, optionally followed by `-TYPE` (a bare prefix has the
  type `_`);
* a chunk ENDS before the current token when the previous tag is E or S, when the previous
  tag is B or I and the current one is B, S or O, or when the previous tag is not O and the
  type changes;
* a chunk STARTS at the current token when its tag is B or S, when its tag is E or I and the
  previous tag is E, S or O (so an `I-X` without a `B-X` starts a chunk), or when its tag is
  not O and the type changes (`B-PER I-LOC` is two chunks);
* sentences are joined with an `O` between them, so no chunk crosses a sentence boundary.

A chunk is (type, first token, last token); a predicted chunk is correct when the gold has
exactly the same one. Precision/recall/F1 are micro-averaged over all chunks of the corpus and
also given per type (union of gold and predicted types, support = gold chunks); a zero
denominator gives 0, as seqeval does. Scores are on a 0-100 scale.

Stricter than seqeval, which only warns: a label that is not O/B/I/E/S[-TYPE] raises
ValueError (it would silently produce nonsense chunks).
"""
from __future__ import annotations

from typing import Any, Sequence

_BARE = frozenset({"O", "B", "I", "E", "S"})
_PREFIXES = ("B-", "I-", "E-", "S-")


def _split_label(label: str) -> tuple[str, str]:
    """(tag, type) of a label, e.g. "B-PER" -> ("B", "PER"), "O" -> ("O", "_")."""
    if label in _BARE:
        return label, "_"
    if label.startswith(_PREFIXES) and len(label) > 2:
        return label[0], label[2:]
    raise ValueError(f"label {label!r} is not an IOB/IOBES tag (O, or B/I/E/S optionally "
                     "followed by -TYPE)")


def _chunk_ends(prev_tag: str, prev_type: str, tag: str, type_: str) -> bool:
    if prev_tag in ("E", "S"):
        return True
    if prev_tag in ("B", "I") and tag in ("B", "S", "O"):
        return True
    return prev_tag != "O" and prev_type != type_


def _chunk_starts(prev_tag: str, prev_type: str, tag: str, type_: str) -> bool:
    if tag in ("B", "S"):
        return True
    if tag in ("E", "I") and prev_tag in ("E", "S", "O"):
        return True
    return tag != "O" and prev_type != type_


def extract_chunks(labels: Sequence[str]) -> list[tuple[str, int, int]]:
    """The chunks (type, first index, last index) of one label sequence, in order."""
    chunks = []
    prev_tag, prev_type, begin = "O", "", 0
    for i, label in enumerate([*labels, "O"]):  # the final O closes an open chunk
        tag, type_ = _split_label(label)
        if _chunk_ends(prev_tag, prev_type, tag, type_):
            chunks.append((prev_type, begin, i - 1))
        if _chunk_starts(prev_tag, prev_type, tag, type_):
            begin = i
        prev_tag, prev_type = tag, type_
    return chunks


def _prf(correct: int, predicted: int, gold: int) -> tuple[float, float, float]:
    precision = correct / predicted if predicted else 0.0
    recall = correct / gold if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return 100.0 * precision, 100.0 * recall, 100.0 * f1


def seqeval_scores(gold: Sequence[Sequence[str]],
                   pred: Sequence[Sequence[str]]) -> dict[str, Any]:
    """{"precision", "recall", "f1", "per_type": {type: {precision, recall, f1, support}}} of
    predicted label sentences against gold ones (same number and lengths of sentences)."""
    if len(gold) != len(pred):
        raise ValueError(f"{len(gold)} gold sentences but {len(pred)} predicted")
    for n, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {n}: {len(g)} gold labels but {len(p)} predicted")

    def corpus_chunks(sentences: Sequence[Sequence[str]]) -> set[tuple[str, int, int]]:
        flat: list[str] = []
        for sentence in sentences:
            flat.extend(sentence)
            flat.append("O")  # seqeval's sentence separator
        return set(extract_chunks(flat))

    gold_chunks, pred_chunks = corpus_chunks(gold), corpus_chunks(pred)
    precision, recall, f1 = _prf(len(gold_chunks & pred_chunks), len(pred_chunks),
                                 len(gold_chunks))
    per_type = {}
    for type_ in sorted({c[0] for c in gold_chunks | pred_chunks}):
        g = {c for c in gold_chunks if c[0] == type_}
        p = {c for c in pred_chunks if c[0] == type_}
        tp, tr, tf = _prf(len(g & p), len(p), len(g))
        per_type[type_] = {"precision": tp, "recall": tr, "f1": tf, "support": len(g)}
    return {"precision": precision, "recall": recall, "f1": f1, "per_type": per_type}


def read_conll(path: str) -> list[list[tuple[str, str, int]]]:
    """Sentences of (token, label, line number) of a CoNLL file: whitespace-separated columns,
    the first the token and the last the label; blank lines separate sentences and
    `-DOCSTART-` lines are skipped. A line with one column or a bad label raises ValueError
    naming the file and line."""
    sentences: list[list[tuple[str, str, int]]] = []
    current: list[tuple[str, str, int]] = []
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            columns = line.split()
            if not columns or columns[0].startswith("-DOCSTART-"):
                if current:
                    sentences.append(current)
                    current = []
                continue
            if len(columns) < 2:
                raise ValueError(f"{path} line {line_no}: expected 'TOKEN ... LABEL' columns, "
                                 f"got one column {columns[0]!r}")
            try:
                _split_label(columns[-1])
            except ValueError as e:
                raise ValueError(f"{path} line {line_no}: {e}") from None
            current.append((columns[0], columns[-1], line_no))
    if current:
        sentences.append(current)
    return sentences


def _check_aligned(gold: list, pred: list, gold_path: str, pred_path: str) -> None:
    """Same sentences with the same tokens in both files, else ValueError with both lines."""
    def where(sentences: list, s: int, t: int) -> str:
        if s >= len(sentences):
            return "end of file"
        if t >= len(sentences[s]):
            return f"end of sentence after line {sentences[s][-1][2]}"
        token, _, line_no = sentences[s][t]
        return f"line {line_no} (token {token!r})"

    for s in range(max(len(gold), len(pred))):
        g = gold[s] if s < len(gold) else []
        p = pred[s] if s < len(pred) else []
        for t in range(max(len(g), len(p))):
            if t >= len(g) or t >= len(p) or g[t][0] != p[t][0]:
                raise ValueError(f"gold {gold_path} and predictions {pred_path} differ: "
                                 f"{gold_path} {where(gold, s, t)} vs "
                                 f"{pred_path} {where(pred, s, t)}")


def seqeval_files(gold_path: str, pred_path: str) -> dict[str, Any]:
    """`seqeval_scores` of two CoNLL files with the same sentences and tokens."""
    gold, pred = read_conll(gold_path), read_conll(pred_path)
    _check_aligned(gold, pred, gold_path, pred_path)
    return seqeval_scores([[label for _, label, _ in s] for s in gold],
                          [[label for _, label, _ in s] for s in pred])
