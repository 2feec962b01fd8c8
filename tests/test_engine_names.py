"""Engine knowledge lives in engine_adapter/ (each engine's `EngineKind`): outside it, no module names an
engine in code. Every string a package module holds outside engine_adapter/ (docstrings aside) is
checked for an engine's name (vLLM, llama.cpp and its llama-server, the simulator). What still names
one is listed below, file by file with what it is; the list only shrinks: a new engine name outside
engine_adapter/ fails here (move it into the engine's kind), and one taken out must leave the list."""

from __future__ import annotations

import ast
import re
from collections import Counter

from tests.test_structure import ROOT, modules, syntax

ENGINE_NAME = re.compile(r"vllm|llama|\bsim\b|simulated engine", re.IGNORECASE)
# What still names an engine outside engine_adapter/ (count of strings per file), and what it is.
KNOWN = Counter({
    "cli/capacity.py": 1,  # --help examples
    "cli/dashboard.py": 6,  # --help examples, --vllm-version (an export flag's public name)
    "cli/engine_options.py": 1,  # --engine's help example (vllm+llamacpp)
    "cli/fleet.py": 2,  # --help examples, the default image in help
    "cli/main.py": 6,  # --help examples and usage
    "cli/record.py": 1,  # --help examples
    "cli/replay.py": 1,  # --help examples
    "cli/tune.py": 2,  # --help examples, --engine's help
    "dashboard/export_formats.py": 1,  # the vllm-cmd format's name (a public export name)
    "dashboard/export/document.py": 2,  # measured_vllm/target_vllm keys of the JSON export (public format)
    "fleet/image.py": 1,  # --help example (--engine sim)
    "tuner/trial_record.py": 1,  # the stored vllm_version attribute (older studies read it)
})


def docstrings(tree: ast.Module) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def engine_names(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, text) of every string constant, docstrings aside, that names an engine."""
    skip = docstrings(tree)
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
            and ENGINE_NAME.search(node.value)]


def test_the_check_sees_an_engine_name_in_code_and_not_in_a_docstring():
    tree = ast.parse('"""About vLLM."""\nx = "vllm"\ndef f():\n    """llama.cpp"""\n    return f"{x} llama-server"\n')
    assert [line for line, _ in engine_names(tree)] == [2, 5]


def test_no_engine_name_outside_engine_adapter_but_the_known_ones():
    found: Counter[str] = Counter()
    where: dict[str, list[str]] = {}
    for name, path in modules().items():
        if name.startswith("tracetune.engine_adapter"):
            continue
        hits = engine_names(syntax(path))
        if hits:
            rel = str(path.relative_to(ROOT))
            found[rel] = len(hits)
            where[rel] = [f"{rel}:{line}: {text[:70]!r}" for line, text in hits]
    grown = [line for rel in found if found[rel] > KNOWN[rel] for line in where[rel]]
    assert not grown, ("engine names outside engine_adapter/ (give the engine's kind what it knows, "
                       "engine_adapter/kind.py):\n" + "\n".join(grown))
    assert found == KNOWN, f"fewer engine names than listed: shrink KNOWN to {dict(found)}"
