"""Which data a registered task reads, the raw files or a prepared directory, and where that
is chosen: by the run, where it builds its datasets.

seqio chooses its cache where a dataset is built (`Task.get_dataset(use_cached=True)`), not
where the Task is registered; a task module here registers its corpora once, and the run that
builds datasets from them chooses the data: `loop.train(prepared_data=ROOT)` (or
`registry.select_prepared(TASKS, ROOT)` for a program of its own) replays the registration
calls behind its tasks with ROOT (`Recipe`), and with None the raw files again. Nothing has to
be set before a task module is imported, and nothing outlives the choice but the registrations
themselves, as with any seqio registration.

Three scopes, innermost first, decide what a `registry.register_*` call reads
(`root_for`); each is a context, put back when it ends:
- `preparing()`: nothing prepared and nothing counted (`data.prepared.prepare` registers the
  raw tasks to learn their corpus files);
- `selecting(root)`: exactly `root` (None: the raw files): a replay by `select_prepared`;
- `reading(root)`: `root` where it holds any of the call's tasks: how the run imports its task
  modules, so that a pod host that holds only the prepared data (no raw files) can register
  them at all.
A call's own `prepared_dir=` comes before all three (its module's choice), and before the
deprecated process-wide default of `use` (0.2's switch, kept for one release).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import ModuleType
from typing import Any, Optional

from xlm_jax import cli_help
from xlm_jax.data.prepared import shard_files as pf

__all__ = ["preparing", "reading", "selecting", "root_for", "Recipe", "use", "default_dir",
           "register_from"]

_UNSET = object()
_PREPARING = [False]
_SELECTING: list[Any] = [_UNSET]
_READING: list[Optional[str]] = [None]
_DEFAULT: list[Optional[str]] = [None]  # `use`, deprecated


@contextlib.contextmanager
def _set(cell: list, value: Any) -> Iterator[None]:
    before, cell[0] = cell[0], value
    try:
        yield
    finally:
        cell[0] = before


def preparing() -> contextlib.AbstractContextManager[None]:
    """Registrations inside read no prepared data and count nothing (their rates are
    placeholders, equal): `data.prepared.prepare` counts the corpora itself, in parallel."""
    return _set(_PREPARING, True)


def is_preparing() -> bool:
    return _PREPARING[0]


def selecting(root: Optional[str]) -> contextlib.AbstractContextManager[None]:
    """Registrations inside read exactly `root` (None: their raw files)."""
    return _set(_SELECTING, root or None)


def reading(root: Optional[str]) -> contextlib.AbstractContextManager[None]:
    """Registrations inside read `root` wherever it holds any of the call's tasks (then all of
    them), their raw files otherwise: importing task modules for a run on `root`."""
    return _set(_READING, root or None)


def root_for(prepared_dir: Optional[str], task_names: Sequence[str]) -> Optional[str]:
    """The prepared directory a registration of `task_names` reads, None for the raw files: its
    own `prepared_dir`, else the innermost scope's choice (module docstring). A root that holds
    none of the tasks is not chosen by `reading`: a task module registering several corpora
    can run with only some prepared; a run that uses an unprepared one is stopped by the
    trainer (`train.streams.import_modules`)."""
    if _PREPARING[0]:
        return None
    if prepared_dir:
        return prepared_dir
    if _SELECTING[0] is not _UNSET:
        return _SELECTING[0]
    return _holding(_READING[0] or _DEFAULT[0], task_names)


def _holding(root: Optional[str], task_names: Sequence[str]) -> Optional[str]:
    """`root` when it holds any of `task_names` (then all of them are read from it), else None."""
    return root if root and any(pf.exists(os.path.join(root, t)) for t in task_names) else None


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A `registry.register_*` call as it was made, kept on the Tasks it registered, so that a
    run can register them again over other data. `own_root`: the call's own `prepared_dir`
    (its module's choice, which no run replaces); `uncounted`: made while `preparing` (its
    rates placeholders), so that any run registers them again."""

    function: Callable[..., Any]
    args: tuple
    kwargs: Mapping[str, Any]
    own_root: Optional[str]
    task_names: tuple[str, ...]
    uncounted: bool = False

    def replay(self, root: Optional[str]) -> Any:
        """The same call, reading `root` (None: the raw files)."""
        with selecting(root):
            return self.function(*self.args, **self.kwargs)

    def wanted(self, root: Optional[str]) -> Optional[str]:
        """What a run choosing `root` has these tasks read: `root` where it holds any of them
        (as `reading`), else the raw files; always the call's own prepared_dir if it gave one."""
        return self.own_root or _holding(root, self.task_names)


# ------------------------------------------------------------------- deprecated (0.2's names)

def _deprecated(name: str, instead: str) -> None:
    cli_help.warn_deprecated(f"xlm_jax.data.prepared.{name}", instead)


def use(root: Optional[str]) -> None:
    """Deprecated (kept for one release): a process-wide default for later registrations.
    A run chooses with `loop.train.prepared_data`; a program with `registry.select_prepared`."""
    _deprecated("use", "loop.train.prepared_data or registry.select_prepared")
    _DEFAULT[0] = root or None


def default_dir() -> Optional[str]:
    """Deprecated with `use`: its process-wide default."""
    return _DEFAULT[0]


def register_from(module: str, root: Optional[str]) -> ModuleType:
    """Deprecated (kept for one release): imports `module` (again if imported before) with its
    registrations reading `root` where it holds them. Use `registry.import_tasks`."""
    _deprecated("register_from", "registry.import_tasks")
    loaded = module in sys.modules
    with reading(root) if root else selecting(None):
        imported = importlib.import_module(module)
        if loaded:
            importlib.reload(imported)
    return imported
