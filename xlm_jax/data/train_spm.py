"""Trains an XLM-R-layout SentencePiece model on a CC-100-layout corpus (no TensorFlow).

    python -m xlm_jax.data.train_spm --input_dir DIR --model_prefix PATH \
        --vocab_size 8000 --alpha 0.3 --sentences 300000

The input directory holds one file per language, `{lang}.txt` (or `.txt.xz` / `.txt.gz`), one
sentence per line, documents separated by blank lines (the CC-100 layout). As in XLM-R, the
training text is drawn per language with alpha-smoothed rates p_j ∝ n_j^alpha over the sentence
counts n_j, so low-resource languages are up-sampled (with replacement once a language's
sentences are used up) and high-resource ones down-sampled. The model is a unigram LM with
character_coverage 0.9995 and the XLM-R special layout unk=0, bos=1, eos=2, no pad, which
`xlm_jax.data.vocab` maps to fairseq ids. Sampling uses a fixed seed, so a rerun on the same
input writes the same training text and the same model.

A corpus too small for the vocabulary is trained anyway (SentencePiece fits it), after one
WARNING line naming the sizes and the rule (`corpus_warning`): fewer than
MIN_CHARACTERS_PER_PIECE characters of distinct text per piece. The command prints the
per-language mix as a table with a header line.
"""

from __future__ import annotations

import dataclasses
import gzip
import logging
import lzma
import os
import sys
import tempfile
import zlib
from typing import Callable, Iterator, Mapping, Sequence

import numpy as np
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2

from xlm_jax import cli_help
from xlm_jax.data import sampling
from xlm_jax.data.vocab import SPM_TRAINER_IDS

__all__ = [
    "MIN_CHARACTERS_PER_PIECE",
    "SpmTrainingResult",
    "corpus_warning",
    "find_language_files",
    "read_sentences",
    "sample_counts",
    "sample_sentences",
    "train_spm",
    "main",
]

_SUFFIXES = (".txt.xz", ".txt.gz", ".txt")
logger = logging.getLogger(__name__)

# The least text a piece needs (our choice): characters of the corpus, each distinct sentence
# counted once (the sampling's repeats add no evidence), per piece of the vocabulary. The demo
# corpus has 230 (1.84M characters for 8000 pieces; its model cuts 2.4 characters per token),
# so 100 is about 40 occurrences of an average piece. Below it SentencePiece still trains, but
# on text that the sampling repeats many times over, and pieces fit those few sentences.
MIN_CHARACTERS_PER_PIECE = 100
# The table `main` prints, one row per language: the corpus's sentences, the alpha-smoothed
# sampling probability, the sentences written to the training text, and how many times each
# corpus sentence is drawn on average (> 1: up-sampled with repeats).
TABLE_COLUMNS = ("language", "corpus_sentences", "sampling_rate", "sampled_sentences", "repeats")


@dataclasses.dataclass(frozen=True)
class SpmTrainingResult:
    """What `train_spm` produced: the model files and the per-language training mix."""

    model_path: str
    vocab_path: str
    sentence_counts: dict[str, int]  # sentences available per language
    rates: dict[str, float]  # alpha-smoothed sampling probability per language
    sampled_counts: dict[str, int]  # sentences written to the training text per language
    training_text: str | None  # path of the kept training text, None if it was deleted
    warning: str | None = None  # `corpus_warning`'s line when the corpus is small, else None


def _open_text(path: str):
    if path.endswith(".xz"):
        return lzma.open(path, "rt", encoding="utf-8")
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8")
    return open(path, "rt", encoding="utf-8")


def find_language_files(input_dir: str) -> dict[str, str]:
    """Maps language code -> file path for the `{lang}.txt[.xz|.gz]` files in `input_dir`.

    Other files are ignored. Raises ValueError for a missing/empty directory, an invalid
    language code in a file name, or a language present in two compressions.
    """
    if not os.path.isdir(input_dir):
        raise ValueError(f"--input_dir {input_dir!r} is not a directory")
    files: dict[str, str] = {}
    for name in sorted(os.listdir(input_dir)):
        suffix = next((s for s in _SUFFIXES if name.endswith(s)), None)
        if suffix is None:
            continue
        lang = name[: -len(suffix)]
        try:
            sampling.validate_language_code(lang)
        except ValueError as e:
            raise ValueError(f"{os.path.join(input_dir, name)}: {e}") from None
        if lang in files:
            raise ValueError(
                f"language {lang!r} has two files: {files[lang]} and {os.path.join(input_dir, name)}"
            )
        files[lang] = os.path.join(input_dir, name)
    if not files:
        raise ValueError(f"--input_dir {input_dir!r} has no {{lang}}.txt[.xz|.gz] files")
    return files


def read_sentences(path: str) -> Iterator[str]:
    """Yields the non-blank lines (sentences) of a CC-100-layout file, stripped."""
    with _open_text(path) as f:
        for line in f:
            line = line.strip()
            if line:
                yield line


def sample_counts(sizes: Mapping[str, int], alpha: float, total: int) -> dict[str, int]:
    """Splits `total` sentences over languages in proportion to the alpha-smoothed rates.

    Largest-remainder rounding, so the counts sum exactly to `total` and each is within 1 of
    total * p_j.
    """
    if not isinstance(total, int) or total <= 0:
        raise ValueError(f"--sentences must be a positive int, got {total!r}")
    rates = sampling.smoothed_rates(sizes, alpha)
    langs = sorted(rates)
    exact = np.array([rates[lang] * total for lang in langs])
    counts = np.floor(exact).astype(np.int64)
    remainder = total - int(counts.sum())
    # Ties broken by language order (stable sort) for determinism.
    order = np.argsort(-(exact - counts), kind="stable")
    counts[order[:remainder]] += 1
    return {lang: int(c) for lang, c in zip(langs, counts)}


def sample_sentences(sentences: Sequence[str], count: int, seed: int, lang: str) -> list[str]:
    """Draws `count` sentences: whole shuffled passes over the data plus a random remainder.

    Up-sampling repeats every sentence the same number of times (±1) instead of i.i.d. draws,
    so a tiny language is not represented by a lucky few lines. Seeded per language.
    """
    rng = np.random.default_rng([seed, zlib.crc32(lang.encode("utf-8"))])
    n = len(sentences)
    full, rest = divmod(count, n)
    picks = [rng.permutation(n) for _ in range(full)]
    picks.append(rng.permutation(n)[:rest])
    idx = np.concatenate(picks) if picks else np.zeros(0, dtype=np.int64)
    return [sentences[i] for i in idx]


def corpus_warning(characters: int, sentences: int, vocab_size: int, sampled: int
                   ) -> str | None:
    """The WARNING line for a corpus of `characters` characters in `sentences` distinct
    sentences, too small for `vocab_size` pieces (fewer than MIN_CHARACTERS_PER_PIECE per
    piece), naming the sizes, the rule, how often the `sampled` training sentences repeat the
    corpus's and the largest vocabulary the rule allows; None when the corpus is large enough."""
    if characters >= MIN_CHARACTERS_PER_PIECE * vocab_size:
        return None
    largest = characters // MIN_CHARACTERS_PER_PIECE
    advice = (f"--vocab_size {largest} or less, or more text" if largest >= 8
              else "more text")
    repeats = sampled / max(sentences, 1)
    why = (f"the {sampled:,} sampled sentences repeat each one {repeats:.1f}x on average, so "
           "the pieces fit those sentences" if repeats > 1 else
           "each piece is estimated from few occurrences")
    return (f"train_spm: the corpus is small for {vocab_size} pieces: {characters:,} characters "
            f"in {sentences:,} distinct sentences, {characters / vocab_size:.0f} per piece, "
            f"below the rule of {MIN_CHARACTERS_PER_PIECE} characters per piece (our choice); "
            f"{why}: use {advice}")


def _run_trainer(where: str, **kwargs) -> None:
    try:
        spm.SentencePieceTrainer.train(**kwargs)
    except RuntimeError as e:  # SentencePiece reports e.g. "Vocabulary size too high (N)".
        msg = " ".join(str(e).split())
        raise ValueError(f"SentencePiece training on {where} failed: {msg}") from None


def _normalize_model_file(path: str, prefix_name: str) -> None:
    """Rewrites the machine-specific trainer fields (temp/output paths, thread count) that
    SentencePiece records in the model, so the same input gives a byte-identical file."""
    proto = sentencepiece_model_pb2.ModelProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    del proto.trainer_spec.input[:]
    proto.trainer_spec.input.append(prefix_name + ".train.txt")
    proto.trainer_spec.model_prefix = prefix_name
    proto.trainer_spec.ClearField("num_threads")
    with open(path, "wb") as f:
        f.write(proto.SerializeToString(deterministic=True))


def train_spm(
    input_dir: str,
    model_prefix: str,
    vocab_size: int = 8000,
    alpha: float = sampling.ALPHA_XLMR,
    sentences: int = 300_000,
    seed: int = 0,
    keep_training_text: bool = False,
    num_threads: int = 1,
    on_warning: Callable[[str], None] | None = None,
) -> SpmTrainingResult:
    """Samples the training text with alpha-smoothed rates and trains the SentencePiece model.

    Writes `{model_prefix}.model` and `{model_prefix}.vocab`; with `keep_training_text` also
    `{model_prefix}.train.txt` (one sampled sentence per line, languages in sorted order).
    SentencePiece's result depends on `num_threads`; the default 1 keeps it reproducible
    across machines (more threads are faster on big corpora, but give a different model).
    A corpus too small for `vocab_size` (`corpus_warning`) is reported before training, to
    `on_warning` (default: this module's logger at WARNING), and in the result's `warning`.
    """
    if not isinstance(vocab_size, int) or vocab_size < 8:
        raise ValueError(f"--vocab_size must be an int >= 8, got {vocab_size!r}")
    files = find_language_files(input_dir)
    corpus = {lang: list(read_sentences(path)) for lang, path in files.items()}
    sizes = {lang: len(lines) for lang, lines in corpus.items()}
    empty = sorted(lang for lang, n in sizes.items() if n == 0)
    if empty:
        raise ValueError(f"{files[empty[0]]}: language {empty[0]!r} has no sentences")
    rates = sampling.smoothed_rates(sizes, alpha)
    counts = sample_counts(sizes, alpha, sentences)
    distinct = {line for lines in corpus.values() for line in lines}
    warning = corpus_warning(sum(map(len, distinct)), len(distinct), vocab_size, sentences)
    if warning:
        (on_warning or logger.warning)(warning)

    out_dir = os.path.dirname(os.path.abspath(model_prefix))
    os.makedirs(out_dir, exist_ok=True)
    if keep_training_text:
        text_path = model_prefix + ".train.txt"
    else:
        fd, text_path = tempfile.mkstemp(prefix="spm_train_", suffix=".txt", dir=out_dir)
        os.close(fd)
    try:
        with open(text_path, "w", encoding="utf-8") as f:
            for lang in sorted(corpus):
                for line in sample_sentences(corpus[lang], counts[lang], seed, lang):
                    f.write(line + "\n")
        _run_trainer(
            input_dir,
            input=text_path,
            model_prefix=model_prefix,
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=0.9995,
            **SPM_TRAINER_IDS,
            # Use the sampled text as is: its mix *is* the alpha-smoothed distribution.
            input_sentence_size=0,
            shuffle_input_sentence=False,
            seed_sentencepiece_size=1_000_000,
            num_threads=num_threads,
            minloglevel=2,
        )
        _normalize_model_file(model_prefix + ".model", os.path.basename(model_prefix))
    finally:
        if not keep_training_text and os.path.exists(text_path):
            os.remove(text_path)
    return SpmTrainingResult(
        model_path=model_prefix + ".model",
        vocab_path=model_prefix + ".vocab",
        sentence_counts=sizes,
        rates=rates,
        sampled_counts=counts,
        training_text=text_path if keep_training_text else None,
        warning=warning,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point; prints the per-language mix."""
    parser = cli_help.Parser(prog="python -m xlm_jax.data.train_spm",
                             description=__doc__.split("\n\n")[0],
                             formatter_class=cli_help.HelpFormatter)
    parser.add_argument("--input_dir", required=True, help="CC-100-layout dir of {lang}.txt[.xz|.gz]")
    parser.add_argument("--model_prefix", required=True, help="writes PREFIX.model and PREFIX.vocab")
    parser.add_argument("--vocab_size", type=int, default=8000,
                        help="pieces of the model (a run reading it needs vocab_size >= this + 2: "
                             "<pad> and <mask> are added)")
    parser.add_argument("--alpha", type=float, default=sampling.ALPHA_XLMR,
                        help="language sampling exponent (XLM-R: 0.3)")
    parser.add_argument("--sentences", type=int, default=300_000, help="sentences sampled in all")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sentence sampling")
    parser.add_argument("--num_threads", type=int, default=1,
                        help="SentencePiece threads; the model depends on it (1: reproducible)")
    parser.add_argument("--keep_training_text", action="store_true",
                        help="keep PREFIX.train.txt (the sampled training text)")
    args = parser.parse_args(argv)
    def warn(line: str) -> None:
        print(f"WARNING: {line}", file=sys.stderr, flush=True)

    try:
        result = train_spm(
            args.input_dir, args.model_prefix, args.vocab_size, args.alpha, args.sentences,
            args.seed, args.keep_training_text, args.num_threads, on_warning=warn,
        )
    except ValueError as e:
        print(f"train_spm: error: {e}", file=sys.stderr)
        return 2
    print("\t".join(TABLE_COLUMNS))
    for lang in sorted(result.sampled_counts):
        available, drawn = result.sentence_counts[lang], result.sampled_counts[lang]
        print(f"{lang}\t{available}\t{result.rates[lang]:.5f}\t{drawn}\t"
              f"{drawn / available:.2f}")
    print(f"wrote {result.model_path} and {result.vocab_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
