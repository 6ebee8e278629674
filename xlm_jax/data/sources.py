"""Corpus readers and seqio data sources for monolingual and parallel text.

Layouts read here (every file may be plain, `.xz` or `.gz` compressed):

  CC-100       `{data_dir}/{lang}.txt` (or the files of a directory `{data_dir}/{lang}/`): one
               sentence per line, documents separated by blank lines. An example is one
               document (its list of lines).
  OPUS/Moses   `{data_dir}/{src}-{tgt}.{src}` and `{data_dir}/{src}-{tgt}.{tgt}`, line aligned
               (the reversed name `{tgt}-{src}.*` is found as well). An example is one pair.
  TSV          `{data_dir}/{src}-{tgt}.tsv`: `src<TAB>tgt` per line.
  TFDS         any TFDS text dataset (e.g. `c4/multilingual:3.1.0`, one split per language)
               through `seqio.TfdsDataSource`; it needs the prepared TFDS data on disk
               (`tfds_data_dir`). The tests exercise it with a tiny dataset prepared
               locally; mC4 itself was not tried (no network).

Files are read with python generators (so that bad UTF-8 can be skipped and counted) and fed
to tf.data block by block (`block_reader.BlockReader`), so that the input position can be
checkpointed. A line that is not valid UTF-8 is skipped
and counted (a pair is skipped when either side is bad); pairs with an empty side and TSV
lines without exactly one tab are skipped and counted too. `count_*` return those counts;
the registry logs them and stores them in the stats JSON.

TensorFlow is imported lazily (only when a dataset is built), so the readers and counters can
be used without it.
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import lzma
from typing import TYPE_CHECKING, Any, Callable, Iterator, Optional, Sequence

from xlm_jax.data import block_reader, corpus_fs

if TYPE_CHECKING:  # pragma: no cover
    import seqio
    import tensorflow as tf

__all__ = [
    "COMPRESSED_SUFFIXES",
    "ReadCounts",
    "CorpusStats",
    "ParallelFiles",
    "open_lines",
    "languages_in_dir",
    "pairs_in_dir",
    "find_monolingual_files",
    "find_parallel_files",
    "iter_documents",
    "iter_pairs",
    "count_monolingual",
    "count_parallel",
    "GeneratorSource",
    "monolingual_source",
    "parallel_source",
    "mixup_source",
    "tfds_source",
]

COMPRESSED_SUFFIXES: tuple[str, ...] = ("", ".xz", ".gz")


# ----------------------------------------------------------------------------- file access

def open_lines(path: str) -> Iterator[bytes]:
    """Yields the raw lines (bytes, newline stripped) of a plain, .xz or .gz file, local or
    remote (`corpus_fs`)."""
    with corpus_fs.open_binary(path) as raw:
        if path.endswith(".xz"):
            f: Any = lzma.open(raw, "rb")
        elif path.endswith(".gz"):
            f = gzip.open(raw, "rb")
        else:
            f = raw
        with f:
            for line in f:
                yield line.rstrip(b"\r\n")


def likely_encoding(paths: Sequence[str]) -> str:
    """A guess at the encoding of the first of `paths` that is not UTF-8, from its first MiB:
    UTF-16 by its byte-order mark, else Latin-1/Windows-1252 when the bytes decode as
    Windows-1252 (true of most 8-bit Western text), else "an encoding other than UTF-8"."""
    for path in paths:
        raw = b"".join(itertools.islice(open_lines(path), 4096))[: 1 << 20]
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            return "UTF-16 (it starts with a UTF-16 byte-order mark)"
        try:
            raw.decode("utf-8")
            continue
        except UnicodeDecodeError:
            pass
        try:
            raw.decode("cp1252")
            return "Latin-1 / Windows-1252 (ISO-8859-1)"
        except UnicodeDecodeError:
            return "an encoding other than UTF-8"
    return "an encoding other than UTF-8"


def _first_existing(candidates: Sequence[str]) -> Optional[str]:
    for c in candidates:
        if corpus_fs.isfile(c):
            return c
    return None


def _strip_compression(name: str) -> str:
    for suffix in (".xz", ".gz"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def _text_files(directory: str) -> list[str]:
    """The `*.txt[.xz|.gz]` files of `directory`, sorted (one language's parts)."""
    if not corpus_fs.isdir(directory):
        return []
    return sorted(corpus_fs.join(directory, n) for n in corpus_fs.listdir(directory)
                  if _strip_compression(n).endswith(".txt"))


def languages_in_dir(data_dir: str) -> list[str]:
    """Languages with a CC-100 style `{lang}.txt[.xz|.gz]` file, or a `{lang}/` directory of
    such files, in `data_dir`."""
    if not corpus_fs.isdir(data_dir):
        return []
    found = set()
    for name in corpus_fs.listdir(data_dir):
        base = _strip_compression(name)
        if base.endswith(".txt"):
            found.add(base[: -len(".txt")])
        elif _text_files(corpus_fs.join(data_dir, name)):
            found.add(name)
    return sorted(found)


def pairs_in_dir(data_dir: str) -> list[str]:
    """Pairs `src-tgt` with OPUS (`src-tgt.src`) or TSV (`src-tgt.tsv`) files in `data_dir`."""
    if not corpus_fs.isdir(data_dir):
        return []
    found = set()
    for name in corpus_fs.listdir(data_dir):
        base = _strip_compression(name)
        stem, _, ext = base.rpartition(".")
        if "-" in stem and (ext == "tsv" or ext in stem.split("-")):
            found.add(stem)
    return sorted(found)


def find_monolingual_files(data_dir: str, lang: str) -> list[str]:
    """The files of language `lang` in `data_dir`: `{lang}.txt[.xz|.gz]`, or the
    `*.txt[.xz|.gz]` files of the directory `{lang}/` in name order (one corpus in parts: a
    document never spans two files, and `data.prepared.prepare` reads the parts in parallel).

    Raises FileNotFoundError naming the paths tried and the languages the directory has.
    """
    base = corpus_fs.join(data_dir, f"{lang}.txt")
    path = _first_existing([base + s for s in COMPRESSED_SUFFIXES])
    if path is not None:
        return [path]
    parts = _text_files(corpus_fs.join(data_dir, lang))
    if parts:
        return parts
    if not corpus_fs.isdir(data_dir):
        raise FileNotFoundError(
            f"corpus directory {data_dir} does not exist (looking for language {lang!r})"
        )
    raise FileNotFoundError(
        f"no corpus file for language {lang!r}: {base}[.xz|.gz] does not exist, nor "
        f"{corpus_fs.join(data_dir, lang)}/*.txt[.xz|.gz]; languages found in {data_dir}: "
        f"{languages_in_dir(data_dir) or 'none'}"
    )


@dataclasses.dataclass(frozen=True)
class ParallelFiles:
    """Where a language pair lives: two line-aligned files, or one TSV file (`tgt` is None).

    `swapped` is True when the files are named `{tgt}-{src}.*` (or the TSV is `tgt<TAB>src`),
    in which case the reader swaps the columns back so that `src` is always `src`.
    """

    src: str
    tgt: Optional[str]
    swapped: bool = False

    @property
    def paths(self) -> tuple[str, ...]:
        return (self.src,) if self.tgt is None else (self.src, self.tgt)


def find_parallel_files(data_dir: str, src: str, tgt: str) -> ParallelFiles:
    """Finds the OPUS/Moses pair `{src}-{tgt}.{src|tgt}` (or `{tgt}-{src}.*`, or a `.tsv`).

    Raises FileNotFoundError naming the files tried and the pairs the directory has.
    """
    for a, b, swapped in ((src, tgt, False), (tgt, src, True)):
        stem = corpus_fs.join(data_dir, f"{a}-{b}")
        src_path = _first_existing([f"{stem}.{src}{s}" for s in COMPRESSED_SUFFIXES])
        tgt_path = _first_existing([f"{stem}.{tgt}{s}" for s in COMPRESSED_SUFFIXES])
        if src_path and tgt_path:
            return ParallelFiles(src_path, tgt_path, swapped=False)
        if bool(src_path) != bool(tgt_path):
            have, missing = (src_path, f"{stem}.{tgt}") if src_path else (tgt_path, f"{stem}.{src}")
            raise FileNotFoundError(
                f"parallel corpus {src}-{tgt}: found {have} but not {missing}[.xz|.gz]"
            )
        tsv = _first_existing([f"{stem}.tsv{s}" for s in COMPRESSED_SUFFIXES])
        if tsv:
            return ParallelFiles(tsv, None, swapped=swapped)
    if not corpus_fs.isdir(data_dir):
        raise FileNotFoundError(
            f"corpus directory {data_dir} does not exist (looking for pair {src}-{tgt})"
        )
    raise FileNotFoundError(
        f"no parallel corpus for {src}-{tgt} in {data_dir}: tried {src}-{tgt}.{{{src},{tgt}}}, "
        f"{tgt}-{src}.{{{src},{tgt}}} and .tsv (each [.xz|.gz]); pairs found: "
        f"{pairs_in_dir(data_dir) or 'none'}"
    )


# ----------------------------------------------------------------------------- readers

@dataclasses.dataclass
class ReadCounts:
    """What a pass over a file saw: the skipped lines are counted, not fatal."""

    lines: int = 0  # physical lines read (per file; for pairs: per side)
    invalid_utf8: int = 0  # lines (or pairs) skipped because they are not UTF-8
    malformed: int = 0  # TSV lines without exactly one tab
    empty_pairs: int = 0  # pairs with an empty side (skipped)


def _decode(raw: bytes) -> Optional[str]:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def iter_documents(path: str, counts: Optional[ReadCounts] = None) -> Iterator[list[str]]:
    """Yields the documents of a CC-100 file as lists of non-blank lines.

    Blank (whitespace-only) lines separate documents; invalid UTF-8 lines are skipped and
    counted in `counts.invalid_utf8`.
    """
    counts = counts if counts is not None else ReadCounts()
    doc: list[str] = []
    for raw in open_lines(path):
        counts.lines += 1
        line = _decode(raw)
        if line is None:
            counts.invalid_utf8 += 1
            continue
        if line.strip():
            doc.append(line)
        elif doc:
            yield doc
            doc = []
    if doc:
        yield doc


def iter_pairs(files: ParallelFiles, counts: Optional[ReadCounts] = None
               ) -> Iterator[tuple[str, str]]:
    """Yields aligned (src, tgt) sentence pairs from OPUS/Moses files or a TSV file.

    Pairs with invalid UTF-8 or an empty side are skipped and counted. Two-file corpora whose
    files end at different lines raise ValueError naming both files and both line counts.
    """
    counts = counts if counts is not None else ReadCounts()
    if files.tgt is None:
        for raw in open_lines(files.src):
            counts.lines += 1
            line = _decode(raw)
            if line is None:
                counts.invalid_utf8 += 1
                continue
            fields = line.split("\t")
            if len(fields) != 2:
                counts.malformed += 1
                continue
            a, b = (fields[1], fields[0]) if files.swapped else (fields[0], fields[1])
            if not a.strip() or not b.strip():
                counts.empty_pairs += 1
                continue
            yield a, b
        return
    src_lines, tgt_lines = open_lines(files.src), open_lines(files.tgt)
    n = 0
    while True:
        a_raw = next(src_lines, None)
        b_raw = next(tgt_lines, None)
        if a_raw is None or b_raw is None:
            if a_raw is not None or b_raw is not None:
                n_src = n + (a_raw is not None) + sum(1 for _ in src_lines)
                n_tgt = n + (b_raw is not None) + sum(1 for _ in tgt_lines)
                raise ValueError(
                    f"parallel files have different line counts: {files.src} has {n_src} "
                    f"lines, {files.tgt} has {n_tgt} lines"
                )
            return
        n += 1
        counts.lines += 1
        a, b = _decode(a_raw), _decode(b_raw)
        if a is None or b is None:
            counts.invalid_utf8 += 1
            continue
        if not a.strip() or not b.strip():
            counts.empty_pairs += 1
            continue
        yield a, b


# ----------------------------------------------------------------------------- counting

@dataclasses.dataclass(frozen=True)
class CorpusStats:
    """Size of one corpus, counted once and cached by the registry.

    examples: documents (monolingual) or kept sentence pairs (parallel).
    tokens: monolingual: pieces of all kept lines + one `</s>` per document (the length of
      the token stream that is cut into segments); parallel: pieces of both sides, without
      special tokens.
    """

    examples: int
    tokens: int
    lines: int
    bytes: int
    invalid_utf8_lines: int = 0
    malformed_lines: int = 0
    empty_pairs: int = 0

    def to_json(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CorpusStats":
        fields = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: int(v) for k, v in d.items() if k in fields})


def count_monolingual(paths: Sequence[str], encode: Callable[[str], Sequence[int]]
                      ) -> CorpusStats:
    """Counts documents, lines and tokens of a CC-100 corpus's files (one full pass,
    tokenizing)."""
    counts = ReadCounts()
    examples = tokens = lines = 0
    for path in paths:
        for doc in iter_documents(path, counts):
            examples += 1
            lines += len(doc)
            tokens += sum(len(encode(line)) for line in doc) + 1  # + the document's </s>
    return CorpusStats(examples=examples, tokens=tokens, lines=lines,
                       bytes=sum(corpus_fs.getsize(p) for p in paths),
                       invalid_utf8_lines=counts.invalid_utf8)


def count_parallel(files: ParallelFiles, encode: Callable[[str], Sequence[int]]) -> CorpusStats:
    """Counts kept pairs and tokens of a parallel corpus (one full pass, tokenizing)."""
    counts = ReadCounts()
    examples = tokens = 0
    for a, b in iter_pairs(files, counts):
        examples += 1
        tokens += len(encode(a)) + len(encode(b))
    return CorpusStats(examples=examples, tokens=tokens, lines=counts.lines,
                       bytes=sum(corpus_fs.getsize(p) for p in files.paths),
                       invalid_utf8_lines=counts.invalid_utf8, malformed_lines=counts.malformed,
                       empty_pairs=counts.empty_pairs)


# ----------------------------------------------------------------------------- seqio sources

def _seqio():
    import seqio  # pylint: disable=g-import-not-at-top

    return seqio


def _base_source_class():
    """`GeneratorSource` derives from seqio.DataSource, which needs TF: build it lazily."""
    seqio = _seqio()
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    class _GeneratorSource(seqio.DataSource):
        """A seqio DataSource over a python generator of dict examples (split "train").

        `make_examples()` yields examples as dicts of python values matching
        `output_signature`. They reach tf.data in blocks of `block`
        (`block_reader.BlockReader`: each feature stacked, string vectors flattened with
        their row lengths), read by block number through
        `Dataset.counter().map(numpy_function)` and unbatched in TF; the order is unchanged. Unlike `from_generator`, the position of such a source is
        the counter, which tf.data can checkpoint: a restored input pipeline continues
        exactly where it was saved (`xlm_jax.data.pipeline.BatchIterator.save`).

        Sharding happens at the source: shard i of n keeps the examples whose index is
        i mod n (every host still reads the whole file but converts only its share); a
        corpus with fewer than n examples gives shard i its example i mod size. The
        source itself does not shuffle; the Task shuffles the preprocessed examples.
        """

        def __init__(self, name: str, make_examples: Callable[[], Iterator[dict[str, Any]]],
                     output_signature: dict[str, "tf.TensorSpec"], num_examples: Optional[int],
                     block: int = 256):
            self._name = name
            self._make_examples = make_examples
            self._signature = dict(output_signature)
            self._block = block
            super().__init__(
                splits=("train",),
                num_input_examples=None if num_examples is None else {"train": num_examples},
                caching_permitted=True,
            )

        @property
        def supports_arbitrary_sharding(self) -> bool:
            return True

        def list_shards(self, split: str) -> Sequence[str]:
            return [self._name]

        def __repr__(self) -> str:
            return f"GeneratorSource({self._name})"

        def get_dataset(self, split: str = "train", shuffle: bool = True,
                        seed: Optional[int] = None, shard_info=None, *,
                        sequence_length=None, use_cached: bool = False,
                        num_epochs: Optional[int] = 1) -> "tf.data.Dataset":
            del shuffle, seed, sequence_length, use_cached, num_epochs
            if split != "train":
                raise ValueError(f"{self._name}: unknown split {split!r}; only 'train' exists")
            index, num = (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)
            sig, vector_keys = self._signature, self._vector_keys()
            reader = block_reader.BlockReader(self._make_examples, sig, vector_keys, index,
                                              num, self._block)
            outputs = [(k, spec.dtype) for k, spec in sig.items()]
            outputs += [(k + "/len", tf.int64) for k in vector_keys]

            def read(i):
                values = tf.numpy_function(reader.read, [i], [d for _, d in outputs],
                                           stateful=True)
                block = {}
                for (k, _), v in zip(outputs, values):
                    v.set_shape([None])
                    block[k] = v
                return block

            def unflatten(b):
                out = {k: b[k] for k in sig if k not in vector_keys}
                for k in vector_keys:
                    # `flush` builds the lengths from the values, so the (costly to trace,
                    # once per Task) validation asserts are skipped.
                    out[k] = tf.RaggedTensor.from_row_lengths(b[k], b[k + "/len"],
                                                              validate=False)
                return out

            first = outputs[0][0] + ("/len" if outputs[0][0] in vector_keys else "")
            ds = tf.data.Dataset.counter().map(read)
            ds = ds.take_while(lambda b: tf.size(b[first]) > 0)
            return ds.map(unflatten).unbatch()

        def _vector_keys(self) -> list[str]:
            return [k for k, spec in self._signature.items() if spec.shape.rank == 1]

    return _GeneratorSource


_GENERATOR_SOURCE: Any = None


def GeneratorSource(*args, **kwargs) -> "seqio.DataSource":  # pylint: disable=invalid-name
    """Builds a seqio DataSource over a python generator (see `_GeneratorSource`)."""
    global _GENERATOR_SOURCE
    if _GENERATOR_SOURCE is None:
        _GENERATOR_SOURCE = _base_source_class()
    return _GENERATOR_SOURCE(*args, **kwargs)


def monolingual_source(paths: Sequence[str], lang_id: int, num_examples: Optional[int] = None
                       ) -> "seqio.DataSource":
    """Documents of a CC-100 corpus's files, in order, as `{"lines": string[n], "lang": int32}`
    examples."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    def make():
        for path in paths:
            for doc in iter_documents(path):
                yield {"lines": doc, "lang": lang_id}

    return GeneratorSource(
        "|".join(paths), make,
        {"lines": tf.TensorSpec([None], tf.string), "lang": tf.TensorSpec([], tf.int32)},
        num_examples)


def _pair_signature():
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    return {"src": tf.TensorSpec([], tf.string), "tgt": tf.TensorSpec([], tf.string),
            "src_lang": tf.TensorSpec([], tf.int32), "tgt_lang": tf.TensorSpec([], tf.int32)}


def parallel_source(files: ParallelFiles, src_lang_id: int, tgt_lang_id: int,
                    num_examples: Optional[int] = None) -> "seqio.DataSource":
    """Sentence pairs as `{"src", "tgt": string, "src_lang", "tgt_lang": int32}` examples."""

    def make():
        for a, b in iter_pairs(files):
            yield {"src": a, "tgt": b, "src_lang": src_lang_id, "tgt_lang": tgt_lang_id}

    return GeneratorSource("|".join(files.paths), make, _pair_signature(), num_examples)


def _mixup_choices(rates: Sequence[float], seed: int) -> "tf.data.Dataset":
    """Corpus indices c_0, d_0, c_1, d_1, ...: c ~ rates, d ~ rates restricted to != c."""
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    p = tf.constant(rates, tf.float64)
    p = p / tf.reduce_sum(p)
    k = len(rates)

    def pick(r):
        u = tf.cast(r % (1 << 52), tf.float64) / float(1 << 52)  # two uniforms in [0, 1)
        c = tf.minimum(tf.searchsorted(tf.cumsum(p), u[:1], side="right")[0], k - 1)
        q = tf.tensor_scatter_nd_update(p, [[c]], [0.0])
        q = q / tf.reduce_sum(q)
        d = tf.minimum(tf.searchsorted(tf.cumsum(q), u[1:], side="right")[0], k - 1)
        d = tf.where(tf.equal(d, c), (c + 1) % k, d)  # rounding guard: never the same corpus
        return tf.cast(tf.stack([c, d]), tf.int64)

    return tf.data.Dataset.random(seed=seed).batch(2).map(pick).unbatch()


def mixup_source(corpora: Sequence["seqio.DataSource"], rates: Sequence[float], name: str
                 ) -> "seqio.DataSource":
    """The XLCo mixup source: each example joins two translation pairs of different corpora.

    Example i is pair c from corpus c_i ~ `rates` and pair d from corpus d_i, drawn from
    `rates` restricted to the other corpora (renormalized). The draws come from
    `tf.data.Dataset.random(seed)` (seed = the Task seed, or 0); every corpus is read in
    order and repeated, so the source is endless. Features: `c_src, c_tgt, d_src, d_tgt`
    (string) and `c_src_lang, c_tgt_lang, d_src_lang, d_tgt_lang` (int32).
    """
    seqio = _seqio()
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    if len(corpora) < 2 or len(corpora) != len(rates):
        raise ValueError(f"{name}: mixup needs >= 2 corpora with one rate each, got "
                         f"{len(corpora)} corpora and {len(rates)} rates")

    class _MixupSource(seqio.DataSource):
        def __init__(self):
            super().__init__(splits=("train",))

        @property
        def supports_arbitrary_sharding(self) -> bool:
            return True

        def list_shards(self, split: str) -> Sequence[str]:
            return [name]

        def __repr__(self) -> str:
            return f"MixupSource({name})"

        def get_dataset(self, split: str = "train", shuffle: bool = True,
                        seed: Optional[int] = None, shard_info=None, *,
                        sequence_length=None, use_cached: bool = False,
                        num_epochs: Optional[int] = 1) -> "tf.data.Dataset":
            del sequence_length, use_cached, num_epochs
            datasets = [c.get_dataset(split, shuffle=shuffle, seed=seed,
                                      shard_info=shard_info).repeat() for c in corpora]
            choices = _mixup_choices(list(rates), 0 if seed is None else seed)
            stream = tf.data.Dataset.choose_from_datasets(datasets, choices)

            def join(two):
                out = {f"c_{k}": v[0] for k, v in two.items()}
                out.update({f"d_{k}": v[1] for k, v in two.items()})
                return out

            return stream.batch(2, drop_remainder=True).map(join)

    return _MixupSource()


def tfds_source(tfds_name: str, split: str, tfds_data_dir: Optional[str] = None
                ) -> "seqio.DataSource":
    """A `seqio.TfdsDataSource` reading `split` of `tfds_name` as the "train" split.

    Example: `tfds_source("c4/multilingual:3.1.0", "de")`. Pair it with the
    `preprocessors.rekey_text` preprocessor to turn its `text_key` into the `lines` feature.
    """
    return _seqio().TfdsDataSource(tfds_name=tfds_name, splits={"train": split},
                                   tfds_data_dir=tfds_data_dir)
