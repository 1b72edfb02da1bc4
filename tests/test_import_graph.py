"""The packages' import graph has no circle, counting every import: module-level ones, those under
``if TYPE_CHECKING:`` and those inside functions; and reading results imports no agent."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agent_shell", "cb_core", "cb_io", "envs")


def modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every module of ours ``path`` imports anywhere in its text (``from package import name``
    counts as the submodule ``package.name`` when there is one, else as ``package``)."""

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(resolve(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in known else resolve(node.module))
    return {m for m in found if m is not None}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in graph:
        if v not in index:
            visit(v)
    return out


def test_the_finder_sees_a_circle_closed_only_by_a_type_checking_import(tmp_path):
    """The detector itself: a circle whose one edge is under TYPE_CHECKING and another inside a
    function is found."""
    (tmp_path / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import b\n")
    (tmp_path / "b.py").write_text("def f():\n    import a\n")
    known = {"a": tmp_path / "a.py", "b": tmp_path / "b.py"}
    assert circles({m: imports(p, known) - {m} for m, p in known.items()}) == [["a", "b"]]


def test_no_import_circle_even_counting_type_checking_and_in_function_imports():
    known = modules()
    graph = {m: imports(p, known) - {m} for m, p in known.items()}
    assert circles(graph) == []


def test_reading_results_imports_no_agent_and_no_configuration():
    code = ("import sys, agent_shell.results\n"
            "print(sorted(m for m in sys.modules if m.startswith(('agent_shell.agents', 'agent_shell.run_config', "
            "'agent_shell.calibration'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True)
    assert out.stdout.strip() == "[]"


def test_files_and_numerics_import_no_other_layer_and_the_lm_layer_no_game():
    """cb_io and cb_core import nothing else of the project; the LM backends, the feature
    extractors and the embedder write their files through cb_io and import no game."""
    known = modules()
    for name, path in known.items():
        found = imports(path, known)
        if name.split(".")[0] in ("cb_io", "cb_core"):
            assert {m.split(".")[0] for m in found} <= {name.split(".")[0]}, (name, found)
        if name.startswith(("agent_shell.lm", "agent_shell.features", "agent_shell.embeddings")):
            assert not any(m.split(".")[0] == "envs" for m in found), (name, found)
