"""Tests for xlm_jax.finetune.qa (SQuAD-style featurisation and span decoding) and
XLMRTokenizer.encode_with_offsets, on the repository's multilingual demo SentencePiece model
and on a one-token-per-word tokenizer that makes windows easy to compute by hand."""

from __future__ import annotations

import pathlib
import re
import unicodedata
import zlib

import numpy as np
import pytest
import sentencepiece as spm

from xlm_jax.data.vocab import UNK, XLMRTokenizer, fairseq_to_spm
from xlm_jax.data.xtreme_readers import Answer
from xlm_jax.data.xtreme_readers import QAExample as Example
from xlm_jax.finetune import qa

SPM_PATH = pathlib.Path(__file__).resolve().parents[2] / "tasks" / "demo_data" / "spm.model"


def make(id_: str, question: str, context: str, answer: str, occurrence: int = 0,
         lang: str = "en") -> Example:
    """An example whose answer is the `occurrence`-th match of `answer` in `context`."""
    starts = [m.start() for m in re.finditer(re.escape(answer), context)]
    return Example(id_, question, context, (Answer(answer, starts[occurrence]),), lang)


class WordTokenizer:
    """One token per whitespace-separated word (ids >= 4), the XLM-R specials."""

    bos_id, pad_id, eos_id = 0, 1, 2

    def encode_with_offsets(self, text: str):
        spans = [(m.start(), m.end()) for m in re.finditer(r"\S+", text)]
        return [4 + zlib.crc32(text[s:e].encode()) % 1000 for s, e in spans], spans

    def encode(self, text: str):
        return self.encode_with_offsets(text)[0]


@pytest.fixture(scope="module")
def tok() -> XLMRTokenizer:
    return XLMRTokenizer(SPM_PATH)


@pytest.fixture(scope="module")
def sp() -> spm.SentencePieceProcessor:
    return spm.SentencePieceProcessor(model_file=str(SPM_PATH))


# ------------------------------------------------------------------------------------------
# encode_with_offsets

SENTENCES = [
    "Die Größe  der Straße ist schön, sagte Jürgen.",  # umlauts, ß, a double space
    "北京是中国的首都，也是一座历史悠久的城市。",
    "भारत की राजधानी नई दिल्ली है।",
    "  Leading and   trailing spaces\tand a tab  ",
]


@pytest.mark.parametrize("text", SENTENCES)
def test_offsets_reproduce_pieces(tok, sp, text):
    ids, spans = tok.encode_with_offsets(text)
    assert ids == tok.encode(text)
    assert len(spans) == len(ids)
    pieces = sp.id_to_piece(fairseq_to_spm(np.asarray(ids)).tolist())
    known = 0
    for i, (piece, (s, e)) in enumerate(zip(pieces, spans)):
        assert 0 <= s <= e <= len(text)
        if i:
            assert s >= spans[i - 1][1], "spans overlap or go backwards"
        if ids[i] == UNK:  # '<unk>' has no text to compare; its span is still a word part
            assert e > s and not any(c.isspace() for c in text[s:e])
            continue
        # The piece is the NFKC-normalised text (full-width "，" -> ","); the span is original.
        assert unicodedata.normalize("NFKC", text[s:e]) == piece.lstrip("▁"), (piece, text[s:e])
        known += text[s:e] == piece.lstrip("▁")
    assert known >= len(ids) // 2
    # Together the spans cover every non-space character and no space.
    assert "".join(text[s:e] for s, e in spans) == re.sub(r"\s", "", text)


def test_offsets_are_characters_not_bytes(tok):
    text = "Größe über Straße"
    _, spans = tok.encode_with_offsets(text)
    assert spans[-1][1] == len(text)  # bytes would end at len(text.encode()) == 20
    assert tok.encode_with_offsets("") == ([], [])


# ------------------------------------------------------------------------------------------
# featurize

def test_window_starts_by_hand():
    assert qa.window_starts(20, 10, 5) == [0, 5, 10]
    assert qa.window_starts(21, 10, 5) == [0, 5, 10, 15]
    assert qa.window_starts(10, 10, 5) == [0]
    assert qa.window_starts(0, 10, 5) == [0]


def test_long_context_windows_and_labels(tok):
    filler = ("Der Rhein fließt durch mehrere Länder und mündet in die Nordsee. "
              "Viele Schiffe fahren täglich auf dem Fluss. ")
    context = filler * 3 + "Die größte Stadt am Fluss ist Köln am Rhein. " + filler * 3
    ex = make("de-1", "Welche Stadt ist die größte?", context, "Köln am Rhein")
    q_len = len(tok.encode(ex.question))
    c_ids, c_spans = tok.encode_with_offsets(context)
    max_length, stride = 48, 10
    feats = qa.featurize([ex], tok, max_length=max_length, doc_stride=stride,
                         max_query_length=16)
    window = max_length - q_len - 4
    starts = qa.window_starts(len(c_ids), window, stride)
    assert len(feats) == len(starts) > 3
    assert feats.input_ids.shape == (len(starts), max_length)
    assert feats.input_ids.dtype == np.int32 and feats.context_spans.dtype == np.int32
    assert (feats.example_index == 0).all()

    a_start = ex.answers[0].start
    a_end = a_start + len(ex.answers[0].text)
    ans_toks = [i for i, (s, e) in enumerate(c_spans) if s < a_end and max(e, s + 1) > a_start]
    labelled = 0
    for r, w0 in enumerate(starts):
        ln = min(window, len(c_ids) - w0)
        row = feats.input_ids[r]
        off = q_len + 3
        assert row[0] == tok.bos_id and list(row[q_len + 1 : off]) == [tok.eos_id] * 2
        assert list(row[off : off + ln]) == c_ids[w0 : w0 + ln]
        assert row[off + ln] == tok.eos_id and (row[off + ln + 1 :] == tok.pad_id).all()
        assert (feats.context_spans[r, :off] == -1).all()
        assert (feats.context_spans[r, off + ln :] == -1).all()
        assert [tuple(x) for x in feats.context_spans[r, off : off + ln]] == c_spans[w0 : w0 + ln]
        st, en = int(feats.start_positions[r]), int(feats.end_positions[r])
        if w0 <= ans_toks[0] and ans_toks[-1] < w0 + ln:
            labelled += 1
            assert off <= st <= en < off + ln
            assert tok.decode(row[st : en + 1]).strip() == "Köln am Rhein"
            span = feats.context_spans[r]
            assert context[span[st, 0] : span[en, 1]] == "Köln am Rhein"
        else:
            assert st == en == 0
    assert 1 <= labelled < len(starts)


def test_question_is_truncated(tok):
    ex = make("q", "eins zwei drei vier fünf sechs sieben acht neun zehn", "Ein Satz.", "Satz")
    feats = qa.featurize([ex], tok, max_length=32, doc_stride=4, max_query_length=3)
    q = tok.encode(ex.question)[:3]
    assert list(feats.input_ids[0, : 6]) == [tok.bos_id, *q, tok.eos_id, tok.eos_id]


def test_max_context_by_hand():
    # 20 one-token words, window 10 (max_length 15 - question 1 - 4 specials), stride 5:
    # windows [0, 10), [5, 15), [10, 20). HF's score min(left, right) + 0.01 * length, ties
    # to the first window: p7 (2 vs 2) -> w0, p12 (2 vs 2) -> w1.
    context = " ".join(f"w{i}" for i in range(20))
    ex = make("h", "q", context, "w3")
    feats = qa.featurize([ex], WordTokenizer(), max_length=15, doc_stride=5, max_query_length=4)
    assert len(feats) == 3
    t, f = True, False
    want = [[t] * 8 + [f] * 2, [f] * 3 + [t] * 5 + [f] * 2, [f] * 3 + [t] * 7]
    for r in range(3):
        assert feats.max_context[r, 4:14].tolist() == want[r]
        assert not feats.max_context[r, :4].any() and not feats.max_context[r, 14:].any()
    # Every context position is max-context in exactly one window.
    pos = feats.context_spans[..., 0][feats.max_context]
    assert sorted(pos.tolist()) == sorted(context.index(f"w{i} ") if i < 19
                                          else context.rindex("w19") for i in range(20))


def test_training_false_has_no_labels(tok):
    ex = make("n", "Wo?", "Er wohnt in Berlin.", "Berlin")
    feats = qa.featurize([ex], tok, max_length=32, doc_stride=8, max_query_length=8,
                         training=False)
    assert (feats.start_positions == 0).all() and (feats.end_positions == 0).all()
    assert qa.featurize([ex], tok, max_length=32, doc_stride=8,
                        max_query_length=8).start_positions[0] > 0


def test_bad_input(tok):
    good = make("ok", "Wo?", "Er wohnt in Berlin.", "Berlin")
    bad = Example("bad-7", "Wo?", "Er wohnt in Berlin.", (Answer("Berlin", 3),), "de")
    with pytest.raises(ValueError, match="bad-7"):
        qa.featurize([good, bad], tok, max_length=32, doc_stride=8, max_query_length=8)
    with pytest.raises(ValueError, match="bad-7"):
        qa.featurize([bad], tok, max_length=32, doc_stride=8, max_query_length=8,
                     training=False)
    # doc_stride must not exceed the shortest window, 32 - 8 - 4 = 20.
    qa.featurize([good], tok, max_length=32, doc_stride=20, max_query_length=8)
    with pytest.raises(ValueError, match="doc_stride"):
        qa.featurize([good], tok, max_length=32, doc_stride=21, max_query_length=8)
    with pytest.raises(ValueError, match="max_length"):
        qa.featurize([good], tok, max_length=12, doc_stride=1, max_query_length=8)
    with pytest.raises(ValueError, match="max_query_length"):
        qa.featurize([good], tok, max_length=32, doc_stride=1, max_query_length=0)
    feats = qa.featurize([good], tok, max_length=32, doc_stride=8, max_query_length=8)
    with pytest.raises(ValueError, match="shape"):
        qa.decode([good], feats, np.zeros((1, 31)), np.zeros((1, 32)))


# ------------------------------------------------------------------------------------------
# decode

def _word_features():
    # 20 words, 3 windows as in test_max_context_by_hand; row index = 4 + position - start.
    context = " ".join(f"w{i}" for i in range(20))
    ex = make("d", "q", context, "w3")
    feats = qa.featurize([ex], WordTokenizer(), max_length=15, doc_stride=5,
                         max_query_length=4, training=False)
    return ex, feats


def _row(window: int, position: int) -> int:
    return 4 + position - 5 * window


def test_decode_picks_best_valid_span_across_windows():
    ex, feats = _word_features()
    start = np.full(feats.input_ids.shape, -10.0)
    end = np.full(feats.input_ids.shape, -10.0)
    start[1, _row(1, 9)] = 5.0  # window 1 holds w9's max context
    end[1, _row(1, 11)] = 5.0
    start[0, _row(0, 2)] = 4.0  # a lower-scoring span in window 0
    end[0, _row(0, 3)] = 4.0
    start[0, _row(0, 9)] = 9.0  # w9 in window 0 is not max context: ignored
    end[0, _row(0, 9)] = 9.0
    start[2, 0] = end[2, 0] = 50.0  # <s> and the question are never answers
    start[2, 1] = end[2, 1] = 40.0
    # (max_answer_length=3 rules out w2..w9, which would score 4 + 9 in window 0)
    assert qa.decode([ex], feats, start, end, max_answer_length=3) == {"d": "w9 w10 w11"}
    # Without window 1's span, window 0's wins.
    start[1], end[1] = -10.0, -10.0
    assert qa.decode([ex], feats, start, end, max_answer_length=3) == {"d": "w2 w3"}


def test_decode_respects_max_answer_length_and_order():
    ex, feats = _word_features()
    start = np.zeros(feats.input_ids.shape)
    end = np.zeros(feats.input_ids.shape)
    start[0, _row(0, 1)] = 10.0
    end[0, _row(0, 6)] = 10.0  # 6 tokens
    end[0, _row(0, 3)] = 8.0  # 3 tokens
    assert qa.decode([ex], feats, start, end)["d"] == "w1 w2 w3 w4 w5 w6"
    assert qa.decode([ex], feats, start, end, max_answer_length=5)["d"] == "w1 w2 w3"
    assert qa.decode([ex], feats, start, end, max_answer_length=3)["d"] == "w1 w2 w3"
    assert qa.decode([ex], feats, start, end, max_answer_length=2)["d"] != "w1 w2 w3"
    # end before start is never chosen, however high its score.
    start2 = np.zeros_like(start)
    end2 = np.zeros_like(end)
    start2[0, _row(0, 5)] = 10.0
    end2[0, _row(0, 2)] = 10.0
    end2[0, _row(0, 6)] = 1.0
    assert qa.decode([ex], feats, start2, end2)["d"] == "w5 w6"
    # Nothing valid in any window -> "".
    only_question = np.full_like(start, -100.0)
    only_question[:, 1] = 100.0
    assert qa.decode([ex], feats, only_question, only_question, n_best=1) == {"d": ""}


def test_decode_returns_exact_non_ascii_substring(tok):
    context = "Die  Größe der Straße ist  schön,  sagte Jürgen."
    ex = make("de-x", "Was ist schön?", context, "Straße ist  schön")
    feats = qa.featurize([ex], tok, max_length=64, doc_stride=16, max_query_length=16,
                         training=False)
    spans = feats.context_spans[0]
    first = int(np.flatnonzero((spans[:, 0] <= context.index("Straße"))
                               & (spans[:, 1] > context.index("Straße")))[0])
    last = int(np.flatnonzero(spans[:, 1] == context.index(","))[0])
    start = np.zeros(feats.input_ids.shape)
    end = np.zeros(feats.input_ids.shape)
    start[0, first] = end[0, last] = 10.0
    pred = qa.decode([ex], feats, start, end)["de-x"]
    assert pred == "Straße ist  schön"  # the double space survives
    assert tok.decode(feats.input_ids[0, first : last + 1]).strip() != pred


# ------------------------------------------------------------------------------------------
# round trip

def test_round_trip_multilingual(tok):
    de = ("Der Rhein fließt durch mehrere Länder und mündet in die Nordsee. " * 4
          + "Die größte Stadt am Fluss ist Köln. " + "Viele Schiffe fahren täglich. " * 4)
    examples = [
        make("de", "Welche Stadt ist die größte?", de, "Köln", lang="de"),
        make("zh", "中国的首都是哪里？", "北京是中国的首都，也是一座历史悠久的城市。", "北京", lang="zh"),
        make("zh2", "北京是什么？", "北京是中国的首都，也是一座历史悠久的城市。", "中国的首都",
             lang="zh"),
        make("hi", "भारत की राजधानी क्या है?", "भारत की राजधानी नई दिल्ली है।", "नई दिल्ली",
             lang="hi"),
        make("en", "Who wrote it?", "It was written in  1850 by Jane   Doe, a poet.",
             "Jane   Doe"),
        make("en2", "When?", "It was written in  1850 by Jane   Doe, a poet.", "1850"),
    ]
    feats = qa.featurize(examples, tok, max_length=48, doc_stride=8, max_query_length=16)
    assert len(feats) > len(examples)  # the German context needs several windows
    for i in range(len(examples)):
        rows = feats.example_index == i
        assert rows.any() and (feats.start_positions[rows] > 0).any()
    start = np.zeros(feats.input_ids.shape)
    end = np.zeros(feats.input_ids.shape)
    rows = np.arange(len(feats))
    start[rows, feats.start_positions] = 10.0
    end[rows, feats.end_positions] = 10.0
    pred = qa.decode(examples, feats, start, end)
    assert pred == {ex.id: ex.answers[0].text for ex in examples}


def test_labelled_window_need_not_be_the_start_tokens_max_context_window(tok):
    """HF's rule, kept: training labels go to every window that holds the whole answer, but
    decoding only starts spans at max-context tokens. Here the 24-token context gets windows
    [0, 20) and [8, 24); the answer (positions 13-20) lies wholly in the second only, while its
    first token has more context in the first (min(13, 6) > min(5, 10)): one-hot logits at the
    labels decode to ""."""
    ex = make("hi", "भारत की राजधानी क्या है?", "भारत की राजधानी नई दिल्ली है।", "नई दिल्ली")
    feats = qa.featurize([ex], tok, max_length=40, doc_stride=8, max_query_length=16)
    assert feats.start_positions.tolist()[0] == 0 and feats.start_positions[1] > 0
    assert not feats.max_context[1, feats.start_positions[1]]
    start = np.zeros(feats.input_ids.shape)
    end = np.zeros(feats.input_ids.shape)
    start[1, feats.start_positions[1]] = end[1, feats.end_positions[1]] = 10.0
    assert qa.decode([ex], feats, start, end, n_best=1) == {"hi": ""}
