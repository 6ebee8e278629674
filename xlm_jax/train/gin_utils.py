"""Gin plumbing for the CLIs: `--gin.NAME=VALUE` rewriting, file lookup, parsing.

Python stays gin-free (t5x style): only `loop.train` and the classes the .gin files name are
configurable, through `from __gin__ import dynamic_registration` inside the .gin files.
"""
from __future__ import annotations

import contextlib
import difflib
import inspect
import io
import logging
import os
import re
import sys
import tokenize
from collections.abc import Iterator, Sequence
from typing import Any

import gin

from xlm_jax.train import gin_imports

# The directory that holds `xlm_jax` and `tasks`: the repository in a checkout or an editable
# install, site-packages (or a --target directory) after `pip install .`.
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# gin_configs/ of a checkout, and where a wheel installs it (setup.py: `xlm_jax/gin_configs`).
GIN_CONFIG_DIRS = (os.path.join(PACKAGE_ROOT, "gin_configs"),
                   os.path.join(PACKAGE_ROOT, "xlm_jax", "gin_configs"))
# The repository's tasks/ folder installs as the package `xlm_jax_tasks` (setup.py), so a
# shipped path the gin files write as 'tasks/demo_data/...' lies under that name in a wheel.
SHIPPED_ALIASES = (("tasks/", "xlm_jax_tasks/"),)


def shipped_path(path: str, root: str = PACKAGE_ROOT) -> str | None:
    """The absolute path of a relative shipped path (`tasks/demo_data/spm.model`) under
    `root`, as a checkout or an installed wheel holds it, or None when neither has it."""
    names = [path] + [new + path[len(old):] for old, new in SHIPPED_ALIASES
                      if path.startswith(old)]
    for name in names:
        if os.path.exists(os.path.join(root, name)):
            return os.path.join(root, name)
    return None


# The run files leave their data and schedule length to the user (required macros); tools that
# compile or time a run file without its data (`xlm_jax.accelerator.bench`,
# `xlm_jax.accelerator.pod_memory`, `xlm_jax.accelerator.lower`) bind these, with synthetic streams
# standing in for the tasks. They are placeholders: `parse` lets them go unused (a run file names
# only the tasks its objectives read), while an unused macro the user or a gin file binds is an
# error.
SYNTHETIC_RUN_MACROS: tuple[str, ...] = (
    "TRAIN_STEPS = 1000000", "MONO_TASK = 'synthetic:mono'", "PAIR_TASK = 'synthetic:pair'",
    "TASK_MODULES = []", "XLCO_TASK = 'synthetic:mixup_pair'",
    "VECO_MONO_TASK = 'synthetic:split_pair'", "VECO_BI_TASK = 'synthetic:split_pair'",
    "TARGET_LANGUAGES = ['de', 'fr']", "INIT_FROM = None")


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


class GinConfigError(ValueError):
    """A gin file or binding the run cannot use; the message is one line naming it."""


def parse(gin_files: Sequence[str], bindings: Sequence[str],
          search_paths: Sequence[str] = (), check_required: bool = True,
          placeholders: Sequence[str] = SYNTHETIC_RUN_MACROS) -> list[str]:
    """Parses files and bindings; unknown configurables/parameters raise here, before any
    model is built or compiled. Returns the resolved file paths. gin's syntax errors and
    unknown parameters become one-line `GinConfigError`s naming the binding or file line
    (`one_line_errors`).

    A macro that nothing uses is an error (`check_macros_used`): gin itself accepts
    `--gin.TRIAN_STEPS=3` and the run trains with the file's TRAIN_STEPS. Bindings that are
    exactly one of `placeholders` (the tools' `SYNTHETIC_RUN_MACROS`) may go unused."""
    paths = list(search_paths) + default_search_paths()
    files = [find_gin_file(f, paths) for f in gin_files]
    searched = gin.config._LOCATION_PREFIXES  # gin offers no public way to read them
    for p in paths:
        if os.path.isdir(p) and p not in searched:  # once: a process may parse many times
            gin.add_config_file_search_path(p)
    _make_file_checks_safe()
    with _quiet_include_lookup(), one_line_errors((), files):
        gin.parse_config_files_and_bindings(files, None, finalize_config=False)
    file_refs = used_macros()  # before the bindings override the parameters that use them
    # the bindings see the files' imports, as a line of a gin file would (gin_imports.py)
    with_imports = gin_imports.preamble(bindings, GIN_CONFIG_DIRS) + list(bindings)
    with one_line_errors(with_imports):
        gin.parse_config_files_and_bindings([], with_imports, finalize_config=False)
    resolve_shipped_paths()
    missing = missing_required_macros() if check_required else []
    if missing:
        raise ValueError(f"required gin macro(s) not set: {', '.join(missing)} (set them with "
                         f"--gin.{missing[0]}=VALUE; files: {', '.join(files)})")
    check_macros_used(bindings, gin_files, paths, placeholders, file_refs)
    return files


def _macro_references(value: Any, out: set[str]) -> None:
    """Adds the names of the macros `value` refers to (`%NAME`, inside lists, dicts...)."""
    if isinstance(value, gin.config.ConfigurableReference):
        if value.configurable.wrapped is gin.config.macro:
            out.add("/".join(value.scopes))
    elif isinstance(value, (list, tuple, set, frozenset)):
        for v in value:
            _macro_references(v, out)
    elif isinstance(value, dict):
        for k, v in value.items():
            _macro_references(k, out)
            _macro_references(v, out)


def binding_macro(binding: str) -> str | None:
    """The macro a binding string sets (`NAME = VALUE`, `scope/NAME = VALUE`), else None
    (a parameter binding `a.b = VALUE`, an include or an import)."""
    m = re.match(r"\s*([A-Za-z_][\w/]*)\s*=", binding)
    return m.group(1) if m else None


def used_macros() -> set[str]:
    """The macros the parsed configuration refers to (`%NAME` in any bound value)."""
    used: set[str] = set()
    for params in gin.config._CONFIG.values():  # gin has no public listing
        for value in params.values():
            _macro_references(value, used)
    return used


def check_macros_used(bindings: Sequence[str], gin_files: Sequence[str],
                      search_paths: Sequence[str],
                      placeholders: Sequence[str] = SYNTHETIC_RUN_MACROS,
                      file_refs: set[str] | frozenset[str] = frozenset()) -> None:
    """Raises `GinConfigError` for the first macro (in the order bound) that no configurable
    parameter and no other macro refers to, naming where it was set and the closest macros
    the configuration does use. Why: gin accepts any macro, so a misspelt `--gin.` override
    was silently ignored and a pod run trained with the file's value. Only macros the user
    or a gin file sets are checked; `placeholders` (exact binding strings) may go unused, and
    a file's macro that the files themselves refer to (`file_refs`) stays valid when a binding
    overrides the parameter using it (`--gin.loop.train.seq_len=16` over `%SEQ_LEN`)."""
    bound: list[str] = []
    used = used_macros()
    parameters: dict[str, str] = {}  # parameter name -> 'configurable.parameter'
    for (scope, selector), params in gin.config._CONFIG.items():  # gin has no public listing
        if selector == "gin.macro":
            bound.append(scope)
            continue
        short = ".".join(selector.split(".")[-2:])
        for param in params:
            parameters.setdefault(param, f"{scope + '/' if scope else ''}{short}.{param}")
    placeholder_set = {b.strip() for b in placeholders}
    given = {}  # macro -> the user's binding
    for b in bindings:
        name = binding_macro(b)
        if name and b.strip() not in placeholder_set:
            given[name] = b
    only_placeholders = {binding_macro(b) for b in bindings if b.strip() in placeholder_set}
    for name in bound:
        if (name in used or (name in only_placeholders and name not in given)
                or (name in file_refs and name not in given)):
            continue
        where = (f"--gin.{given[name].split('=', 1)[0].strip()}="
                 f"{given[name].split('=', 1)[1].strip()}" if name in given
                 else _macro_file(name, gin_files, search_paths))
        known = sorted(used)
        close = (_close_names(name, known)
                 or [f"--gin.{parameters[p]}" for p in _close_names(name, list(parameters))])
        hint = (f"did you mean {' or '.join(close)}?" if close else
                f"the macros this configuration uses: {', '.join(known) or 'none'}")
        raise GinConfigError(f"gin macro {name} ({where}) is not used by any configurable or "
                             f"macro; {hint}")


def _close_names(name: str, known: Sequence[str]) -> list[str]:
    """Up to three of `known` closest to `name` (difflib, case-insensitive)."""
    folded = {k.upper(): k for k in known}
    return [folded[k] for k in difflib.get_close_matches(name.upper(), list(folded), n=3,
                                                         cutoff=0.6)]


# gin's own wording of the mistakes `one_line_errors` rewrites, and where it says they are.
_NO_PARAMETER = re.compile(r"Configurable '([^']+)' doesn't have a parameter named '([^']+)'")
_NO_CONFIGURABLE = re.compile(r"No configurable matching '([^']+)'")
# ... and under dynamic registration (a name resolved through a gin file's `import`)
_NO_ATTRIBUTE = re.compile(r"Couldn't resolve selector ([\w.]+); <module '([\w.]+)'")
_NO_IMPORT = re.compile(r"'(\w+)' was not provided by an import statement")
_IN_BINDINGS = re.compile(r"In bindings string line (\d+)")
_IN_FILE = re.compile(r'In file "([^"]+)", line (\d+)')
# A value gin reads as a name (it fails to parse) that is a string once quoted: a path, a
# task name. Brackets, quotes, references and separators make it something else.
_BARE_VALUE = re.compile(r"[^\s'\"\[\](){}@%,=]+")
_BINDING = re.compile(r"\s*([\w./]+)\s*=\s*(.*?)\s*")


@contextlib.contextmanager
def one_line_errors(bindings: Sequence[str], files: Sequence[str] = ()
                    ) -> Iterator[None]:
    """Runs a gin parse of files or of `bindings`, turning gin's `SyntaxError` (a traceback,
    since it is no `CLI_ERRORS` type: an unquoted string such as
    `--gin.loop.train.spm_model=my_spm.model` printed 64 lines) and its unknown-parameter
    `ValueError` into a one-line `GinConfigError` naming the binding (`--gin.NAME=VALUE`) or
    the file and line: an unquoted string is shown quoted, a misspelt parameter or
    configurable gets the closest names (`parameter_hint`, `configurable_hint`), and an
    unclosed bracket (Python's `TokenError`) names its binding or file (of `files`)."""
    try:
        yield
    except SyntaxError as e:
        raise GinConfigError(syntax_error_line(e, bindings)) from e
    except GinConfigError:
        raise
    except ValueError as e:
        param, configurable = _NO_PARAMETER.search(str(e)), _NO_CONFIGURABLE.search(str(e))
        if not (param or configurable):
            raise
        where, flag = _error_location(str(e), bindings)
        hint = (parameter_hint(param[1], param[2], flag) if param
                else configurable_hint(configurable[1]))
        raise GinConfigError(f"{where}: {hint}") from e
    except (AttributeError, NameError) as e:
        missing, alias = _NO_ATTRIBUTE.search(str(e)), _NO_IMPORT.search(str(e))
        if not (missing or alias):
            raise
        where, _ = _error_location(str(e), bindings)
        raise GinConfigError(f"{where}: {dynamic_name_hint(missing, alias)}") from e
    except tokenize.TokenError as e:  # an unclosed bracket: gin says neither where nor which
        bad = ([binding_flag(b) for b in bindings if not _tokenizes(b)]
               + [f for f in files if not _tokenizes(open(f, encoding="utf-8").read())])
        where = bad[0] if bad else "gin"
        raise GinConfigError(f"{where}: gin cannot parse ({e.args[0]})") from e


def _tokenizes(text: str) -> bool:
    """Whether Python's tokenizer, which gin's parser uses, reads `text` to its end."""
    try:
        list(tokenize.generate_tokens(io.StringIO(text).readline))
        return True
    except tokenize.TokenError:
        return False


def _as_setting(name: str, flag: bool) -> str:
    """How to set the parameter `name` ('[scope/]selector.param'): on the command line
    (`flag`), by the macro the configuration binds it to when there is one
    (`--gin.TRAIN_STEPS (it sets optim.OptimizerConfig.total_steps)`: setting the parameter
    alone would leave the other parameters that macro sets), else `--gin.NAME`; in a file,
    the name itself."""
    if not flag:
        return name
    selector, param = name.split("/")[-1].rsplit(".", 1)
    macro = macro_for(selector, param)
    return f"--gin.{macro} (it sets {name})" if macro else f"--gin.{name}"


def configurable_hint(selector: str) -> str:
    """'no configurable SELECTOR; did you mean ...?': the closest registered configurable
    names with as many dotted parts as `selector` (difflib, `_close_names`)."""
    parts = selector.count(".") + 1
    names = {".".join(k.split(".")[-parts:]) for k, _ in gin.config._REGISTRY.items()}
    close = _close_names(selector, sorted(names))
    return (f"no configurable {selector}"
            + (f"; did you mean {' or '.join(close)}?" if close else ""))


def dynamic_name_hint(missing: re.Match | None, alias: re.Match | None) -> str:
    """A name a gin file's import should provide (dynamic registration) that it does not:
    'no configurable A.B; did you mean A.C?' from the module's own names, or which import
    names are known."""
    if missing is not None:
        selector, module = missing[1], sys.modules.get(missing[2])
        prefix, name = selector.rsplit(".", 1)
        names = [n for n in dir(module) if not n.startswith("_")
                 and callable(getattr(module, n)) and not inspect.ismodule(getattr(module, n))
                 ] if module is not None else []
        close = [f"{prefix}.{n}" for n in _close_names(name, names)]
        return (f"no configurable {selector}"
                + (f"; did you mean {' or '.join(close)}?" if close else ""))
    known = sorted({s.alias for s in gin.config._IMPORTS if s.alias})  # no public listing
    return (f"no import named {alias[1]!r} in the gin files (they import "
            f"{', '.join(known) or 'nothing'})")


def _binding_at(bindings: Sequence[str], line: int) -> str | None:
    """The binding holding line `line` (1-based) of the bindings gin joins with newlines."""
    end = 0
    for b in bindings:
        end += b.count("\n") + 1
        if line <= end:
            return b
    return None


def binding_flag(binding: str) -> str:
    """How the user gives `binding` on the command line: `--gin.NAME=VALUE` for a one-line
    `NAME = VALUE`, else `--gin_bindings='...'`."""
    m = _BINDING.fullmatch(binding)
    return f"--gin.{m[1]}={m[2]}" if m and "\n" not in binding else f"--gin_bindings={binding!r}"


def _error_location(message: str, bindings: Sequence[str]) -> tuple[str, bool]:
    """(where gin's error `message` says it happened, whether that is a command-line binding):
    `--gin.NAME=VALUE`, `FILE:LINE`, or 'gin' when the message does not say."""
    m = _IN_BINDINGS.search(message)
    binding = _binding_at(bindings, int(m[1])) if m else None
    if binding is not None:
        return binding_flag(binding), True
    m = _IN_FILE.search(message)
    return (f"{m[1]}:{m[2]}", False) if m else ("gin", False)


def syntax_error_line(e: SyntaxError, bindings: Sequence[str]) -> str:
    """One line for gin's `SyntaxError` in a binding or a file line: the binding as the user
    gave it (or `FILE:LINE`), then an unquoted string shown quoted, or gin's reason."""
    binding = None if e.filename else _binding_at(bindings, e.lineno or 0)
    text = binding if binding is not None else (e.text or "")
    where = binding_flag(binding) if binding is not None else f"{e.filename or 'gin'}:{e.lineno}"
    m = _BINDING.fullmatch(text.strip()) if "\n" not in text.strip() else None
    reason = (str(e.msg).strip().splitlines() or ["cannot parse it"])[-1].strip()
    if m and _BARE_VALUE.fullmatch(m[2]):
        name, value = m[1], m[2]
        if value.lower() in ("none", "true", "false"):
            fixed = (f"--gin.{name}={value.capitalize()}" if binding is not None
                     else f"{name} = {value.capitalize()}")
            return f"{where}: gin writes None, True and False capitalised: {fixed}"
        fixed = (f'--gin.{name}="{value!r}"' if binding is not None
                 else f"{name} = {value!r}")
        return f"{where}: a string must be quoted in gin: {fixed}"
    if reason.startswith("Failed to parse token"):
        reason += "; a string must be quoted"
    shown = "" if binding is not None else f" {text.strip()!r}"
    return f"{where}: gin cannot parse{shown} ({reason})"


def configurable_parameters(selector: str) -> tuple[str, list[str]] | None:
    """(the full selector, the parameter names) of the configurable `selector` names (a
    suffix of its full name, as gin matches it), or None when it names none or several."""
    matches = list(gin.config._REGISTRY.matching_selectors(selector))  # no public lookup
    if len(matches) != 1:
        return None
    wrapped = gin.config._REGISTRY[matches[0]].wrapped
    try:
        params = inspect.signature(wrapped).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature
        return matches[0], []
    kinds = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    return matches[0], [p.name for p in params if p.kind not in kinds and p.name != "self"]


def parameter_hint(selector: str, param: str, flag: bool = True) -> str:
    """'SELECTOR has no parameter PARAM; did you mean ...?': up to three of the closest
    parameter names (difflib's ratio, at least 0.6 as `difflib.get_close_matches`), from
    `selector`'s own parameters and, only where closer than all of those, the parameters of
    the other configurables this configuration binds (a `total_steps` meant for
    `optim.OptimizerConfig` but given to `loop.train`), none more than 0.1 below the best (a
    near-exact match makes the rest noise); given as a command-line setting when `flag` (the
    user wrote a binding; `_as_setting`). Without a close one, the configurable's parameters
    are listed. Why: gin says only that the parameter does not exist, which left the user to
    find the real name in the source."""
    own = configurable_parameters(selector)
    scored: dict[str, tuple[float, int]] = {}

    def add(name: str, full: str, mine: int) -> None:
        ratio = difflib.SequenceMatcher(None, param.lower(), name.lower()).ratio()
        scored[full] = max(scored.get(full, (0.0, 0)), (ratio, mine))

    for p in (own[1] if own else []):
        add(p, f"{selector}.{p}", 1)
    for scope, full_selector in list(gin.config._CONFIG):  # gin has no public listing
        if full_selector == "gin.macro" or (own and full_selector == own[0]):
            continue
        other = configurable_parameters(full_selector)
        short = (scope + "/" if scope else "") + ".".join(full_selector.split(".")[-2:])
        for p in (other[1] if other else []):
            add(p, f"{short}.{p}", 0)
    best_own = max((ratio for ratio, mine in scored.values() if mine), default=0.0)
    ranked = sorted(((n, s) for n, s in scored.items() if s[1] or s[0] > best_own),
                    key=lambda kv: kv[1], reverse=True)
    best = ranked[0][1][0] if ranked else 0.0
    close = [n for n, (ratio, _) in ranked if ratio >= max(0.6, best - 0.1)][:3]
    head = f"{selector} has no parameter {param}"
    if close:
        return f"{head}; did you mean {' or '.join(_as_setting(c, flag) for c in close)}?"
    return f"{head}; its parameters: {', '.join(own[1]) if own else 'unknown'}"


def _macro_file(name: str, gin_files: Sequence[str], search_paths: Sequence[str]) -> str:
    """'set in FILE': the first of `gin_files` or their includes (depth first) that binds
    `name` at the start of a line; 'set in a gin file' when none does."""
    pattern = re.compile(rf"^\s*{re.escape(name)}\s*=", re.M)
    include = re.compile(r"^\s*include\s+['\"]([^'\"]+)['\"]", re.M)
    todo, seen = list(gin_files), set()
    while todo:
        f = todo.pop(0)
        try:
            path = find_gin_file(f, search_paths)
        except FileNotFoundError:
            continue
        if path in seen:
            continue
        seen.add(path)
        text = open(path, encoding="utf-8").read()
        if pattern.search(text):
            return f"set in {f}"
        todo[:0] = include.findall(text)
    return "set in a gin file"


def macro_for(selector: str, param: str) -> str | None:
    """The macro bound to `selector.param` (`OptimizerConfig.total_steps = %TRAIN_STEPS` ->
    'TRAIN_STEPS'; `selector` may be a suffix of the configurable's full name), else None."""
    for (_scope, name), params in gin.config._CONFIG.items():  # gin has no public listing
        if name == "gin.macro" or param not in params:
            continue
        if name == selector or name.endswith("." + selector):
            refs: set[str] = set()
            value = params[param]
            if isinstance(value, gin.config.ConfigurableReference):
                _macro_references(value, refs)
            if refs:
                return refs.pop()
    return None


_SETTING = re.compile(r"\b([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*)\.([A-Za-z_]\w*)=(\S+)")


def user_names(message: str) -> str:
    """`message` with each `Configurable.param=VALUE` whose value came from a gin macro written
    as `MACRO=VALUE (Configurable.param)`: the user set TRAIN_STEPS, not total_steps."""

    def name(m: re.Match) -> str:
        macro = macro_for(m.group(1), m.group(2))
        if macro is None:
            return m.group(0)
        value = m.group(3)
        tail = value[-1] if value[-1] in ",;:" else ""
        return f"{macro}={value[:len(value) - len(tail)]} ({m.group(1)}.{m.group(2)}){tail}"

    return _SETTING.sub(name, message)


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
                    and not os.path.exists(value)):
                return shipped_path(value, root) or value
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
