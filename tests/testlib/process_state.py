"""The process-wide state a test can leave behind, read cheaply, compared and put back.

A test that changes gin's registry or configuration, seqio's registries, a jax flag, an
environment variable, the working directory, `sys.path`, a logger or the prepared-data
choice (`xlm_jax.data.prepared.choice`: its scopes and 0.2's deprecated `use`) and does not
undo it changes what every later test in the same process sees: the later test then passes or
fails by the schedule (issue 56: a gin registration left by one file broke another only when
both ran on one worker).
`tests/testlib/leak_check.py` takes a `snapshot()` around every test and module and fails the
one that changed something.

Reading the state imports nothing: a library the process has not imported (gin, seqio, jax,
xlm_jax's data package) has no state to read, so its category is simply absent.

What a module does when it is first imported is process-wide by design (seqio tasks a tasks
module registers, gin configurables its decorators register, the variables jax and TensorFlow
put in the environment, their loggers): importing it again is a no-op, so undoing it would
break every later test. `ImportObserver` records what each first import changed, and only
those changes, with those values, are allowed; `importlib.reload` re-runs a module
deliberately and is not a first import (a reload that re-registers a task changes it for the
tests after).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import Any

# A snapshot: {category: {key: value}}; a key absent from a category means "not set".
State = dict[str, dict[Hashable, Any]]
# What a comparison found: {(category, key): (before, after)}, `MISSING` for "not set".
Changes = dict[tuple[str, Hashable], tuple[Any, Any]]

MISSING: Any = type("Missing", (), {"__repr__": lambda self: "<not set>"})()
_PRIMITIVES = (str, bytes, int, float, bool, complex, type(None))
_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGUSR2")


def same(a: Any, b: Any) -> bool:
    """Whether two recorded values are the same state: primitives by value, containers
    element by element, anything else by identity (a bound numpy array or a provider object
    has no cheap or safe `==`)."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, _PRIMITIVES):
        return a == b
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, frozenset):
        return a == b
    return False


# ------------------------------------------------------------------------------- the readers

def _environment() -> dict[Hashable, Any]:
    """os.environ, less pytest's own PYTEST_CURRENT_TEST (it names the phase that runs)."""
    env = dict(os.environ)
    env.pop("PYTEST_CURRENT_TEST", None)
    return env


# Python's freeze count when the first snapshot is taken: CPython 3.12 counts its immortal
# objects there (375 in 3.12.1), 0 on 3.11. Objects frozen beyond it are someone's.
_FROZEN_AT_START: list[int] = []
FROZEN = "objects frozen out of the collector"


def _process() -> dict[Hashable, Any]:
    """The working directory, `sys.path`, the handlers of the signals a trainer may catch and
    whether objects are frozen out of the garbage collector (the step loop freezes its heap,
    `xlm_jax.train.host_gc`, and must unfreeze it when it leaves)."""
    import gc
    import signal  # the standard library, imported by pytest already

    try:
        cwd: Any = os.getcwd()
    except FileNotFoundError:  # a test chdir'ed into a directory that is gone now
        cwd = "<a removed directory>"
    if not _FROZEN_AT_START:
        _FROZEN_AT_START.append(gc.get_freeze_count())
    out: dict[Hashable, Any] = {"working directory": cwd, "sys.path": tuple(sys.path),
                                FROZEN: gc.get_freeze_count() > _FROZEN_AT_START[0]}
    for name in _SIGNALS:
        number = getattr(signal, name, None)
        if number is not None:
            out[f"signal handler {name}"] = signal.getsignal(number)
    return out


def _is_pytest_handler(handler: logging.Handler) -> bool:
    """pytest's capture handlers, which it adds and removes around each test phase itself."""
    return type(handler).__module__.startswith("_pytest")


_DEFAULT_LOGGER = (logging.NOTSET, (), True, False)


def _logging() -> dict[Hashable, Any]:
    """Per logger: (level, handlers, propagate, disabled), for loggers not in the default
    state (a logger that merely exists is no state); the root logger and
    `logging.disable`'s level always."""
    manager = logging.Logger.manager
    out: dict[Hashable, Any] = {"logging.disable": manager.disable}
    loggers = [("<root>", logging.root)] + list(manager.loggerDict.items())
    for name, logger in loggers:
        if not isinstance(logger, logging.Logger):  # a PlaceHolder
            continue
        handlers = tuple(h for h in logger.handlers if not _is_pytest_handler(h))
        state = (logger.level, handlers, logger.propagate, logger.disabled)
        if name == "<root>" or state != _DEFAULT_LOGGER:
            out[f"logger {name}"] = state
    return out


def gin_globals(config: Any) -> dict[str, dict[Hashable, Any]]:
    """gin's process-wide state, from its `gin.config` module: the registry (selector ->
    configurable), the inverse registry (object -> the configurable gin uses for it; what
    dynamic registration looks a class up in), the bindings, and the rest of its globals.
    `tests/testlib/gin_state.py` puts them back."""
    registry = dict(config._REGISTRY.items())
    inverse = {(getattr(k, "__module__", None), getattr(k, "__qualname__", repr(k)), id(k)):
               (k, v) for k, v in config._INVERSE_REGISTRY.items()}
    bindings = {key: dict(params) for key, params in config._CONFIG.items()}
    with config._OPERATIVE_CONFIG_LOCK:
        operative = {key: dict(params) for key, params in config._OPERATIVE_CONFIG.items()}
    other: dict[Hashable, Any] = {
        "imports": frozenset(config._IMPORTS),
        "operative config": operative,
        "singletons": dict(config._SINGLETONS),
        "constants": dict(config._CONSTANTS.items()),
        "renamed selectors": dict(config._RENAMED_SELECTORS),
        "file readers": tuple(config._FILE_READERS),
        "config file search paths": tuple(config._LOCATION_PREFIXES),
        "finalize hooks": tuple(config._FINALIZE_HOOKS),
        "config locked": config._CONFIG_IS_LOCKED,
        "interactive mode": config._INTERACTIVE_MODE,
        "active scopes": tuple(tuple(s) for s in config._SCOPE_MANAGER.active_scopes),
        "parse contexts": tuple(config._PARSE_CONTEXTS),
    }
    return {"gin registry": registry, "gin inverse registry": inverse,
            "gin bindings": bindings, "gin": other}


def _seqio(providers: Any) -> dict[Hashable, Any]:
    return {(kind, name): provider
            for kind, registry in (("task", providers.TaskRegistry),
                                   ("mixture", providers.MixtureRegistry))
            for name, provider in getattr(registry, "_REGISTRY", {}).items()}


def _jax(config: Any) -> dict[Hashable, Any]:
    values = getattr(config, "values", None)
    return dict(values) if isinstance(values, dict) else {}


def _prepared() -> dict[Hashable, Any]:
    """What makes registrations read prepared data or none (`data.prepared.choice`): its
    scopes (`preparing`, `selecting`, `reading`; each a context, None outside one) and the
    deprecated process-wide default of `use`."""
    choice = sys.modules.get("xlm_jax.data.prepared.choice")
    if choice is None:
        return {}
    return {name: getattr(choice, name)[0] for name in PREPARED_CELLS}


TEMPORARY_MODULES = "modules imported from a temporary directory"
_TEMP_ROOTS: tuple[str, ...] = ()
_ORIGIN: dict[tuple[str, int], bool] = {}  # (name, id(module)) -> from a test's directory


def is_temporary(path: Any) -> bool:
    """Whether a module file lies under pytest's temporary directories (`tmp_path` and
    `tmp_path_factory`: `<tmp>/pytest-of-<user>/`), where tests write tasks modules."""
    global _TEMP_ROOTS
    if not _TEMP_ROOTS:
        import tempfile  # the standard library, imported by pytest already

        bases = {tempfile.gettempdir(), os.path.realpath(tempfile.gettempdir())}
        _TEMP_ROOTS = tuple(os.path.join(b, "pytest-of-") for b in bases)
    return isinstance(path, str) and path.startswith(_TEMP_ROOTS)


def _temporary_modules() -> dict[Hashable, Any]:
    """Modules imported from a test's temporary directory (a tasks module it wrote): left in
    `sys.modules`, the next test that imports the same name gets this one, bound to the first
    test's files (issue 56: `prep_tasks` imported by one file read another file's corpus,
    deleted by then). The library's and installed modules never lie there, so this stays
    empty between tests (`temp_modules.importable` forgets them)."""
    out: dict[Hashable, Any] = {}
    for name, module in list(sys.modules.items()):
        key = (name, id(module))
        temp = _ORIGIN.get(key)
        if temp is None:
            temp = _ORIGIN[key] = is_temporary(getattr(module, "__file__", None))
        if temp:
            out[name] = module
    return out


# `data.prepared.choice`'s state, one-element lists.
PREPARED_CELLS = ("_PREPARING", "_SELECTING", "_READING", "_DEFAULT")


def snapshot() -> State:
    """The state now, of the libraries this process has imported (none is imported here)."""
    state: State = {"environment": _environment(), "process": _process(),
                    "logging": _logging(), "prepared data": _prepared(),
                    TEMPORARY_MODULES: _temporary_modules()}
    gin_config = sys.modules.get("gin.config")
    if gin_config is not None and hasattr(gin_config, "_OPERATIVE_CONFIG_LOCK"):
        state.update(gin_globals(gin_config))
    providers = sys.modules.get("seqio.dataset_providers")
    if providers is not None and hasattr(providers, "MixtureRegistry"):
        state["seqio registries"] = _seqio(providers)
    jax = sys.modules.get("jax")
    if jax is not None and hasattr(jax, "config"):
        state["jax config"] = _jax(jax.config)
    return state


def compare(before: State, after: State) -> Changes:
    """Every key whose value differs; a category present on one side only (its library was
    imported in between) compares against an empty one."""
    out: Changes = {}
    for category in before.keys() | after.keys():
        b, a = before.get(category, {}), after.get(category, {})
        if b is a:
            continue
        for key in b.keys() | a.keys():
            old, new = b.get(key, MISSING), a.get(key, MISSING)
            if not same(old, new):
                out[(category, key)] = (old, new)
    return out


# --------------------------------------------------------------------------- first imports

def _stable_snapshot() -> State:
    """`snapshot()` taken off the main thread, where another thread may change a dict while
    it is read (RuntimeError: dictionary changed size): read again."""
    for _ in range(9):
        try:
            return snapshot()
        except RuntimeError:
            continue
    return snapshot()


class Watch:
    """One window (a test, a module): the state at its start, and what first imports changed
    inside it, `{(category, key): value right after the import}`."""

    def __init__(self) -> None:
        self.before = snapshot()
        self.imported: dict[tuple[str, Hashable], Any] = {}

    def expected(self) -> State:
        """The state at the start with what first imports changed since: what the window
        must leave."""
        if not self.imported:
            return self.before
        out = {category: dict(values) for category, values in self.before.items()}
        for (category, key), value in self.imported.items():
            values = out.setdefault(category, {})
            if value is MISSING:
                values.pop(key, None)
            else:
                values[key] = value
        return out

    def leaks(self) -> tuple[State, Changes]:
        """(the state now, its differences from `expected()`: what the window changed that
        no first import did, or changed again after an import did)."""
        now = snapshot()
        return now, compare(self.expected(), now)


class ImportObserver:
    """Records the state changes of every first import made while a `Watch` is open, into
    every open watch. A first import is one that executes the module (CPython's
    `importlib._bootstrap._load_unlocked`); the outermost one of each thread is recorded, so
    the changes of the modules it imports in turn are its own. Other threads count too: a
    library may import lazily on its I/O thread (gcsfs does)."""

    def __init__(self, bootstrap: Any) -> None:
        self._watches: list[Watch] = []
        self._local = threading.local()
        self._original: Callable[[Any], Any] = bootstrap._load_unlocked

        def _load_unlocked(spec: Any) -> Any:
            if (not self._watches or getattr(self._local, "depth", 0)
                    or is_temporary(getattr(spec, "origin", None))):
                # a module a test wrote is the test's doing, its registrations too (the
                # first imports it makes in turn are observed on their own)
                return self._original(spec)
            self._local.depth = 1
            before = _stable_snapshot()
            try:
                return self._original(spec)
            finally:
                after = _stable_snapshot()
                self._local.depth = 0
                for key, (_, value) in compare(before, after).items():
                    for watch in list(self._watches):
                        watch.imported[key] = value

        _load_unlocked.observer = self  # type: ignore[attr-defined]
        bootstrap._load_unlocked = _load_unlocked

    def open(self) -> Watch:
        watch = Watch()
        self._watches.append(watch)
        return watch

    def close(self, watch: Watch) -> None:
        self._watches.remove(watch)


@contextlib.contextmanager
def restored(*prefixes: str) -> Iterator[None]:
    """Runs the block, then puts the categories whose names start with one of `prefixes`
    ("gin", "seqio", "environment", ...) back as they were, less what first imports did
    inside it (the modules stay imported). For tests that must change such state on purpose:
    re-register a task, parse gin files."""
    watch = open_watch()
    try:
        yield
    finally:
        close_watch(watch)
        _, changes = watch.leaks()
        failed = put_back({k: v for k, v in changes.items() if k[0].startswith(prefixes)})
        if failed:
            raise RuntimeError("could not put the state back: " + "; ".join(failed))


def observer() -> ImportObserver | None:
    """The process's observer, installed on first use (one per process, however this module
    was imported); None where the interpreter has no `_load_unlocked` to observe (then a first
    import's changes count as the test's)."""
    import importlib._bootstrap as bootstrap  # the frozen module the import system runs

    current = getattr(bootstrap, "_load_unlocked", None)
    if current is None:
        return None
    installed = getattr(current, "observer", None)
    return installed if installed is not None else ImportObserver(bootstrap)


def open_watch() -> Watch:
    obs = observer()
    return obs.open() if obs is not None else Watch()


def close_watch(watch: Watch) -> None:
    obs = observer()
    if obs is not None and watch in obs._watches:
        obs.close(watch)


# ------------------------------------------------------------------------------ putting back

def _put_back_gin(config: Any, category: str, key: Hashable, old: Any, new: Any) -> None:
    """Sets one of gin's globals (`gin_globals`' names) back to `old`."""
    if category == TEMPORARY_MODULES:
        return f"<module from {getattr(value, '__file__', '?')}>"
    if category == "gin registry":
        if old is MISSING:
            config._REGISTRY.pop(key)
        else:
            config._REGISTRY[key] = old
    elif category == "gin inverse registry":
        if old is MISSING:
            config._INVERSE_REGISTRY.pop(new[0], None)
        else:
            config._INVERSE_REGISTRY[old[0]] = old[1]
    elif category == "gin bindings":
        if old is MISSING:
            config._CONFIG.pop(key, None)
        else:
            config._CONFIG[key] = dict(old)
    elif key == "imports":
        config._IMPORTS.clear()
        config._IMPORTS.update(old)
    elif key == "operative config":
        with config._OPERATIVE_CONFIG_LOCK:
            config._OPERATIVE_CONFIG.clear()
            config._OPERATIVE_CONFIG.update({k: dict(v) for k, v in old.items()})
    elif key in ("singletons", "renamed selectors"):
        target = config._SINGLETONS if key == "singletons" else config._RENAMED_SELECTORS
        target.clear()
        target.update(old)
    elif key == "constants":
        config._CONSTANTS.clear()
        for name, value in old.items():
            config._CONSTANTS[name] = value
    elif key in ("file readers", "config file search paths", "finalize hooks",
                 "parse contexts"):
        target = {"file readers": config._FILE_READERS,
                  "config file search paths": config._LOCATION_PREFIXES,
                  "finalize hooks": config._FINALIZE_HOOKS,
                  "parse contexts": config._PARSE_CONTEXTS}[key]
        target[:] = list(old)
    elif key == "config locked":
        config._set_config_is_locked(old)
    elif key == "interactive mode":
        config._INTERACTIVE_MODE = old
    elif key == "active scopes":
        config._SCOPE_MANAGER._active_scopes = [list(s) for s in old]


def _put_back_logger(key: str, old: Any) -> None:
    if key == "logging.disable":
        logging.disable(old)
        return
    name = key[len("logger "):]
    logger = logging.root if name == "<root>" else logging.getLogger(name)
    level, handlers, propagate, disabled = _DEFAULT_LOGGER if old is MISSING else old
    kept = [h for h in logger.handlers if _is_pytest_handler(h)]
    logger.handlers[:] = list(handlers) + kept
    logger.setLevel(level)
    logger.propagate, logger.disabled = propagate, disabled


def _put_back_process(key: str, old: Any) -> None:
    import signal

    if key == FROZEN and old is False:
        import gc

        gc.unfreeze()
    elif key == "working directory" and old is not MISSING and os.path.isdir(old):
        os.chdir(old)
    elif key == "sys.path":
        sys.path[:] = list(old)
    elif key.startswith("signal handler ") and old is not None and old is not MISSING:
        signal.signal(getattr(signal, key[len("signal handler "):]), old)


def put_back(changes: Changes) -> list[str]:
    """Sets every changed key back to its value before (or unsets it), so that one test's leak
    fails that test only. Returns what could not be put back (one line each)."""
    failed = []
    for (category, key), (old, new) in changes.items():
        try:
            if category == "environment":
                if old is MISSING:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = old
            elif category == "process":
                _put_back_process(key, old)
            elif category == "logging":
                _put_back_logger(key, old)
            elif category == "prepared data":  # not there before: its first import's value
                if old is not MISSING:
                    getattr(sys.modules["xlm_jax.data.prepared.choice"], key)[0] = old
            elif category.startswith("gin"):
                _put_back_gin(sys.modules["gin.config"], category, key, old, new)
            elif category == "seqio registries":
                providers = sys.modules["seqio.dataset_providers"]
                registry = (providers.TaskRegistry if key[0] == "task"
                            else providers.MixtureRegistry)._REGISTRY
                if old is MISSING:
                    registry.pop(key[1], None)
                else:
                    registry[key[1]] = old
            elif category == TEMPORARY_MODULES:
                if old is MISSING:
                    sys.modules.pop(key, None)
                else:
                    sys.modules[key] = old
            elif category == "jax config" and old is not MISSING:
                sys.modules["jax"].config.update(key, old)
        except Exception as e:  # noqa: BLE001 - reported, and the test fails anyway
            failed.append(f"{category}: {_key_text(category, key)}: {type(e).__name__}: {e}")
    return failed


# ------------------------------------------------------------------------------- reporting

def _key_text(category: str, key: Hashable) -> str:
    if category == "gin inverse registry" and isinstance(key, tuple):
        return f"{key[0]}.{key[1]}"
    if category == "seqio registries" and isinstance(key, tuple):
        return f"{key[0]} {key[1]!r}"
    if category == "gin bindings" and isinstance(key, tuple):
        scope, selector = key
        return f"{scope + '/' if scope else ''}{selector}"
    return str(key)


def _value_text(category: str, value: Any) -> str:
    if value is MISSING:
        return "<not set>"
    if category == "gin inverse registry":
        return f"-> {value[1].selector}"
    if category == TEMPORARY_MODULES:
        return f"<module from {getattr(value, '__file__', '?')}>"
    if category == "gin registry":
        return (f"({getattr(value.wrapped, '__module__', '?')}."
                f"{getattr(value.wrapped, '__qualname__', '?')})")
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def describe(changes: Changes, limit: int = 12) -> list[str]:
    """One line per change, `category: key: before -> after`, sorted; the first `limit`."""
    lines = []
    for (category, key), (old, new) in changes.items():
        if old is MISSING:
            what = f"added {_value_text(category, new)}"
        elif new is MISSING:
            what = f"removed (was {_value_text(category, old)})"
        else:
            what = f"{_value_text(category, old)} -> {_value_text(category, new)}"
        lines.append(f"{category}: {_key_text(category, key)}: {what}")
    lines.sort()
    return lines[:limit] + ([f"... and {len(lines) - limit} more"] if len(lines) > limit else [])


def categories(changes: Changes) -> Iterator[str]:
    return iter(sorted({category for category, _ in changes}))
