"""The code's shape, checked on every run (no model, no engine): no import circles between tracetune's
modules, no module over 500 lines and no function over 80, no `sys.path` manipulation, no import
of the old top-level names (`replay`, `cli`, ...) that pyproject now maps under `tracetune`, no
import of an engine's own package (`engine_adapter.vllm`) from outside engine_adapter/, no study
runner under the read-only dashboard, and `Any` on at most 120 lines of package code.

The import graph counts every absolute `import` / `from ... import`, at module level or inside a
function: a circle closed by a lazy import is still a circle (the two modules cannot be understood,
tested or moved apart).
"""

from __future__ import annotations

import ast
import functools
import os
import tomllib
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 80
SIZED_FOLDERS = ("scripts", "benchmarks", "tests")  # besides tracetune's own folders
SKIPPED_DIRS = {"__pycache__", "build", "dist", "node_modules"}
ENGINE_PACKAGES = ("tracetune.engine_adapter.vllm",)  # an engine's own code: reached through its EngineKind
STUDY_RUNNERS = ("tracetune.tuner.study", "tracetune.tuner.measure")  # run trials: not for the read-only dashboard
MAX_ANY_LINES = 120


@functools.cache
def package_dirs() -> dict[str, str]:
    """Folder -> package, as pyproject's [tool.setuptools.package-dir] maps them."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {folder: package for package, folder in pyproject["tool"]["setuptools"]["package-dir"].items()}


def python_files(folder: Path) -> Iterator[Path]:
    """The .py files under `folder`, without hidden (.venv, .git), cache or build folders."""
    for here, dirs, files in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not (d.startswith(".") or d in SKIPPED_DIRS or d.endswith(".egg-info")))
        yield from (Path(here) / f for f in sorted(files) if f.endswith(".py"))


@functools.cache
def syntax(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@functools.cache
def modules() -> dict[str, Path]:
    """Every tracetune module by its dotted name (a package by its own name, from its __init__.py)."""
    out = {}
    for folder, package in package_dirs().items():
        for path in python_files(ROOT / folder):
            parts = [p for p in path.relative_to(ROOT / folder).with_suffix("").parts if p != "__init__"]
            out[".".join([package, *parts])] = path
    return out


def imported_names(tree: ast.Module) -> Iterator[str]:
    """Every absolutely imported name, anywhere in the module: `a.b` for `import a.b`, and `a.b.c`
    and `a.b` for `from a.b import c` (c may be a submodule or a name in a.b)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    """Module -> the tracetune modules it imports."""
    known = modules()
    return {name: {target for target in imported_names(syntax(path)) if target in known and target != name}
            for name, path in known.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            successor = next(successors, None)
            if successor is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif successor not in index:
                index[successor] = low[successor] = len(index)
                stack.append(successor)
                on_stack.add(successor)
                work.append((successor, iter(sorted(graph[successor]))))
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
    return found


def sized_files() -> Iterator[Path]:
    for folder in [*package_dirs(), *SIZED_FOLDERS]:
        yield from python_files(ROOT / folder)


def repository_files() -> Iterator[Path]:
    yield from python_files(ROOT)


def relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_cycle_search_finds_a_circle_and_its_members():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_checks_see_what_they_look_for():
    tree = ast.parse("import sys\nsys.path.insert(0, 'x')\nsys.path[0:0] = ['y']\nimport replay.trace\n"
                     "def f():\n    from cli.main import main\nfrom tracetune.cli import main\n")
    assert sorted(sys_path_changes(tree)) == [2, 3]
    assert [name for _, name in old_imports(tree, {"replay", "cli"})] == ["replay.trace", "cli.main"]


def test_the_package_map_covers_every_subpackage():
    assert "tracetune.replay.send" in modules() and "tracetune.cli.main" in modules()
    assert "tracetune.engine_adapter.vllm" in modules()  # a nested package, by its folder


def test_no_import_cycles():
    found = cycles(import_graph())
    assert not found, "import circles (each line: modules that import one another, directly or through the " \
                      "others):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_over_500_lines():
    over = [f"{relative(p)}: {n} lines" for p in sized_files()
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES]
    assert not over, f"modules over {MAX_MODULE_LINES} lines:\n" + "\n".join(over)


def test_no_function_over_80_lines():
    over = [f"{relative(p)}:{node.lineno}: {node.name}() {node.end_lineno - node.lineno + 1} lines"
            for p in sized_files() for node in ast.walk(syntax(p))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES]
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines (def to end):\n" + "\n".join(over)


def _is_sys_path(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name) \
        and node.value.id == "sys"


def sys_path_changes(tree: ast.Module) -> Iterator[int]:
    """Lines that change sys.path: sys.path.insert/append/extend(...), sys.path[...], sys.path = / +=."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_sys_path(node.value) and node.attr in ("insert", "append", "extend"):
            yield node.lineno
        elif isinstance(node, ast.Subscript) and _is_sys_path(node.value):
            yield node.lineno
        elif isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(_is_sys_path(t) for t in targets):
                yield node.lineno


def test_no_sys_path_manipulation():
    found = [f"{relative(p)}:{line}" for p in repository_files() for line in sys_path_changes(syntax(p))]
    assert not found, "sys.path changed (import through the installed `tracetune` package instead):\n" + \
        "\n".join(found)


def old_imports(tree: ast.Module, old: set[str]) -> Iterator[tuple[int, str]]:
    """(line, name) of every absolute import whose first part is one of the old top-level names."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.split(".")[0] in old)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] in old:
            yield node.lineno, node.module


def test_no_import_of_the_old_top_level_names():
    old = {folder for folder, package in package_dirs().items() if folder != package}
    found = [f"{relative(p)}:{line}: {name} (now tracetune.{name})" for p in repository_files()
             for line, name in old_imports(syntax(p), old)]
    assert not found, "imports of the old top-level names:\n" + "\n".join(found)


def imports_of(tree: ast.Module, targets: tuple[str, ...]) -> Iterator[tuple[int, str]]:
    """(line, name) of every absolute import of one of `targets` or a module inside one, anywhere in
    the module: `import t.x`, `from t import x`, `from t.x import y`, and `from parent import t`."""
    def hit(name: str) -> bool:
        return any(name == t or name.startswith(t + ".") for t in targets)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if hit(a.name))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] if hit(node.module) else \
                [f"{node.module}.{a.name}" for a in node.names if hit(f"{node.module}.{a.name}")]
            yield from ((node.lineno, name) for name in names)


def test_the_import_rules_see_what_they_look_for():
    tree = ast.parse("import tracetune.engine_adapter.vllm.settings\nfrom tracetune.engine_adapter import vllm, kind\n"
                     "def f():\n    from tracetune.engine_adapter.vllm import VLLMConfig\n"
                     "from tracetune.engine_adapter.vllmx import y\nfrom tracetune.engine_adapter.kind import vllm\n")
    assert list(imports_of(tree, ENGINE_PACKAGES)) == [
        (1, "tracetune.engine_adapter.vllm.settings"), (2, "tracetune.engine_adapter.vllm"),
        (4, "tracetune.engine_adapter.vllm")]
    graph = {"tracetune.dashboard.a": {"tracetune.tuner.storage"}, "tracetune.tuner.storage": {"tracetune.tuner.study"},
             "tracetune.tuner.study": set(), "tracetune.cli.x": {"tracetune.tuner.study"}}
    assert reached_from(graph, "tracetune.dashboard", STUDY_RUNNERS) == [
        ["tracetune.dashboard.a", "tracetune.tuner.storage", "tracetune.tuner.study"]]
    assert reached_from({"tracetune.dashboard.a": set()}, "tracetune.dashboard", STUDY_RUNNERS) == []


def test_no_engine_package_imported_from_outside_engine_adapter():
    found = [f"{relative(path)}:{line}: {name}" for module, path in modules().items()
             if not module.startswith("tracetune.engine_adapter")
             for line, name in imports_of(syntax(path), ENGINE_PACKAGES)]
    assert not found, "an engine's own package imported from outside engine_adapter/ (reach the engine " \
                      "through its EngineKind, engine_adapter.registry):\n" + "\n".join(found)


def reached_from(graph: dict[str, set[str]], package: str, targets: tuple[str, ...]) -> list[list[str]]:
    """For each module of `package` that imports one of `targets` (a module or one inside it), directly
    or through other modules, the shortest chain of imports that gets there (breadth first)."""
    def hit(name: str) -> bool:
        return any(name == t or name.startswith(t + ".") for t in targets)
    chains = []
    for start in sorted(m for m in graph if m == package or m.startswith(package + ".")):
        seen, queue = {start}, [[start]]
        while queue:
            chain = queue.pop(0)
            if hit(chain[-1]):
                chains.append(chain)
                break
            for nxt in sorted(graph.get(chain[-1], ())):
                if nxt not in seen:
                    seen.add(nxt)
                    queue.append([*chain, nxt])
    return chains


def test_the_dashboard_imports_no_study_runner():
    found = reached_from(import_graph(), "tracetune.dashboard", STUDY_RUNNERS)
    assert not found, "the read-only dashboard imports a study runner (each line: the chain of imports):\n" + \
        "\n".join(" -> ".join(chain) for chain in found)


# `Any` and the aliases of it (tracetune.types: JSON whose shape is not known is still unchecked).
ANY_NAMES = frozenset({"Any", "Json", "JsonDict"})


def _names_any(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id in ANY_NAMES or \
        isinstance(node, ast.Attribute) and node.attr in ANY_NAMES


def any_lines(tree: ast.Module) -> set[int]:
    """Lines that name `Any` or its JSON aliases (`Any`, `typing.Any`, `Json`, `JsonDict`, or inside a
    string annotation); an import is not a use."""
    lines = set()
    for node in ast.walk(tree):
        if _names_any(node):
            lines.add(node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200 \
                and any(name in node.value for name in ANY_NAMES):
            try:
                annotation = ast.parse(node.value, mode="eval")
            except SyntaxError:
                continue
            if any(_names_any(n) for n in ast.walk(annotation)):
                lines.add(node.lineno)
    return lines


def test_the_any_count_sees_what_it_looks_for():
    tree = ast.parse("from typing import Any\nimport typing\nx: Any = 1\ndef f(a: 'dict[str, Any]') -> typing.Any:"
                     "\n    return a\ny: 'Anything' = 2\nz = 'Any day now'\nj: JsonDict = {}\nk: 'list[Json]' = []\n"
                     "JsonList = 1\n")
    assert any_lines(tree) == {3, 4, 8, 9}


def test_any_on_at_most_120_lines_of_package_code():
    per_file = {relative(path): len(any_lines(syntax(path))) for path in modules().values()}
    total = sum(per_file.values())
    top = sorted(((n, f) for f, n in per_file.items() if n), reverse=True)[:15]
    assert total <= MAX_ANY_LINES, f"`Any` or its JSON aliases on {total} lines of package code (at most " \
        f"{MAX_ANY_LINES}; type the data: a record, a TypedDict, a protocol, tracetune.types.Scalar); the most:\n" + "\n".join(f"{n:4} {f}" for n, f in top)


# The packages bottom up; a package imports only those on lower floors (capacity and quality share
# one floor and import neither each other; so do the dashboard and the fleet manifests).
# `tracetune.__main__` runs the command line: the entry point, not a floor.
FLOORS = [{"tracetune"}, {"tracetune.engine_adapter"}, {"tracetune.replay"},
          {"tracetune.capacity", "tracetune.quality"}, {"tracetune.search_spaces"}, {"tracetune.tuner"},
          {"tracetune.dashboard", "tracetune.fleet"}, {"tracetune.cli"}]
ENTRY_POINTS = {"tracetune.__main__"}


def package_of(module: str) -> str:
    """The floor's package a module belongs to: `tracetune.capacity.levels` -> `tracetune.capacity`."""
    parts = module.split(".")
    candidate = ".".join(parts[:2])
    return candidate if any(candidate in floor for floor in FLOORS) else "tracetune"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """'a -> b' for every import of a module on the same floor's other package or on a higher floor."""
    level = {package: i for i, floor in enumerate(FLOORS) for package in floor}
    found = []
    for module, targets in graph.items():
        if module in ENTRY_POINTS:
            continue
        here = package_of(module)
        for target in targets:
            there = package_of(target)
            if there != here and level[there] >= level[here]:
                found.append(f"{module} -> {target}")
    return sorted(found)


def test_the_floor_check_sees_what_it_looks_for():
    graph = {"tracetune.replay.trace": {"tracetune.tuner.front"}, "tracetune.capacity.levels":
             {"tracetune.quality.gate", "tracetune.replay.trace"}, "tracetune.__main__": {"tracetune.cli.main"}}
    assert upward_imports(graph) == ["tracetune.capacity.levels -> tracetune.quality.gate",
                                     "tracetune.replay.trace -> tracetune.tuner.front"]


def test_every_package_sits_on_a_floor():
    assert {package_of(m) for m in modules()} <= set().union(*FLOORS)
    assert set(package_dirs().values()) == set().union(*FLOORS)


def test_no_import_runs_back_up_the_floors():
    found = upward_imports(import_graph())
    assert not found, "imports of a package on the same or a higher floor (data flows trace -> replay -> " \
                      "capacity, quality -> tuner -> dashboard -> cli):\n" + "\n".join(found)
