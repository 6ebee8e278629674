"""The layout of a prepared shard's index and ids (the index header of format 2, and the id
width it announces), and the checks of an index entry and a record's ids that the reader
(`shard_files.CorpusRecords`) and `verify` share.

Format 2 (issue 54) starts every `.idx` with a 16-byte header, as Megatron's `.idx` does
(magic, version, dtype):

  bytes 0-7    b"XLMJXIDX"   the magic: this is an index of xlm_jax.data.prepared.prepare
  bytes 8-11   <u4 2         the format version
  bytes 12-15  <u4 2 or 4    the bytes of one token id in the `.bin`: 2 (uint16) where the
                             vocabulary has at most 65,536 ids, else 4 (int32)

then the records' byte offsets into the `.bin` as before (int64 little-endian, records + 1 of
them, the first 0, the last the `.bin` size). uint16 ids halve what a host reads and stores for
a vocabulary that fits (the demo's 8,002 ids, BERT's 30,522; not XLM-R's 250,002).
Format 1 (no header, int32 ids) is still read, for one release.
"""
from __future__ import annotations

import dataclasses
import struct
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

__all__ = ["MAGIC", "HEADER_BYTES", "VERSION", "Layout", "id_bytes_for", "header",
           "parse_header", "layout", "index_span_problem", "bad_record", "bad_ids"]

MAGIC = b"XLMJXIDX"
HEADER_BYTES = 16
VERSION = 2
UINT16_IDS = 1 << 16  # vocabularies of at most this many ids are stored as uint16


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where a shard's index entries start and how wide its ids are."""

    header: int  # bytes before the first offset: HEADER_BYTES (format 2) or 0 (format 1)
    id_bytes: int  # 2 (uint16) or 4 (int32)

    @property
    def dtype(self) -> str:
        return "<u2" if self.id_bytes == 2 else "<i4"

    @property
    def id_name(self) -> str:
        return "uint16" if self.id_bytes == 2 else "int32"

    def index_bytes(self, records: int) -> int:
        """The size of the index of a shard of `records` records."""
        return self.header + 8 * (records + 1)

    def entry(self, k: int) -> int:
        """The byte offset of index entry `k` (the start of record k)."""
        return self.header + 8 * k


FORMAT1 = Layout(0, 4)


def id_bytes_for(vocab_size: Optional[int]) -> int:
    """2 where every id of a `vocab_size` vocabulary fits in uint16, else 4 (also when the
    size is unknown)."""
    return 2 if vocab_size is not None and 0 < vocab_size <= UINT16_IDS else 4


def header(id_bytes: int) -> bytes:
    """The 16-byte header of a format-2 index whose ids are `id_bytes` wide."""
    return MAGIC + struct.pack("<II", VERSION, id_bytes)


def parse_header(path: str, data: bytes) -> Layout:
    """The layout a format-2 index's first 16 bytes announce; ValueError naming `path` when
    they are not such a header."""
    if len(data) < HEADER_BYTES or data[:8] != MAGIC:
        raise ValueError(f"{path}: no index header (it starts with {data[:8]!r}, not {MAGIC!r}):"
                         " not an index of format 2, or damaged")
    version, id_bytes = struct.unpack("<II", data[8:HEADER_BYTES])
    if version != VERSION or id_bytes not in (2, 4):
        raise ValueError(f"{path}: index header of version {version} with {id_bytes}-byte "
                         f"ids; this xlm_jax reads version {VERSION} with 2- or 4-byte ids")
    return Layout(HEADER_BYTES, id_bytes)


def layout(format_version: int, id_bytes: int = 4) -> Layout:
    """The layout of a manifest's `format` (1: no header, int32 ids)."""
    return FORMAT1 if format_version == 1 else Layout(HEADER_BYTES, id_bytes)


# ----------------------------------------------------------------------------- checks

def index_span_problem(prefix: str, shard: Mapping[str, Any], first: int,
                       last: int) -> Optional[str]:
    """Why an index whose first and last offsets are `first` and `last` does not span its
    shard's bytes, else None."""
    if first != 0 or last != shard["bytes"]:
        return (f"{prefix}.idx does not match its shard: it spans bytes {first}-{last}, "
                f"{prefix}.bin has {shard['bytes']}")
    return None


def bad_record(prefix: str, k: int, start: int, end: int, shard_bytes: int,
               lay: Layout = FORMAT1) -> Optional[str]:
    """Why index entries (`start`, `end`) cannot delimit record `k` of a shard of
    `shard_bytes` bytes (going backwards, past the end, not whole ids of the layout's width),
    else None."""
    if start > end:
        return f"{prefix}.idx: record {k} ends at byte {end}, before its start {start}"
    if end > shard_bytes:
        return f"{prefix}.idx: record {k} ends at byte {end}, past the shard's {shard_bytes}"
    if start % lay.id_bytes or end % lay.id_bytes:
        return (f"{prefix}.idx: record {k} spans bytes {start}-{end}, not whole {lay.id_name} "
                f"ids (offsets are multiples of {lay.id_bytes})")
    return None


def bad_ids(ids: np.ndarray, vocab: Optional[int], pair: bool = False) -> Optional[str]:
    """Why a record's token ids cannot come from a vocabulary of `vocab` ids (negative, or not
    below it), else None. A pair's record is `[len(src), src..., tgt...]`: its first number
    is a length, at most the ids that follow."""
    if pair:
        if ids.size == 0 or not 0 <= int(ids[0]) <= ids.size - 1:
            return (f"a pair record of {ids.size} numbers whose source length is "
                    f"{int(ids[0]) if ids.size else 'missing'}")
        ids = ids[1:]
    if ids.size == 0 or vocab is None:
        return None
    low, high = int(ids.min()), int(ids.max())
    if low >= 0 and high < vocab:
        return None
    return f"token id {low if low < 0 else high} outside the vocabulary of {vocab}"
