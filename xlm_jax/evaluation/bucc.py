r"""BUCC 2018 bitext mining (XTREME): margin-scored nearest neighbours, F1 against gold pairs.

    python -m xlm_jax.evaluation.bucc --checkpoint DIR [--step N] --bucc_dir DIR --layer N \
        [--languages de,fr] [--split test] [--threshold_from dev | --threshold X] [--k 4] \
        [--strategy max] [--pool mean] [--max_length N] [--batch_size 64] [--block_size 4096] \
        [--language_list CODES|FILE] [--predictions_dir DIR] [--output_json FILE]

Files, in `bucc_dir` or its `{xx}-en/` subfolder (as the BUCC tarballs unpack):
`{xx}-en.{split}.{xx}` and `{xx}-en.{split}.en` with `id<TAB>sentence` lines, and
`{xx}-en.{split}.gold` with `xx_id<TAB>en_id` lines. BUCC's splits are `sample`, `training` and
`test` (gold withheld); XTREME's `scripts/download_data.sh` renames `sample` -> `dev` and
`training` -> `test` and deletes its test gold. Split names are taken as the folder has them.

Sentences are embedded as Tatoeba retrieval embeds them (`embedding.embed_keyed`, i.e.
`Encoder.embed_layers`; each side in its language for a model with language embeddings).
Mining follows LASER's `source/mine_bitexts.py` with the settings of its `tasks/bucc/bucc.sh`
(`--retrieval max --margin ratio -k 4 --unify`), also the defaults of XTREME's
`third_party/utils_retrieve.py::mine_bitext`: the ratio margin (`margin_scores`); each xx
sentence's k cosine-nearest English sentences rescored by margin and the best kept (forward),
likewise backward; `strategy` keeps forward, backward, their intersection, or (`max`, the
default) both sorted by score, kept greedily so that no sentence is used twice. Identical
sentences of a file are searched once, and a text found under several ids maps to no id (its
pairs are dropped as ambiguous), as LASER's `tasks/bucc/bucc.py` does.

The threshold is the best-F1 one (`optimize_threshold`, LASER's `BuccOptimize`) on
`--threshold_from`'s gold, applied to `--split` (XTREME: tuned on its `dev`, applied to its
`test`); without it, on `--split`'s own gold (LASER's README table for BUCC `training`: an upper
bound); `--threshold X` scores a given one. Pairs scoring >= threshold are predicted and scored
by `xlm_jax.evaluation.metrics.bucc_scores` (0-100). XTREME's own `test` folder has no gold
(its leaderboard scores it): mine it with `--threshold_from dev` and `--predictions_dir DIR`,
which writes each language's predicted pairs as `test-{xx}.tsv` (`xx_id<TAB>en_id` lines, the
lines XTREME's `bucc_extract` writes); the table then shows counts and no scores. BUCC's own
`training` gold scores the papers' test numbers where XTREME's folder lacks it.

Search: every sentence's k nearest of the other side, exact, in float32 as LASER's and
XTREME's FAISS index (`IndexFlatIP`) searches, in jax on blocks of `--block_size` sentences a
side (`evaluation/nearest.py`): the margin's means and the candidates come from those lists,
so no [N, M] matrix is built and XTREME's test split (BUCC `training`, ~400k sentences a side)
fits in about 2.5 GB of device memory at 768 dimensions (docs/architecture.md, "BUCC at
XTREME's size", has the measured times).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xlm_jax import cli_help
from xlm_jax import model_dir as md
from xlm_jax.evaluation import embedding, nearest
from xlm_jax.evaluation.metrics.bucc_f1 import bucc_scores

FILE_PATTERN = "{xx}-en.{split}.{xx} + {xx}-en.{split}.en + {xx}-en.{split}.gold"
STRATEGIES = ("max", "intersect", "forward", "backward")
DEFAULT_K = 4  # LASER tasks/bucc/bucc.sh `-k 4`, XTREME mine_bitext(neighborhood=4)
ENGLISH = embedding.ENGLISH
Pair = tuple[str, str]


# ----------------------------------------------------------------------------- data

@dataclasses.dataclass(frozen=True)
class BuccSplit:
    """One language's split: ids and sentences of both sides (file order) and the gold pairs
    (None for a split without a gold file, such as XTREME's `test`, read to predict only)."""

    lang: str
    src_ids: list[str]
    src: list[str]
    en_ids: list[str]
    en: list[str]
    gold: set[Pair] | None


def _path(bucc_dir: str, lang: str, split: str, ext: str) -> str:
    """`{lang}-en.{split}.{ext}` in `bucc_dir`, else in its `{lang}-en/` subfolder."""
    name = f"{lang}-en.{split}.{ext}"
    flat = os.path.join(bucc_dir, name)
    nested = os.path.join(bucc_dir, f"{lang}-en", name)
    return nested if not os.path.isfile(flat) and os.path.isfile(nested) else flat


def find_languages(bucc_dir: str, split: str) -> list[str]:
    """Languages xx with both sentence files of `split` (flat or in `{xx}-en/`), sorted."""
    if not os.path.isdir(bucc_dir):
        raise FileNotFoundError(f"bucc_dir {bucc_dir}: not a directory (expected files "
                                f"{FILE_PATTERN})")
    names = set(os.listdir(bucc_dir))
    for sub in [n for n in names if os.path.isdir(os.path.join(bucc_dir, n))]:
        names |= set(os.listdir(os.path.join(bucc_dir, sub)))
    pattern = re.compile(rf"^([^./\\-]+)-en\.{re.escape(split)}\.([^./\\-]+)$")
    langs = sorted({m.group(1) for m in map(pattern.match, names)
                    if m and m.group(1) == m.group(2) and m.group(1) != ENGLISH
                    and f"{m.group(1)}-en.{split}.en" in names})
    if not langs:
        raise FileNotFoundError(f"bucc_dir {bucc_dir}: no BUCC files of split {split!r} "
                                f"(looked for {FILE_PATTERN.replace('{split}', split)})")
    return langs


def read_sentences(path: str) -> tuple[list[str], list[str]]:
    """(ids, sentences) of an `id<TAB>sentence` file; a line without both, or an id seen
    before, is a ValueError naming the file and line."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: BUCC sentence file not found")
    ids, sents, first = [], [], {}
    for n, line in enumerate(embedding.read_lines(path), 1):  # lines stripped
        sid, tab, sent = line.partition("\t")
        if not tab or not sid.strip() or not sent.strip():
            raise ValueError(f"{path}:{n}: expected 'id<TAB>sentence', got {line[:80]!r}")
        if sid.strip() in first:
            raise ValueError(f"{path}:{n}: duplicate id {sid.strip()!r} (first on line "
                             f"{first[sid.strip()]})")
        first[sid.strip()] = n
        ids.append(sid.strip())
        sents.append(sent.strip())
    if not ids:
        raise ValueError(f"{path}: no sentences")
    return ids, sents


def read_gold(path: str, src_ids: Sequence[str], en_ids: Sequence[str],
              src_path: str = "the xx file", en_path: str = "the en file") -> set[Pair]:
    """The `xx_id<TAB>en_id` pairs of a gold file; a malformed line, or an id missing from its
    sentence file, is a ValueError naming the file and line."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: gold file not found (needed to score or tune on "
                                "this split)")
    known = (set(src_ids), set(en_ids))
    gold = set()
    for n, line in enumerate(embedding.read_lines(path), 1):
        fields = [f.strip() for f in line.split("\t")]
        if len(fields) != 2 or not all(fields):
            raise ValueError(f"{path}:{n}: expected 'xx_id<TAB>en_id', got {line[:80]!r}")
        for sid, ids, where in zip(fields, known, (src_path, en_path)):
            if sid not in ids:
                raise ValueError(f"{path}:{n}: id {sid!r} is not in {where}")
        gold.add((fields[0], fields[1]))
    return gold


def read_split(bucc_dir: str, lang: str, split: str, need_gold: bool = True) -> BuccSplit:
    """Reads one language's split: both sentence files and the gold pairs (with `need_gold`
    False, a missing gold file gives `gold=None`; a gold file that is there is checked)."""
    src_path, en_path, gold_path = (_path(bucc_dir, lang, split, ext)
                                    for ext in (lang, ENGLISH, "gold"))
    src_ids, src = read_sentences(src_path)
    en_ids, en = read_sentences(en_path)
    gold = (read_gold(gold_path, src_ids, en_ids, src_path, en_path)
            if need_gold or os.path.isfile(gold_path) else None)
    return BuccSplit(lang, src_ids, src, en_ids, en, gold)


# ----------------------------------------------------------------------------- mining

def _unit_rows(x: Any) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"need a non-empty [N, D] array of vectors, got shape {x.shape}")
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


def _top_k_mean(sim: np.ndarray, k: int) -> np.ndarray:
    """Mean of each row's k largest values (k capped at the row length, as LASER does)."""
    k = min(k, sim.shape[1])
    return np.mean(-np.partition(-sim, k - 1, axis=1)[:, :k], axis=1)


def margin_scores(x: Any, y: Any, k: int = DEFAULT_K) -> np.ndarray:
    """The ratio margin of every pair, [N, M] float64 (Artetxe & Schwenk 2019):

        margin(x, y) = cos(x, y) / (sum_{z in NN_k(x)} cos(x, z) / 2k
                                    + sum_{z in NN_k(y)} cos(y, z) / 2k)

    NN_k(x) are x's k nearest rows of `y` by cosine, NN_k(y) y's k nearest rows of `x` (k is
    capped at the other side's size, as in LASER's `knn(x, y, min(y.shape[0], k))`)."""
    return _margin(_unit_rows(x) @ _unit_rows(y).T, k)


def _margin(sim: np.ndarray, k: int) -> np.ndarray:
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    fwd, bwd = _top_k_mean(sim, k), _top_k_mean(sim.T, k)
    return sim / ((fwd[:, None] + bwd[None, :]) / 2.0)


def _best_of(nn: nearest.Neighbours, own_mean: np.ndarray, other_mean: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """Per row: among its k nearest rows of the other side by cosine, the one with the best
    margin, and that margin (LASER's `score_candidates` over its `knn` indices, then `argmax`:
    the first of equal margins)."""
    sims = nn.sims.astype(np.float64)
    margin = sims / ((own_mean[:, None] + other_mean[nn.index]) / 2.0)
    pick = np.argmax(margin, axis=1)
    rows = np.arange(len(margin))
    return nn.index[rows, pick].astype(np.int64), margin[rows, pick]


def mine(x: Any, y: Any, k: int = DEFAULT_K, strategy: str = "max",
         block: int = nearest.DEFAULT_BLOCK) -> list[tuple[int, int, float]]:
    """Candidate pairs (row of x, row of y, margin score), highest score first.

    `forward`: each x with its best y; `backward`: each y with its best x; `intersect`: the
    forward pairs that are also backward pairs; `max` (default, LASER's and XTREME's): forward
    and backward pairs by decreasing score, a pair kept only when neither of its sentences is
    in a pair kept before (ties in the forward-then-backward order).

    Everything comes from each side's k nearest rows of the other (`nearest.mutual_nearest`,
    exact, in float32 as LASER's FAISS index, `block` rows of each side at a time): the margin's
    two neighbourhood means and the candidates, so no [N, M] matrix is built."""
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    x_nn, y_nn = nearest.mutual_nearest(x, y, k, block)  # checks k and block
    fwd_mean = x_nn.sims.astype(np.float64).mean(axis=1)  # each x's k nearest y
    bwd_mean = y_nn.sims.astype(np.float64).mean(axis=1)  # each y's k nearest x
    fwd_best, fwd_score = _best_of(x_nn, fwd_mean, bwd_mean)
    bwd_best, bwd_score = _best_of(y_nn, bwd_mean, fwd_mean)
    fwd = [(i, int(j), float(s)) for i, (j, s) in enumerate(zip(fwd_best, fwd_score))]
    bwd = [(int(i), j, float(s)) for j, (i, s) in enumerate(zip(bwd_best, bwd_score))]
    if strategy == "forward":
        pairs = fwd
    elif strategy == "backward":
        pairs = bwd
    elif strategy == "intersect":
        pairs = [p for p in fwd if bwd_best[p[1]] == p[0]]
    else:
        pairs, seen_x, seen_y = [], set(), set()
        for i, j, s in sorted(fwd + bwd, key=lambda p: -p[2]):  # stable: fwd first on ties
            if i not in seen_x and j not in seen_y:
                seen_x.add(i)
                seen_y.add(j)
                pairs.append((i, j, s))
    return sorted(pairs, key=lambda p: -p[2])


def mine_pairs(x: Any, y: Any, src_ids: Sequence[str | None], en_ids: Sequence[str | None],
               k: int = DEFAULT_K, strategy: str = "max", block: int = nearest.DEFAULT_BLOCK
               ) -> dict[Pair, float]:
    """`mine` keyed by ids: {(src_id, en_id): score}. Row i of `x` is `src_ids[i]`; a None id
    (an ambiguous sentence) drops its pairs."""
    if len(src_ids) != len(x) or len(en_ids) != len(y):
        raise ValueError(f"mine_pairs: {len(x)}/{len(y)} vectors but {len(src_ids)}/"
                         f"{len(en_ids)} ids")
    out: dict[Pair, float] = {}
    for i, j, s in mine(x, y, k, strategy, block):
        if src_ids[i] is not None and en_ids[j] is not None:
            key = (src_ids[i], en_ids[j])
            out[key] = max(s, out.get(key, s))
    return out


def predict(pairs: Mapping[Pair, float], threshold: float) -> set[Pair]:
    """The pairs with score >= threshold (LASER's `BuccExtract`)."""
    return {p for p, s in pairs.items() if s >= threshold}


def optimize_threshold(pairs: Mapping[Pair, float], gold: set[Pair]) -> float:
    """The threshold with the best F1 of `predict(pairs, threshold)` against `gold`.

    As LASER's `BuccOptimize`: candidates by decreasing score, F1 of every prefix, the midpoint
    between the best prefix's last score and the next one. Our changes: a prefix may only end
    where the score changes (a threshold cannot split tied scores); on equal F1 the highest
    threshold wins; when every candidate is kept the threshold is the lowest score (LASER
    indexes past its list there). With no correct candidate, 0.0 (as LASER)."""
    if not gold:
        raise ValueError("optimize_threshold: no gold pairs")
    items = sorted(pairs.items(), key=lambda kv: -kv[1])
    scores = np.array([s for _, s in items], np.float64)
    correct = np.array([p in gold for p, _ in items])
    if not correct.any():
        return 0.0
    hits = np.cumsum(correct)
    n = np.arange(1, len(scores) + 1)
    f1 = 2 * hits / (n + len(gold))  # 2PR/(P+R) with P = hits/n, R = hits/|gold|
    ends = np.flatnonzero(np.append(scores[1:] < scores[:-1], True))  # last of each tie group
    best = ends[np.argmax(f1[ends])]
    return float(scores[best] if best == len(scores) - 1
                 else (scores[best] + scores[best + 1]) / 2.0)


# ----------------------------------------------------------------------------- evaluation

@dataclasses.dataclass(frozen=True)
class MiningScore:
    """One language's scores (precision, recall, f1 on 0-100) at `threshold`; the three scores
    and `num_gold` are None for a split without gold (predicted only)."""

    precision: float | None
    recall: float | None
    f1: float | None
    threshold: float
    num_gold: int | None
    num_predicted: int
    num_candidates: int

    def to_json(self) -> dict[str, float | None]:
        return dataclasses.asdict(self)


def score(pairs: Mapping[Pair, float], gold: set[Pair] | None, threshold: float) -> MiningScore:
    """`bucc_scores` of the pairs predicted at `threshold` (only the counts without gold)."""
    pred = predict(pairs, threshold)
    if gold is None:
        return MiningScore(None, None, None, float(threshold), None, len(pred), len(pairs))
    s = bucc_scores(gold, pred)
    return MiningScore(s["precision"], s["recall"], s["f1"], float(threshold), len(gold),
                         len(pred), len(pairs))


def write_predictions(path: str, pairs: Mapping[Pair, float], threshold: float) -> int:
    """The pairs predicted at `threshold`, one `xx_id<TAB>en_id` line each by decreasing score
    (the lines XTREME's `bucc_extract` writes; a gold file's format), written whole or not at
    all (`model_dir.write_text`: local or gs://). Returns the number of lines."""
    lines = [f"{a}\t{b}\n" for (a, b), s in sorted(pairs.items(), key=lambda kv: -kv[1])
             if s >= threshold]
    md.write_text(path, "".join(lines))
    return len(lines)


def _unify(ids: Sequence[str], sents: Sequence[str]) -> tuple[list[str], list[str | None]]:
    """Distinct sentences (first-occurrence order) and each one's id, None when it has several."""
    by_text: dict[str, list[str]] = {}
    for i, s in zip(ids, sents):
        by_text.setdefault(s, []).append(i)
    return list(by_text), [v[0] if len(v) == 1 else None for v in by_text.values()]


def split_pairs(encoder: Any, data: BuccSplit, layer: int, k: int = DEFAULT_K,
                strategy: str = "max", pool: str = "mean", max_length: int | None = None,
                batch_size: int = 64, block: int = nearest.DEFAULT_BLOCK) -> dict[Pair, float]:
    """Embeds a split's distinct sentences (retrieval's path, each side in its language for a
    model with language embeddings) and mines them: {(src_id, en_id): score}."""
    uses = embedding.uses_languages(encoder)
    src, src_ids = _unify(data.src_ids, data.src)
    en, en_ids = _unify(data.en_ids, data.en)
    keys = [(data.lang if uses else None, s) for s in src] + [(ENGLISH if uses else None, s)
                                                              for s in en]
    uniq = list(dict.fromkeys(keys))
    vecs = embedding.embed_keyed(encoder, uniq, [layer], pool, max_length, batch_size)[0]
    at = {key: i for i, key in enumerate(uniq)}
    rows = np.array([at[key] for key in keys])
    return mine_pairs(vecs[rows[:len(src)]], vecs[rows[len(src):]], src_ids, en_ids, k, strategy,
                      block)


@dataclasses.dataclass
class BuccResult:
    """The outcome of `evaluate`; `to_json` is the CLI's JSON file."""

    layer: int
    split: str
    threshold_from: str  # a split name, or "given"
    k: int
    strategy: str
    per_language: dict[str, MiningScore]
    checkpoint: str | None = None
    step: int | None = None
    predictions: dict[str, str] | None = None  # language -> its predictions file

    @property
    def average_f1(self) -> float | None:
        """The mean F1 over the languages; None when a language has no gold to score."""
        f1 = [s.f1 for s in self.per_language.values()]
        return None if any(v is None for v in f1) else float(np.mean(f1))

    def to_json(self) -> dict[str, Any]:
        return {"layer": self.layer, "split": self.split, "threshold_from": self.threshold_from,
                "k": self.k, "strategy": self.strategy, "average_f1": self.average_f1,
                "per_language": {l: s.to_json() for l, s in sorted(self.per_language.items())},
                "checkpoint": self.checkpoint, "step": self.step,
                "predictions": self.predictions}


def evaluate(encoder: Any, bucc_dir: str, layer: int, languages: Sequence[str] | None = None,
             split: str = "test", threshold_from: str | None = None,
             threshold: float | None = None, k: int = DEFAULT_K, strategy: str = "max",
             pool: str = "mean", max_length: int | None = None, batch_size: int = 64,
             checkpoint: str | None = None, step: int | None = None,
             block: int = nearest.DEFAULT_BLOCK,
             predictions_dir: str | None = None) -> BuccResult:
    """Mines and scores `split` of every language (default: all found) with one layer.

    The threshold is `threshold` if given, else the best-F1 one on `threshold_from`'s gold
    (default: `split`'s own). A split without gold files (XTREME's `test`) can be mined with a
    threshold from elsewhere: its languages get the counts and no scores. With
    `predictions_dir`, each language's predicted pairs go to `{split}-{lang}.tsv` there
    (`write_predictions`; XTREME's file names). Every file is read and checked before
    anything is embedded."""
    if threshold is not None and threshold_from is not None:
        raise ValueError("give a threshold or a split to tune it on (threshold_from), not both")
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r} is not one of {', '.join(STRATEGIES)}")
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    if block < 1:
        raise ValueError(f"block={block} must be >= 1")
    layer = embedding.check_layer(layer, encoder.config.num_layers)[0]
    found = find_languages(bucc_dir, split)
    langs = list(dict.fromkeys(languages)) if languages else found
    unknown = [l for l in langs if l not in found]
    if unknown:
        raise FileNotFoundError(f"bucc_dir {bucc_dir}: no {split!r} files for language(s) "
                                f"{', '.join(unknown)} (found: {', '.join(found)}; pattern "
                                f"{FILE_PATTERN.replace('{split}', split)})")
    if embedding.uses_languages(encoder):
        for lang in [*langs, ENGLISH]:
            encoder.lang_id(lang)
    tune_on = threshold_from or (None if threshold is not None else split)
    data = {l: read_split(bucc_dir, l, split, need_gold=tune_on == split) for l in langs}
    tune = (data if tune_on in (None, split)
            else {l: read_split(bucc_dir, l, tune_on) for l in langs})
    args = dict(layer=layer, k=k, strategy=strategy, pool=pool, max_length=max_length,
                batch_size=batch_size, block=block)
    per_language, predictions = {}, {}
    for lang in langs:
        pairs = split_pairs(encoder, data[lang], **args)
        th = threshold
        if th is None:
            tuned = pairs if tune_on == split else split_pairs(encoder, tune[lang], **args)
            th = optimize_threshold(tuned, tune[lang].gold)
        per_language[lang] = score(pairs, data[lang].gold, th)
        if predictions_dir is not None:
            path = os.fspath(md.resolve(predictions_dir) / f"{split}-{lang}.tsv")
            write_predictions(path, pairs, th)
            predictions[lang] = path
    return BuccResult(layer, split, tune_on or "given", k, strategy, per_language,
                      checkpoint, step, predictions or None)


# ----------------------------------------------------------------------------- CLI

def main(argv: list[str] | None = None) -> int:
    from xlm_jax.cli_help import HelpFormatter

    p = cli_help.Parser(prog="python -m xlm_jax.evaluation.bucc",
                        description=__doc__.split("\n\n")[1],
                        formatter_class=HelpFormatter)
    p.add_argument("--checkpoint", required=True, help="model directory (as retrieval)")
    p.add_argument("--step", type=int, default=None, help="trainer checkpoint step")
    p.add_argument("--bucc_dir", required=True, help=f"directory with {FILE_PATTERN}")
    p.add_argument("--layer", type=int, required=True, help="layer to pool (0 = embeddings)")
    p.add_argument("--languages", default=None, help="comma-separated (default: all found)")
    p.add_argument("--split", default="test", help="split to score (default: test)")
    tune = p.add_mutually_exclusive_group()
    tune.add_argument("--threshold_from", default=None,
                      help="split whose gold picks the best-F1 threshold (default: --split)")
    tune.add_argument("--threshold", type=float, default=None, help="a fixed margin threshold")
    p.add_argument("--k", type=int, default=DEFAULT_K, help="margin neighbourhood size")
    p.add_argument("--strategy", default="max", choices=STRATEGIES,
                   help="how candidate pairs are mined (LASER's)")
    p.add_argument("--pool", default="mean", choices=embedding.POOLS,
                   help="how a sentence's tokens pool")
    p.add_argument("--max_length", type=int, default=None, help="as retrieval")
    p.add_argument("--batch_size", type=int, default=64, help="sentences per forward pass")
    p.add_argument("--block_size", type=int, default=nearest.DEFAULT_BLOCK,
                   help="sentences of each side per block of the nearest-neighbour search "
                        "(device memory: block_size^2 x 4 bytes)")
    p.add_argument("--language_list", default=None, help="as retrieval")
    p.add_argument("--predictions_dir", default=None,
                   help="write each language's predicted pairs to {split}-{lang}.tsv here "
                        "(xx_id<TAB>en_id lines, XTREME's files); a split without gold files "
                        "is mined with --threshold_from or --threshold")
    p.add_argument("--output_json", default=None, help="also write the scores here (JSON)")
    args = p.parse_args(argv)
    if args.block_size < 1:
        p.error(f"--block_size={args.block_size} must be >= 1")
    languages = ([l.strip() for l in args.languages.split(",") if l.strip()]
                 if args.languages else None)
    try:
        find_languages(args.bucc_dir, args.split)  # a bad data dir fails before loading
        language_list = (embedding.read_language_list(args.language_list)
                         if args.language_list is not None else None)
        encoder = embedding.load_checkpoint(args.checkpoint, args.step, language_list)
        result = evaluate(encoder, args.bucc_dir, args.layer, languages, split=args.split,
                          threshold_from=args.threshold_from, threshold=args.threshold,
                          k=args.k, strategy=args.strategy, pool=args.pool,
                          max_length=args.max_length, batch_size=args.batch_size,
                          checkpoint=os.path.abspath(args.checkpoint),
                          step=embedding.resolve_step(args.checkpoint, args.step),
                          block=args.block_size, predictions_dir=args.predictions_dir)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(result.to_json(), f, indent=2)

    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    print(f"{'lang':<6}{'precision':>10}{'recall':>8}{'f1':>8}{'threshold':>11}{'predicted':>11}")
    for lang, s in sorted(result.per_language.items()):
        print(f"{lang:<6}{num(s.precision):>10}{num(s.recall):>8}{num(s.f1):>8}"
              f"{s.threshold:>11.4f}{s.num_predicted:>11}")
    average = ("no gold to score" if result.average_f1 is None
               else f"average F1 {result.average_f1:.2f}")
    written = [p for p in (args.output_json, args.predictions_dir) if p]
    print(f"layer {result.layer}, split {result.split} (threshold from {result.threshold_from})"
          f": {average}" + (f" -> {', '.join(written)}" if written else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
