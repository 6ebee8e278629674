"""The package root shows the architecture (docs/architecture.md opens with its tree):

* at most `ROOT_MODULES` modules at `xlm_jax/` beside its packages (the moved commands' old
  names, `cli_help.MOVED`, aside: they go in the release after 0.2);
* no two library modules share a basename, so a traceback line or an import names one file;
* no module is named like a package beside it;
* docs/architecture.md's first screen is the tree, with a line for every package and root module;
* each old name is a thin module that forwards to its new one, with one WARNING.

The one-way import layers are tests/structure_test.py's; `--help` from every new and old name
is tests/cli_table_test.py's.
"""
import ast
import collections
import importlib
import importlib.util
import logging
import pathlib

from xlm_jax import cli_help
from xlm_jax.cli_help import MOVED

REPO = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = REPO / "xlm_jax"
# Our number: the public API (`encoder`: load_encoder; `model_dir`: the model directory), the
# three CLIs users type most that belong to no package (`demo`, `embed`, `translate`) and the
# helpers every CLI shares (`cli_help`).
ROOT_MODULES = 6
# docs/architecture.md's first screen: the tree is within its first lines.
FIRST_SCREEN = 45


def _path_of(module: str) -> pathlib.Path:
    """The file of a module name of the package (a package: its `__init__.py`)."""
    base = REPO.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def moved_files() -> set[pathlib.Path]:
    """The old names' files: each MOVED module, and the `__main__` of an old package."""
    files = {_path_of(old) for old in MOVED}
    files |= {p.parent / "__main__.py" for p in files if p.name == "__init__.py"}
    return files


def library_modules() -> list[pathlib.Path]:
    """Every module of the package but `__init__`/`__main__` and the old names."""
    moved = moved_files()
    return sorted(p for p in PACKAGE.rglob("*.py")
                  if p.name not in ("__init__.py", "__main__.py") and p not in moved)


def root_modules() -> list[str]:
    return sorted(p.stem for p in library_modules() if p.parent == PACKAGE)


def root_packages() -> list[str]:
    return sorted(p.parent.name for p in PACKAGE.glob("*/__init__.py")
                  if p not in moved_files())


def test_the_root_holds_few_modules_beside_its_packages():
    modules = root_modules()
    assert "encoder" in modules and "demo" in modules, modules
    assert len(modules) <= ROOT_MODULES, (
        f"{len(modules)} modules at xlm_jax/ beside its packages (at most {ROOT_MODULES}): "
        f"{modules}; a family of modules becomes a package")


def test_no_two_library_modules_share_a_basename():
    names = collections.defaultdict(list)
    for p in library_modules():
        names[p.name].append(p.relative_to(REPO).as_posix())
    assert len(names) > 100
    shared = {n: ps for n, ps in names.items() if len(ps) > 1}
    assert not shared, f"basenames used twice (rename one): {shared}"


def test_no_module_is_named_like_a_package_beside_it():
    clashes = []
    for init in PACKAGE.rglob("__init__.py"):
        package = init.parent
        modules = {p.stem for p in package.glob("*.py")}
        subpackages = {p.parent.name for p in package.glob("*/__init__.py")}
        clashes += [f"{package.relative_to(REPO)}/{n}" for n in sorted(modules & subpackages)]
    assert not clashes, clashes


def test_architecture_md_opens_with_the_tree():
    head = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines()
    screen = "\n".join(head[:FIRST_SCREEN])
    assert "```" in screen, "docs/architecture.md should open with the package tree"
    tree = screen.split("```")[1]
    missing = [f"{name}/" for name in root_packages() if f"{name}/" not in tree]
    missing += [f"{name}.py" for name in root_modules() if f"{name}.py" not in tree]
    assert not missing, f"docs/architecture.md's tree lacks {missing}"
    lines = [line for line in tree.splitlines() if line.strip()]
    for name in [f"{n}/" for n in root_packages()] + [f"{n}.py" for n in root_modules()]:
        assert sum(name in line.split() for line in lines) == 1, name  # one line each


def test_old_names_are_thin_modules_that_import_only_cli_help():
    files = moved_files()
    assert len(files) == len(MOVED) + 1  # xlm_jax/compile/ has a __main__ too
    for path in files:
        text = path.read_text(encoding="utf-8")
        assert len(text.splitlines()) <= 10, path
        imports = [n for n in ast.walk(ast.parse(text))
                   if isinstance(n, (ast.Import, ast.ImportFrom))]
        assert [(n.module, [a.name for a in n.names]) for n in imports] == [
            ("xlm_jax", ["cli_help"])], path
    for new in MOVED.values():
        assert importlib.util.find_spec(new) is not None, new


def test_an_old_name_forwards_to_the_new_module_with_one_warning(monkeypatch):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    monkeypatch.setattr(cli_help, "_warned", set())
    cli_help._MOVED_LOG.addHandler(handler)
    try:
        old = importlib.import_module("xlm_jax.pod_memory")
        new = importlib.import_module("xlm_jax.accelerator.pod_memory")
        assert old is not new
        assert old.main is new.main and old.build is new.build
        from xlm_jax.pod_memory import parse_mesh  # noqa: the from-import path too
        assert parse_mesh is new.parse_mesh
    finally:
        cli_help._MOVED_LOG.removeHandler(handler)
    assert [(r.levelno, r.getMessage()) for r in records] == [(
        logging.WARNING, "`xlm_jax.pod_memory` has moved to `xlm_jax.accelerator.pod_memory`; "
        "the old name is removed in the release after 0.2")]
