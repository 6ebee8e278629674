"""Prepared tasks as seqio data sources: each process reads only its share, in a global
shuffle, from a position that restores in constant time.

`python -m xlm_jax.data.prepared.prepare` tokenises a registered task's corpora once into
sharded random-access files (`shard_files`). With a prepared directory chosen (by the run,
`loop.train(prepared_data=ROOT)`, or by the registration, `prepared_dir=ROOT`; `choice`), the
registry registers each Task under its usual name with a `PreparedSource` over `ROOT/TASK/`
instead of its raw files: the mixture rates are the counts `prepare` wrote (no host
tokenises a corpus), the tokenising preprocessor is dropped, and everything after it
(segments, pairs, packing, α-smoothed mixtures, the gin surface) is unchanged.

The order a prepared corpus of N records is read in: global position g (0, 1, 2, ...) is
record `IndexShuffle(N, (seed, g // N, salt))(g mod N)`: every epoch a new seeded permutation
of the whole corpus, the salt a hash of the task and member (so the languages of a mixture,
which seqio gives one seed, are shuffled independently). Process p of P takes the positions
g = p, p + P, p + 2P, ...: the processes' reads are disjoint, together they are exactly the
one-process order, and each reads about 1/P of the bytes. Reads come in blocks of `block`
records by block number (`Dataset.counter().map(read)`), as the raw sources do
(`block_reader`), so the position tf.data checkpoints is a counter, and a restored block is
two positioned reads per record away, whatever the step. The Tasks read no shuffle buffer
after the source (`performs_internal_shuffling`), and `data.pipeline` saves a prepared
pipeline's position symbolically: a few integers per dataset op. With `shuffle=False` the source is
one epoch in file order (for inspection and tests); with `shuffle=True` it is endless.
"""
from __future__ import annotations

import dataclasses
import os
import zlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Optional

import numpy as np

from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.prepared.index_shuffle import IndexShuffle
from xlm_jax.data.sources import CorpusStats

if TYPE_CHECKING:  # pragma: no cover
    import seqio

__all__ = ["PreparedTask", "load_task", "record_numbers", "source"]


@dataclasses.dataclass(frozen=True)
class PreparedTask:
    """A task's prepared directory, its manifest checked against the registration."""

    directory: str
    manifest: Mapping[str, Any]
    _records: dict[str, pf.CorpusRecords] = dataclasses.field(
        default_factory=dict, compare=False, repr=False)

    @property
    def digest(self) -> str:
        """Identifies the preparation (a registration definition records it)."""
        import hashlib  # pylint: disable=g-import-not-at-top
        import json  # pylint: disable=g-import-not-at-top

        return hashlib.sha1(json.dumps(self.manifest, sort_keys=True).encode()).hexdigest()[:16]

    def stats(self, member: str) -> CorpusStats:
        return CorpusStats.from_json(self.manifest["corpora"][member]["stats"])

    def records(self, member: str) -> pf.CorpusRecords:
        """The member's records (built, and so its shards checked, once)."""
        if member not in self._records:
            self._records[member] = pf.CorpusRecords(
                os.path.join(self.directory, member), self.manifest["corpora"][member],
                vocab_size=pf.vocab_size(self.manifest["vocabulary"]),
                records=self.manifest["records"], format_version=self.manifest["format"])
        return self._records[member]


def _missing(root: str, task: str) -> str:
    """Why `root/task` has no manifest, naming the first unfinished work unit if any."""
    directory = os.path.join(root, task)
    plan = os.path.join(directory, pf.PLAN)
    if not pf.exists(plan):
        return (f"{directory}: task {task} is not prepared there; run python -m "
                f"xlm_jax.data.prepared.prepare --tasks {task} --output_dir {root} first")
    corpora = pf.read_json(plan)["corpora"]
    units = [os.path.join(member, pf.shard_name(k, c["units"]))
             for member, c in sorted(corpora.items()) for k in range(c["units"])]
    missing = [u for u in units if not pf.exists(os.path.join(directory, u + ".json"))]
    done = (f"{len(units) - len(missing)} of {len(units)} work units written, {missing[0]} "
            "not" if missing else "every work unit written, the manifest not")
    return (f"{directory}: the preparation of task {task} did not finish ({done}); run the "
            "same prepare command again to complete it")


def load_task(root: str, task: str, records: str, vocabulary: str,
              raw_paths: Mapping[str, Optional[Sequence[str]]]) -> PreparedTask:
    """The prepared directory `root/task`, checked against what the registration expects:
    record type, vocabulary fingerprint, members and, where the raw files are present here,
    their names and sizes; then every shard (`shard_files.CorpusRecords`). Any mismatch is
    a one-line `PreparedError` naming the directory and what differs."""
    directory = os.path.join(root, task)
    path = os.path.join(directory, pf.MANIFEST)
    if not pf.exists(path):
        raise pf.PreparedError(_missing(root, task))
    try:
        manifest = pf.read_json(path)
        plan = pf.Plan.from_json(manifest)
    except pf.PreparedError:  # not JSON: the message names the file
        raise
    except (ValueError, KeyError, TypeError) as e:
        raise pf.PreparedError(f"{path}: not a manifest of xlm_jax.data.prepared.prepare "
                               f"({e!r})") from None
    if manifest.get("format") not in pf.READ_FORMATS:
        raise pf.PreparedError(f"{path}: format {manifest.get('format')!r}, this xlm_jax reads "
                               f"formats {', '.join(map(str, pf.READ_FORMATS))}; prepare the "
                               "task again")
    wrong = [f"{what} {have!r} where the task has {want!r}" for what, have, want in (
        ("task", plan.task, task), ("records", plan.records, records),
        ("vocabulary", plan.vocabulary, vocabulary),
        ("corpora", sorted(plan.corpora), sorted(raw_paths))) if have != want]
    if wrong:
        raise pf.PreparedError(f"{directory} was prepared with another SentencePiece model or "
                               f"task definition: {'; '.join(wrong)}")
    changed = []
    for member, paths in sorted(raw_paths.items()):
        if paths and member in plan.corpora and all(pf.exists(p) for p in paths):
            changed += [f"{member}: {phrase}" for phrase in pf.changed_sources(
                plan.corpora[member]["sources"], pf.source_entries(paths))]
    if changed:
        raise pf.PreparedError(f"{directory}: the corpus changed since it was prepared "
                               f"({'; '.join(changed)}); prepare the task again into another "
                               "directory, or train on the files as they were")
    prepared = PreparedTask(directory, manifest)
    for member in plan.corpora:  # checks every shard now, before a step is trained
        prepared.records(member)
    return prepared


def record_numbers(block: int, size: int, index: int, count: int, num_records: int,
                   shuffle: bool, seed: int, salt: int) -> np.ndarray:
    """The record numbers of block `block` (of `size` positions) of process `index` of
    `count`; see the module docstring. Past the end of an unshuffled epoch: fewer, or none."""
    local = block * size + np.arange(size, dtype=np.int64)
    pos = local * count + index
    if not shuffle:
        return pos[pos < num_records]
    epochs, offsets = np.divmod(pos, num_records)
    out = np.empty_like(offsets)
    for epoch in np.unique(epochs).tolist():
        at = epochs == epoch
        out[at] = IndexShuffle(num_records, (seed, epoch, salt))(offsets[at])
    return out


_SOURCE_CLASS: Any = None


def _source_class() -> type:
    """`PreparedSource` derives from seqio.DataSource, which needs TensorFlow: built lazily."""
    global _SOURCE_CLASS
    if _SOURCE_CLASS is not None:
        return _SOURCE_CLASS
    import seqio  # pylint: disable=g-import-not-at-top
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    class PreparedSource(seqio.DataSource):
        """A prepared corpus as seqio's "train" split: tokenised documents
        `{"tokens": int32[n], "lang": int32}` or pairs `{"src_ids", "tgt_ids": int32[n],
        "src_lang", "tgt_lang": int32}`, the examples the raw path has after tokenising."""

        def __init__(self, prepared: PreparedTask, member: str, langs: Sequence[int],
                     block: int = 256, parallel_reads: int = 4):
            self._prepared, self._member, self._langs = prepared, member, tuple(langs)
            self._records = prepared.records(member)
            self._pairs = prepared.manifest["records"] == "pairs"
            self._block, self._parallel = block, parallel_reads
            self._salt = zlib.crc32(f"{prepared.manifest['task']}/{member}".encode())
            super().__init__(splits=("train",), num_input_examples=None,
                             caching_permitted=False)

        @property
        def supports_arbitrary_sharding(self) -> bool:
            return True

        @property
        def performs_internal_shuffling(self) -> bool:
            """True: the whole corpus is permuted (module docstring), so the Task reads no
            shuffle buffer (registered with `shuffle_buffer_size=None`)."""
            return True

        def list_shards(self, split: str) -> Sequence[str]:
            return [os.path.join(self._prepared.directory, self._member)]

        def __repr__(self) -> str:
            return f"PreparedSource({os.path.join(self._prepared.directory, self._member)})"

        def _block_arrays(self, block, index, count, shuffle, seed) -> list[np.ndarray]:
            numbers = record_numbers(int(block), self._block, index, count,
                                     self._records.num_records, shuffle, seed, self._salt)
            recs = self._records.read(numbers)
            n = len(recs)
            if not self._pairs:
                return [_flat(recs), _lengths(recs), np.full(n, self._langs[0], np.int32)]
            src = [r[1:1 + r[0]] for r in recs]
            tgt = [r[1 + r[0]:] for r in recs]
            return [_flat(src), _lengths(src), _flat(tgt), _lengths(tgt),
                    np.full(n, self._langs[0], np.int32), np.full(n, self._langs[1], np.int32)]

        def get_dataset(self, split: str = "train", shuffle: bool = True,
                        seed: Optional[int] = None, shard_info=None, *,
                        sequence_length=None, use_cached: bool = False,
                        num_epochs: Optional[int] = 1) -> "tf.data.Dataset":
            del sequence_length, use_cached, num_epochs  # endless when shuffled, else 1 epoch
            if split != "train":
                raise ValueError(f"{self!r}: unknown split {split!r}; only 'train' exists")
            index, count = (shard_info.index, shard_info.num_shards) if shard_info else (0, 1)
            if self._records.num_records < count:
                raise pf.PreparedError(
                    f"{os.path.join(self._prepared.directory, self._member)}: "
                    f"{self._records.num_records} records cannot be shared by {count} "
                    "processes (each reads its own records); use at most "
                    f"{self._records.num_records} processes or a larger corpus")
            seed = 0 if seed is None else int(seed)
            keys = ["src_ids", "tgt_ids"] if self._pairs else ["tokens"]
            lang_keys = ["src_lang", "tgt_lang"] if self._pairs else ["lang"]
            dtypes = [tf.int32, tf.int64] * len(keys) + [tf.int32] * len(keys)

            def read(block):
                values = tf.numpy_function(
                    lambda b: self._block_arrays(b, index, count, bool(shuffle), seed),
                    [block], dtypes, stateful=False)
                for v in values:
                    v.set_shape([None])
                out = {k: tf.RaggedTensor.from_row_lengths(values[2 * i], values[2 * i + 1],
                                                           validate=False)
                       for i, k in enumerate(keys)}
                out.update(zip(lang_keys, values[2 * len(keys):]))
                return out

            ds = tf.data.Dataset.counter().map(read, num_parallel_calls=self._parallel,
                                               deterministic=True)
            ds = ds.take_while(lambda b: tf.size(b[lang_keys[0]]) > 0)
            return ds.unbatch()

    _SOURCE_CLASS = PreparedSource
    return PreparedSource


def _flat(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(arrays).astype(np.int32) if arrays else np.zeros(0, np.int32)


def _lengths(arrays: Sequence[np.ndarray]) -> np.ndarray:
    return np.asarray([len(a) for a in arrays], np.int64)


def source(prepared: PreparedTask, member: str, langs: Sequence[int]) -> "seqio.DataSource":
    """The seqio source of one prepared corpus; `langs`: its language id (documents) or the
    ids of (src, tgt) (pairs)."""
    return _source_class()(prepared, member, langs)
