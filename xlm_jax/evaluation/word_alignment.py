"""Word alignment by optimal transport over one layer's word vectors; Pharaoh `i-j` output.

    python -m xlm_jax.evaluation.word_alignment --checkpoint DIR [--step N] --src FILE \
        --tgt FILE --layer N --out FILE.pharaoh [--src_lang xx --tgt_lang yy] \
        [--word_pool mean|first] [--eps 0.1] [--num_iters 100] \
        [--extraction mutual|threshold] [--threshold 0.5] [--gold FILE] [--max_length N]

`--src`/`--tgt` are line-aligned files of whitespace-tokenised sentences. Each output line holds
the links of one sentence pair as `i-j` (0-based source word i, target word j), sorted.
`--gold` (Pharaoh, `i-j` sure and `ipj` possible links, same index base) also prints the AER
computed by `xlm_jax.evaluation.metrics.aer_files`.

Method (what is from where):
* Word vectors (our choice, the SimAlign convention): each sentence is encoded alone as
  `<s> pieces(w1) ... pieces(wn) </s>`, the words' pieces tokenised one word at a time (as
  XLM-Align's aligner does); a word's vector is the MEAN of its subword vectors at `layer`
  (`word_pool="first"`: its first subword's), `<s>`/`</s>` excluded.
* Cost 1 - cosine, uniform marginals, entropic OT solved by log-domain Sinkhorn (`sinkhorn`;
  the textbook formulation, our choice of it). XLM-Align's released aligner
  (CZWin32768/XLM-Align `word_aligner/xlmalign-ot-aligner.py`) differs: it aligns SUBWORDS of
  the pair encoded jointly (`<s> src </s> tgt </s>`), takes the raw dot-product matrix itself
  as the Sinkhorn kernel (no exp, no epsilon), runs 2 row/column normalisations, and lifts
  every subword link to a word link.
* Link extraction `mutual` (default, as that aligner's `extract_wa_from_pi_xi`): (i, j) when
  j is the argmax of row i and i the argmax of column j of the plan. `threshold` (our choice):
  when P_ij >= threshold * min(a_i, b_j), i.e. at least that fraction of the smaller word's mass
  moves along the link (allows one-to-many links).
"""
from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from xlm_jax.evaluation import retrieval

EXTRACTIONS = ("mutual", "threshold")
WORD_POOLS = ("mean", "first")
DEFAULT_EPS = 0.1  # our choice: cost is in [0, 2]; exp(-C/0.1) separates cosines 0.1 apart by e
DEFAULT_NUM_ITERS = 100  # our choice: enough for argmax links; rows may be ~1e-3 off at eps 0.1
DEFAULT_THRESHOLD = 0.5  # our choice, for extraction="threshold"
Link = tuple[int, int]


# ----------------------------------------------------------------------------- optimal transport

def _logsumexp(x: np.ndarray, axis: int) -> np.ndarray:
    m = np.max(x, axis=axis, keepdims=True)
    return np.squeeze(m, axis) + np.log(np.sum(np.exp(x - m), axis=axis))


def sinkhorn(cost: Any, a: Any | None = None, b: Any | None = None, eps: float = DEFAULT_EPS,
             num_iters: int = DEFAULT_NUM_ITERS, tol: float = 1e-9) -> np.ndarray:
    """The entropic OT plan P = diag(u) exp(-cost/eps) diag(v) with row sums `a` and column sums
    `b` (default uniform 1/n and 1/m), float64 [n, m].

    Log-domain Sinkhorn (potentials log u, log v, updated by logsumexp) so that small `eps`
    cannot underflow. Stops after `num_iters` (row, column) updates or once the row sums are
    within `tol` of `a` (the column sums are exact after every column update)."""
    c = np.asarray(cost, np.float64)
    if c.ndim != 2 or 0 in c.shape:
        raise ValueError(f"sinkhorn: need a non-empty [n, m] cost matrix, got shape {c.shape}")
    if eps <= 0 or num_iters < 1:
        raise ValueError(f"sinkhorn: eps={eps} must be > 0 and num_iters={num_iters} >= 1")
    n, m = c.shape
    a = np.full(n, 1.0 / n) if a is None else np.asarray(a, np.float64)
    b = np.full(m, 1.0 / m) if b is None else np.asarray(b, np.float64)
    if a.shape != (n,) or b.shape != (m,) or (a <= 0).any() or (b <= 0).any():
        raise ValueError(f"sinkhorn: marginals must be positive vectors of lengths {n} and {m}")
    if not np.isclose(a.sum(), b.sum(), rtol=1e-9, atol=0):
        raise ValueError(f"sinkhorn: marginals have different masses {a.sum()} and {b.sum()}")
    log_k, log_a, log_b = -c / eps, np.log(a), np.log(b)
    log_v = np.zeros(m)
    for _ in range(num_iters):
        log_u = log_a - _logsumexp(log_k + log_v[None, :], axis=1)
        log_v = log_b - _logsumexp(log_k + log_u[:, None], axis=0)
        plan = np.exp(log_u[:, None] + log_k + log_v[None, :])
        if np.max(np.abs(plan.sum(axis=1) - a)) < tol:
            break
    return plan


def cosine_cost(src: Any, tgt: Any) -> np.ndarray:
    """1 - cosine similarity of every (source, target) row pair, float64 [n, m]."""
    def unit(x: Any) -> np.ndarray:
        x = np.asarray(x, np.float64)
        return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
    return 1.0 - unit(src) @ unit(tgt).T


def extract_links(plan: Any, rule: str = "mutual", threshold: float = DEFAULT_THRESHOLD
                  ) -> list[Link]:
    """Links (i, j), sorted, of a transport plan (or any score matrix, for `mutual`).

    `mutual`: j = argmax of row i and i = argmax of column j (first index on ties).
    `threshold`: P_ij >= threshold * min(row i's sum, column j's sum)."""
    p = np.asarray(plan, np.float64)
    if p.ndim != 2:
        raise ValueError(f"extract_links: need a 2-D plan, got shape {p.shape}")
    if rule == "mutual":
        row_best, col_best = p.argmax(axis=1), p.argmax(axis=0)
        return [(i, int(j)) for i, j in enumerate(row_best) if col_best[j] == i]
    if rule == "threshold":
        scale = np.minimum(p.sum(axis=1)[:, None], p.sum(axis=0)[None, :])
        return [(int(i), int(j)) for i, j in zip(*np.nonzero(p >= threshold * scale))]
    raise ValueError(f"extraction rule {rule!r} is not one of {', '.join(EXTRACTIONS)}")


def align(src_vecs: Any, tgt_vecs: Any, eps: float = DEFAULT_EPS,
          num_iters: int = DEFAULT_NUM_ITERS, rule: str = "mutual",
          threshold: float = DEFAULT_THRESHOLD) -> list[Link]:
    """Word links of one sentence pair from its word vectors ([n, D] and [m, D])."""
    return extract_links(sinkhorn(cosine_cost(src_vecs, tgt_vecs), eps=eps, num_iters=num_iters),
                         rule, threshold)


def to_pharaoh(links: Sequence[Link]) -> str:
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


# ----------------------------------------------------------------------------- word vectors

def word_pieces(tokenizer: Any, words: Sequence[str]) -> tuple[list[int], list[int]]:
    """(`<s>` + every word's piece ids + `</s>`, the word index of each position, -1 for
    `<s>`/`</s>`). Words are tokenised one at a time; a word with no pieces is a ValueError."""
    ids, word_of = [tokenizer.bos_id], [-1]
    for w, word in enumerate(words):
        pieces = tokenizer.encode(word)
        if not pieces:
            raise ValueError(f"word {w} ({word!r}) has no subword pieces")
        ids += pieces
        word_of += [w] * len(pieces)
    return ids + [tokenizer.eos_id], word_of + [-1]


def word_vectors(encoder: Any, sentences: Sequence[Sequence[str]], layer: int,
                 word_pool: str = "mean", lang: str | None = None,
                 max_length: int | None = None, batch_size: int = 32) -> list[np.ndarray]:
    """One float32 [len(words), D] array per sentence (a list of words): `layer`'s hidden states
    (`Encoder.hidden_states`, 0 = embeddings) pooled over each word's subwords.

    `max_length` (default: the model's position table, else no limit) bounds the tokens of a
    sentence with `<s>`/`</s>`; a longer one is a ValueError naming its index (nothing is
    truncated: every word needs a vector). Batches are sorted by length and padded to a
    power-of-two width, as `Encoder.embed_layers` does; `lang` as there."""
    if word_pool not in WORD_POOLS:
        raise ValueError(f"word_pool={word_pool!r} is not one of {', '.join(WORD_POOLS)}")
    layer = retrieval.check_layer(layer, encoder.config.num_layers)[0]
    limit = max_length or encoder.config.max_sequence_length
    tok = encoder.tokenizer
    encoded = []
    for k, words in enumerate(sentences):
        if not words:
            raise ValueError(f"sentence {k}: no words")
        try:
            ids, word_of = word_pieces(tok, words)
        except ValueError as e:
            raise ValueError(f"sentence {k}: {e}") from None
        if limit is not None and len(ids) > limit:
            raise ValueError(f"sentence {k}: {len(ids)} tokens with <s> and </s>, more than "
                             f"max_length {limit}")
        encoded.append((ids, np.array(word_of)))
    out: list[np.ndarray] = [np.empty(0)] * len(encoded)
    if not encoded:
        return out
    order = np.argsort([len(ids) for ids, _ in encoded], kind="stable")
    rows = min(batch_size, 1 << max(0, (len(encoded) - 1).bit_length()))
    for start in range(0, len(order), rows):
        idx = order[start:start + rows]
        longest = max(len(encoded[i][0]) for i in idx)
        width = max(8, 1 << max(0, (longest - 1).bit_length()))
        width = min(width, limit) if limit is not None else width
        ids = np.full((rows, width), encoder.config.pad_id, np.int32)
        mask = np.zeros((rows, width), np.int32)
        for r, i in enumerate(idx):
            ids[r, :len(encoded[i][0])] = encoded[i][0]
            mask[r, :len(encoded[i][0])] = 1
        mask[len(idx):, :2] = 1  # filler rows: <s> </s>, keeping the batch shape fixed
        ids[len(idx):, 0], ids[len(idx):, 1] = tok.bos_id, tok.eos_id
        hidden = encoder.hidden_states(ids, mask, encoder.lang_ids_for(lang, mask))[layer]
        hidden = np.asarray(hidden, np.float32)
        for r, i in enumerate(idx):
            word_of = encoded[i][1]
            n_words = int(word_of.max()) + 1
            states = hidden[r, :len(word_of)]
            if word_pool == "first":
                first = np.array([np.flatnonzero(word_of == w)[0] for w in range(n_words)])
                out[i] = states[first]
            else:
                onehot = (word_of[None, :] == np.arange(n_words)[:, None]).astype(np.float32)
                out[i] = (onehot @ states) / onehot.sum(axis=1, keepdims=True)
    return out


# ----------------------------------------------------------------------------- files and CLI

def read_sentences(path: str) -> list[list[str]]:
    """The whitespace-split words of every line; an empty line is a ValueError naming it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: sentence file not found")
    lines = retrieval._read_lines(path)
    for n, line in enumerate(lines, 1):
        if not line.split():
            raise ValueError(f"{path}:{n}: empty line (every line must hold a sentence)")
    if not lines:
        raise ValueError(f"{path}: no sentences")
    return [line.split() for line in lines]


def align_files(encoder: Any, src_path: str, tgt_path: str, layer: int,
                src_lang: str | None = None, tgt_lang: str | None = None,
                word_pool: str = "mean", eps: float = DEFAULT_EPS,
                num_iters: int = DEFAULT_NUM_ITERS, rule: str = "mutual",
                threshold: float = DEFAULT_THRESHOLD, max_length: int | None = None,
                batch_size: int = 32) -> list[list[Link]]:
    """The links of every line pair of two line-aligned files (errors name file and line)."""
    src, tgt = read_sentences(src_path), read_sentences(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has "
                         f"{len(tgt)}")
    if rule not in EXTRACTIONS:
        raise ValueError(f"extraction rule {rule!r} is not one of {', '.join(EXTRACTIONS)}")
    if encoder.has_language_embeddings and not (src_lang and tgt_lang):
        raise ValueError(f"{encoder.path} has language embeddings: give --src_lang and "
                         "--tgt_lang")
    vecs = []
    for sents, lang, path in ((src, src_lang, src_path), (tgt, tgt_lang, tgt_path)):
        try:
            vecs.append(word_vectors(encoder, sents, layer, word_pool, lang, max_length,
                                     batch_size))
        except ValueError as e:
            msg = str(e)
            if msg.startswith("sentence "):  # "sentence K: ..." -> "path:K+1: ..."
                k, rest = msg[len("sentence "):].split(":", 1)
                msg = f"{path}:{int(k) + 1}:{rest}"
            raise ValueError(msg) from None
    return [align(s, t, eps, num_iters, rule, threshold) for s, t in zip(*vecs)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m xlm_jax.evaluation.word_alignment",
                                description=__doc__.split("\n\n")[1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="HF XLM-R dir, xlm_jax model dir, or trainer model_dir")
    p.add_argument("--step", type=int, default=None, help="trainer checkpoint step")
    p.add_argument("--src", required=True, help="source sentences, one per line, tokenised")
    p.add_argument("--tgt", required=True, help="target sentences, line-aligned with --src")
    p.add_argument("--layer", type=int, required=True, help="layer (0 = embeddings)")
    p.add_argument("--out", required=True, help="Pharaoh output, one line per sentence pair")
    p.add_argument("--src_lang", default=None, help="needed by a model with language embeddings")
    p.add_argument("--tgt_lang", default=None)
    p.add_argument("--language_list", default=None, help="lang_ids table (as retrieval)")
    p.add_argument("--word_pool", default="mean", choices=WORD_POOLS)
    p.add_argument("--eps", type=float, default=DEFAULT_EPS, help="entropic regularisation")
    p.add_argument("--num_iters", type=int, default=DEFAULT_NUM_ITERS)
    p.add_argument("--extraction", default="mutual", choices=EXTRACTIONS)
    p.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                   help="for --extraction threshold")
    p.add_argument("--gold", default=None, help="gold Pharaoh file: also print AER")
    p.add_argument("--max_length", type=int, default=None,
                   help="tokens per sentence with <s> and </s> (default: the position table)")
    p.add_argument("--batch_size", type=int, default=32)
    args = p.parse_args(argv)
    try:
        read_sentences(args.src)  # bad input fails before the model is loaded
        read_sentences(args.tgt)
        language_list = (retrieval.read_language_list(args.language_list)
                         if args.language_list is not None else None)
        encoder = retrieval.load_checkpoint(args.checkpoint, args.step, language_list)
        links = align_files(encoder, args.src, args.tgt, args.layer, args.src_lang,
                            args.tgt_lang, args.word_pool, args.eps, args.num_iters,
                            args.extraction, args.threshold, args.max_length, args.batch_size)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            f.writelines(to_pharaoh(l) + "\n" for l in links)
        print(f"{len(links)} sentence pairs, {sum(map(len, links))} links -> {args.out}")
        if args.gold:
            from xlm_jax.evaluation.metrics import aer_files

            s = aer_files(args.gold, args.out)
            print(f"AER {s['aer']:.2f}  precision {s['precision']:.2f}  recall "
                  f"{s['recall']:.2f}")
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
