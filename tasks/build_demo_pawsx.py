"""The demo's cross-lingual transfer task, "translation or near miss?", in PAWS-X's layout.

    python -m xlm_jax_tasks.build_demo_pawsx --out tasks/demo_data/pawsx

From the demo corpus's held-out Tatoeba split (`tasks/demo_data/tatoeba`: English interface
strings of Django and Wagtail with their translations, none of them in the pre-training
files), a binary sentence-pair task whose first sentence is English:
- label 1: the second sentence renders the first (in English: the sentence itself; in
  language xx: its human translation);
- label 0: a near miss: the rendering of the other English string of the same split that
  shares the most words with the first (Jaccard over lower-cased words; ties to the first in
  file order), so both sides have the same topic and register.
The English strings are split by a hash of their text into train (70%), dev (10%) and test
(20%); each pair's English side belongs to its split, so no test string is seen in training.
Train and dev are English only (`train-en.tsv`, `dev-en.tsv`); test has English and every
Tatoeba language (`test-xx.tsv`). Dev files for the other languages (`dev-xx.tsv`) are
written too, for `select_on="all"`.

Zero-shot transfer is what the task measures: fine-tuned on English pairs (whose positives are
copies), a model labels the xx pairs correctly only where its representation of the
translation lands near the English string's. That the English positives are copies is our
choice, forced by the corpus: it has no English paraphrases. The files are XTREME's
processed PAWS-X layout (`{split}-{lang}.tsv`, `sentence1<TAB>sentence2<TAB>label`, no
header, labels 0/1), read by `xlm_jax.evaluation.xtreme_readers`; unlike XTREME's test
files, ours keep their labels.

Deterministic: the same Tatoeba files give byte-identical output.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import re
import sys
from collections.abc import Sequence

from xlm_jax import cli_help

HERE = os.path.dirname(os.path.abspath(__file__))
TATOEBA = os.path.join(HERE, "demo_data", "tatoeba")
SPLITS = (("train", 70), ("dev", 80), ("test", 100))  # cumulative percent of the hash
_WORD = re.compile(r"\w+", re.UNICODE)


def split_of(english: str) -> str:
    """train / dev / test by a hash of the string (stable across machines and runs)."""
    bucket = int(hashlib.sha1(english.encode("utf-8")).hexdigest(), 16) % 100
    return next(name for name, top in SPLITS if bucket < top)


def _words(text: str) -> set[str]:
    return {w.lower() for w in _WORD.findall(text)}


def near_miss(index: int, english: Sequence[str]) -> int:
    """The index of the other string sharing the most words with `english[index]`."""
    mine = _words(english[index])
    best, best_score = -1, -1.0
    for j, other in enumerate(english):
        if j == index or other == english[index]:
            continue
        theirs = _words(other)
        score = len(mine & theirs) / max(len(mine | theirs), 1)
        if score > best_score:
            best, best_score = j, score
    return best


def pairs(english: Sequence[str], rendered: Sequence[str]) -> list[tuple[str, str, int]]:
    """For each string: (it, its rendering, 1) and (it, a near miss's rendering, 0)."""
    out = []
    for i, e in enumerate(english):
        j = near_miss(i, english)
        out.append((e, rendered[i], 1))
        if j >= 0:
            out.append((e, rendered[j], 0))
    return out


def _read(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def _write(path: str, rows: Sequence[tuple[str, str, int]]) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        for a, b, label in rows:
            f.write(f"{a}\t{b}\t{label}\n")


def build(out_dir: str, tatoeba_dir: str = TATOEBA) -> dict[str, int]:
    """Writes the task files; returns the number of pairs per file name."""
    langs = sorted(name.split(".")[1].split("-")[0] for name in os.listdir(tatoeba_dir)
                   if name.endswith(".eng"))
    os.makedirs(out_dir, exist_ok=True)
    counts = {}
    english_all: dict[str, None] = {}
    by_lang = {}
    for lang in langs:
        eng = _read(os.path.join(tatoeba_dir, f"tatoeba.{lang}-eng.eng"))
        src = _read(os.path.join(tatoeba_dir, f"tatoeba.{lang}-eng.{lang}"))
        by_lang[lang] = (eng, src)
        english_all.update(dict.fromkeys(eng))
    english = [e for e in english_all if "\t" not in e]
    for split in ("train", "dev", "test"):
        own = [e for e in english if split_of(e) == split]
        name = f"{split}-en.tsv"
        counts[name] = len(pairs(own, own))
        _write(os.path.join(out_dir, name), pairs(own, own))
    for lang in langs:
        eng, src = by_lang[lang]
        for split in ("dev", "test"):
            keep = [i for i, e in enumerate(eng) if split_of(e) == split
                    and "\t" not in e + src[i]]
            rows = pairs([eng[i] for i in keep], [src[i] for i in keep])
            name = f"{split}-{lang}.tsv"
            counts[name] = len(rows)
            _write(os.path.join(out_dir, name), rows)
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    p = cli_help.Parser(prog="python -m xlm_jax_tasks.build_demo_pawsx", description=__doc__,
                        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="output folder (PAWS-X layout)")
    p.add_argument("--tatoeba_dir", default=TATOEBA)
    args = p.parse_args(argv)
    counts = build(args.out, args.tatoeba_dir)
    print(f"{sum(counts.values())} pairs in {len(counts)} files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
