"""seqio preprocessors: tokenization, monolingual segments, pairs, mixup and packing.

Every preprocessor takes and returns a `tf.data.Dataset`; the ones that need randomness use
`seqio.map_over_dataset(num_seeds=...)`, i.e. stateless seeds handed out by the Task from its
seed, so that a seeded pipeline is reproducible. Token ids are in the fairseq/XLM-R layout
(`<s>`=0, `<pad>`=1, `</s>`=2); see `xlm_jax.data.features` for the feature contract.

Example formats produced (before the feature converter pads/packs them to static shapes):

  monolingual segment   `<s> t_1 ... t_{T-2} </s>`: the token stream of consecutive documents
                        (sentences concatenated, `</s>` after every document) cut into pieces
                        of T-2 tokens, so segments cross document boundaries (XLM-R/RoBERTa
                        "full sentences"). pair_side = 1, lang_ids = the language.
  adjacent split pair   x = segment 2i, y = segment 2i+1 of that stream (same format; VECO).
  parallel pair         `<s> a </s></s> b </s>`; (a, b) is (src, tgt) or, with probability 1/2
                        when `random_order`, (tgt, src). pair_side is 1 on `<s> a </s>` and 2 on
                        `</s> b </s>`; lang_ids is the language of each side on its tokens.
  XLCo mixup            see `mixup_pairs`.
  packed rows           `pack_numpy`/`pack_dataset`: short examples packed first-fit into rows
                        of T tokens (segment_ids 1..k, positions restart per example).
"""

from __future__ import annotations

import functools
from typing import Mapping, Optional, Sequence

import numpy as np
import seqio
import tensorflow as tf

from xlm_jax.data.features import BOS_ID, EOS_ID, PAD_ID, language_index

__all__ = [
    "language_index",
    "tokenize",
    "monolingual_segments",
    "adjacent_segment_pairs",
    "truncate_pair_lengths",
    "check_pair_limits",
    "parallel_pairs",
    "veco_parallel_pairs",
    "mixup_pairs",
    "pair_examples",
    "split_pair_examples",
    "mixup_pair_examples",
    "pack_numpy",
    "pack_dataset",
    "add_task_name",
    "rekey_text",
]

TOKEN_FEATURES = ("input_ids", "pair_side", "lang_ids")


def _length(sequence_length: Optional[Mapping[str, int]], key: str, default: int) -> int:
    """The target length of `key` (from seqio's `sequence_length`) or `default`."""
    if sequence_length and sequence_length.get(key):
        return int(sequence_length[key])
    return int(default)


def _vocabulary(output_features: Mapping[str, seqio.Feature]) -> seqio.Vocabulary:
    for key in ("input_ids", "x_input_ids", "query_input_ids"):
        if key in output_features:
            return output_features[key].vocabulary
    raise ValueError(
        f"tokenize: output_features {sorted(output_features)} has no *input_ids feature "
        "to take the vocabulary from"
    )


def tokenize(dataset: tf.data.Dataset, output_features: Mapping[str, seqio.Feature],
             keys: Mapping[str, str], block: int = 128) -> tf.data.Dataset:
    """Tokenizes string features: `keys` maps an input key to the output key of its ids.

    A string vector (a document's lines) is tokenized line by line and the ids concatenated
    (sentences concatenated); a scalar string gives its ids. Ids are int32, without specials.
    Examples are tokenized `block` at a time (one tokenizer call per block; the order and the
    result are those of one-by-one tokenization).
    """
    vocab = _vocabulary(output_features)
    for key in keys:
        if key not in dataset.element_spec:
            raise ValueError(f"tokenize: no feature {key!r} to tokenize "
                             f"(features: {sorted(dataset.element_spec)})")
    # One traced tokenizing graph (ragged merges with their checks) per (vocabulary, keys) in
    # the process instead of one per Task; same ops, so the same ids
    # (tests/data/determinism_test.py compares shared and per-Task traces).
    fn = _shared_fn(_tokenize_block, vocab, tuple(keys.items()))
    return (dataset.ragged_batch(block).map(fn, num_parallel_calls=tf.data.AUTOTUNE)
            .unbatch())


def _tokenize_block(batch, vocab: seqio.Vocabulary, keys: tuple[tuple[str, str], ...]):
    batch = dict(batch)
    for src_key, dst_key in keys:
        text = batch.pop(src_key)
        ids = vocab.encode_tf(text)  # [B, None] or, for line vectors, [B, lines, None]
        if ids.shape.rank == 3:  # concatenate the lines of each document
            ids = ids.merge_dims(1, 2)
        batch[dst_key] = tf.cast(ids, tf.int32)
    return batch


def rekey_text(dataset: tf.data.Dataset, text_key: str, lang_id: int) -> tf.data.Dataset:
    """Turns a TFDS text example into the monolingual source format `{"lines", "lang"}`."""

    def fn(ex):
        if text_key not in ex:
            raise ValueError(f"rekey_text: TFDS example has no key {text_key!r} "
                             f"(keys: {sorted(ex)})")
        return {"lines": tf.reshape(ex[text_key], [1]), "lang": tf.constant(lang_id, tf.int32)}

    return dataset.map(fn, num_parallel_calls=tf.data.AUTOTUNE)


def add_task_name(dataset: tf.data.Dataset, name: str) -> tf.data.Dataset:
    """Adds a scalar string feature `task` (mixture statistics read it; converters drop it)."""
    return dataset.map(lambda ex: {**ex, "task": tf.constant(name)},
                       num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- monolingual

def _token_chunks(dataset: tf.data.Dataset, chunk: int) -> tf.data.Dataset:
    """The stream `doc_1 </s> doc_2 </s> ...` (tokens and their language) in chunks of `chunk`.

    Input examples: `{"tokens": int32[n], "lang": int32}`; output `{"t", "l": int32[chunk]}`;
    when a finite stream ends, the leftover tokens form one shorter, final chunk.
    (unbatch + batch measured faster here than a vectorized `scan` with a carried remainder.)
    """

    def doc_stream(ex):
        tokens = tf.concat([ex["tokens"], tf.constant([EOS_ID], tf.int32)], 0)
        return {"t": tokens, "l": tf.fill(tf.shape(tokens), tf.cast(ex["lang"], tf.int32))}

    return dataset.map(doc_stream, num_parallel_calls=tf.data.AUTOTUNE).unbatch().batch(chunk)


def _wrap(tokens: tf.Tensor, langs: tf.Tensor, prefix: str = "") -> dict[str, tf.Tensor]:
    """`<s> tokens </s>` with pair_side 1 and the tokens' language on the specials too."""
    ids = tf.concat([[BOS_ID], tokens, [EOS_ID]], 0)
    lang = tf.concat([langs[:1], langs, langs[-1:]], 0)
    return {prefix + "input_ids": ids, prefix + "pair_side": tf.ones_like(ids),
            prefix + "lang_ids": lang}


def monolingual_segments(dataset: tf.data.Dataset,
                         sequence_length: Optional[Mapping[str, int]] = None,
                         default_length: int = 512) -> tf.data.Dataset:
    """Full-length monolingual segments `<s> ... </s>` of T = sequence_length["input_ids"].

    Input: tokenized documents `{"tokens", "lang"}`. Output: `input_ids`, `pair_side`,
    `lang_ids` of length T (the last segment of a finite stream may be shorter).
    """
    length = _length(sequence_length, "input_ids", default_length)
    if length < 3:
        raise ValueError(f"monolingual_segments: sequence length {length} < 3")
    return _token_chunks(dataset, length - 2).map(
        lambda c: _wrap(c["t"], c["l"]), num_parallel_calls=tf.data.AUTOTUNE)


def adjacent_segment_pairs(dataset: tf.data.Dataset,
                           sequence_length: Optional[Mapping[str, int]] = None,
                           default_length: int = 512) -> tf.data.Dataset:
    """VECO monolingual examples: two adjacent segments x, y of the document stream.

    The stream is cut into chunks of 2(T-2) tokens; x = `<s>` first T-2 `</s>`, y = `<s>` the
    rest `</s>` (T = sequence_length["x_input_ids"]). A final chunk too short to give y at
    least one token is dropped.
    """
    length = _length(sequence_length, "x_input_ids", default_length)
    if length < 3:
        raise ValueError(f"adjacent_segment_pairs: sequence length {length} < 3")
    body = length - 2

    def split(c):
        out = _wrap(c["t"][:body], c["l"][:body], "x_")
        out.update(_wrap(c["t"][body:], c["l"][body:], "y_"))
        return out

    ds = _token_chunks(dataset, 2 * body).filter(lambda c: tf.size(c["t"]) > body)
    return ds.map(split, num_parallel_calls=tf.data.AUTOTUNE)


# ----------------------------------------------------------------------------- pairs

def truncate_pair_lengths(a: tf.Tensor, b: tf.Tensor, max_side: int, max_total: int
                          ) -> tuple[tf.Tensor, tf.Tensor]:
    """Content lengths (without specials) of a `<s> a </s></s> b </s>` pair after truncation.

    Each side with its two specials is cut to `max_side` tokens; if the pair is then longer
    than `max_total`, the longer side is cut first (longest-first), down to an even split in
    which the first side keeps the odd token.
    """
    cap = max_side - 2
    budget = max_total - 4
    a = tf.minimum(tf.cast(a, tf.int32), cap)
    b = tf.minimum(tf.cast(b, tf.int32), cap)
    over = a + b > budget
    short = tf.minimum(a, b)
    fits_short = short <= budget // 2
    long_len = budget - short
    a_cut = tf.where(fits_short, tf.where(a <= b, a, long_len), budget - budget // 2)
    b_cut = tf.where(fits_short, tf.where(a <= b, long_len, b), budget // 2)
    return tf.where(over, a_cut, a), tf.where(over, b_cut, b)


def _pair_row(first: tf.Tensor, second: tf.Tensor, first_lang: tf.Tensor,
              second_lang: tf.Tensor, prefix: str = "") -> dict[str, tf.Tensor]:
    """`<s> first </s></s> second </s>` with pair_side 1/2 and per-side language ids."""
    ids = tf.concat([[BOS_ID], first, [EOS_ID, EOS_ID], second, [EOS_ID]], 0)
    n1 = tf.size(first) + 2
    n2 = tf.size(second) + 2
    side = tf.concat([tf.fill([n1], 1), tf.fill([n2], 2)], 0)
    lang = tf.concat([tf.fill([n1], tf.cast(first_lang, tf.int32)),
                      tf.fill([n2], tf.cast(second_lang, tf.int32))], 0)
    return {prefix + "input_ids": ids, prefix + "pair_side": side, prefix + "lang_ids": lang}


def _concat_pair(a, b, lang_a, lang_b, max_side, max_total, prefix=""):
    na, nb = truncate_pair_lengths(tf.size(a), tf.size(b), max_side, max_total)
    return _pair_row(a[:na], b[:nb], lang_a, lang_b, prefix)


def check_pair_limits(max_side_length: int, max_total_length: int) -> None:
    """Raises ValueError unless a pair with one token per side fits both limits."""
    if max_side_length < 3 or max_total_length < 6:
        raise ValueError(
            f"pair truncation limits too small: max_side_length={max_side_length} (need >= 3), "
            f"max_total_length={max_total_length} (need >= 6)"
        )


def _pair_limits(sequence_length, key, max_side_length, max_total_length):
    check_pair_limits(max_side_length, max_total_length)
    total = min(max_total_length, _length(sequence_length, key, max_total_length))
    if total < 6:
        raise ValueError(f"sequence length {total} is too short for a pair (need >= 6)")
    return max_side_length, total


def _swap(cond, a, b):
    return tf.cond(cond, lambda: (b, a), lambda: (a, b))


# (python function, parameter keys) -> (parameters, tf.function); see `_shared_fn`.
_SHARED_FNS: dict = {}


def _param_key(param):
    """A parameter as a dict key: itself when hashable, else its identity (seqio vocabularies
    define __eq__ without __hash__). `_SHARED_FNS` keeps the parameter alive with its entry,
    so the id cannot be reused by another object."""
    try:
        hash(param)
    except TypeError:
        return ("id", id(param))
    return param


def _shared_fn(fn, *params):
    """`fn(*args, *params)` as a `tf.function` of `args`, one per (fn, params) in the process,
    shared by every Task whose map calls it.

    A mixture of k Tasks builds k copies of each map; with a shared function each copy only
    traces a call, and the body (tokenizer, conds, truncation, ...) is traced once per input
    signature instead of k times. The ops, and so the examples, are unchanged.
    """
    key = (fn,) + tuple(_param_key(p) for p in params)
    hit = _SHARED_FNS.get(key)
    if hit is None:
        hit = _SHARED_FNS[key] = (
            params, tf.function(lambda *args: fn(*args, *params), autograph=False))
    return hit[1]


@seqio.map_over_dataset(num_seeds=1)
def parallel_pairs(ex: Mapping[str, tf.Tensor], seed: tf.Tensor,
                   sequence_length: Optional[Mapping[str, int]] = None,
                   max_side_length: int = 128, max_total_length: int = 256,
                   random_order: bool = True) -> dict[str, tf.Tensor]:
    """TLM-style pair `<s> a </s></s> b </s>` from `{src_ids, tgt_ids, src_lang, tgt_lang}`.

    With `random_order`, (a, b) = (tgt, src) with probability 1/2 (stateless, from `seed`).
    Truncation: `truncate_pair_lengths` with `max_side_length` per side and
    min(`max_total_length`, sequence_length["input_ids"]) in total.
    """
    max_side, max_total = _pair_limits(sequence_length, "input_ids", max_side_length,
                                       max_total_length)
    return _shared_fn(_parallel_pair, max_side, max_total, bool(random_order))(ex, seed)


def _parallel_pair(ex, seed, max_side, max_total, random_order):
    a, b, la, lb = ex["src_ids"], ex["tgt_ids"], ex["src_lang"], ex["tgt_lang"]
    if random_order:
        flip = tf.random.stateless_uniform([], seed) < 0.5
        a, b = _swap(flip, a, b)
        la, lb = _swap(flip, la, lb)
    return _concat_pair(a, b, la, lb, max_side, max_total)


@seqio.map_over_dataset(num_seeds=1)
def veco_parallel_pairs(ex: Mapping[str, tf.Tensor], seed: tf.Tensor,
                        sequence_length: Optional[Mapping[str, int]] = None,
                        max_side_length: int = 128, random_order: bool = True
                        ) -> dict[str, tf.Tensor]:
    """VECO bilingual example: x = `<s> src </s>`, y = `<s> tgt </s>` (swapped w.p. 1/2).

    Each row is cut to min(`max_side_length`, sequence_length["x_input_ids"]) tokens; both
    rows have pair_side 1 (each row is a single sentence) and their own language id.
    """
    cap = min(max_side_length, _length(sequence_length, "x_input_ids", max_side_length)) - 2
    if cap < 1:
        raise ValueError(f"veco_parallel_pairs: row length {cap + 2} is too short (need >= 3)")
    return _shared_fn(_veco_parallel_pair, cap, bool(random_order))(ex, seed)


def _veco_parallel_pair(ex, seed, cap, random_order):
    a, b, la, lb = ex["src_ids"], ex["tgt_ids"], ex["src_lang"], ex["tgt_lang"]
    if random_order:
        flip = tf.random.stateless_uniform([], seed) < 0.5
        a, b = _swap(flip, a, b)
        la, lb = _swap(flip, la, lb)
    out = _wrap(a[:cap], tf.fill(tf.shape(a[:cap]), la), "x_")
    out.update(_wrap(b[:cap], tf.fill(tf.shape(b[:cap]), lb), "y_"))
    # _wrap takes the specials' language from the tokens; an empty side must still get it.
    out["x_lang_ids"] = tf.fill(tf.shape(out["x_input_ids"]), tf.cast(la, tf.int32))
    out["y_lang_ids"] = tf.fill(tf.shape(out["y_input_ids"]), tf.cast(lb, tf.int32))
    return out


@seqio.map_over_dataset(num_seeds=1)
def mixup_pairs(ex: Mapping[str, tf.Tensor], seed: tf.Tensor,
                sequence_length: Optional[Mapping[str, int]] = None,
                max_side_length: int = 128, max_total_length: int = 256,
                random_direction: bool = True) -> dict[str, tf.Tensor]:
    """InfoXLM XLCo mixup example from two translation pairs of different corpora.

    Input: pair c = (`c_src_ids`, `c_tgt_ids`) and pair d = (`d_src_ids`, `d_tgt_ids`) with
    their `*_lang` ids (see `sources.mixup_source`). With four stateless uniforms u0..u3:
      1. c1, c2 = (c_src, c_tgt), swapped if `random_direction` and u0 < 1/2; likewise
         d1, d2 from d with u1. (c1, d1 go to the query, their translations to the key.)
      2. query = `<s> c1 </s></s> d1 </s>`, or `<s> d1 </s></s> c1 </s>` if u2 < 1/2;
      3. key   = `<s> c2 </s></s> d2 </s>`, or `<s> d2 </s></s> c2 </s>` if u3 < 1/2
         (the two orders are drawn independently).
    Each row uses the pair format and truncation of `parallel_pairs` (pair_side 1/2 per
    sentence, per-side language ids), with T = sequence_length["query_input_ids"].
    """
    max_side, max_total = _pair_limits(sequence_length, "query_input_ids", max_side_length,
                                       max_total_length)
    u = tf.random.stateless_uniform([4], seed)
    c1, c2, lc1, lc2 = ex["c_src_ids"], ex["c_tgt_ids"], ex["c_src_lang"], ex["c_tgt_lang"]
    d1, d2, ld1, ld2 = ex["d_src_ids"], ex["d_tgt_ids"], ex["d_src_lang"], ex["d_tgt_lang"]
    if random_direction:
        c1, c2 = _swap(u[0] < 0.5, c1, c2)
        lc1, lc2 = _swap(u[0] < 0.5, lc1, lc2)
        d1, d2 = _swap(u[1] < 0.5, d1, d2)
        ld1, ld2 = _swap(u[1] < 0.5, ld1, ld2)
    q_a, q_b = _swap(u[2] < 0.5, c1, d1)
    lq_a, lq_b = _swap(u[2] < 0.5, lc1, ld1)
    k_a, k_b = _swap(u[3] < 0.5, c2, d2)
    lk_a, lk_b = _swap(u[3] < 0.5, lc2, ld2)
    out = _concat_pair(q_a, q_b, lq_a, lq_b, max_side, max_total, "query_")
    out.update(_concat_pair(k_a, k_b, lk_a, lk_b, max_side, max_total, "key_"))
    return out


# ----------------------------------------------------------------------------- packing

_PAD_VALUES = {"input_ids": PAD_ID, "pair_side": 0, "lang_ids": 0}


def pack_numpy(rows: Mapping[str, np.ndarray], lengths: np.ndarray, length: int
               ) -> dict[str, np.ndarray]:
    """Greedy first-fit packing of variable-length examples into rows of `length` tokens.

    `rows` maps each token feature (`input_ids`, `pair_side`, `lang_ids`) to an [N, L] array
    whose row i holds example i in its first `lengths[i]` entries. Examples are taken in
    order; each goes into the first (earliest opened) row with room for it, or opens a new
    row (examples longer than `length` are cut to `length`, empty ones skipped); within a
    row, examples keep their order. Returns [R, length] int32 arrays for the three features
    plus `segment_ids` (1..k per row, 0 on padding) and `positions` (0.. within each example,
    0 on padding); padding is pad id 1 for `input_ids` and 0 elsewhere.
    """
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), length)
    assignments: list[list[int]] = []
    free = np.zeros(len(lengths), np.int64)  # room left in each opened row
    for i, n in enumerate(lengths):
        if n <= 0:
            continue
        fits = np.nonzero(free[:len(assignments)] >= n)[0]
        if fits.size:
            r = int(fits[0])
        else:
            r = len(assignments)
            assignments.append([])
            free[r] = length
        assignments[r].append(i)
        free[r] -= n
    num_rows = len(assignments)
    out = {k: np.full((num_rows, length), _PAD_VALUES.get(k, 0), np.int32) for k in rows}
    out["segment_ids"] = np.zeros((num_rows, length), np.int32)
    out["positions"] = np.zeros((num_rows, length), np.int32)
    for r, members in enumerate(assignments):
        start = 0
        for seg, i in enumerate(members, start=1):
            n = int(lengths[i])
            for k, v in rows.items():
                out[k][r, start:start + n] = v[i, :n]
            out["segment_ids"][r, start:start + n] = seg
            out["positions"][r, start:start + n] = np.arange(n, dtype=np.int32)
            start += n
    return out


def pack_dataset(dataset: tf.data.Dataset, length: int, prefix: str = "",
                 window: int = 256) -> tf.data.Dataset:
    """Packs examples first-fit (`pack_numpy`) into rows of `length`, `window` at a time.

    Deterministic: the packing depends only on the order of the incoming examples. Each
    window of `window` consecutive examples is packed on its own (rows do not carry over
    between windows). Output features are the five model features (with `prefix`), each
    int32 [length].
    """
    keys = [prefix + k for k in TOKEN_FEATURES]

    def select(ex):
        out = {k: ex[k][:length] for k in keys}
        out["__len"] = tf.size(out[keys[0]])
        return out

    ds = dataset.map(select, num_parallel_calls=tf.data.AUTOTUNE)
    ds = ds.padded_batch(window, padded_shapes={**{k: [None] for k in keys}, "__len": []})

    def np_pack(ids, side, lang, lens):
        packed = pack_numpy({"input_ids": ids, "pair_side": side, "lang_ids": lang}, lens, length)
        return tuple(packed[k] for k in ("input_ids", "positions", "segment_ids", "pair_side",
                                         "lang_ids"))

    names = [prefix + k for k in ("input_ids", "positions", "segment_ids", "pair_side",
                                  "lang_ids")]

    def pack(batch):
        outs = tf.numpy_function(np_pack, [batch[k] for k in keys] + [batch["__len"]],
                                 [tf.int32] * 5, stateful=False)
        result = {}
        for name, t in zip(names, outs):
            t.set_shape([None, length])
            result[name] = t
        return result

    return ds.map(pack).unbatch()


def finalize_unpacked(ex: Mapping[str, tf.Tensor], length: int, prefix: str = ""
                      ) -> dict[str, tf.Tensor]:
    """Pads one example (one row) to `length`: positions 0..n-1, segment_ids 1, pads 1/0."""
    ids = ex[prefix + "input_ids"][:length]
    n = tf.size(ids)
    pad = length - n

    def padded(t, value):
        t = tf.pad(t[:length], [[0, pad]], constant_values=value)
        t.set_shape([length])
        return t

    return {
        prefix + "input_ids": padded(ids, PAD_ID),
        prefix + "positions": padded(tf.range(n, dtype=tf.int32), 0),
        prefix + "segment_ids": padded(tf.ones([n], tf.int32), 0),
        prefix + "pair_side": padded(tf.cast(ex[prefix + "pair_side"], tf.int32), 0),
        prefix + "lang_ids": padded(tf.cast(ex[prefix + "lang_ids"], tf.int32), 0),
    }


# ----------------------------------------------------------------------------- per-kind builders
# What `registry.register_parallel` runs for each example kind that is built from translation
# pairs (`features.ExampleKind.from_pairs`): the tokenize keys {text feature: ids feature}
# and the preprocessor that makes examples of the ids.

_PAIR_KEYS = {"src": "src_ids", "tgt": "tgt_ids"}


def pair_examples(max_side_length: int, max_total_length: int, random_order: bool):
    """Kind pair: `parallel_pairs`."""
    return dict(_PAIR_KEYS), bind(parallel_pairs, max_side_length=max_side_length,
                                  max_total_length=max_total_length, random_order=random_order)


def split_pair_examples(max_side_length: int, max_total_length: int, random_order: bool):
    """Kind split_pair: `veco_parallel_pairs` (each side is its own row: no total limit)."""
    del max_total_length
    return dict(_PAIR_KEYS), bind(veco_parallel_pairs, max_side_length=max_side_length,
                                  random_order=random_order)


def mixup_pair_examples(max_side_length: int, max_total_length: int, random_order: bool):
    """Kind mixup_pair: `mixup_pairs` on the two pairs c, d of `sources.mixup_source`."""
    keys = {f"{x}_{s}": f"{x}_{s}_ids" for x in "cd" for s in ("src", "tgt")}
    return keys, bind(mixup_pairs, max_side_length=max_side_length,
                      max_total_length=max_total_length, random_direction=random_order)


def bind(fn, **kwargs):
    """`functools.partial` that keeps the seqio signature introspection working."""
    return functools.partial(fn, **kwargs)


def language_ids_for(languages: Sequence[str], language_list: Sequence[str]) -> dict[str, int]:
    """`{lang: language_index(lang, language_list)}` for each of `languages`."""
    return {lang: language_index(lang, language_list) for lang in languages}
