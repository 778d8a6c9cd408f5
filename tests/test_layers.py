"""Imports flow one way: library → commands → CLI (docs/architecture.md).

The test parses every module of the package with ``ast`` and collects its imports of ``specdec``
modules, at module level *and* inside functions (imports under ``if TYPE_CHECKING:`` are type hints
only and are skipped). It fails on any import cycle and on an import that goes up a layer.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import specdec

ROOT = Path(specdec.__file__).parent

#: the layers (docs/architecture.md): every module not named here is library
COMMANDS = {"specdec.bench", "specdec.demo", "specdec.tune", "specdec.srh", "specdec.fidelity", "specdec.friendly",
            "specdec.evaluation", "specdec.train_draft_command"}
CLI = {"specdec.cli", "specdec.__main__"}
_RANK = {"library": 0, "commands": 1, "cli": 2}


def layer_of(module: str) -> str:
    return "cli" if module in CLI else "commands" if module in COMMANDS else "library"


def _module_name(path: Path, root: Path) -> str:
    rel = path.relative_to(root.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking_block(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")
    )


def import_graph(root: Path) -> dict[str, set[str]]:
    """``{module: {specdec modules it imports}}`` over every ``.py`` file under ``root`` (the package),
    counting imports at any depth (functions, methods, branches) except ``if TYPE_CHECKING:`` blocks."""
    pkg = root.name
    files = {_module_name(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        deps: set[str] = set()
        is_pkg = path.name == "__init__.py"

        def visit(node: ast.AST) -> None:
            for child in ast.iter_child_nodes(node):
                if _type_checking_block(child):
                    for sub in child.orelse:
                        visit(sub)
                    continue
                if isinstance(child, ast.Import):
                    for a in child.names:
                        if a.name == pkg or a.name.startswith(pkg + "."):
                            deps.add(a.name)
                elif isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                        anchor = anchor[: len(anchor) - (child.level - 1)]
                        base = ".".join(anchor + ([base] if base else []))
                    if base == pkg or base.startswith(pkg + "."):
                        for a in child.names:
                            sub = f"{base}.{a.name}"
                            deps.add(sub if sub in files else base)
                visit(child)

        visit(ast.parse(path.read_text(encoding="utf-8")))
        deps.discard(name)
        graph[name] = {d for d in deps if d in files}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]``, or ``None``."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def dfs(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state:
                found = dfs(d)
                if found:
                    return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state:
            found = dfs(m)
            if found:
                return found
    return None


def layer_violations(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """``(importer, imported)`` pairs where a lower layer imports a higher one."""
    return sorted((a, b) for a, deps in graph.items() for b in deps if _RANK[layer_of(b)] > _RANK[layer_of(a)])


def test_every_module_has_a_layer_and_the_layer_names_exist():
    graph = import_graph(ROOT)
    for name in COMMANDS | CLI:
        assert name in graph, f"{name} is listed as a layer module but does not exist"
    assert {layer_of(m) for m in graph} == {"library", "commands", "cli"}


def test_no_import_cycle():
    cycle = find_cycle(import_graph(ROOT))
    assert cycle is None, "import cycle: " + " → ".join(cycle)


def test_imports_go_down_the_layers():
    bad = layer_violations(import_graph(ROOT))
    assert not bad, "imports that go up a layer: " + "; ".join(f"{a} ({layer_of(a)}) imports {b} ({layer_of(b)})" for a, b in bad)


def test_nothing_imports_the_cli():
    graph = import_graph(ROOT)
    users = sorted(m for m, deps in graph.items() if "specdec.cli" in deps and m != "specdec.__main__")
    assert users == [], f"{users} import specdec.cli; move what they need below the commands"


def test_function_level_imports_are_seen(tmp_path):
    """The walker sees an import hidden in a function, and reports the cycle it closes (planted)."""
    pkg = tmp_path / "specdec"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from specdec.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from specdec import a\n    return a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from specdec import a\n")
    graph = import_graph(pkg)
    assert graph["specdec.b"] == {"specdec.a"}
    assert graph["specdec.c"] == set()
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"specdec.a", "specdec.b"}


def test_a_library_module_importing_a_command_is_reported(tmp_path):
    graph = {"specdec.engine": {"specdec.bench"}, "specdec.bench": set()}
    assert layer_violations(graph) == [("specdec.engine", "specdec.bench")]


def test_import_specdec_loads_no_cli_toolkit():
    code = "import specdec, sys; bad = [m for m in ('typer', 'rich', 'click') if m in sys.modules]; print(bad)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]", f"import specdec loaded {out}"


def test_the_walker_parses_every_file():
    for path in ROOT.rglob("*.py"):
        ast.parse(path.read_text(encoding="utf-8"))
