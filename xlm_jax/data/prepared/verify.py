"""`python -m xlm_jax.data.prepared.verify DIR [--tasks PATTERNS]`: checks prepared data against its
manifests, every byte, before a pod reads it.

Per shard of every finished task (`manifest.json`) under DIR: both files present at the sizes
the manifest records; the index's header (format 2: magic, version, id width) holds; its
offsets start at 0, never go backwards, fall on whole ids and end at the shard's size; the
shard's sha1 equals the manifest's; every token id lies in the vocabulary the manifest's
fingerprint names (a pair record's leading source length at most the ids after it). A task
directory without a manifest is an unfinished preparation. Prints one line per bad shard (the
file and what is wrong) and a last line with the totals and the throughput; exit 0 when
everything holds, 1 when something does not, 2 for a DIR that is
not prepared data.

The trainer's reader checks what is cheap on open and on every record it reads
(`shard_files.CorpusRecords`): this is the full check, once, e.g. after copying a
preparation to a bucket. It reads each shard once, in blocks of about 16 MB (memory stays
bounded for a language prepared as a single unit), through `etils.epath` (local or `gs://`).
TensorFlow-free.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, Optional

import numpy as np

from xlm_jax import cli_help
from xlm_jax.data.prepared import shard_files as pf
from xlm_jax.data.prepared import shard_index

BLOCK_BYTES = 16 << 20


@dataclasses.dataclass
class Totals:
    """What a verification read: tasks, shards, bytes, and the bad shards' lines."""

    tasks: int = 0
    shards: int = 0
    bytes: int = 0
    problems: list[str] = dataclasses.field(default_factory=list)


def _blocks(offsets: np.ndarray) -> Iterator[tuple[int, int]]:
    """(first record, end record) ranges of about BLOCK_BYTES each (at least one record)."""
    k, n = 0, len(offsets) - 1
    while k < n:
        end = int(np.searchsorted(offsets, offsets[k] + BLOCK_BYTES, side="right")) - 1
        end = min(max(end, k + 1), n)
        yield k, end
        k = end


def check_shard(prefix: str, shard: dict[str, Any], vocab: Optional[int],
                pairs: bool, format_version: int = pf.FORMAT) -> tuple[Optional[str], int]:
    """(what is wrong with shard `prefix` against its manifest entry `shard`, or None; the
    bytes read)."""
    bin_path, idx_path = prefix + ".bin", prefix + ".idx"
    lay = shard_index.layout(format_version)
    wrong = pf.shard_files_problem(prefix, shard, lay.header)  # the reader's check on open
    if wrong:
        return wrong, 0
    want_idx = lay.index_bytes(shard["records"])
    index = pf.read_bytes(idx_path)
    if lay.header:
        try:
            lay = shard_index.parse_header(idx_path, index[:lay.header])
        except ValueError as e:
            return str(e), want_idx
    offsets = np.frombuffer(index[lay.header:], "<i8")
    wrong = pf.index_span_problem(prefix, shard, int(offsets[0]), int(offsets[-1]))
    if wrong:
        return wrong, want_idx
    steps = np.diff(offsets)
    if (steps < 0).any():
        k = int(np.argmax(steps < 0))
        return pf.bad_record(prefix, k, int(offsets[k]), int(offsets[k + 1]),
                             shard["bytes"], lay), want_idx
    if (offsets % lay.id_bytes).any():
        k = max(int(np.argmax(offsets % lay.id_bytes)) - 1, 0)
        return pf.bad_record(prefix, k, int(offsets[k]), int(offsets[k + 1]),
                             shard["bytes"], lay), want_idx
    digest, problem = hashlib.sha1(), None
    with pf.open_read(bin_path) as f:
        for first, end in _blocks(offsets):
            data = f.read(int(offsets[end] - offsets[first]))
            digest.update(data)
            if problem is None:
                problem = _check_ids(prefix, np.frombuffer(data, lay.dtype).astype(np.int32),
                                     (offsets[first:end + 1] - offsets[first]) // lay.id_bytes,
                                     first, vocab, pairs)
    if problem:
        return problem, want_idx + shard["bytes"]
    index_sha1 = hashlib.sha1(index).hexdigest()
    if shard.get("index_sha1") and index_sha1 != shard["index_sha1"]:
        return (f"{idx_path}: sha1 {index_sha1}, the manifest says {shard['index_sha1']} (an "
                "offset moved: its records are cut elsewhere)"), want_idx + shard["bytes"]
    if digest.hexdigest() != shard["sha1"]:
        return (f"{bin_path}: sha1 {digest.hexdigest()}, the manifest says {shard['sha1']} "
                "(its bytes changed since it was prepared)"), want_idx + shard["bytes"]
    return None, want_idx + shard["bytes"]


def _check_ids(prefix: str, ids: np.ndarray, starts: np.ndarray, first: int,
               vocab: Optional[int], pairs: bool) -> Optional[str]:
    """The first bad record of a block of records (`starts`: their id offsets in `ids`)."""
    ok = np.ones(ids.size, bool)
    if pairs:
        heads = starts[:-1]
        lengths = ids[heads].astype(np.int64)
        bad = (lengths < 0) | (lengths > np.diff(starts) - 1)
        if bad.any():
            k = int(np.argmax(bad))
            return (f"{prefix}.bin: record {first + k}: "
                    f"{pf.bad_ids(ids[starts[k]:starts[k + 1]], vocab, True)}")
        ok[heads] = False
    if vocab is None:
        return None
    outside = ok & ((ids < 0) | (ids >= vocab))
    if not outside.any():
        return None
    k = int(np.searchsorted(starts, int(np.argmax(outside)), side="right")) - 1
    return (f"{prefix}.bin: record {first + k}: "
            f"{pf.bad_ids(ids[starts[k]:starts[k + 1]], vocab, pairs)}")


def verify(root: str, patterns: Sequence[str] = ("*",), out=None) -> Totals:
    """Checks every task under `root` whose name matches one of `patterns`; prints each bad
    shard's line to `out` (standard output) as it is found."""
    out = out or sys.stdout
    totals = Totals()
    names = sorted(n for n in pf.children(root)
                   if any(fnmatch.fnmatch(n, pattern) for pattern in patterns)
                   and (pf.exists(os.path.join(root, n, pf.PLAN))
                        or pf.exists(os.path.join(root, n, pf.MANIFEST))))
    for name in names:
        directory = os.path.join(root, name)
        totals.tasks += 1
        manifest_path = os.path.join(directory, pf.MANIFEST)
        if not pf.exists(manifest_path):
            _report(totals, f"{directory}: unfinished (no {pf.MANIFEST}); run the same prepare "
                            "command again to complete it", out)
            continue
        try:
            manifest = pf.read_json(manifest_path)
            corpora = manifest["corpora"]
            vocab, pairs = pf.vocab_size(manifest["vocabulary"]), manifest["records"] == "pairs"
        except pf.PreparedError as e:  # not JSON: the message names the file
            _report(totals, str(e), out)
            continue
        except (ValueError, KeyError, TypeError) as e:
            _report(totals, f"{manifest_path}: not a manifest of "
                    f"xlm_jax.data.prepared.prepare ({e!r})", out)
            continue
        for member, entry in sorted(corpora.items()):
            for shard in entry["shards"]:
                totals.shards += 1
                problem, nbytes = check_shard(os.path.join(directory, member, shard["name"]),
                                              shard, vocab, pairs, manifest.get("format", 1))
                totals.bytes += nbytes
                if problem:
                    _report(totals, problem, out)
    return totals


def _report(totals: Totals, line: str, out) -> None:
    totals.problems.append(line)
    print(line, file=out, flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = cli_help.Parser(prog="python -m xlm_jax.data.prepared.verify", description=__doc__)
    parser.add_argument("directory", help="the --output_dir of `python -m xlm_jax.data.prepared.prepare`")
    parser.add_argument("--tasks", default="*",
                        help="comma-separated task names or globs (default: every task)")
    args = parser.parse_args(argv)
    patterns = [p for p in args.tasks.split(",") if p]
    if not pf.is_dir(args.directory):
        print(f"error: verify: {args.directory} is not a directory", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    totals = verify(args.directory, patterns)
    seconds = time.perf_counter() - t0
    if not totals.tasks:
        print(f"error: verify: no prepared task matching {args.tasks!r} in {args.directory}",
              file=sys.stderr)
        return 2
    mb = totals.bytes / 1e6
    verdict = (f"{len(totals.problems)} bad" if totals.problems else "all as the manifests say")
    print(f"verified {totals.tasks} task(s), {totals.shards} shard(s), {mb:.1f} MB in "
          f"{seconds:.1f} s ({mb / max(seconds, 1e-9):.0f} MB/s): {verdict}", flush=True)
    return 1 if totals.problems else 0


if __name__ == "__main__":
    sys.exit(main())
