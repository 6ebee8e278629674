"""Command-line gin bindings resolve names as the run's gin files do.

The shipped gin files register the classes they name through `from __gin__ import
dynamic_registration` and `import xlm_jax.train.evaluators as evaluators`: inside a file,
`@evaluators.TatoebaRetrieval()` finds its class through that import. gin parses the
command line's `--gin.NAME=VALUE` bindings as a text of their own, without the files'
imports, so the same reference there failed (`No configurable matching reference
'@evaluators.TatoebaRetrieval()'`), though docs/quickstart.md gives exactly that binding.

`preamble(bindings)` is the import block the bindings are parsed with (`gin_utils.parse`):
when the parsed files use dynamic registration, the files' own imports (their aliases), and,
for an alias the bindings use that no file imports, the module the shipped gin files import
under that alias (`evaluators` -> `xlm_jax.train.evaluators`; read from the shipped files, so
the two cannot drift). Our choice, what a gin file of the user's would hold: t5x documents the
same gap and asks users to repeat the import on the command line; here the shipped aliases
work as written. Without dynamic registration in the files, nothing is added (such files name
configurables registered by decorators, which need no import).
"""
from __future__ import annotations

import functools
import glob
import os
import re
from collections.abc import Sequence

import gin

DYNAMIC = "__gin__.dynamic_registration"
_IMPORT = re.compile(r"^\s*import\s+([\w.]+)\s+as\s+(\w+)\s*(?:#.*)?$")


@functools.lru_cache(maxsize=4)
def shipped_aliases(config_dirs: tuple[str, ...]) -> dict[str, str]:
    """{alias: module} of every `import MODULE as ALIAS` in the gin files under `config_dirs`
    (the shipped ones: `gin_utils.GIN_CONFIG_DIRS`), for the aliases that name one module
    only."""
    seen: dict[str, set[str]] = {}
    for root in config_dirs:
        for path in glob.glob(os.path.join(root, "**", "*.gin"), recursive=True):
            with open(path, encoding="utf-8") as f:
                for line in f:
                    m = _IMPORT.match(line)
                    if m:
                        seen.setdefault(m[2], set()).add(m[1])
    return {alias: next(iter(mods)) for alias, mods in seen.items() if len(mods) == 1}


def _file_imports() -> tuple[bool, dict[str, str]]:
    """(whether a parsed file enabled dynamic registration, {alias: module} of its imports
    that one alias names once)."""
    dynamic, aliases, clashing = False, {}, set()
    for statement in gin.config._IMPORTS:  # gin has no public listing of the parsed imports
        if statement.module == DYNAMIC:
            dynamic = True
            continue
        alias = statement.alias or (None if statement.is_from else statement.module)
        if not alias or statement.is_from:
            continue
        if aliases.get(alias, statement.module) != statement.module:
            clashing.add(alias)
        aliases[alias] = statement.module
    return dynamic, {a: m for a, m in aliases.items() if a not in clashing}


def preamble(bindings: Sequence[str], config_dirs: tuple[str, ...]) -> list[str]:
    """The import lines to parse `bindings` with (empty when the parsed files use no dynamic
    registration): the files' imports, and the alias (from the gin files under `config_dirs`)
    of each name the bindings use as `ALIAS.` that no file imports."""
    dynamic, aliases = _file_imports()
    if not dynamic:
        return []
    text = re.sub(r"'[^']*'|\"[^\"]*\"", "''", "\n".join(bindings))  # names, not strings
    for alias, module in sorted(shipped_aliases(tuple(config_dirs)).items()):
        if alias not in aliases and re.search(rf"(?<![\w.]){re.escape(alias)}\.", text):
            aliases[alias] = module
    return ["from __gin__ import dynamic_registration"] + [
        f"import {module} as {alias}" if alias != module else f"import {module}"
        for alias, module in sorted(aliases.items())]
