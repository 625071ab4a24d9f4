"""The import contracts of fused_layers and trainprof.

fused_layers: no cycle, lazy imports (inside functions) included, and the layers point one way:
ops -> dispatch -> backends, a backend never reaching back up, the CUDA C++ backend a leaf beside
the shared custom-op glue.

trainprof: no cycle among the imports that run, at the top of a module or inside a function (a
lazy import, there to keep torch out of `trainprof analyze`, closes a cycle as surely); imports under
`if TYPE_CHECKING:` do not count (they never run, and only name a type for an annotation), and
the C modules count through their `.pyi` types. Also: the base records (`analysis.records`) import no
analysis module, and no library module imports a command module.

The graph is read from the source with ``ast`` (nothing is imported), so an import that only runs
on a GPU, or inside a function, counts as much as one at the top of a module.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``package`` (a folder of ROOT)."""
    modules = {}
    for path in sorted([*(ROOT / package).rglob("*.py"), *(ROOT / package).rglob("*.pyi")]):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of ``modules`` that importing ``name`` runs: itself, or its longest known prefix."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _type_checking_blocks(tree: ast.AST) -> set[int]:
    """The ids of the nodes inside `if TYPE_CHECKING:` blocks of `tree`."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            inside.update(id(child) for statement in node.body for child in ast.walk(statement))
    return inside


def import_graph(package: str, type_checking: bool = True) -> dict[str, set[str]]:
    """Module -> the modules of ``package`` it imports anywhere in its source (lazy imports included;
    those under `if TYPE_CHECKING:` only with ``type_checking``).

    ``from a import b`` is an edge to the module ``a.b`` where that is a module, else to ``a``.
    """
    modules = _modules(package)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        is_package = path.name == "__init__.py"
        targets = set()
        tree = ast.parse(path.read_text(), str(path))
        skipped = set() if type_checking else _type_checking_blocks(tree)
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets.update(_resolve(alias.name, modules) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: from the module's package, one level up per extra dot
                    anchor = module.split(".")[: len(module.split(".")) - node.level + is_package]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    targets.add(full if full in modules else _resolve(base, modules))
        graph[module] = {target for target in targets if target is not None and target != module}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as [a, b, ..., a], or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for target in sorted(graph.get(node, ())):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done:
                cycle = visit(target)
                if cycle:
                    return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph("fused_layers")


def test_the_cycle_finder_finds_a_lazy_import_cycle(tmp_path, monkeypatch):
    """The check itself: a cycle closed by an import inside a function is found."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.a import g\n")
    (package / "c.py").write_text("from . import a\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    pkg_graph = import_graph("pkg")
    assert pkg_graph["pkg.c"] == {"pkg.a"}
    assert find_cycle(pkg_graph) == ["pkg.a", "pkg.b", "pkg.a"]


def test_fused_layers_has_no_import_cycle(graph):
    assert "fused_layers.dispatch" in graph and "fused_layers.backends.cuda.build" in graph
    assert find_cycle(graph) is None


def _imports_under(graph: dict[str, set[str]], prefix: str) -> dict[str, set[str]]:
    return {module: targets for module, targets in graph.items() if module.startswith(prefix)}


def test_backends_never_reach_back_up(graph):
    """A backend imports only from fused_layers.backends; the torch one from nothing of ours; the CUDA
    C++ one from itself and the shared custom-op glue only (no Triton, no ops, no dispatch)."""
    for module, targets in _imports_under(graph, "fused_layers.backends").items():
        assert all(t.startswith("fused_layers.backends") for t in targets), (module, targets)
    for module, targets in _imports_under(graph, "fused_layers.backends.torch").items():
        assert targets == set(), (module, targets)
    allowed = ("fused_layers.backends.cuda", "fused_layers.backends.custom_ops")
    for module, targets in _imports_under(graph, "fused_layers.backends.cuda").items():
        assert all(t.startswith(allowed) for t in targets), (module, targets)


def test_ops_pick_their_implementation_through_dispatch_only(graph):
    """The public ops reach a backend through the one table, never directly."""
    for module, targets in _imports_under(graph, "fused_layers.ops").items():
        assert not any(t.startswith("fused_layers.backends") for t in targets), (module, targets)
        assert "fused_layers.dispatch" in targets, module


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of ``graph`` with more than one module: its cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    components: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(component)

    for start in sorted(graph):
        if start not in index:
            visit(start)
    return components


@pytest.fixture(scope="module")
def trainprof_graph() -> dict[str, set[str]]:
    return import_graph("trainprof", type_checking=False)


def test_a_type_checking_import_is_left_out_on_request(tmp_path, monkeypatch):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from pkg import b\n")
    (package / "b.py").write_text("def f():\n    from pkg.a import g\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert find_cycle(import_graph("pkg")) == ["pkg.a", "pkg.b", "pkg.a"]
    assert find_cycle(import_graph("pkg", type_checking=False)) is None
    assert _cycles(import_graph("pkg")) == [{"pkg.a", "pkg.b"}]


def test_trainprof_has_no_import_cycle(trainprof_graph):
    assert "trainprof.analysis.records" in trainprof_graph and "trainprof.trace._scan" in trainprof_graph
    assert _cycles(trainprof_graph) == []


def test_the_base_records_import_no_analysis_module():
    """`records` (the base types every analysis module imports) names no analysis module's types,
    not even for annotations: only the vocabulary and what each kind's figures are."""
    full = import_graph("trainprof")
    assert full["trainprof.analysis.records"] == {"trainprof.analysis.kinds", "trainprof.analysis.figures"}
    assert full["trainprof.analysis.kinds"] == set() and full["trainprof.analysis.figures"] == set()


def test_no_trainprof_library_module_imports_a_command_module():
    """The command line (`trainprof.cli`, one module per command family) sits on top of the library:
    no other module of trainprof imports it, lazily or not (#34 item 5), except `python -m trainprof`."""
    graph = import_graph("trainprof")
    assert {"trainprof.cli", "trainprof.cli.analyze", "trainprof.cli.run", "trainprof.cli.ab",
            "trainprof.cli.ncu", "trainprof.cli.common"} <= set(graph)
    outside = {module: sorted(t for t in targets if t == "trainprof.cli" or t.startswith("trainprof.cli."))
               for module, targets in graph.items()
               if not module.startswith("trainprof.cli") and module != "trainprof.__main__"}
    assert {module: targets for module, targets in outside.items() if targets} == {}
