"""The corpus-stats cache of the registry: corpus sizes counted once, kept beside the data.

Corpus sizes are counted once (a full tokenizing pass) and cached in a stats JSON beside the
data, `{data_dir}/xlm_jax_stats.json`, keyed by file name + size + mtime + the vocabulary's
fingerprint, so an edited file or another vocabulary is recounted. If the data directory is
not writable the cache goes to `$XDG_CACHE_HOME/xlm_jax/stats/` (default `~/.cache`). The
JSON also records the skipped invalid-UTF-8 / malformed lines of every file, and
`corpus_stats` refuses a file that is mostly not UTF-8.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from typing import Any, Callable, Sequence

import seqio

from xlm_jax.data import corpus_fs, sources
from xlm_jax.data.sources import CorpusStats

__all__ = ["STATS_FILE", "StatsCache", "check_stats", "corpus_stats", "file_key",
           "stats_path", "vocab_fingerprint"]

logger = logging.getLogger(__name__)

STATS_FILE = "xlm_jax_stats.json"
_STATS_VERSION = 1


def _cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xlm_jax", "stats")


def _dir_writable(path: str) -> bool:
    """True if a file can actually be created in `path` (os.access lies for root)."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=".xlm_jax_probe_", dir=path)
    except OSError:
        return False
    os.close(fd)
    os.remove(tmp)
    return True


def stats_path(data_dir: str) -> str:
    """Where the stats JSON of `data_dir` lives: under $XLM_JAX_STATS_DIR when set (what
    `data.inspect` sets, so that looking at a corpus writes nothing into it), else in the data
    directory if writable (shared by every host of a pod), else in the user cache. A remote
    data directory (`gs://`) keeps its stats in the user cache (our choice: nothing is written
    into a corpus bucket; each host counts once, or reads a prepared task's manifest)."""
    digest = hashlib.sha1(corpus_fs.abspath(data_dir).encode()).hexdigest()[:16]
    forced = os.environ.get("XLM_JAX_STATS_DIR")
    if forced:
        return os.path.join(forced, f"{digest}.json")
    if not corpus_fs.is_remote(data_dir) and _dir_writable(data_dir):
        return os.path.join(data_dir, STATS_FILE)
    return os.path.join(_cache_root(), f"{digest}.json")


def vocab_fingerprint(vocab: seqio.Vocabulary) -> str:
    """Identifies a vocabulary's tokenization (the SentencePiece model bytes when available)."""
    model = getattr(vocab, "sp_model", None)
    if isinstance(model, (bytes, bytearray)):
        return f"spm:{hashlib.sha1(model).hexdigest()[:16]}:{vocab.vocab_size}"
    return f"{type(vocab).__name__}:{vocab.vocab_size}"


def file_key(paths: Sequence[str], vocab_fp: str, what: str) -> str:
    """The fast cache key: kind + (file name, size, mtime) of every file + vocabulary."""
    parts = []
    for p in paths:
        size, mtime_ns = corpus_fs.stat_key(p)
        parts.append(f"{os.path.basename(p)}:{size}:{mtime_ns}")
    return f"{what}|{'|'.join(parts)}|{vocab_fp}"


def _content_key(paths: Sequence[str], vocab_fp: str, what: str) -> str:
    """The fallback key: (file name, size, sha1 of the bytes) — survives a fresh checkout,
    which changes every mtime but not the content."""
    parts = []
    for p in paths:
        h = hashlib.sha1()
        with corpus_fs.open_binary(p) as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        parts.append(f"{os.path.basename(p)}:{corpus_fs.getsize(p)}:{h.hexdigest()}")
    return f"{what}|{'|'.join(parts)}|{vocab_fp}"


class StatsCache:
    """The stats JSON of one data directory: `{"version", "entries": {key: entry}}`.

    An entry is `{"files", "content", "stats"}` under its fast key (name, size, mtime). A
    fast-key miss falls back to the content key (name, size, sha1), so a committed stats
    file stays valid after a fresh clone; only a real change of the bytes forces a recount.
    """

    def __init__(self, data_dir: str):
        self.path = stats_path(data_dir)
        self._entries: dict[str, Any] = {}
        if os.path.isfile(self.path):
            try:
                with open(self.path, encoding="utf-8") as f:
                    data = json.load(f)
                if data.get("version") == _STATS_VERSION:
                    self._entries = dict(data.get("entries", {}))
            except (OSError, ValueError) as e:
                logger.warning("ignoring unreadable stats cache %s: %s", self.path, e)

    def lookup(self, paths: Sequence[str], vocab_fp: str, what: str,
               count: Callable[[], CorpusStats]) -> CorpusStats:
        """The cached stats of `paths`, counting (and caching) them on a miss."""
        key = file_key(paths, vocab_fp, what)
        entry = self._entries.get(key)
        if entry is not None:
            return CorpusStats.from_json(entry["stats"])
        content = _content_key(paths, vocab_fp, what)
        match = next((e for e in self._entries.values() if e.get("content") == content), None)
        if match is None:
            _announce_count(paths)
        stats = CorpusStats.from_json(match["stats"]) if match else count()
        files = [os.path.basename(p) for p in paths]
        # Drop stale entries of the same files (older versions / mtimes), keep the rest.
        self._entries = {k: e for k, e in self._entries.items()
                         if not (e.get("files") == files and k.split("|")[0] == what
                                 and k.endswith("|" + vocab_fp))}
        self._entries[key] = {"files": files, "content": content, "stats": stats.to_json()}
        self._save()
        return stats

    def _save(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".xlm_jax_stats_", dir=os.path.dirname(self.path))
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"version": _STATS_VERSION, "entries": self._entries}, f, indent=1,
                      sort_keys=True)
        os.replace(tmp, self.path)  # atomic: concurrent hosts never read a half-written file


# The counting pass's speed, measured: `sources.count_monolingual`'s per-line `vocab.encode`
# over the generated 300 MB benchmark corpus (docs/performance.md, "Input at pod scale") ran
# at 3.3 MB of text per second on one core of the 2-core machine. A corpus file of
# ANNOUNCE_BYTES or more on disk is announced before it is counted.
COUNT_MB_PER_S = 3.3
ANNOUNCE_BYTES = 32 << 20


def _announce_count(paths: Sequence[str]) -> None:
    """Says, before a long counting pass, how long it will take and what avoids it."""
    size = sum(corpus_fs.getsize(p) for p in paths)
    if size < ANNOUNCE_BYTES:
        return
    compressed = any(p.endswith((".xz", ".gz")) for p in paths)
    seconds = size / 1e6 / COUNT_MB_PER_S
    logger.warning(
        "counting the tokens of %s (%.0f MB%s) on this host: about %.0f s%s at %.1f MB/s, once "
        "(cached in the stats file); python -m xlm_jax.data.prepared.prepare counts in parallel "
        "while it prepares the corpus", " + ".join(paths), size / 1e6,
        " compressed" if compressed else "", seconds, " or several times that (compressed)"
        if compressed else "", COUNT_MB_PER_S)


# A corpus file is refused, not warned about, when at least this share of its lines is not
# UTF-8 (our choice: a Latin-1 French or German file loses about half its lines, a few
# corrupt lines in a large UTF-8 corpus stay a warning with their count), for files of at
# least NOT_UTF8_MIN_LINES lines (a handful of lines is too few to judge an encoding).
NOT_UTF8_FRACTION = 0.2
NOT_UTF8_MIN_LINES = 20


def corpus_stats(cache: StatsCache, paths: Sequence[str], vocab: seqio.Vocabulary, what: str,
                 count: Callable[[], CorpusStats]) -> CorpusStats:
    """The corpus's cached (or counted) stats, checked by `check_stats`."""
    return check_stats(cache.lookup(paths, vocab_fingerprint(vocab), what, count), paths, what)


def check_stats(stats: CorpusStats, paths: Sequence[str], what: str) -> CorpusStats:
    """Refuses a corpus that is mostly not UTF-8 or has no usable example (a one-line
    ValueError naming the files); warns about the lines it skipped. `what`: "mono" or
    "pair"."""
    shown = " + ".join(paths)
    read = stats.lines + stats.invalid_utf8_lines
    if read >= NOT_UTF8_MIN_LINES and stats.invalid_utf8_lines >= NOT_UTF8_FRACTION * read:
        raise ValueError(
            f"{shown}: {stats.invalid_utf8_lines} of {read} lines are not valid UTF-8; the "
            f"text looks like {sources.likely_encoding(paths)}: convert it to UTF-8 first (e.g. "
            f"iconv -f <encoding> -t UTF-8), or it would train on what is left")
    if stats.invalid_utf8_lines:
        logger.warning("%s: skipped %d lines that are not valid UTF-8", shown,
                       stats.invalid_utf8_lines)
    if stats.malformed_lines:
        logger.warning("%s: skipped %d lines without exactly one tab", shown,
                       stats.malformed_lines)
    if stats.empty_pairs:
        logger.warning("%s: skipped %d pairs with an empty side", shown, stats.empty_pairs)
    if stats.examples == 0:
        raise ValueError(
            f"empty corpus: {shown} has no usable {'documents' if what == 'mono' else 'pairs'} "
            f"({stats.lines} lines, {stats.invalid_utf8_lines} invalid UTF-8)"
        )
    return stats
