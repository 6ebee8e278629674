"""The run's persistent compilation cache, and what the train step's compile found in it.

A restart after preemption (or a second run of the same run file) compiles the same train step
again: minutes at the run files' sizes on a TPU pod. With jax's persistent compilation cache
(`jax_compilation_cache_dir`) the first run writes each compiled executable there and the restart
loads it instead. `loop.train.compilation_cache_dir` (and `python -m xlm_jax.accelerator.bench
--compilation_cache_dir`) says where; `configure` applies it before the run's first compile:

- 'auto' (the default): a cache already set up outside the run wins, JAX_COMPILATION_CACHE_DIR
  or a `jax_compilation_cache_dir` configured in this process (a launcher's, a test suite's);
  else on a GPU or TPU `default_dir()` ($XDG_CACHE_HOME/xlm_jax/jax_cache, else
  ~/.cache/xlm_jax/jax_cache); else (CPU) off: the CPU runs here are the demo and the tests,
  whose compiles take seconds, and the tests set their own cache (tests/conftest.py).
- a path, local or gs://: the cache there, on any platform, over the environment's.
- None or '': off, also when the environment sets one.

Entries are written for compiles of at least `MIN_COMPILE_SECS` unless
JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS or this process's jax config already says otherwise.
A local cache directory that cannot be written is one WARNING and the run goes on without a
cache: a cache only saves time, it must never stop a run. `compile_timed` compiles the step
ahead of its first call and reports the time and whether the executable came from the cache
(jax's monitoring events), for the trainer's "step compiled" line and the benchmark.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from typing import Any

import jax

from xlm_jax import model_dir as md

logger = logging.getLogger(__name__)

AUTO = "auto"
ACCELERATORS = ("gpu", "tpu")  # `jax.default_backend()` names where 'auto' turns the cache on
DIR_ENV = "JAX_COMPILATION_CACHE_DIR"
MIN_TIME_ENV = "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"
# Our choice, jax's own default (0.10), pinned so that a jax release moving it does not move
# what a run caches: the compiles a restart repeats and that cost (train step, eval step,
# init) take seconds to minutes at real sizes, while a run also compiles dozens of small
# functions (a save compiles a slice per device and shape, ~20 ms each: tests/conftest.py),
# each of which would cost a read at every start (a round trip when the cache is on gs://).
MIN_COMPILE_SECS = 1.0
_JAX_DEFAULT_MIN_COMPILE_SECS = 1.0
# The monitoring events jax 0.10 records in `compiler.compile_or_get_cached` (a hit) and
# `compilation_cache.put_executable_and_time` (a compile written to the cache), and the
# duration event of every backend compile, hit or not (`dispatch.BACKEND_COMPILE_EVENT`).
HIT_EVENT = "/jax/compilation_cache/cache_hits"
WRITE_EVENT = "/jax/compilation_cache/cache_misses"
BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_set_by_us: list[str | None] = []  # the directory `configure` last put in jax's config


def default_dir(env: Mapping[str, str] | None = None) -> str:
    """The per-user cache directory 'auto' uses on an accelerator: $XDG_CACHE_HOME/xlm_jax/
    jax_cache, else ~/.cache/xlm_jax/jax_cache (the XDG base directory rule)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "xlm_jax", "jax_cache")


@dataclasses.dataclass(frozen=True)
class CacheChoice:
    """Where the run's compilation cache is (None: no cache) and why."""

    path: str | None
    source: str  # "loop.train.compilation_cache_dir", "JAX_COMPILATION_CACHE_DIR", ...


def resolve(setting: str | None, platform: str, env: Mapping[str, str] | None = None,
            configured: str | None = None, enabled: bool = True) -> CacheChoice:
    """The cache `setting` (`loop.train.compilation_cache_dir`) stands for on `platform`
    (`jax.default_backend()`), given the environment `env`, the directory already in jax's
    config (`configured`: jax reads JAX_COMPILATION_CACHE_DIR into it at import, and code may
    set it later) and `jax_enable_compilation_cache` (`enabled`, which 'auto' respects);
    pure, see the module docstring for the rules."""
    env = os.environ if env is None else env
    if setting is None or setting == "":
        return CacheChoice(None, "off: loop.train.compilation_cache_dir is empty")
    if setting != AUTO:
        return CacheChoice(setting, "loop.train.compilation_cache_dir")
    if not enabled:
        return CacheChoice(None, "off: jax_enable_compilation_cache is False")
    if configured:
        return CacheChoice(configured, DIR_ENV if env.get(DIR_ENV) == configured
                           else "jax_compilation_cache_dir, set in this process")
    if env.get(DIR_ENV):  # set after jax was imported, or replaced by an earlier run's path
        return CacheChoice(env[DIR_ENV], DIR_ENV)
    if platform in ACCELERATORS:
        return CacheChoice(default_dir(env), f"the default on {platform}")
    return CacheChoice(None, f"off: the default on {platform} (set "
                             "loop.train.compilation_cache_dir to a directory to cache)")


def unwritable(path: str) -> str | None:
    """Why the local directory `path` cannot hold the cache (created when missing), or None
    when a file can be written there. A remote path (gs://) is not checked: probing a bucket
    needs its client, and jax warns at a failed write and compiles as usual."""
    if md.is_remote(path):
        return None
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write_check_"):
            pass
    except OSError as e:
        return e.strerror or str(e)
    return None


def _min_compile_secs(env: Mapping[str, str]) -> float:
    """Sets `MIN_COMPILE_SECS` unless the environment or this process's config chose a
    threshold; returns the one in force."""
    current = jax.config.jax_persistent_cache_min_compile_time_secs
    if MIN_TIME_ENV not in env and current == _JAX_DEFAULT_MIN_COMPILE_SECS:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_SECS)
        return MIN_COMPILE_SECS
    return current


def _set_dir(path: str | None) -> None:
    """Puts `path` in jax's config; jax opens its cache once, at the first compile that
    looks, so a change after that also resets it (the next compile opens `path`)."""
    if jax.config.jax_compilation_cache_dir != path:
        from jax.experimental.compilation_cache import compilation_cache

        jax.config.update("jax_compilation_cache_dir", path)
        compilation_cache.reset_cache()
    if path and not jax.config.jax_enable_compilation_cache:
        jax.config.update("jax_enable_compilation_cache", True)
    _set_by_us[:] = [path]


def configure(setting: str | None, platform: str | None = None,
              env: Mapping[str, str] | None = None,
              process_count: int | None = None) -> tuple[CacheChoice, str]:
    """Applies `setting` to jax's (process-wide) config before the run's first compile; returns
    the cache in force and the line that says so (`loop.train` prints it). A directory an earlier
    `configure` of this process set is not taken for the user's under 'auto'. An unwritable
    local directory is one WARNING, and the run goes on without a cache. With several processes
    (`process_count`, default jax's) the line says when the cache is the per-user default: jax
    writes from process 0 only, so the other hosts find nothing in their own directory."""
    env = os.environ if env is None else env
    process_count = jax.process_count() if process_count is None else process_count
    configured = jax.config.jax_compilation_cache_dir
    if _set_by_us and configured == _set_by_us[0]:
        configured = None  # ours, from an earlier run in this process: not the user's
    choice = resolve(setting, platform or jax.default_backend(), env, configured,
                     jax.config.jax_enable_compilation_cache)
    if choice.path and not md.is_remote(choice.path):  # '~/cache', 'cache': as jax will use it
        choice = dataclasses.replace(
            choice, path=os.path.abspath(os.path.expanduser(choice.path)))
    why = choice.path and unwritable(choice.path)
    if why:
        logger.warning("compilation cache %s (%s) is not writable (%s): this run compiles "
                       "without a persistent cache", choice.path, choice.source, why)
        choice = CacheChoice(None, f"off: {choice.path} is not writable")
    _set_dir(choice.path)
    if choice.path is None:
        return choice, f"compilation cache: {choice.source}"
    line = (f"compilation cache: {choice.path} ({choice.source}; compiles of "
            f">= {_min_compile_secs(env):g} s are written)")
    if process_count > 1 and choice.source.startswith("the default"):
        line += (f"; only process 0 writes, so the other {process_count - 1} processes compile "
                 "at every start: give a directory all hosts share (gs://...)")
    return choice, line


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """The train step's compile: trace + lower + compile, timed, and what the cache did."""

    seconds: float  # all of it
    backend_seconds: float  # XLA's part: the compile, or the executable's read on a hit
    cache_dir: str | None  # the persistent cache in force (None: none)
    cache_hit: bool  # the executable was loaded from the persistent cache
    written: bool  # it was compiled and written to the persistent cache
    compiled: bool  # False: this process had compiled it already (its in-memory cache)

    def timing(self) -> str:
        """The time and its parts: a cache hit saves XLA's compile, not the tracing and
        lowering that come before it (which compute the cache key)."""
        return (f"{self.seconds:.1f} s (trace + lower {self.seconds - self.backend_seconds:.1f}"
                f" s, XLA {self.backend_seconds:.1f} s)")

    def describe(self) -> str:
        """What happened, in a few words (the trainer's "step compiled" line)."""
        if not self.compiled:
            return "already compiled in this process"
        if self.cache_hit:
            return "persistent compilation cache hit"
        if self.cache_dir is None:
            return "no persistent compilation cache"
        if self.written:
            return "compiled, written to the persistent compilation cache"
        return ("compiled, not cached (faster than jax_persistent_cache_min_compile_time_secs, "
                "or not process 0)")


def compile_timed(jitted: Any, *args: Any, cache_dir: str | None) -> CompileReport:
    """Traces, lowers and compiles `jitted` (a `jax.jit` function) for `args`, timed, and
    whether jax found the executable in the persistent cache at `cache_dir` (None: none in
    force). The jit keeps what it compiled: its first call with `args` (arrays of the same
    shapes, dtypes and shardings) runs the executable without compiling again. `args` may be
    `jax.ShapeDtypeStruct`s with shardings (`train.compile_ahead` compiles the first step so,
    before any batch exists). Only this thread's events count (`CompileEvents`), so a compile
    on another thread meanwhile (the run's prefill while the step compiles ahead) is not
    taken for this one."""
    with CompileEvents() as seen:
        start = time.perf_counter()
        jitted.lower(*args).compile()
        seconds = time.perf_counter() - start
    return CompileReport(seconds=seconds, backend_seconds=seen.backend_seconds,
                         cache_dir=cache_dir, cache_hit=seen.hits > 0, written=seen.writes > 0,
                         compiled=seen.count > 0)


class CompileEvents:
    """jax's compile events that this thread records while the block runs: backend compiles
    (persistent-cache hits included) and their seconds, cache hits and writes. For
    `compile_timed`, and the loop's check that the first call ran the executable compiled
    before it instead of compiling again (`count` 0). jax records them in the thread that
    compiles, so another thread's compiles are not counted."""

    def __init__(self) -> None:
        self.count = 0  # backend compiles
        self.backend_seconds = 0.0
        self.hits = 0
        self.writes = 0
        self._here = threading.get_ident()

    def _on_event(self, event: str, **_: Any) -> None:
        if threading.get_ident() != self._here:
            return
        if event == HIT_EVENT:
            self.hits += 1
        elif event == WRITE_EVENT:
            self.writes += 1

    def _on_duration(self, event: str, duration: float, **_: Any) -> None:
        if event == BACKEND_COMPILE_EVENT and threading.get_ident() == self._here:
            self.count += 1
            self.backend_seconds += duration

    def __enter__(self) -> "CompileEvents":
        self._here = threading.get_ident()
        jax.monitoring.register_event_listener(self._on_event)
        jax.monitoring.register_event_duration_secs_listener(self._on_duration)
        return self

    def __exit__(self, *exc: Any) -> None:
        jax.monitoring.unregister_event_listener(self._on_event)
        jax.monitoring.unregister_event_duration_listener(self._on_duration)
