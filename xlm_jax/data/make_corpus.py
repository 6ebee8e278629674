"""`python -m xlm_jax.data.make_corpus`: a CC-100-style corpus of any size, for benchmarks.

  python -m xlm_jax.data.make_corpus --output_dir /tmp/big --megabytes 300 --languages en \\
      [--compress xz]

Writes `OUTPUT_DIR/{lang}.txt` (or `.txt.xz`): documents of 1 to 12 lines separated by blank
lines, each line a sentence of the demo corpus's file of that language (human-translated
Django and Wagtail messages, `xlm_jax_tasks/demo_data/mono`), every second one with its
words in a new order, so that the text is real words of the language but does not repeat
verbatim (a SentencePiece model then sees realistic pieces). `--megabytes` is the size of the
plain text per language; the draw is seeded (`--seed`), so the same command writes the same
bytes. `.xz` uses the `xz` command when there is one (all cores), else Python's lzma.
TensorFlow-free; this is test and benchmark tooling, not a data source.
"""
from __future__ import annotations

import argparse
import importlib.util
import lzma
import os
import random
import shutil
import subprocess
from collections.abc import Sequence
from typing import Optional

__all__ = ["demo_mono_dir", "sentences", "write_language", "main"]


def demo_mono_dir() -> str:
    """The demo corpus's monolingual files (found, not imported: `xlm_jax_tasks` registers
    tasks when imported)."""
    spec = importlib.util.find_spec("xlm_jax_tasks")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the demo corpus (package xlm_jax_tasks) is not installed")
    return os.path.join(list(spec.submodule_search_locations)[0], "demo_data", "mono")


def sentences(source_dir: str, lang: str) -> list[str]:
    """The non-blank lines of the demo text of `lang`."""
    path = os.path.join(source_dir, f"{lang}.txt.xz")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no demo text for language {lang!r}: {path} does not exist")
    with lzma.open(path, "rt", encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()]


def write_language(path: str, lines: Sequence[str], megabytes: float, seed: int) -> int:
    """Writes about `megabytes` MB of documents of `lines` to `path` (plain); returns the
    bytes written."""
    rng = random.Random(seed)
    target, written = int(megabytes * 1e6), 0
    with open(path, "w", encoding="utf-8") as f:
        while written < target:
            doc_lines = []
            for _ in range(rng.randint(1, 12)):
                words = rng.choice(lines).split()
                if rng.random() < 0.5:
                    rng.shuffle(words)
                doc_lines.append(" ".join(words))
            doc = "\n".join(doc_lines) + "\n\n"
            f.write(doc)
            written += len(doc.encode("utf-8"))
    return written


def _compress_xz(path: str) -> str:
    if shutil.which("xz"):
        subprocess.run(["xz", "-T0", "-6", "-f", path], check=True)
    else:
        with open(path, "rb") as src, lzma.open(path + ".xz", "wb", preset=6) as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.remove(path)
    return path + ".xz"


def main(argv: Optional[Sequence[str]] = None) -> list[str]:
    parser = argparse.ArgumentParser(prog="python -m xlm_jax.data.make_corpus",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--megabytes", type=float, default=300.0,
                        help="plain-text MB per language")
    parser.add_argument("--languages", default="en", help="comma-separated demo languages")
    parser.add_argument("--compress", choices=("none", "xz"), default="none")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.makedirs(args.output_dir, exist_ok=True)
    source, out = demo_mono_dir(), []
    for i, lang in enumerate(args.languages.split(",")):
        path = os.path.join(args.output_dir, f"{lang}.txt")
        size = write_language(path, sentences(source, lang), args.megabytes, args.seed + i)
        if args.compress == "xz":
            path = _compress_xz(path)
        print(f"{path}: {size / 1e6:.1f} MB of text, {os.path.getsize(path) / 1e6:.1f} MB on disk",
              flush=True)
        out.append(path)
    return out


if __name__ == "__main__":
    main()
