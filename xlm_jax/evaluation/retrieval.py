r"""Tatoeba sentence retrieval (XTREME): cosine nearest neighbour over pooled hidden states.

    python -m xlm_jax.evaluation.retrieval --checkpoint DIR [--step N] --tatoeba_dir DIR \
        --layer N|all [--languages xx,yy] [--pool mean] [--max_length N] [--batch_size 64] \
        [--language_list CODES|FILE] [--output_json FILE] [--plot FILE.png]

The Tatoeba directory holds, per language xx, the line-aligned files `tatoeba.{xx}-eng.{xx}` and
`tatoeba.{xx}-eng.eng` (the XTREME layout). Each sentence is embedded by pooling one layer's
hidden states over its real tokens (padding excluded) with `Encoder.embed_layers`, the path
`Encoder.embed` takes (`--max_length` default: `xlm_jax.encoder.DEFAULT_MAX_LENGTH`, capped at
the model's position table); for every xx sentence the English sentence with the highest
cosine similarity is retrieved (xx->eng) and vice versa (eng->xx).
acc@1 counts how often the retrieved sentence is the one on the same line. The reported
average is over languages and both directions.

`--layer all` scores every layer 0..L (0 = embeddings) from ONE forward pass per sentence and
writes the per-layer curve (the XLM-E Fig. 3 plot) as a PNG; `average` and `per_language` are
then those of the best layer. TensorFlow is never imported; jax is imported only to run a model.

The file codes xx are the data registry's language codes (`de`, `zh`, ...; English is `en`), as
in `tasks/demo_data/tatoeba`. A model with language embeddings (`num_languages > 0`) embeds the
xx side with the `lang_ids` of xx and the English side with those of `en`, through
the model's language list: `--language_list` (comma-separated codes or a file with one code per
line), else the `languages.txt` a trainer model_dir holds, else the data registry's list. Such a model gives the same
string different vectors in different languages, so sentences are then shared between files
only within one language.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from xlm_jax import cli_help
from xlm_jax.evaluation import embedding
from xlm_jax.evaluation.embedding import (  # noqa: F401  (re-exported: retrieval's public API)
    ENGLISH, POOLS, check_layer, embed_layers, load_checkpoint, read_language_list)

FILE_PATTERN = "tatoeba.{xx}-eng.{xx} + tatoeba.{xx}-eng.eng"
_SRC_RE = re.compile(r"^tatoeba\.([^./\\-]+)-eng\.([^./\\-]+)$")


# ----------------------------------------------------------------------------- results

@dataclasses.dataclass(frozen=True)
class LanguageScore:
    """acc@1 of one language in both directions, and how many sentence pairs were scored."""

    src_to_eng: float  # xx -> eng
    eng_to_src: float  # eng -> xx
    num_pairs: int
    # Which sentences each direction found (xx -> eng, eng -> xx), when scored here or read
    # from a JSON file that holds them (`to_json` writes the reported layer's): what a paired
    # comparison of two models resamples (the demo's bootstrap).
    hits: tuple[np.ndarray, np.ndarray] | None = dataclasses.field(
        default=None, compare=False, repr=False)

    @property
    def mean(self) -> float:
        return (self.src_to_eng + self.eng_to_src) / 2.0

    def to_json(self, lang: str, hits: bool = False) -> dict[str, Any]:
        """The scores; with `hits` (and hits to write), each direction's per-sentence hits as
        a string of 0/1 characters (one byte a sentence), which `from_json` reads back so a
        stored result can be compared with another (`paired_bootstrap`)."""
        out: dict[str, Any] = {f"{lang}->eng": self.src_to_eng, f"eng->{lang}": self.eng_to_src,
                               "mean": self.mean, "num_pairs": self.num_pairs}
        if hits and self.hits is not None:
            out["hits"] = {key: "".join("1" if h else "0" for h in np.asarray(row).ravel())
                           for key, row in zip((f"{lang}->eng", f"eng->{lang}"), self.hits)}
        return out


@dataclasses.dataclass
class RetrievalResult:
    """The outcome of `evaluate`; `to_json`/`from_json` round-trip the CLI's JSON file.

    `layer` is the layer asked for (an int, or "all"); `reported_layer` the one whose scores
    fill `per_language`/`average` (the best layer for "all"). `per_layer_language` keeps the
    scores of every evaluated layer; `layer_norm` the states they pooled (`Encoder.hidden_states`).
    """

    layer: int | str
    reported_layer: int
    per_language: dict[str, LanguageScore]
    per_layer_language: dict[int, dict[str, LanguageScore]]
    checkpoint: str | None = None
    step: int | None = None
    layer_norm: str = "none"

    @property
    def average(self) -> float:
        """Mean acc@1 over languages and both directions at `reported_layer`."""
        return _average(self.per_language)

    @property
    def standard_error(self) -> float:
        """The binomial standard error of `average`: each direction's acc@1 over its
        `num_pairs` sentences as an independent proportion, Var(mean of means) =
        sum of p(1 - p) / n over languages and directions / (2 x languages)^2. The hits of
        one sentence set at two steps are correlated, so for a difference of two steps this
        overstates the noise (a conservative test: our choice)."""
        if not self.per_language:
            return float("nan")
        terms = [p * (1.0 - p) / max(s.num_pairs, 1) for s in self.per_language.values()
                 for p in (s.src_to_eng, s.eng_to_src)]
        return float(np.sqrt(sum(terms)) / len(terms))

    @property
    def per_layer(self) -> dict[int, float]:
        """Average acc@1 of every evaluated layer."""
        return {layer: _average(scores)
                for layer, scores in sorted(self.per_layer_language.items())}

    @property
    def best_layer(self) -> int:
        """The layer with the highest average (the lowest such layer on ties)."""
        per_layer = self.per_layer
        return max(per_layer, key=lambda k: (per_layer[k], -k))

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "layer": self.layer, "reported_layer": self.reported_layer, "average": self.average,
            "per_language": {lang: s.to_json(lang, hits=True)
                             for lang, s in sorted(self.per_language.items())},
            "checkpoint": self.checkpoint, "step": self.step, "layer_norm": self.layer_norm,
        }
        if self.layer == "all":
            out["per_layer"] = {str(k): v for k, v in self.per_layer.items()}
            out["best_layer"] = self.best_layer
            out["per_layer_language"] = {
                str(k): {lang: s.to_json(lang) for lang, s in sorted(v.items())}
                for k, v in sorted(self.per_layer_language.items())}
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: str = "result") -> "RetrievalResult":
        """Reads what `to_json` wrote (or a minimal JSON with `layer` and `per_language`)."""
        def need(mapping: Mapping[str, Any], key: str, where: str) -> Any:
            if not isinstance(mapping, Mapping) or key not in mapping:
                raise ValueError(f"{source}: missing key {key!r} in {where}")
            return mapping[key]

        def scores(raw: Any, where: str) -> dict[str, LanguageScore]:
            if not isinstance(raw, Mapping) or not raw:
                raise ValueError(f"{source}: {where} must be a non-empty object, got {raw!r}")
            out = {}
            for lang, entry in raw.items():
                vals = []
                for key in (f"{lang}->eng", f"eng->{lang}"):
                    v = need(entry, key, f"{where}[{lang!r}]")
                    if not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                        raise ValueError(f"{source}: {where}[{lang!r}][{key!r}]={v!r} is not an "
                                         "accuracy in [0, 1]")
                    vals.append(float(v))
                num_pairs = int(entry.get("num_pairs", 0))
                out[lang] = LanguageScore(vals[0], vals[1], num_pairs,
                                          hits=read_hits(entry, lang, num_pairs, vals,
                                                         f"{where}[{lang!r}]"))
            return out

        def read_hits(entry: Mapping[str, Any], lang: str, num_pairs: int, vals: list[float],
                      where: str) -> tuple[np.ndarray, np.ndarray] | None:
            """The per-sentence hits `to_json` wrote, checked against the scores beside them."""
            raw = entry.get("hits")
            if raw is None:
                return None
            rows = []
            for key, acc in zip((f"{lang}->eng", f"eng->{lang}"), vals):
                text = need(raw, key, f"{where}['hits']")
                if (not isinstance(text, str) or len(text) != num_pairs
                        or set(text) - {"0", "1"}):
                    raise ValueError(f"{source}: {where}['hits'][{key!r}] must be {num_pairs} "
                                     "characters 0/1 (one per sentence)")
                row = np.frombuffer(text.encode("ascii"), np.uint8) == ord("1")
                if abs(float(row.mean()) - acc) > 1e-9:
                    raise ValueError(f"{source}: {where}['hits'][{key!r}] gives acc@1 "
                                     f"{row.mean():.6f}, the file says {acc!r}")
                rows.append(row)
            return rows[0], rows[1]

        layer = need(data, "layer", "the top level")
        if not (layer == "all" or (isinstance(layer, int) and layer >= 0)):
            raise ValueError(f"{source}: layer={layer!r} must be a layer number or 'all'")
        per_language = scores(need(data, "per_language", "the top level"), "per_language")
        reported = data.get("reported_layer", data.get("best_layer", layer))
        if not isinstance(reported, int):
            raise ValueError(f"{source}: reported_layer={reported!r} must be a layer number")
        per_layer_language = {reported: per_language}
        for k, v in (data.get("per_layer_language") or {}).items():
            if not str(k).isdigit():
                raise ValueError(f"{source}: per_layer_language key {k!r} is not a layer number")
            per_layer_language[int(k)] = scores(v, f"per_layer_language[{k!r}]")
        return cls(layer=layer, reported_layer=reported, per_language=per_language,
                   per_layer_language=per_layer_language, checkpoint=data.get("checkpoint"),
                   step=data.get("step"), layer_norm=data.get("layer_norm", "none"))

    @classmethod
    def load(cls, path: str) -> "RetrievalResult":
        """Reads a JSON file written by the CLI; errors name the file."""
        return cls.from_json(read_result_json(path), source=path)


def read_result_json(path: str) -> dict[str, Any]:
    """The JSON object of a result file, as written (its `settings` included, where a result
    file records them); errors name the file."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{path}: retrieval result JSON not found")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from None


def _average(scores: Mapping[str, LanguageScore]) -> float:
    return float(np.mean([s.mean for s in scores.values()])) if scores else float("nan")


@dataclasses.dataclass(frozen=True)
class DeltaSpread:
    """The bootstrap standard deviation of `b - a`'s acc@1 (fractions), per language and for
    the average over languages."""

    per_language: dict[str, float]
    average: float
    resamples: int


def paired_bootstrap(a: RetrievalResult, b: RetrievalResult, resamples: int = 1000,
                     seed: int = 0) -> DeltaSpread:
    """How much `b.average - a.average` (and each language's difference) moves when the
    held-out sentences are drawn again: each resample draws every language's sentences with
    replacement, the same draw for both models and both directions (a paired bootstrap over
    sentences), and recomputes the differences; the spread is their standard deviation. Both
    results must come from `evaluate` (they carry each sentence's hits) on the same files."""
    langs = sorted(b.per_language)
    if sorted(a.per_language) != langs:
        raise ValueError(f"paired_bootstrap: languages differ ({sorted(a.per_language)} and "
                         f"{langs})")
    rng = np.random.default_rng(seed)
    deltas = np.zeros((resamples, len(langs)))
    for j, lang in enumerate(langs):
        sa, sb = a.per_language[lang], b.per_language[lang]
        if sa.hits is None or sb.hits is None or sa.num_pairs != sb.num_pairs:
            raise ValueError(f"paired_bootstrap: language {lang!r} lacks per-sentence hits "
                             "(scores read from a JSON file without them) or was scored on other "
                             "sentences")
        # per sentence: the mean of its two directions' hits, b minus a
        hits_a, hits_b = (np.asarray(sa.hits, float), np.asarray(sb.hits, float))  # [2, n]
        diff = (hits_b.sum(axis=0) - hits_a.sum(axis=0)) / 2.0
        draws = rng.integers(0, len(diff), size=(resamples, len(diff)))
        deltas[:, j] = diff[draws].mean(axis=1)
    return DeltaSpread({lang: float(deltas[:, j].std(ddof=1)) for j, lang in enumerate(langs)},
                       float(deltas.mean(axis=1).std(ddof=1)), resamples)


# ----------------------------------------------------------------------------- the metric

def retrieval_accuracy(src_vecs: Any, tgt_vecs: Any) -> float:
    """acc@1 of cosine nearest-neighbour retrieval: row i of `src_vecs` should find row i of
    `tgt_vecs` (the mean of `retrieval_hits`)."""
    return float(np.mean(retrieval_hits(src_vecs, tgt_vecs)))


def retrieval_hits(src_vecs: Any, tgt_vecs: Any) -> np.ndarray:
    """Per row i of `src_vecs`, whether its cosine nearest neighbour in `tgt_vecs` is row i.
    Computed in float64 so that an exact duplicate (cosine 1) always wins; ties go to the
    lowest index, as `argmax` does."""
    src = np.asarray(src_vecs, np.float64)
    tgt = np.asarray(tgt_vecs, np.float64)
    if src.ndim != 2 or tgt.ndim != 2 or src.shape != tgt.shape:
        raise ValueError(f"retrieval_accuracy: need two [N, D] arrays of equal shape, got "
                         f"{src.shape} and {tgt.shape}")
    if src.shape[0] == 0:
        raise ValueError("retrieval_accuracy: no vectors to score (N=0)")
    src = src / np.maximum(np.linalg.norm(src, axis=1, keepdims=True), 1e-12)
    tgt = tgt / np.maximum(np.linalg.norm(tgt, axis=1, keepdims=True), 1e-12)
    nearest = np.argmax(src @ tgt.T, axis=1)
    return nearest == np.arange(src.shape[0])


# ----------------------------------------------------------------------------- data

@dataclasses.dataclass(frozen=True)
class TatoebaPair:
    """One language's line-aligned sentences and the files they came from."""

    lang: str
    src: list[str]
    eng: list[str]
    src_path: str
    eng_path: str


def find_languages(tatoeba_dir: str) -> list[str]:
    """Languages xx with both `tatoeba.{xx}-eng.{xx}` and `tatoeba.{xx}-eng.eng`, sorted."""
    if not os.path.isdir(tatoeba_dir):
        raise FileNotFoundError(f"tatoeba_dir {tatoeba_dir}: not a directory (expected files "
                                f"{FILE_PATTERN})")
    names = set(os.listdir(tatoeba_dir))
    langs = []
    for name in names:
        m = _SRC_RE.match(name)
        if m and m.group(1) == m.group(2) and m.group(1) != "eng":
            if f"tatoeba.{m.group(1)}-eng.eng" in names:
                langs.append(m.group(1))
    if not langs:
        raise FileNotFoundError(f"tatoeba_dir {tatoeba_dir}: no Tatoeba files found (looked for "
                                f"{FILE_PATTERN})")
    return sorted(langs)


def read_pair(tatoeba_dir: str, lang: str) -> TatoebaPair:
    """Reads one language's two files; they must exist, be non-empty and have equal lines."""
    src_path = os.path.join(tatoeba_dir, f"tatoeba.{lang}-eng.{lang}")
    eng_path = os.path.join(tatoeba_dir, f"tatoeba.{lang}-eng.eng")
    missing = [p for p in (src_path, eng_path) if not os.path.isfile(p)]
    if missing:
        raise FileNotFoundError(f"language {lang!r}: missing {', '.join(missing)}")
    src, eng = embedding.read_lines(src_path), embedding.read_lines(eng_path)
    if len(src) != len(eng):
        raise ValueError(f"line counts differ: {src_path} has {len(src)} lines, {eng_path} has "
                         f"{len(eng)}")
    if not src:
        raise ValueError(f"{src_path}: no sentences")
    return TatoebaPair(lang, src, eng, src_path, eng_path)


def scoring_settings(tatoeba_dir: str, languages: Sequence[str],
                     layers: int | str | Sequence[int] = "all", pool: str = "mean",
                     max_sentences: int | None = None, max_length: int | None = None,
                     batch_size: int = 64) -> dict[str, Any]:
    """How a result was scored, as a result file records it beside the scores (the training
    evaluator's `eval/retrieval_stepN.json`, the shipped base's `retrieval.json`); the
    defaults are `evaluate`'s, so `scoring_settings(dir, find_languages(dir))` is what a
    plain `evaluate(encoder, dir)` scores (`max_sentences`: the first N lines of each file)."""
    return {"tatoeba_dir": tatoeba_dir, "languages": list(languages),
            "layers": layers if isinstance(layers, (int, str)) else list(layers), "pool": pool,
            "max_sentences": max_sentences, "max_length": max_length, "batch_size": batch_size}


# ----------------------------------------------------------------------------- evaluation

def evaluate(encoder: Any, tatoeba_dir: str, layers: int | str | Sequence[int] = "all",
             languages: Sequence[str] | None = None, pool: str = "mean",
             max_length: int | None = None, batch_size: int = 64,
             checkpoint: str | None = None, step: int | None = None,
             layer_norm: str = "none") -> RetrievalResult:
    """Scores Tatoeba retrieval for `encoder` (an `xlm_jax.encoder.Encoder`).

    `layers` is one layer, "all", or a list of layers (several are reported like "all", over
    those layers); `languages` defaults to every language found in `tatoeba_dir`. Each
    language's sentences are embedded once for all layers. A model with language embeddings
    gets the language of each side (xx, and `en` for English; see the module docstring); a
    language missing from its language list is a ValueError naming it, raised before any
    sentence is embedded. `pool`, `max_length` (None: `DEFAULT_MAX_LENGTH`, capped at the
    model's position table), `batch_size` and `layer_norm` ("none": a pre-LN model's raw
    residual states below the last layer; "final": those states through its final LayerNorm)
    go to `Encoder.embed_layers`.
    """
    encoder.check_layer_norm(layer_norm)
    num_layers = encoder.config.num_layers
    if isinstance(layers, (int, str)):
        layer_list = check_layer(layers, num_layers)
        layer_spec: int | str = "all" if layers == "all" else layer_list[0]
    else:
        layer_list = sorted({l for x in layers for l in check_layer(x, num_layers)})
        if not layer_list:
            raise ValueError("layers: empty list")
        layer_spec = layer_list[0] if len(layer_list) == 1 else "all"
    found = find_languages(tatoeba_dir)
    if languages:
        unknown = [l for l in languages if l not in found]
        if unknown:
            raise FileNotFoundError(f"tatoeba_dir {tatoeba_dir}: no files for language(s) "
                                    f"{', '.join(unknown)} (found: {', '.join(found)}; pattern "
                                    f"{FILE_PATTERN})")
        langs = list(dict.fromkeys(languages))
    else:
        langs = found
    uses_languages = embedding.uses_languages(encoder)
    if uses_languages:
        for lang in [*langs, ENGLISH]:  # fail before reading or embedding anything
            encoder.lang_id(lang)
    pairs = [read_pair(tatoeba_dir, lang) for lang in langs]  # read all first: fail early

    def side_langs(pair: TatoebaPair) -> tuple[str | None, str | None]:
        """The languages of the xx and English sides; None for a model without language
        embeddings (a string's vector is then the same in every language)."""
        return (pair.lang, ENGLISH) if uses_languages else (None, None)

    def keys(pair: TatoebaPair) -> list[tuple[str | None, str]]:
        """The pair's distinct (language, sentence) keys, ordered so that runs batch alike."""
        src_lang, eng_lang = side_langs(pair)
        return list(dict.fromkeys([(src_lang, s) for s in pair.src]
                                  + [(eng_lang, s) for s in pair.eng]))

    # Keys in more than one language's files (the English side often is) are embedded once
    # for all languages; the rest per language, so memory stays one language's worth.
    counts: dict[tuple[str | None, str], int] = {}
    for pair in pairs:
        for k in keys(pair):
            counts[k] = counts.get(k, 0) + 1
    shared = [k for k, c in counts.items() if c > 1]
    shared_vecs = embedding.embed_keyed(encoder, shared, layer_list, pool, max_length, batch_size,
                                        layer_norm)
    shared_at = {k: i for i, k in enumerate(shared)}
    per_layer_language: dict[int, dict[str, LanguageScore]] = {l: {} for l in layer_list}
    for pair in pairs:
        # Each distinct key is embedded once (an identical key gets the identical vector).
        own = [k for k in keys(pair) if k not in shared_at]
        own_vecs = embedding.embed_keyed(encoder, own, layer_list, pool, max_length, batch_size,
                                         layer_norm)
        own_at = {k: i for i, k in enumerate(own)}

        def lookup(lang: str | None, sentences: list[str]) -> np.ndarray:
            ks = [(lang, s) for s in sentences]
            mine = np.array([k in own_at for k in ks])
            out = np.empty((len(layer_list), len(ks), own_vecs.shape[-1]), np.float32)
            out[:, mine] = own_vecs[:, [own_at[k] for k in ks if k in own_at]]
            out[:, ~mine] = shared_vecs[:, [shared_at[k] for k in ks if k not in own_at]]
            return out

        src_lang, eng_lang = side_langs(pair)
        src_all, eng_all = lookup(src_lang, pair.src), lookup(eng_lang, pair.eng)
        for k, layer in enumerate(layer_list):
            src, eng = src_all[k], eng_all[k]
            forward, backward = retrieval_hits(src, eng), retrieval_hits(eng, src)
            per_layer_language[layer][pair.lang] = LanguageScore(
                float(np.mean(forward)), float(np.mean(backward)), len(pair.src),
                hits=(forward, backward))
    result = RetrievalResult(layer=layer_spec, reported_layer=layer_list[0], per_language={},
                             per_layer_language=per_layer_language, checkpoint=checkpoint,
                             step=step, layer_norm=layer_norm)
    result.reported_layer = result.best_layer if layer_spec == "all" else layer_list[0]
    result.per_language = per_layer_language[result.reported_layer]
    return result


# ----------------------------------------------------------------------------- plots

def plot_layers(result: RetrievalResult, out_png: str, title: str | None = None) -> str:
    """Writes the per-layer average acc@1 curve (x = layer, y = acc@1 %, XLM-E Fig. 3 style),
    with each language's mean as a thin line; a single-layer result is drawn as per-language
    bars instead. Uses matplotlib's Agg canvas directly (no global backend change)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    per_layer = result.per_layer
    if len(per_layer) > 1:
        xs = list(per_layer)
        langs = sorted({l for v in result.per_layer_language.values() for l in v})
        many = len(langs) > 10  # then one grey line per language, labelled once
        for i, lang in enumerate(langs):
            ys = [100 * result.per_layer_language[x][lang].mean for x in xs]
            if many:
                ax.plot(xs, ys, lw=0.7, alpha=0.35, color="grey",
                        label=f"each language ({len(langs)})" if i == 0 else None)
            else:
                ax.plot(xs, ys, lw=0.9, alpha=0.6, label=lang)
        avg = [100 * per_layer[x] for x in xs]
        ax.plot(xs, avg, "o-", color="black", lw=2.2, label="average")
        best = result.best_layer
        ax.annotate(f"best: layer {best} ({100 * per_layer[best]:.1f})",
                    (best, 100 * per_layer[best]),
                    textcoords="offset points", xytext=(0, 9), fontsize=8,
                    ha="right" if best == xs[-1] else "left" if best == xs[0] else "center")
        ax.set_xlabel("layer (0 = embeddings)")
        ax.set_xticks(xs)
        top = max(100 * s.mean for v in result.per_layer_language.values() for s in v.values())
    else:
        langs = sorted(result.per_language)
        x = np.arange(len(langs))
        ax.bar(x - 0.2, [100 * result.per_language[l].src_to_eng for l in langs], 0.4,
               label="xx->eng")
        ax.bar(x + 0.2, [100 * result.per_language[l].eng_to_src for l in langs], 0.4,
               label="eng->xx")
        ax.set_xticks(x)
        ax.set_xticklabels(langs, rotation=90 if len(langs) > 10 else 0, fontsize=8)
        ax.set_xlabel(f"language (layer {result.reported_layer})")
        top = max(100 * max(s.src_to_eng, s.eng_to_src) for s in result.per_language.values())
    ax.set_ylabel("Tatoeba acc@1 (%)")
    ax.set_ylim(0, min(105.0, 1.2 * top + 2))  # room for the labels; XLM-E Fig. 3 zooms too
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2 if len(langs) <= 10 else 1)
    ax.set_title(title or ("Tatoeba retrieval by layer" if len(per_layer) > 1
                           else f"Tatoeba retrieval by language (layer {result.reported_layer})"))
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
    fig.savefig(out_png, format="png")
    return out_png


# ----------------------------------------------------------------------------- CLI

def _layer_arg(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--layer {text!r}: expected an integer or 'all'") from None


def layer_table(result: RetrievalResult) -> str:
    """acc@1 (%, mean of both directions) per layer (rows) and language (columns), with the
    average; the best layer, the one reported, marked with '*'."""
    langs = sorted(result.per_language)
    width = max(7, *(len(lang) + 1 for lang in langs))
    head = "layer  " + "".join(f"{lang:>{width}}" for lang in langs) + f"{'average':>{width + 1}}"
    lines = ["acc@1 (%) per layer, mean of xx->eng and eng->xx (* = reported):", head]
    for layer, scores in sorted(result.per_layer_language.items()):
        mark = "*" if layer == result.reported_layer else " "
        cells = "".join(f"{100 * scores[lang].mean:>{width}.1f}" for lang in langs)
        lines.append(f"{layer:>4}{mark}  {cells}{100 * _average(scores):>{width + 1}.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    from xlm_jax.cli_help import HelpFormatter
    from xlm_jax.encoder import LAYER_NORMS

    p = cli_help.Parser(prog="python -m xlm_jax.evaluation.retrieval",
                        description=__doc__.split("\n\n")[1],
                        formatter_class=HelpFormatter)
    p.add_argument("--checkpoint", required=True,
                   help="HF XLM-R dir, xlm_jax model dir, or trainer model_dir")
    p.add_argument("--step", type=int, default=None,
                   help="trainer checkpoint step (default: latest)")
    p.add_argument("--tatoeba_dir", required=True, help=f"directory with {FILE_PATTERN}")
    p.add_argument("--layer", type=_layer_arg, required=True,
                   help="layer to pool (0 = embeddings, L = last) or 'all'")
    p.add_argument("--languages", default=None,
                   help="comma-separated, e.g. de,fr (default: all found)")
    p.add_argument("--pool", default="mean", choices=POOLS, help="how a sentence's tokens pool")
    p.add_argument("--max_length", type=int, default=None,
                   help="tokens per sentence with <s> and </s>, longer ones truncated (default: "
                        "xlm_jax.encoder.DEFAULT_MAX_LENGTH, capped at the model's positions)")
    p.add_argument("--batch_size", type=int, default=64, help="sentences per forward pass")
    p.add_argument("--layer_norm", default="none", choices=LAYER_NORMS,
                   help="a pre-LN model's states below the last layer: raw ('none', as HF "
                        "returns them) or through the final LayerNorm ('final', the state XLCo "
                        "trains with its layer_norm='final')")
    p.add_argument("--language_list", default=None,
                   help="lang_ids table of a model with language embeddings: comma-separated "
                        "codes or a file with one per line (default: the data registry's list)")
    p.add_argument("--output_json", default=None,
                   help="where the scores are written (the table is printed either way)")
    p.add_argument("--plot", default=None,
                   help="PNG path (default with --layer all and --output_json: the JSON's "
                        "path with .png)")
    args = p.parse_args(argv)
    languages = ([l.strip() for l in args.languages.split(",") if l.strip()]
                 if args.languages else None)
    try:
        find_languages(args.tatoeba_dir)  # a bad data dir fails before the model is loaded
        language_list = (read_language_list(args.language_list)
                         if args.language_list is not None else None)
        encoder = load_checkpoint(args.checkpoint, args.step, language_list)
        result = evaluate(encoder, args.tatoeba_dir, args.layer, languages, pool=args.pool,
                          max_length=args.max_length, batch_size=args.batch_size,
                          checkpoint=os.path.abspath(args.checkpoint),
                          step=embedding.resolve_step(args.checkpoint, args.step),
                          layer_norm=args.layer_norm)
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.output_json:
        os.makedirs(os.path.dirname(os.path.abspath(args.output_json)), exist_ok=True)
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(result.to_json(), f, indent=2)
    if result.layer == "all":
        print(layer_table(result))
    for lang, s in sorted(result.per_language.items()):
        print(f"{lang}: {lang}->eng {100 * s.src_to_eng:.1f}  eng->{lang} {100 * s.eng_to_src:.1f}")
    print(f"layer {result.reported_layer}: average acc@1 {100 * result.average:.2f}"
          + (f" -> {args.output_json}" if args.output_json else ""))
    plot = args.plot or (os.path.splitext(args.output_json)[0] + ".png"
                         if result.layer == "all" and args.output_json else None)
    if plot:
        plot_layers(result, plot)
        print(f"plot -> {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
