"""Golden tests of the seqio preprocessors, the packer and the feature converters.

Every expected token list, position, segment, side and language id below is written out by
hand from the documented formats (`xlm_jax/data/preprocessors.py`); tokenization is checked
against the TF-free `XLMRTokenizer` (sentencepiece + numpy), an independent code path.
"""

import random

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
seqio = pytest.importorskip("seqio")
pytest.importorskip("sentencepiece")

from xlm_jax.data import converters, preprocessors as prep  # noqa: E402
from xlm_jax.data.features import language_index  # noqa: E402
from xlm_jax.data.vocab import XLMRTokenizer, get_vocabulary  # noqa: E402

PAD = 1


def _ds(examples):
    """A dataset of dict examples with int32 token lists (ragged allowed) and int32 scalars."""
    keys = examples[0].keys()
    sig = {}
    for k in keys:
        v = examples[0][k]
        if isinstance(v, (list, tuple)):
            dtype = tf.string if v and isinstance(v[0], str) else tf.int32
            sig[k] = tf.TensorSpec([None], dtype)
        elif isinstance(v, str):
            sig[k] = tf.TensorSpec([], tf.string)
        else:
            sig[k] = tf.TensorSpec([], tf.int32)
    return tf.data.Dataset.from_generator(lambda: iter(examples), output_signature=sig)


def _rows(ds):
    return [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in ex.items()}
            for ex in ds.as_numpy_iterator()]


DOCS = [{"tokens": [10, 11, 12], "lang": 7}, {"tokens": [20, 21], "lang": 7},
        {"tokens": [30, 31, 32, 33], "lang": 7}]


@pytest.fixture(scope="module")
def spm_path(tmp_path_factory, train_xlmr_spm):
    d = tmp_path_factory.mktemp("spm")
    words = ["hello", "world", "bonjour", "monde", "hallo", "welt", "guten", "tag", "merci"]
    rnd = random.Random(0)
    (d / "train.txt").write_text(
        "\n".join(" ".join(rnd.choice(words) for _ in range(8)) for _ in range(300)))
    return train_xlmr_spm(d / "train.txt", d / "m", 40)


def test_language_index_is_one_based_with_zero_for_padding():
    assert language_index("en", ["en", "de"]) == 1
    assert language_index("de", ["en", "de"]) == 2
    with pytest.raises(ValueError, match="'fr' is not in the language list"):
        language_index("fr", ["en", "de"])


def test_tokenize_matches_numpy_tokenizer_line_by_line(spm_path):
    vocab = get_vocabulary(spm_path)
    ref = XLMRTokenizer(spm_path)
    docs = [["hello world", "bonjour monde"], ["guten tag"], ["merci", "hallo welt", "tag"],
            ["hello"], ["monde monde"]]
    ds = _ds([{"lines": d, "lang": 3} for d in docs])
    out = _rows(prep.tokenize(ds, {"input_ids": seqio.Feature(vocab)}, {"lines": "tokens"},
                              block=2))  # 5 docs in blocks of 2: order must survive
    assert [r["tokens"] for r in out] == [sum((ref.encode(s) for s in d), []) for d in docs]
    assert all(r["lang"] == 3 for r in out) and all("lines" not in r for r in out)
    pairs = _ds([{"src": "hello world", "tgt": "bonjour monde"}, {"src": "tag", "tgt": "merci"}])
    out = _rows(prep.tokenize(pairs, {"input_ids": seqio.Feature(vocab)},
                              {"src": "src_ids", "tgt": "tgt_ids"}))
    assert out[0]["src_ids"] == ref.encode("hello world")
    assert out[1]["tgt_ids"] == ref.encode("merci")


def test_monolingual_segments_cross_document_boundaries():
    # stream: 10 11 12 </s> 20 21 </s> 30 31 32 33 </s>  (13 tokens with the </s> per doc)
    out = _rows(prep.monolingual_segments(_ds(DOCS), {"input_ids": 6}))
    assert [r["input_ids"] for r in out] == [[0, 10, 11, 12, 2, 2], [0, 20, 21, 2, 30, 2],
                                             [0, 31, 32, 33, 2, 2]]
    assert all(r["pair_side"] == [1] * 6 and r["lang_ids"] == [7] * 6 for r in out)
    out = _rows(prep.monolingual_segments(_ds(DOCS), {"input_ids": 8}))
    assert [r["input_ids"] for r in out] == [[0, 10, 11, 12, 2, 20, 21, 2],
                                             [0, 2, 30, 31, 32, 33, 2, 2]]
    # body 5: the finite stream's leftover (33 </s>) becomes a short last segment
    out = _rows(prep.monolingual_segments(_ds(DOCS), {"input_ids": 7}))
    assert [r["input_ids"] for r in out] == [[0, 10, 11, 12, 2, 20, 2], [0, 21, 2, 30, 31, 32, 2],
                                             [0, 33, 2, 2]]
    # the default length is used when seqio passes no sequence_length
    out = _rows(prep.monolingual_segments(_ds(DOCS), None, default_length=6))
    assert len(out) == 3 and len(out[0]["input_ids"]) == 6


def test_monolingual_converter_pads_with_pad_id_and_zeros():
    ds = prep.monolingual_segments(_ds(DOCS), {"input_ids": 7})
    conv = converters.MonolingualConverter()
    out = _rows(conv(ds, converters.task_feature_lengths("mono", 7)))
    last = out[-1]
    assert last == {"input_ids": [0, 33, 2, 2, PAD, PAD, PAD],
                    "positions": [0, 1, 2, 3, 0, 0, 0],
                    "segment_ids": [1, 1, 1, 1, 0, 0, 0],
                    "pair_side": [1, 1, 1, 1, 0, 0, 0],
                    "lang_ids": [7, 7, 7, 7, 0, 0, 0]}
    assert out[0]["positions"] == list(range(7)) and out[0]["segment_ids"] == [1] * 7


def test_adjacent_segment_pairs_for_veco():
    docs = DOCS + [{"tokens": [40], "lang": 7}]
    # T = 4: body 2, chunks of 4: [10 11 12 </s>] [20 21 </s> 30] [31 32 33 </s>] [40 </s>]
    out = _rows(prep.adjacent_segment_pairs(_ds(docs), {"x_input_ids": 4}))
    assert [(r["x_input_ids"], r["y_input_ids"]) for r in out] == [
        ([0, 10, 11, 2], [0, 12, 2, 2]),
        ([0, 20, 21, 2], [0, 2, 30, 2]),
        ([0, 31, 32, 2], [0, 33, 2, 2]),
    ]  # the last chunk [40 </s>] cannot give y a token and is dropped
    assert all(r["x_lang_ids"] == [7] * 4 and r["y_pair_side"] == [1] * 4 for r in out)
    conv = converters.SplitPairConverter()
    ds = prep.adjacent_segment_pairs(_ds(docs), {"x_input_ids": 6})
    got = _rows(conv(ds, converters.task_feature_lengths("split_pair", 6)))
    # T = 6: body 4, chunks of 8: [10 11 12 </s> 20 21 </s> 30] [31 32 33 </s> 40 </s>]
    assert got[1]["x_input_ids"] == [0, 31, 32, 33, 2, 2]
    assert got[1]["y_input_ids"] == [0, 40, 2, 2, PAD, PAD]
    assert got[1]["y_positions"] == [0, 1, 2, 3, 0, 0]
    assert got[1]["y_segment_ids"] == [1, 1, 1, 1, 0, 0]
    assert got[1]["y_lang_ids"] == [7, 7, 7, 7, 0, 0]


def _truncate_reference(a, b, max_side, max_total):
    """Independent reference: cap each side, then cut the longer side one token at a time
    (ties: the second side) until the pair fits."""
    a, b = min(a, max_side - 2), min(b, max_side - 2)
    while a + b > max_total - 4:
        if a > b:
            a -= 1
        else:
            b -= 1
    return a, b


def test_truncate_pair_lengths_is_longest_first():
    cases = [(200, 10, 128, 256, (126, 10)), (200, 200, 128, 256, (126, 126)),
             (200, 200, 128, 100, (48, 48)), (5, 200, 128, 100, (5, 91)),
             (50, 47, 128, 100, (49, 47)), (60, 60, 128, 101, (49, 48))]
    for a, b, side, total, want in cases:
        got = prep.truncate_pair_lengths(tf.constant(a), tf.constant(b), side, total)
        assert (int(got[0]), int(got[1])) == want, (a, b, side, total)
    rnd = random.Random(1)
    for _ in range(300):
        a, b = rnd.randint(0, 300), rnd.randint(0, 300)
        side, total = rnd.randint(3, 200), rnd.randint(6, 300)
        got = prep.truncate_pair_lengths(tf.constant(a), tf.constant(b), side, total)
        assert (int(got[0]), int(got[1])) == _truncate_reference(a, b, side, total)


PAIR = {"src_ids": [10, 11, 12], "tgt_ids": [20, 21], "src_lang": 5, "tgt_lang": 9}
FORWARD = {"input_ids": [0, 10, 11, 12, 2, 2, 20, 21, 2],
           "pair_side": [1, 1, 1, 1, 1, 2, 2, 2, 2],
           "lang_ids": [5, 5, 5, 5, 5, 9, 9, 9, 9]}
SWAPPED = {"input_ids": [0, 20, 21, 2, 2, 10, 11, 12, 2],
           "pair_side": [1, 1, 1, 1, 2, 2, 2, 2, 2],
           "lang_ids": [9, 9, 9, 9, 5, 5, 5, 5, 5]}


def test_parallel_pairs_fixed_order_and_truncation():
    out = _rows(prep.parallel_pairs(_ds([PAIR]), random_order=False))
    assert out == [FORWARD]
    long_pair = {"src_ids": list(range(10, 18)), "tgt_ids": list(range(20, 26)), "src_lang": 5,
                 "tgt_lang": 9}
    out = _rows(prep.parallel_pairs(_ds([long_pair]), max_side_length=6, max_total_length=12,
                                    random_order=False))
    assert out[0]["input_ids"] == [0, 10, 11, 12, 13, 2, 2, 20, 21, 22, 23, 2]
    out = _rows(prep.parallel_pairs(_ds([long_pair]), sequence_length={"input_ids": 10},
                                    max_side_length=6, max_total_length=12, random_order=False))
    assert out[0] == {"input_ids": [0, 10, 11, 12, 2, 2, 20, 21, 22, 2],
                      "pair_side": [1, 1, 1, 1, 1, 2, 2, 2, 2, 2],
                      "lang_ids": [5, 5, 5, 5, 5, 9, 9, 9, 9, 9]}


def test_parallel_pairs_random_order_uses_both_orders_reproducibly():
    def run(seed):
        with seqio.utils.map_seed_manager(seed):
            return _rows(prep.parallel_pairs(_ds([PAIR] * 200)))

    out = run(7)
    assert all(r in (FORWARD, SWAPPED) for r in out)
    n_swapped = sum(r == SWAPPED for r in out)
    assert 70 <= n_swapped <= 130  # p = 1/2
    assert run(7) == out and run(8) != out


def test_veco_parallel_pairs_rows():
    pair = {"src_ids": [10, 11, 12, 13], "tgt_ids": [20, 21], "src_lang": 5, "tgt_lang": 9}
    out = _rows(prep.veco_parallel_pairs(_ds([pair]), max_side_length=5, random_order=False))
    assert out == [{"x_input_ids": [0, 10, 11, 12, 2], "x_pair_side": [1] * 5,
                    "x_lang_ids": [5] * 5, "y_input_ids": [0, 20, 21, 2],
                    "y_pair_side": [1] * 4, "y_lang_ids": [9] * 4}]


MIX = {"c_src_ids": [10, 11], "c_tgt_ids": [20], "d_src_ids": [30], "d_tgt_ids": [40, 41],
       "c_src_lang": 5, "c_tgt_lang": 6, "d_src_lang": 7, "d_tgt_lang": 8}


def _row(first, second, lf, ls):
    return ([0] + first + [2, 2] + second + [2],
            [1] * (len(first) + 2) + [2] * (len(second) + 2),
            [lf] * (len(first) + 2) + [ls] * (len(second) + 2))


def test_mixup_pairs_query_and_key_orders_are_independent():
    with seqio.utils.map_seed_manager(3):
        out = _rows(prep.mixup_pairs(_ds([MIX] * 400), random_direction=False))
    c1, d1, c2, d2 = [10, 11], [30], [20], [40, 41]
    q_options = {"cd": _row(c1, d1, 5, 7), "dc": _row(d1, c1, 7, 5)}
    k_options = {"cd": _row(c2, d2, 6, 8), "dc": _row(d2, c2, 8, 6)}
    combos = {}
    for r in out:
        q = next(k for k, v in q_options.items()
                 if v == (r["query_input_ids"], r["query_pair_side"], r["query_lang_ids"]))
        k = next(k for k, v in k_options.items()
                 if v == (r["key_input_ids"], r["key_pair_side"], r["key_lang_ids"]))
        combos[q + "/" + k] = combos.get(q + "/" + k, 0) + 1
    assert set(combos) == {"cd/cd", "cd/dc", "dc/cd", "dc/dc"}
    assert all(60 <= n <= 140 for n in combos.values()), combos  # 1/4 each of 400


def test_mixup_pairs_random_direction_keeps_translations_on_the_key():
    with seqio.utils.map_seed_manager(4):
        out = _rows(prep.mixup_pairs(_ds([MIX] * 200)))
    translation = {10: 20, 20: 10, 30: 40, 40: 30}  # first piece of each sentence -> partner
    directions = set()
    for r in out:
        q, k = r["query_input_ids"], r["key_input_ids"]
        q_firsts = {q[1], q[q.index(2) + 2]}  # first piece of each query sentence
        k_firsts = {k[1], k[k.index(2) + 2]}
        assert {translation[x] for x in q_firsts} == k_firsts
        directions.add((10 in q_firsts, 30 in q_firsts))
    assert directions == {(True, True), (True, False), (False, True), (False, False)}


def test_pack_numpy_first_fit():
    ids = np.array([[11, 12, 13, 0, 0], [21, 22, 23, 24, 0], [31, 32, 0, 0, 0],
                    [41, 42, 43, 44, 45]])
    side = np.where(ids > 0, 1, 0)
    lang = np.where(ids > 0, 3, 0)
    out = prep.pack_numpy({"input_ids": ids, "pair_side": side, "lang_ids": lang},
                          np.array([3, 4, 2, 5]), 8)
    assert out["input_ids"].tolist() == [[11, 12, 13, 21, 22, 23, 24, PAD],
                                         [31, 32, 41, 42, 43, 44, 45, PAD]]
    assert out["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 2, 2, 0], [1, 1, 2, 2, 2, 2, 2, 0]]
    assert out["positions"].tolist() == [[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 0, 1, 2, 3, 4, 0]]
    assert out["pair_side"].tolist() == [[1] * 7 + [0]] * 2
    assert out["lang_ids"].tolist() == [[3] * 7 + [0]] * 2
    # first fit: the third example (3) goes back into the first row (5 + 3 = 8), not into
    # the row that the second one (5) had to open
    out = prep.pack_numpy({"input_ids": np.array([[11] * 5, [21] * 5, [31, 32, 33, 0, 0]])},
                          np.array([5, 5, 3]), 8)
    assert out["input_ids"].tolist() == [[11, 11, 11, 11, 11, 31, 32, 33],
                                         [21, 21, 21, 21, 21, PAD, PAD, PAD]]
    assert out["segment_ids"].tolist() == [[1, 1, 1, 1, 1, 2, 2, 2], [1, 1, 1, 1, 1, 0, 0, 0]]
    assert out["positions"].tolist() == [[0, 1, 2, 3, 4, 0, 1, 2], [0, 1, 2, 3, 4, 0, 0, 0]]
    # an example that exactly fills the rest of a row joins it
    out = prep.pack_numpy({"input_ids": ids}, np.array([3, 5, 4]), 8)
    assert out["segment_ids"].tolist() == [[1, 1, 1, 2, 2, 2, 2, 2], [1, 1, 1, 1, 0, 0, 0, 0]]
    # too long -> cut to the row length; empty -> skipped
    out = prep.pack_numpy({"input_ids": np.array([[5, 6, 7], [0, 0, 0], [8, 9, 0]])},
                          np.array([3, 0, 2]), 2)
    assert out["input_ids"].tolist() == [[5, 6], [8, 9]]
    assert out["segment_ids"].tolist() == [[1, 1], [1, 1]]


def test_pair_converter_packs_with_windows():
    pairs = [{"input_ids": [0, 10, 2, 2, 20, 2], "pair_side": [1, 1, 1, 2, 2, 2],
              "lang_ids": [5, 5, 5, 9, 9, 9]},
             {"input_ids": [0, 30, 2, 2, 40, 41, 2], "pair_side": [1, 1, 1, 2, 2, 2, 2],
              "lang_ids": [5, 5, 5, 6, 6, 6, 6]},
             {"input_ids": [0, 50, 2, 2, 60, 2], "pair_side": [1, 1, 1, 2, 2, 2],
              "lang_ids": [9, 9, 9, 5, 5, 5]}]
    lengths = converters.task_feature_lengths("pair", 14)
    out = _rows(converters.PairConverter()(_ds(pairs), lengths))
    assert out == [
        {"input_ids": [0, 10, 2, 2, 20, 2, 0, 30, 2, 2, 40, 41, 2, PAD],
         "positions": [0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4, 5, 6, 0],
         "segment_ids": [1] * 6 + [2] * 7 + [0],
         "pair_side": [1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 2, 0],
         "lang_ids": [5, 5, 5, 9, 9, 9, 5, 5, 5, 6, 6, 6, 6, 0]},
        {"input_ids": [0, 50, 2, 2, 60, 2] + [PAD] * 8,
         "positions": [0, 1, 2, 3, 4, 5] + [0] * 8,
         "segment_ids": [1] * 6 + [0] * 8,
         "pair_side": [1, 1, 1, 2, 2, 2] + [0] * 8,
         "lang_ids": [9, 9, 9, 5, 5, 5] + [0] * 8},
    ]
    # window 1: every example is packed on its own -> three rows
    out = _rows(converters.PairConverter(pack_window=1)(_ds(pairs), lengths))
    assert [r["segment_ids"].count(1) for r in out] == [6, 7, 6]
    assert all(max(r["segment_ids"]) == 1 for r in out)
    # pack=False: one pair per row
    out = _rows(converters.PairConverter(pack=False)(_ds(pairs), lengths))
    assert len(out) == 3 and out[1]["positions"][:8] == [0, 1, 2, 3, 4, 5, 6, 0]


def test_mixup_converter_pads_both_rows():
    ex = {"query_input_ids": [0, 10, 2, 2, 30, 2], "query_pair_side": [1, 1, 1, 2, 2, 2],
          "query_lang_ids": [5, 5, 5, 7, 7, 7], "key_input_ids": [0, 20, 2, 2, 40, 41, 2],
          "key_pair_side": [1, 1, 1, 2, 2, 2, 2], "key_lang_ids": [6, 6, 6, 8, 8, 8, 8]}
    out = _rows(converters.MixupPairConverter()(
        _ds([ex]), converters.task_feature_lengths("mixup_pair", 8)))
    assert out[0]["query_input_ids"] == [0, 10, 2, 2, 30, 2, PAD, PAD]
    assert out[0]["key_positions"] == [0, 1, 2, 3, 4, 5, 6, 0]
    assert out[0]["key_segment_ids"] == [1] * 7 + [0]
    assert out[0]["query_lang_ids"] == [5, 5, 5, 7, 7, 7, 0, 0]
    assert sorted(out[0]) == sorted(f"{p}{f}" for p in ("query_", "key_") for f in
                                    ("input_ids", "positions", "segment_ids", "pair_side",
                                     "lang_ids"))
