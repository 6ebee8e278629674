r"""Word alignment from one layer's hidden states; Pharaoh `i-j` output. Two methods.

    python -m xlm_jax.evaluation.word_alignment --checkpoint DIR [--step N] --src FILE \
        --tgt FILE --layer N --out FILE.pharaoh [--method sinkhorn|xlmalign] \
        [--src_lang xx --tgt_lang yy] [--word_pool mean|first] [--eps 0.1] [--num_iters N] \
        [--extraction mutual|threshold] [--threshold 0.5] [--gold FILE] [--max_length N]

`--src`/`--tgt` are line-aligned files of whitespace-tokenised sentences. Each output line holds
the links of one sentence pair as `i-j` (0-based source word i, target word j), sorted.
`--gold` (Pharaoh, `i-j` sure and `ipj` possible links, same index base) also prints the AER
computed by `xlm_jax.evaluation.metrics.aer_files`.

`--method sinkhorn` (default; word-level OT, our choice, the SimAlign convention):
* each sentence encoded alone as `<s> pieces(w1) ... pieces(wn) </s>`, the words' pieces
  tokenised one word at a time (as XLM-Align's aligner does); a word's vector is the MEAN of its
  subword vectors at `layer` (`--word_pool first`: its first subword's), `<s>`/`</s>` excluded.
* Cost 1 - cosine, uniform marginals, entropic OT solved by log-domain Sinkhorn (`sinkhorn`,
  the textbook formulation).
* Links `mutual` (default): (i, j) when j is the argmax of row i and i the argmax of column j
  of the plan. `threshold` (our choice): P_ij >= threshold * min(a_i, b_j), i.e. at least that
  fraction of the smaller word's mass moves along the link (allows one-to-many links).

`--method xlmalign`: XLM-Align's released aligner (CZWin32768/XLM-Align,
`word_aligner/xlmalign-ot-aligner.py`), as read there:
* Joint input (`RawPair2WordAlignDataset.__getitem__`, `get_indices_and_gid`): `<s> src </s>
  tgt </s>` with ONE `</s>` between the sentences (not XLM-R's `</s></s>` pair layout), each
  word SentencePiece-encoded alone and every piece tagged with its word's index in its own
  sentence (both sides from 0; the target offset there is commented out). Positions run on
  across the pair (HF XLM-R numbers non-pad tokens; `default_positions` does the same), token
  types all 0. There pieces become ids through the fairseq dictionary (`vocab.index(piece)`,
  unknown piece -> `<unk>`), here through `XLMRTokenizer` (SentencePiece id + 1): the same ids
  for XLM-R, whose dictionary holds every piece. A model with language embeddings (not in
  the released code): `<s> src </s>` gets `src_lang`'s lang_ids, `tgt </s>` `tgt_lang`'s (the
  `pair_side` convention of our pair data).
* Similarity (`get_wa`): `hidden_states[layer]` (0 = embeddings) of the joint pass, the raw dot
  product `rep @ rep^T`, cut to source-piece rows x target-piece columns (`sinkhorn`: the
  `[src_fr:src_to, trg_fr:trg_to]` slice, so no special token). The released code runs it in
  float32 (GPU); we take float32 states and their dot products in float64.
* `_sinkhorn_iter(S, num_iter)`: that matrix IS the kernel (no exp, no epsilon; `exp(S*10)` is
  commented out). `num_iter` = `--sinkhorn_iter`, default 2; each iteration normalises the
  COLUMNS first (xi = pi / pi.sum(dim=0)), then the rows (pi = xi / xi.sum(dim=1)); it returns
  (pi, xi) of the last iteration, and (S, S) for num_iter <= 0. Its `S[S<=0].fill_(1e-6)`
  fills a boolean-indexed COPY, so it changes nothing: entries <= 0 stay in the kernel, and we
  keep them too (`kernel_sinkhorn`; a zero sum gives inf/nan there as here).
* `extract_wa_from_pi_xi(pi, xi)`: subword link (i, j) when j is the argmax of row i of pi and
  i the argmax of column j of xi (`mutual_links`; argmax ties: numpy takes the first index,
  torch's choice is not documented). `get_wa` lifts each to the word pair owning the two pieces
  in a set (`lift_links`: duplicates removed); it adds 1 to both indices for its 1-based gold
  files, we write 0-based like `--gold`.
* Differences: `run` scores all 13 layers of XLM-R base (its `--wa_layer 8` default is
  overwritten), `--layer` picks one; it pads batches of 64 (masked, so no effect on states).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from xlm_jax import cli_help
from xlm_jax.evaluation import embedding

METHODS = ("sinkhorn", "xlmalign")
EXTRACTIONS = ("mutual", "threshold")
WORD_POOLS = ("mean", "first")
DEFAULT_EPS = 0.1  # our choice: cost is in [0, 2]; exp(-C/0.1) separates cosines 0.1 apart by e
DEFAULT_NUM_ITERS = 100  # our choice: enough for argmax links; rows may be ~1e-3 off at eps 0.1
DEFAULT_THRESHOLD = 0.5  # our choice, for extraction="threshold"
XLMALIGN_NUM_ITERS = 2  # the released aligner's --sinkhorn_iter default
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
        return mutual_links(p, p)
    if rule == "threshold":
        scale = np.minimum(p.sum(axis=1)[:, None], p.sum(axis=0)[None, :])
        return [(int(i), int(j)) for i, j in zip(*np.nonzero(p >= threshold * scale))]
    raise ValueError(f"extraction rule {rule!r} is not one of {', '.join(EXTRACTIONS)}")


def mutual_links(rows: Any, cols: Any) -> list[Link]:
    """(i, j), sorted, where j is the argmax of row i of `rows` and i the argmax of column j of
    `cols` (two [n, m] matrices; first index on ties)."""
    row_best, col_best = np.asarray(rows).argmax(axis=1), np.asarray(cols).argmax(axis=0)
    return [(i, int(j)) for i, j in enumerate(row_best) if col_best[j] == i]


def align(src_vecs: Any, tgt_vecs: Any, eps: float = DEFAULT_EPS,
          num_iters: int = DEFAULT_NUM_ITERS, rule: str = "mutual",
          threshold: float = DEFAULT_THRESHOLD) -> list[Link]:
    """Word links of one sentence pair from its word vectors ([n, D] and [m, D])."""
    return extract_links(sinkhorn(cosine_cost(src_vecs, tgt_vecs), eps=eps, num_iters=num_iters),
                         rule, threshold)


def kernel_sinkhorn(sim: Any, num_iters: int = XLMALIGN_NUM_ITERS
                    ) -> tuple[np.ndarray, np.ndarray]:
    """XLM-Align's normalisation (`_sinkhorn_iter`): the similarity matrix itself is the kernel;
    each iteration divides every column by its sum, then every row by its sum. Returns (pi,
    xi) float64 [n, m]: the last row-normalised and column-normalised matrices ((S, S) for
    num_iters=0). Entries <= 0 are kept, as there."""
    pi = np.array(sim, np.float64)
    if pi.ndim != 2 or 0 in pi.shape or num_iters < 0:
        raise ValueError(f"kernel_sinkhorn: need a non-empty [n, m] matrix and num_iters >= 0, "
                         f"got shape {pi.shape} and num_iters={num_iters}")
    xi = pi
    with np.errstate(divide="ignore", invalid="ignore"):  # a zero sum: inf/nan, as in torch
        for _ in range(num_iters):
            xi = pi / pi.sum(axis=0, keepdims=True)
            pi = xi / xi.sum(axis=1, keepdims=True)
    return pi, xi


def lift_links(links: Sequence[Link], src_word_of: Sequence[int],
               tgt_word_of: Sequence[int]) -> list[Link]:
    """Subword links -> the sorted, distinct links of the words owning the two pieces."""
    return sorted({(int(src_word_of[i]), int(tgt_word_of[j])) for i, j in links})


def xlmalign_align(sim: Any, src_word_of: Sequence[int], tgt_word_of: Sequence[int],
                   num_iters: int = XLMALIGN_NUM_ITERS) -> list[Link]:
    """Word links of one pair from its [source pieces, target pieces] similarity matrix."""
    return lift_links(mutual_links(*kernel_sinkhorn(sim, num_iters)), src_word_of, tgt_word_of)


def to_pharaoh(links: Sequence[Link]) -> str:
    return " ".join(f"{i}-{j}" for i, j in sorted(links))


# ----------------------------------------------------------------------------- hidden states

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


def joint_pieces(tokenizer: Any, src_words: Sequence[str], tgt_words: Sequence[str]
                 ) -> tuple[list[int], list[int], list[int]]:
    """XLM-Align's joint input `<s> src </s> tgt </s>` (one `</s>` between) and the word index
    of every source and every target piece: source pieces sit at positions 1..ns, target
    pieces at ns+2..ns+nt+1."""
    src_ids, src_of = word_pieces(tokenizer, src_words)
    tgt_ids, tgt_of = word_pieces(tokenizer, tgt_words)
    return src_ids + tgt_ids[1:], src_of[1:-1], tgt_of[1:-1]


def _layer_states(encoder: Any, seqs: Sequence[Sequence[int]], langs: Sequence[Any] | None,
                  layer: int, limit: int | None, batch_size: int) -> list[np.ndarray]:
    """`layer`'s hidden states of every id sequence, float32 [len, D] each. `langs`: each
    sequence's per-token lang_ids (None: a model without language embeddings). Batches are
    sorted by length and padded to a power-of-two width, as `Encoder.embed_layers` does."""
    tok = encoder.tokenizer
    out: list[np.ndarray] = [np.empty(0)] * len(seqs)
    if not seqs:
        return out
    order = np.argsort([len(ids) for ids in seqs], kind="stable")
    rows = min(batch_size, 1 << max(0, (len(seqs) - 1).bit_length()))
    for start in range(0, len(order), rows):
        idx = order[start:start + rows]
        longest = max(len(seqs[i]) for i in idx)
        width = max(8, 1 << max(0, (longest - 1).bit_length()))
        width = min(width, limit) if limit is not None else width
        ids = np.full((rows, width), encoder.config.pad_id, np.int32)
        mask = np.zeros((rows, width), np.int32)
        lang = None if langs is None else np.zeros((rows, width), np.int32)
        for r, i in enumerate(idx):
            ids[r, :len(seqs[i])] = seqs[i]
            mask[r, :len(seqs[i])] = 1
            if lang is not None:
                lang[r, :len(seqs[i])] = langs[i]
        mask[len(idx):, :2] = 1  # filler rows: <s> </s>, keeping the batch shape fixed
        ids[len(idx):, 0], ids[len(idx):, 1] = tok.bos_id, tok.eos_id
        if lang is not None:
            lang[len(idx):, :2] = lang[0, :2]
        hidden = np.asarray(encoder.hidden_states(ids, mask, lang)[layer], np.float32)
        for r, i in enumerate(idx):
            out[i] = hidden[r, :len(seqs[i])]
    return out


def word_vectors(encoder: Any, sentences: Sequence[Sequence[str]], layer: int,
                 word_pool: str = "mean", lang: str | None = None,
                 max_length: int | None = None, batch_size: int = 32) -> list[np.ndarray]:
    """One float32 [len(words), D] array per sentence (a list of words): `layer`'s hidden states
    (`Encoder.hidden_states`, 0 = embeddings) pooled over each word's subwords.

    `max_length` (default: the model's position table, else no limit) bounds the tokens of a
    sentence with `<s>`/`</s>`; a longer one is a ValueError naming its index (nothing is
    truncated: every word needs a vector). `lang` as in `Encoder.embed_layers`."""
    if word_pool not in WORD_POOLS:
        raise ValueError(f"word_pool={word_pool!r} is not one of {', '.join(WORD_POOLS)}")
    layer = embedding.check_layer(layer, encoder.config.num_layers)[0]
    limit = max_length or encoder.config.max_sequence_length
    encoded = []
    for k, words in enumerate(sentences):
        if not words:
            raise ValueError(f"sentence {k}: no words")
        try:
            ids, word_of = word_pieces(encoder.tokenizer, words)
        except ValueError as e:
            raise ValueError(f"sentence {k}: {e}") from None
        if limit is not None and len(ids) > limit:
            raise ValueError(f"sentence {k}: {len(ids)} tokens with <s> and </s>, more than "
                             f"max_length {limit}")
        encoded.append((ids, np.array(word_of)))
    seqs = [ids for ids, _ in encoded]
    langs = None
    if encoder.has_language_embeddings:
        langs = [encoder.lang_ids_for(lang, np.ones(len(ids))) for ids in seqs]
    out = []
    for states, (_, word_of) in zip(_layer_states(encoder, seqs, langs, layer, limit,
                                                  batch_size), encoded):
        n_words = int(word_of.max()) + 1
        if word_pool == "first":
            out.append(states[[np.flatnonzero(word_of == w)[0] for w in range(n_words)]])
        else:
            onehot = (word_of[None, :] == np.arange(n_words)[:, None]).astype(np.float32)
            out.append((onehot @ states) / onehot.sum(axis=1, keepdims=True))
    return out


def joint_similarities(encoder: Any, pairs: Sequence[tuple[Sequence[str], Sequence[str]]],
                       layer: int, src_lang: str | None = None, tgt_lang: str | None = None,
                       max_length: int | None = None, batch_size: int = 32
                       ) -> list[tuple[np.ndarray, list[int], list[int]]]:
    """Per (source words, target words) pair, XLM-Align's similarity: (float64 [ns, nt] dot
    products of `layer`'s states of the source and target pieces of the joint pass
    (`joint_pieces`), source word of each row, target word of each column). `max_length`
    bounds the joint sequence (ValueError "pair K: ..."); a language model's lang_ids are
    `src_lang` on `<s> src </s>`, `tgt_lang` on `tgt </s>`."""
    layer = embedding.check_layer(layer, encoder.config.num_layers)[0]
    limit = max_length or encoder.config.max_sequence_length
    seqs, meta, langs = [], [], []
    for k, (src_words, tgt_words) in enumerate(pairs):
        if not src_words or not tgt_words:
            raise ValueError(f"pair {k}: no words")
        try:
            ids, src_of, tgt_of = joint_pieces(encoder.tokenizer, src_words, tgt_words)
        except ValueError as e:
            raise ValueError(f"pair {k}: {e}") from None
        if limit is not None and len(ids) > limit:
            raise ValueError(f"pair {k}: {len(ids)} tokens in <s> src </s> tgt </s>, more than "
                             f"max_length {limit}")
        seqs.append(ids)
        meta.append((src_of, tgt_of))
        if encoder.has_language_embeddings:
            n = len(src_of) + 2
            langs.append(np.concatenate([encoder.lang_ids_for(src_lang, np.ones(n)),
                                         encoder.lang_ids_for(tgt_lang, np.ones(len(ids) - n))]))
    states = _layer_states(encoder, seqs, langs or None, layer, limit, batch_size)
    out = []
    for h, (src_of, tgt_of) in zip(states, meta):
        ns, h = len(src_of), h.astype(np.float64)
        out.append((h[1:1 + ns] @ h[ns + 2:ns + 2 + len(tgt_of)].T, src_of, tgt_of))
    return out


# ----------------------------------------------------------------------------- files and CLI

def read_sentences(path: str) -> list[list[str]]:
    """The whitespace-split words of every line; an empty line is a ValueError naming it."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: sentence file not found")
    lines = embedding.read_lines(path)
    for n, line in enumerate(lines, 1):
        if not line.split():
            raise ValueError(f"{path}:{n}: empty line (every line must hold a sentence)")
    if not lines:
        raise ValueError(f"{path}: no sentences")
    return [line.split() for line in lines]


def _where(e: ValueError, prefix: str, paths: Sequence[str]) -> ValueError:
    """"{prefix} K: ..." -> "path:K+1: ..." (each of `paths`, joined by " + ")."""
    msg = str(e)
    if msg.startswith(prefix + " "):
        k, rest = msg[len(prefix) + 1:].split(":", 1)
        msg = " + ".join(f"{p}:{int(k) + 1}" for p in paths) + ":" + rest
    return ValueError(msg)


def align_files(encoder: Any, src_path: str, tgt_path: str, layer: int,
                src_lang: str | None = None, tgt_lang: str | None = None,
                word_pool: str = "mean", eps: float = DEFAULT_EPS,
                num_iters: int | None = None, rule: str = "mutual",
                threshold: float = DEFAULT_THRESHOLD, max_length: int | None = None,
                batch_size: int = 32, method: str = "sinkhorn") -> list[list[Link]]:
    """The links of every line pair of two line-aligned files (errors name file and line).
    `num_iters` default: 100 (`sinkhorn`), 2 (`xlmalign`, which uses neither `word_pool`,
    `eps`, nor `threshold`, and only rule "mutual")."""
    src, tgt = read_sentences(src_path), read_sentences(tgt_path)
    if len(src) != len(tgt):
        raise ValueError(f"line counts differ: {src_path} has {len(src)} lines, {tgt_path} has "
                         f"{len(tgt)}")
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not one of {', '.join(METHODS)}")
    if rule not in EXTRACTIONS or (method == "xlmalign" and rule != "mutual"):
        raise ValueError(f"extraction rule {rule!r} is not one of "
                         f"{', '.join(EXTRACTIONS if method == 'sinkhorn' else ['mutual'])}")
    if encoder.has_language_embeddings and not (src_lang and tgt_lang):
        raise ValueError(f"{encoder.path} has language embeddings: give --src_lang and "
                         "--tgt_lang")
    if method == "xlmalign":
        try:
            sims = joint_similarities(encoder, list(zip(src, tgt)), layer, src_lang, tgt_lang,
                                      max_length, batch_size)
        except ValueError as e:
            raise _where(e, "pair", [src_path, tgt_path]) from None
        iters = XLMALIGN_NUM_ITERS if num_iters is None else num_iters
        return [xlmalign_align(sim, s_of, t_of, iters) for sim, s_of, t_of in sims]
    vecs = []
    for sents, lang, path in ((src, src_lang, src_path), (tgt, tgt_lang, tgt_path)):
        try:
            vecs.append(word_vectors(encoder, sents, layer, word_pool, lang, max_length,
                                     batch_size))
        except ValueError as e:
            raise _where(e, "sentence", [path]) from None
    iters = DEFAULT_NUM_ITERS if num_iters is None else num_iters
    return [align(s, t, eps, iters, rule, threshold) for s, t in zip(*vecs)]


def main(argv: list[str] | None = None) -> int:
    from xlm_jax.cli_help import HelpFormatter

    p = cli_help.Parser(prog="python -m xlm_jax.evaluation.word_alignment",
                        description=__doc__.split("\n\n")[1],
                        formatter_class=HelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="HF XLM-R dir, xlm_jax model dir, or trainer model_dir")
    p.add_argument("--step", type=int, default=None, help="trainer checkpoint step")
    p.add_argument("--src", required=True, help="source sentences, one per line, tokenised")
    p.add_argument("--tgt", required=True, help="target sentences, line-aligned with --src")
    p.add_argument("--layer", type=int, required=True, help="layer (0 = embeddings)")
    p.add_argument("--out", required=True, help="Pharaoh output, one line per sentence pair")
    p.add_argument("--src_lang", default=None, help="needed by a model with language embeddings")
    p.add_argument("--tgt_lang", default=None,
                   help="language of --tgt (models with language embeddings)")
    p.add_argument("--language_list", default=None, help="lang_ids table (as retrieval)")
    p.add_argument("--method", default="sinkhorn", choices=METHODS,
                   help="sinkhorn: word-level entropic OT; xlmalign: XLM-Align's aligner")
    p.add_argument("--num_iters", type=int, default=None,
                   help=f"default {DEFAULT_NUM_ITERS} (sinkhorn), {XLMALIGN_NUM_ITERS} (xlmalign)")
    sinkhorn_only = {"word_pool": "mean", "eps": DEFAULT_EPS, "extraction": "mutual",
                     "threshold": DEFAULT_THRESHOLD}  # default None: given ones are seen
    p.add_argument("--word_pool", choices=WORD_POOLS, help="default mean")
    p.add_argument("--eps", type=float, help=f"entropic regularisation, default {DEFAULT_EPS}")
    p.add_argument("--extraction", choices=EXTRACTIONS, help="default mutual")
    p.add_argument("--threshold", type=float, help=f"default {DEFAULT_THRESHOLD}")
    p.add_argument("--gold", default=None, help="gold Pharaoh file: also print AER")
    p.add_argument("--max_length", type=int, default=None,
                   help="tokens per sentence with <s> and </s> (default: the position table)")
    p.add_argument("--batch_size", type=int, default=32, help="sentences per forward pass")
    args = p.parse_args(argv)
    try:
        for name, default in sinkhorn_only.items():
            if args.method == "xlmalign" and getattr(args, name) is not None:
                raise ValueError(f"--{name} applies to --method sinkhorn only")
            setattr(args, name, default if getattr(args, name) is None else getattr(args, name))
        read_sentences(args.src)  # bad input fails before the model is loaded
        read_sentences(args.tgt)
        language_list = (embedding.read_language_list(args.language_list)
                         if args.language_list is not None else None)
        encoder = embedding.load_checkpoint(args.checkpoint, args.step, language_list)
        links = align_files(encoder, args.src, args.tgt, args.layer, args.src_lang,
                            args.tgt_lang, args.word_pool, args.eps, args.num_iters,
                            args.extraction, args.threshold, args.max_length, args.batch_size,
                            args.method)
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
