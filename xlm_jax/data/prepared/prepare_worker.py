"""What a Beam worker of `python -m xlm_jax.data.prepared.prepare` runs: one work unit of a corpus,
tokenised, written as one shard.

A `WorkItem` is one Beam element. `run_unit` reads its unit (`corpus_units.read_unit`: the
same documents or pairs, the same skipped lines as the registry's readers), tokenises it with
SentencePiece in the fairseq id layout (1024 examples per call) and writes the shard's `.bin`
as the records come and its `.idx` after them (each whole or not at all:
`shard_files.write_shard`), then its counts file, so a unit with a counts file is
finished and a rerun skips it. This module holds no driver code, so that
the elements and the function Beam pickles belong to an importable module (not to the
`__main__` of the command). TensorFlow-free.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Iterator
from typing import Any, Optional

import numpy as np

from xlm_jax.data.prepared import corpus_units as cu
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.sources import ReadCounts
from xlm_jax.data.vocab import load_spm, spm_to_fairseq

__all__ = ["WorkItem", "run_unit"]


@dataclasses.dataclass(frozen=True)
class WorkItem:
    """One Beam element: unit `index` of `count` of one corpus of one task."""

    directory: str  # OUTPUT_DIR/TASK/MEMBER
    records: str
    spm_path: str
    unit: cu.Unit
    index: int
    count: int
    plan: str = ""  # the task's `Plan.digest`, written into the unit's counts
    vocab_size: Optional[int] = None  # ids are stored as uint16 where it fits (`shard_index`)

    @property
    def prefix(self) -> str:
        return os.path.join(self.directory, pf.shard_name(self.index, self.count))


@functools.lru_cache(maxsize=None)
def _tokenizer(path: str) -> Any:
    """The SentencePiece processor of `path`, loaded once per worker process."""
    return load_spm(path)


def _encode(sp: Any, texts: list[str]) -> list[np.ndarray]:
    """fairseq ids of each text (as `XLMRTokenizer.encode`: spm ids shifted past the
    specials), one SentencePiece call for the lot."""
    pieces = sp.encode(texts, out_type=int)
    if not pieces:
        return []
    # one id map over the whole batch, then split: per text it cost five numpy passes over a
    # few dozen ids (26 s of the test suite's sampled time; a preparation's workers pay it
    # for every line of the corpus)
    lengths = np.fromiter((len(ids) for ids in pieces), np.int64, len(pieces))
    flat = np.fromiter((i for ids in pieces for i in ids), np.int64, int(lengths.sum()))
    return np.split(spm_to_fairseq(flat).astype(np.int32), np.cumsum(lengths)[:-1])


def _records(item: WorkItem, counts: ReadCounts, tally: dict[str, int]
             ) -> Iterator[np.ndarray]:
    """The unit's records in file order, 1024 examples per tokenizer call. `tally` gets the
    tokens and lines as `sources.count_monolingual` / `count_parallel` count them."""
    sp = _tokenizer(item.spm_path)
    batch: list[Any] = []

    def flush():
        if item.records == "documents":
            ids = iter(_encode(sp, [line for doc in batch for line in doc]))
            for doc in batch:
                rec = np.concatenate([next(ids) for _ in doc])
                tally["tokens"] += len(rec) + 1  # + the document's </s>
                tally["lines"] += len(doc)
                yield rec
        else:
            ids = _encode(sp, [s for pair in batch for s in pair])
            for a, b in zip(ids[0::2], ids[1::2]):
                tally["tokens"] += len(a) + len(b)
                yield np.concatenate([[len(a)], a, b]).astype(np.int32)
        batch.clear()

    for example in cu.read_unit(item.unit, counts):
        batch.append(example)
        if len(batch) == 1024:
            yield from flush()
    yield from flush()


def run_unit(item: WorkItem) -> Optional[pf.ShardCounts]:
    """Tokenises and writes one unit, unless an earlier run finished it (its counts file
    exists); returns its counts. A corpus error (misaligned files, an unreadable file) is
    written to the unit's `.error` file instead of failing the worker: the driver reports it
    in one line, and the unit is tried again by the next run."""
    done, failed = item.prefix + ".json", item.prefix + ".error"
    if pf.exists(done):
        return pf.ShardCounts.from_json(pf.read_json(done))
    pf.makedirs(item.directory)
    counts, tally = ReadCounts(), {"tokens": 0, "lines": 0}
    try:
        written = pf.write_shard(item.prefix, _records(item, counts, tally), item.vocab_size)
    except (ValueError, OSError) as e:
        pf.write_json(failed, {"error": f"{type(e).__name__}: {e}"})
        return None
    lines = tally["lines"] if item.records == "documents" else counts.lines
    shard = pf.ShardCounts(records=written.records, tokens=tally["tokens"],
                           bytes=written.bytes, sha1=written.sha1, lines=lines,
                           invalid_utf8=counts.invalid_utf8, malformed=counts.malformed,
                           empty_pairs=counts.empty_pairs, index_sha1=written.index_sha1,
                           plan=item.plan)
    pf.write_json(done, shard.to_json())
    pf.remove(failed)
    return shard
