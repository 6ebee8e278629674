"""Gin plumbing for the CLIs: `--gin.NAME=VALUE` rewriting, file lookup, parsing.

Python stays gin-free (t5x style): only `loop.train` and the classes the .gin files name are
configurable, through `from __gin__ import dynamic_registration` inside the .gin files.
"""
from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence

import gin

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_SEARCH_PATHS = (os.getcwd(), os.path.join(PACKAGE_ROOT, "gin_configs"), PACKAGE_ROOT)


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
    paths = list(search_paths) + list(DEFAULT_SEARCH_PATHS)
    files = [find_gin_file(f, paths) for f in gin_files]
    for p in paths:
        if os.path.isdir(p):
            gin.add_config_file_search_path(p)
    _make_file_checks_safe()
    with _quiet_include_lookup():
        gin.parse_config_files_and_bindings(files, bindings, finalize_config=False)
    missing = missing_required_macros() if check_required else []
    if missing:
        raise ValueError(f"required gin macro(s) not set: {', '.join(missing)} (set them with "
                         f"--gin.{missing[0]}=VALUE; files: {', '.join(files)})")
    return files


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
