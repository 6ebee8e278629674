"""Gin plumbing for the CLIs: `--gin.NAME=VALUE` rewriting, file lookup, parsing.

Python stays gin-free (t5x style): only `loop.train` and the classes the .gin files name are
configurable, through `from __gin__ import dynamic_registration` inside the .gin files.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from typing import Any

import gin

# The directory that holds `xlm_jax` and `tasks`: the repository in a checkout or an editable
# install, site-packages (or a --target directory) after `pip install .`.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# gin_configs/ of a checkout, and where a wheel installs it (setup.py: `xlm_jax/gin_configs`).
GIN_CONFIG_DIRS = (os.path.join(PACKAGE_ROOT, "gin_configs"),
                   os.path.join(PACKAGE_ROOT, "xlm_jax", "gin_configs"))


# The run files leave their data and schedule length to the user (required macros); tools that
# compile or time a run file without its data (`xlm_jax.bench`, `xlm_jax.pod_memory`) bind
# these, with synthetic streams standing in for the tasks. An unused macro binding is harmless.
SYNTHETIC_RUN_MACROS: tuple[str, ...] = (
    "TRAIN_STEPS = 1000000", "MONO_TASK = 'synthetic:mono'", "PAIR_TASK = 'synthetic:pair'",
    "TASK_MODULES = []", "XLCO_TASK = 'synthetic:mixup'", "VECO_MONO_TASK = 'synthetic:veco'",
    "VECO_BI_TASK = 'synthetic:pair'", "TARGET_LANGUAGES = ['de', 'fr']", "INIT_FROM = None")


def default_search_paths() -> list[str]:
    """Where gin files are looked for after `--gin_search_paths`: the working directory (at
    call time), the shipped gin_configs (checkout or installed) and the package root."""
    return [os.getcwd(), *(d for d in GIN_CONFIG_DIRS if os.path.isdir(d)), PACKAGE_ROOT]


def rewrite_gin_args(argv: Sequence[str]) -> list[str]:
    """`--gin.NAME=VALUE` -> `--gin_bindings=NAME=VALUE` (t5x's convention)."""
    out = []
    for arg in argv:
        if arg.startswith("--gin.") and "=" in arg:
            name, value = arg[len("--gin."):].split("=", 1)
            out.append(f"--gin_bindings={name} = {value}")
        else:
            out.append(arg)
    return out


def find_gin_file(path: str, search_paths: Sequence[str]) -> str:
    """Absolute path of a gin file; the error lists every place it looked."""
    candidates = [path] if os.path.isabs(path) else [os.path.join(p, path) for p in search_paths]
    for c in candidates:
        if os.path.isfile(c):
            return os.path.abspath(c)
    raise FileNotFoundError(f"gin file {path!r} not found; looked in: {', '.join(candidates)}")


def parse(gin_files: Sequence[str], bindings: Sequence[str],
          search_paths: Sequence[str] = (), check_required: bool = True) -> list[str]:
    """Parses files and bindings; unknown configurables/parameters raise here, before any
    model is built or compiled. Returns the resolved file paths."""
    paths = list(search_paths) + default_search_paths()
    files = [find_gin_file(f, paths) for f in gin_files]
    for p in paths:
        if os.path.isdir(p):
            gin.add_config_file_search_path(p)
    _make_file_checks_safe()
    with _quiet_include_lookup():
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
    resolve_shipped_paths()
    missing = missing_required_macros() if check_required else []
    if missing:
        raise ValueError(f"required gin macro(s) not set: {', '.join(missing)} (set them with "
                         f"--gin.{missing[0]}=VALUE; files: {', '.join(files)})")
    return files


def resolve_shipped_paths(root: str = PACKAGE_ROOT) -> dict[str, Any]:
    """Rebinds every bound string that is a relative path (it has a '/') missing from the
    working directory but present under `root` to its absolute path under `root`; returns
    {binding: new value}.

    Why: the gin files name the shipped data relative to the package root, as
    `spm_model = 'tasks/demo_data/spm.model'` (what a run from the repository root reads).
    After `pip install .`, or from another directory, the same file lies under `root`, so
    a run works from any directory; a path that exists from the working directory wins."""

    def resolve(value: Any) -> Any:
        if isinstance(value, str):
            if ("/" in value and not os.path.isabs(value) and "://" not in value
                    and not os.path.exists(value) and os.path.exists(os.path.join(root, value))):
                return os.path.join(root, value)
            return value
        if isinstance(value, (list, tuple)):
            items = [resolve(v) for v in value]
            changed = any(a is not b for a, b in zip(items, value))
            return type(value)(items) if changed else value
        if isinstance(value, dict):
            items = {k: resolve(v) for k, v in value.items()}
            return items if any(items[k] is not value[k] for k in value) else value
        return value

    rebound = {}
    for (scope, selector), params in list(gin.config._CONFIG.items()):  # no public listing
        for name, value in list(params.items()):
            new = resolve(value)
            if new is not value:
                key = f"{scope + '/' if scope else ''}{selector}.{name}"
                params[name] = new  # what gin.bind_parameter does, without re-parsing the key
                rebound[key] = new
    return rebound


def missing_required_macros() -> list[str]:
    """Macros still bound to `%gin.REQUIRED` after parsing (gin itself would only notice when
    the value reaches a call, with a message that does not name the macro)."""
    missing = []
    for (scope, selector), params in gin.config._CONFIG.items():  # gin has no public listing
        if selector == "gin.macro" and repr(params.get("value")) == "%gin.REQUIRED":
            missing.append(scope)
    return sorted(missing)


@contextlib.contextmanager
def _quiet_include_lookup() -> Iterator[None]:
    """gin logs an ERROR for every search path an `include` is not found in before the one it
    is found in; a truly missing include still raises, so those lines are only noise."""
    logging.disable(logging.ERROR)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


def _make_file_checks_safe() -> None:
    """gin also looks an include such as 'models/tiny.gin' up as a python package resource
    ('models'); when an unrelated namespace package of that name is importable its check
    raises TypeError instead of answering False. Wrap every check so it answers False."""
    readers = gin.config._FILE_READERS  # gin offers no public way to adjust them
    for i, (reader, check) in enumerate(readers):
        if getattr(check, "_never_raises", False):
            continue

        def safe(path: str, _check=check) -> bool:
            try:
                return bool(_check(path))
            except Exception:  # noqa: BLE001 - "cannot tell" means "not here"
                return False

        safe._never_raises = True
        readers[i] = (reader, safe)
