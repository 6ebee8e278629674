"""Structure checks on the `xlm_jax` package: no import cycles, imports that follow the layer
table, no oversized modules.

Import graph (`test_no_import_cycles`). Every `xlm_jax/**/*.py` file is parsed with `ast`
(nothing is imported) and every `import x` / `from x import y` is collected at any depth:
module level, inside functions and classes, in `try`/`except` and `if` blocks. Only imports
under `if TYPE_CHECKING:` are skipped (they never run), and dynamic imports
(`importlib.import_module`, `__import__`) are not seen. Relative imports are resolved against
the importing module's package. A node is a module; a package's `__init__.py` is the node of
the package itself (`xlm_jax/data/__init__.py` is `xlm_jax.data`). Edges of an import made in
module M:

* `import a.b.c` (or `from a.b.c import y` where `a.b.c.y` is not a module file): an edge
  M -> `a.b.c`; a name that is no module file maps to its longest prefix that is one.
* `from a.b import c` where `a/b/c.py` or `a/b/c/__init__.py` exists: an edge M -> `a.b.c`
  (the imported submodule), not to `a.b`.
* Parent packages. Importing `a.b.c` first runs `a/__init__.py` and `a/b/__init__.py`, so M
  also gets an edge to each of those parent packages, EXCEPT the ones that contain M itself
  (M's own ancestors, and M when it is a package): Python has run (or is running) their
  `__init__` before M's code, so such an edge says nothing about the order of imports, and it
  would turn the usual "a package's `__init__` re-exports its submodules" into a cycle (here:
  `xlm_jax/__init__.py`'s lazy `__getattr__` imports `xlm_jax.encoder`, and every module is in
  `xlm_jax`, so it would report `xlm_jax -> xlm_jax.encoder -> xlm_jax`). So a
  cycle through a package `__init__` is reported only when the package is entered from
  outside it, e.g. `xlm_jax.data` importing `xlm_jax.train.x` at its top while `xlm_jax.train.x`
  imports `xlm_jax.data.pipeline`. (An `__init__` without imports has no outgoing edges, so the
  edges to it can never close a cycle; they are kept for simplicity.)

The strongly connected components of that graph (Tarjan's algorithm, iterative) must all be
single modules without a self-loop; the failure message prints, for every larger component,
a shortest cycle through each of its members, one per line as `a -> b -> a`.
`test_feature_contract_module_imports_no_other_data_module` pins the split that removed the
data package's cycle: `xlm_jax.data.features` imports no xlm_jax module but `sampling`.

Layers (`test_imports_follow_the_layer_table`). On the same graph, every edge between two
units (a subpackage, or a top-level module) must be one `ALLOWED` permits: models <-
objectives <- train <- tools, data and evaluation beside (docs/architecture.md,
"Dependencies between packages"). An edge to a package `__init__` that importing one of its
submodules runs is judged by that submodule. Tools (`TOOLS`) may import any
unit; a unit in neither is reported, and so is an `EXCEPTIONS` entry that no edge uses. The
cycle check is per module, so it could not see a cycle between packages that no one module
closes (objectives.base -> train.step_flops inside a function, train.step -> objectives.base).

Module size (`test_no_library_module_over_600_lines`): no `xlm_jax/**/*.py` over
`MAX_LINES` lines.

That the core (models, objectives, train, bench) does not import TensorFlow or seqio is
checked in `tests/models/model_test.py::test_core_imports_without_tensorflow` and
`tests/accelerator/bench_test.py`.
"""
from __future__ import annotations

import ast
import collections
import pathlib
from typing import Callable, Iterable, Mapping

import pytest

from xlm_jax.cli_help import MOVED

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "xlm_jax"
MAX_LINES = 600


# --------------------------------------------------------------------------- collection


def module_name(path: pathlib.Path, root: pathlib.Path) -> tuple[str, bool]:
    """(dotted name, is_package) of a .py file below `root` (the directory holding the
    top-level package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def package_sources(root: pathlib.Path = REPO, package: str = PACKAGE) -> dict[str, tuple[str, bool]]:
    """{module name: (source, is_package)} for every .py file of `package` below `root`."""
    out = {}
    for path in sorted((root / package).rglob("*.py")):
        name, is_package = module_name(path, root)
        out[name] = (path.read_text(encoding="utf-8"), is_package)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterable[ast.Import | ast.ImportFrom]:
    """Every import statement of `tree` at any depth, except in `if TYPE_CHECKING:` bodies."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
            continue
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)  # the `else:` branch does run
            continue
        stack.extend(ast.iter_child_nodes(node))


def collect_imports(source: str, module: str, is_package: bool,
                    filename: str = "<source>") -> list[tuple[str, tuple[str, ...]]]:
    """The absolute imports of one module's source, at any depth, in source order.

    Each entry is (imported module, names): `import a.b` gives ("a.b", ()), `from a.b import
    c, d` gives ("a.b", ("c", "d")), relative imports are resolved against `module` (which is
    its own package when `is_package`). Star imports give the name "*".
    """
    tree = ast.parse(source, filename=filename)
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in sorted(_import_nodes(tree), key=lambda n: (n.lineno, n.col_offset)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, ()) for alias in node.names)
            continue
        if node.level:
            if node.level > len(package):
                raise ValueError(f"{filename}:{node.lineno}: relative import beyond the top "
                                 f"package {module!r}")
            base = package[: len(package) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module
        found.append((target, tuple(alias.name for alias in node.names)))
    return found


def _existing(name: str, modules: Mapping[str, object]) -> str | None:
    """`name` or its longest dotted prefix that is one of `modules`."""
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in modules:
            return candidate
    return None


def import_graph(sources: Mapping[str, tuple[str, bool]]) -> dict[str, set[str]]:
    """{module: modules it imports} over `sources` (see the module docstring for the edges)."""
    graph: dict[str, set[str]] = {name: set() for name in sources}
    for name, (source, is_package) in sources.items():
        own_packages = {".".join(name.split(".")[:n])
                        for n in range(1, len(name.split(".")) + (1 if is_package else 0))}
        for target, names in collect_imports(source, name, is_package, filename=name):
            imported = []
            if names and target in sources:
                subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in sources]
                imported += subs
                if len(subs) < len(names):  # some names are attributes of `target` itself
                    imported.append(target)
            else:
                found = _existing(target, sources)
                if found is not None:
                    imported.append(found)
            for mod in imported:
                graph[name].add(mod)
                parts = mod.split(".")
                for n in range(1, len(parts)):
                    parent = ".".join(parts[:n])
                    if parent in sources and parent not in own_packages:
                        graph[name].add(parent)
    return graph


# --------------------------------------------------------------------------- cycles


def strongly_connected_components(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Tarjan's algorithm without recursion. Components come out in reverse topological
    order; each is sorted. Nodes only named as edge targets count as nodes too."""
    adjacency = {v: sorted(set(ws)) for v, ws in graph.items()}
    for ws in list(adjacency.values()):
        for w in ws:
            adjacency.setdefault(w, [])
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components = []
    counter = 0
    for root in sorted(adjacency):
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(adjacency[root]))]
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(adjacency[w])))
                    break
                if w in on_stack:
                    low[v] = min(low[v], index[w])
            else:  # every child of v done
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[v])
                if low[v] == index[v]:
                    component = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        component.append(w)
                        if w == v:
                            break
                    components.append(sorted(component))
    return components


def _cycle_through(start: str, members: set[str], graph: Mapping[str, Iterable[str]]) -> list[str]:
    """A shortest cycle start -> ... -> start inside `members` (breadth-first)."""
    previous: dict[str, str | None] = {start: None}
    queue = collections.deque([start])
    while queue:
        v = queue.popleft()
        for w in sorted(graph.get(v, ())):
            if w == start:  # closes the cycle: start -> ... -> v -> start
                path = [v]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return path[::-1] + [start]
            if w in members and w not in previous:
                previous[w] = v
                queue.append(w)
    raise AssertionError(f"{start} is on no cycle")  # pragma: no cover


def import_cycles(graph: Mapping[str, Iterable[str]]) -> list[str]:
    """The cycles to report, one line `a -> b -> a` each: for every strongly connected
    component of more than one node, a shortest cycle through each of its members (so every
    member shows up; the same cycle is listed once), and every self-loop `a -> a`."""
    out = set()
    for component in strongly_connected_components(graph):
        if len(component) > 1:
            for member in component:
                cycle = _cycle_through(member, set(component), graph)[:-1]
                first = cycle.index(min(cycle))  # the same cycle from any member: one line
                cycle = cycle[first:] + cycle[:first]
                out.add(" -> ".join(cycle + cycle[:1]))
        elif component[0] in graph.get(component[0], ()):
            out.add(f"{component[0]} -> {component[0]}")
    return sorted(out)


# --------------------------------------------------------------------------- layers

# The layers of `xlm_jax` and what each may import (docs/architecture.md, "Dependencies").
# A unit is a subpackage (`xlm_jax.train.loop` is in `train`) or a top-level module
# (`xlm_jax.model_dir` is `model_dir`); the package's own `__init__` is the unit `xlm_jax`.
# An entry of a set is a unit, or one module of a unit (`data.features`: objectives may import
# the TF-free feature contract and nothing else of `data`). Imports inside a unit are free
# (its own cycles are `test_no_import_cycles`'s business).
ALLOWED: dict[str, frozenset[str]] = {
    # The encoder, its layers and masks: imports nothing else of the library.
    "models": frozenset(),
    # The library's leaf modules, usable from any layer above models.
    "cli_help": frozenset(),
    "model_dir": frozenset({"models"}),  # reads and writes `models.config.ModelConfig`
    # The objectives: models, and the feature names every example kind uses.
    "objectives": frozenset({"models", "data.features"}),
    # Beside the objectives and the trainer, never importing them.
    "data": frozenset({"model_dir", "cli_help"}),
    "convert": frozenset({"models", "model_dir", "cli_help"}),
    "encoder": frozenset({"models", "data", "model_dir", "convert"}),
    "evaluation": frozenset({"models", "data", "model_dir", "encoder", "cli_help"}),
    # The trainer: everything below it, never convert (its CLI is a tool) nor a tool.
    "train": frozenset({"models", "objectives", "data", "evaluation", "encoder", "model_dir",
                        "cli_help"}),
}
# The top: CLIs and tools, which may import any unit (cycles among them are still cycles).
# The moved commands' old names at the root (`cli_help.MOVED`: thin modules that run the new
# ones) are tools; data's old names stay in data's layer.
TOOLS = frozenset({"xlm_jax", "finetune", "accelerator", "league", "demo", "embed", "translate",
                   *(old.split(".")[1] for old in MOVED if not old.startswith("xlm_jax.data."))})
# Single module edges the table does not allow, each with its reason. Keep this short.
EXCEPTIONS: dict[tuple[str, str], str] = {
    ("evaluation.bleu", "objectives.translation"):
        "BLEU of a trained Translation objective: it rebuilds that objective's encoder-decoder "
        "(run files configure it as `translation_eval.evaluate`)",
}


def unit_of(module: str, package: str = PACKAGE) -> str:
    """The layer-table unit of a module name of `package` (see ALLOWED)."""
    parts = module.split(".")
    assert parts[0] == package, module
    return parts[1] if len(parts) > 1 else package


def _is_tool(unit: str) -> bool:
    return unit in TOOLS


def _matches(target: str, entry: str, package: str) -> bool:
    """Whether the module `target` is the table entry `entry` (a unit or a module of one),
    inside it, or a package `__init__` that importing `entry` runs."""
    full = f"{package}.{entry}"
    return target == full or target.startswith(full + ".") or full.startswith(target + ".")


def layer_violations(graph: Mapping[str, Iterable[str]],
                     allowed: Mapping[str, frozenset[str]] = ALLOWED,
                     is_tool: Callable[[str], bool] = _is_tool,
                     exceptions: Mapping[tuple[str, str], str] = EXCEPTIONS,
                     package: str = PACKAGE) -> list[str]:
    """One line per import edge between two units that `allowed` does not permit,
    `unit -> unit: module imports module`, sorted; a unit that is neither in `allowed` nor a
    tool gives one line `unit: not in the layer table`; so does an exception no edge uses."""
    out, used = set(), set()
    for source, targets in graph.items():
        unit = unit_of(source, package)
        if is_tool(unit):
            continue
        if unit not in allowed:
            out.add(f"{unit}: not in the layer table (ALLOWED or TOOLS)")
            continue
        targets = set(targets)
        for target in targets:
            if any(other.startswith(target + ".") for other in targets):
                continue  # a package `__init__` that importing `other` runs: judge `other`
            target_unit = unit_of(target, package)
            if target_unit == unit or any(_matches(target, e, package) for e in allowed[unit]):
                continue
            key = (source.removeprefix(package + "."), target.removeprefix(package + "."))
            if key in exceptions:
                used.add(key)
                continue
            out.add(f"{unit} -> {target_unit}: {source} imports {target}")
    out.update(f"exception {a} -> {b}: no such import any more" for a, b in exceptions
               if (a, b) not in used)
    return sorted(out)


# --------------------------------------------------------------------------- the checks


def test_no_import_cycles():
    sources = package_sources()
    assert f"{PACKAGE}.data" in sources and f"{PACKAGE}.train.loop" in sources, sorted(sources)
    cycles = import_cycles(import_graph(sources))
    assert not cycles, "import cycles in xlm_jax:\n  " + "\n  ".join(cycles)


def test_imports_follow_the_layer_table():
    """Every import between two units of xlm_jax, function-level imports included, is one the
    layer table allows: models <- objectives <- train <- tools, data and evaluation beside
    (never importing train, objectives, finetune or a tool)."""
    graph = import_graph(package_sources())
    assert f"{PACKAGE}.objectives.base" in graph and f"{PACKAGE}.train.step" in graph
    violations = layer_violations(graph)
    assert not violations, ("imports against the layer table (tests/structure_test.py "
                            "ALLOWED, docs/architecture.md):\n  " + "\n  ".join(violations))


def test_feature_contract_module_imports_no_other_data_module():
    """`xlm_jax.data.features` is the TF-free contract that the seqio modules (registry,
    converters, preprocessors) and the TF-free ones (synthetic, models, objectives) share; it
    must not import them back (that was the registry/converters/preprocessors <-> pipeline
    cycle), nor `pipeline`."""
    graph = import_graph(package_sources())
    assert graph[f"{PACKAGE}.data.features"] <= {f"{PACKAGE}.data.sampling"}, sorted(
        graph[f"{PACKAGE}.data.features"])
    for user in ("registry", "converters", "preprocessors", "synthetic"):
        edges = graph[f"{PACKAGE}.data.{user}"]
        assert f"{PACKAGE}.data.pipeline" not in edges, (user, sorted(edges))


def test_no_library_module_over_600_lines():
    lengths = {}
    for path in sorted((REPO / PACKAGE).rglob("*.py")):
        with open(path, encoding="utf-8") as f:
            lengths[path.relative_to(REPO).as_posix()] = sum(1 for _ in f)
    assert len(lengths) > 10
    big = {p: n for p, n in lengths.items() if n > MAX_LINES}
    assert not big, f"modules over {MAX_LINES} lines:\n  " + "\n  ".join(
        f"{p}: {n} lines" for p, n in sorted(big.items(), key=lambda kv: -kv[1]))


# --------------------------------------------------------------------------- the checkers


SNIPPET = '''
"""A module."""
import os, json as j
from typing import TYPE_CHECKING
from . import sibling
from .. import other as o
from .sub.deep import thing

try:
    import fast_lib
except ImportError:
    fast_lib = None

if TYPE_CHECKING:
    import never_run
else:
    import else_branch


class K:
    from pkg.attr import value


def f():
    def g():
        import pkg.inner.late
    from pkg.mod import name, other
    return g
'''


def test_collect_imports_at_any_depth_and_resolves_relative():
    got = collect_imports(SNIPPET, "pkg.sub.mod", is_package=False)
    assert got == [
        ("os", ()), ("json", ()), ("typing", ("TYPE_CHECKING",)),
        ("pkg.sub", ("sibling",)), ("pkg", ("other",)), ("pkg.sub.sub.deep", ("thing",)),
        ("fast_lib", ()), ("else_branch", ()), ("pkg.attr", ("value",)),
        ("pkg.inner.late", ()), ("pkg.mod", ("name", "other")),
    ]
    with pytest.raises(ValueError, match="beyond the top package"):
        collect_imports("from .. import x\n", "pkg.mod", is_package=False)
    # In a package's __init__, `.` is the package itself.
    assert collect_imports("from . import x\nfrom .y import z\n", "pkg.sub", is_package=True) == [
        ("pkg.sub", ("x",)), ("pkg.sub.y", ("z",))]


def test_import_graph_edges():
    sources = {
        "p": ("", True),
        "p.a": ("from p.b import helper\nfrom p import c\n", False),
        "p.b": ("def helper():\n    from . import a\n", False),
        "p.c": ("", False),
        "p.sub": ("from p.sub import mod\n", True),  # re-export: no self/parent cycle
        "p.sub.mod": ("import os\nimport p.c\n", False),
        "p.q": ("import p.sub.mod.missing\n", False),
    }
    graph = import_graph(sources)
    assert graph["p.a"] == {"p.b", "p.c"}  # not "p": p.a's own package
    assert graph["p.b"] == {"p.a"}  # the function-level import counts
    assert graph["p.sub"] == {"p.sub.mod"}
    assert graph["p.sub.mod"] == {"p.c"}
    assert graph["p.q"] == {"p.sub.mod", "p.sub"}  # longest existing prefix + parent package
    assert import_cycles(graph) == ["p.a -> p.b -> p.a"]


def test_cycle_finder_on_a_synthetic_graph():
    graph = {"a": ["b"], "b": ["c", "d"], "c": ["a"], "d": ["e"], "e": [], "f": ["f"],
             "g": ["h"], "h": ["g", "e"]}
    components = strongly_connected_components(graph)
    assert sorted(components) == [["a", "b", "c"], ["d"], ["e"], ["f"], ["g", "h"]]
    # Reverse topological order: a component comes after those it imports.
    position = {n: i for i, comp in enumerate(components) for n in comp}
    assert position["e"] < position["d"] < position["a"] and position["e"] < position["g"]
    assert import_cycles(graph) == ["a -> b -> c -> a", "f -> f", "g -> h -> g"]
    assert import_cycles({"a": ["b"], "b": ["c"], "c": []}) == []
    # Every member of a component is on some listed cycle.
    assert import_cycles({"a": ["b", "c"], "b": ["a"], "c": ["a"]}) == [
        "a -> b -> a", "a -> c -> a"]
    assert import_cycles({"a": ["b"], "b": ["c"], "c": ["a", "b"]}) == [
        "a -> b -> c -> a", "b -> c -> b"]


def test_cycle_finder_is_not_recursive():
    n = 20000  # far past the recursion limit
    chain = {str(i): [str(i + 1)] for i in range(n)}
    chain[str(n)] = ["0"]
    components = strongly_connected_components(chain)
    assert len(components) == 1 and len(components[0]) == n + 1
    chain[str(n)] = []
    assert len(strongly_connected_components(chain)) == n + 1


def test_layer_checker_on_a_synthetic_graph():
    allowed = {"low": frozenset(), "mid": frozenset({"low", "side.api"}),
               "side": frozenset({"low"})}
    graph = {
        "p": set(), "p.low.a": set(), "p.low.b": {"p.low.a"},  # inside a unit: free
        "p.mid.x": {"p.low.a", "p.low", "p.side.api", "p.side"},  # side's __init__ is run
        "p.mid.y": {"p.side.impl", "p.low.b"},  # only side.api is allowed
        "p.side.api": {"p.low.a", "p.mid.x"},  # upwards
        "p.side.impl": {"p.top"},  # a tool is above everything
        "p.top": {"p.mid.x", "p.side.impl"},  # tools import anything
        "p.odd": {"p.low.a"},  # in no table
    }
    got = layer_violations(graph, allowed, is_tool=lambda u: u in ("top", "p"),
                           exceptions={("mid.y", "side.impl"): "why",
                                       ("side.api", "low.a"): "stale"}, package="p")
    assert got == ["exception side.api -> low.a: no such import any more",
                   "odd: not in the layer table (ALLOWED or TOOLS)",
                   "side -> mid: p.side.api imports p.mid.x",
                   "side -> top: p.side.impl imports p.top"]
    assert layer_violations(graph, allowed, is_tool=lambda u: True, exceptions={},
                            package="p") == []


def test_test_file_names_are_unique():
    """The test folders have no `__init__.py`, so pytest imports each test file by its bare
    name: two files of one name in different folders stop the whole collection ("import file
    mismatch"), which only the full suite shows."""
    names = collections.Counter(p.name for p in (REPO / "tests").rglob("*_test.py"))
    assert not [n for n, c in names.items() if c > 1], sorted(n for n, c in names.items() if c > 1)


if __name__ == "__main__":  # pragma: no cover  (prints the cycles of the current tree)
    print("\n".join(import_cycles(import_graph(package_sources()))) or "no import cycles")
