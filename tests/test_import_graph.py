"""No import circles inside the package: no module imports (at module level, in a function, or for type checking
only) a module that imports it back, directly or through others.

The graph is read from the source with ``ast`` (nothing is imported). An edge from a module to one of its own
parent packages is left out: Python imports the parent before the child, so that edge never loads anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from paths import PACKAGE

#: Circles known and owned elsewhere, each with the way out; remove an entry once its circle is broken.
TOLERATED: dict[frozenset[str], str] = {}


def module_names(root: Path = PACKAGE) -> dict[str, Path]:
    """Dotted name -> file of every module of the package (packages by their ``__init__.py``)."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        names[".".join(parts)] = path
    return names


def _targets(module: str, is_package: bool, node: ast.Import | ast.ImportFrom, names: dict[str, Path]) -> set[str]:
    """The package's modules that ``node`` (in ``module``) imports."""
    if isinstance(node, ast.Import):
        candidates = [alias.name for alias in node.names]
    else:
        if node.level:
            base = module.split(".")[: None if is_package else -1]
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        # `from package import module` imports the module; `from module import name` the module itself
        candidates = [f"{target}.{alias.name}" if f"{target}.{alias.name}" in names else target for alias in node.names]
    found = set()
    for name in candidates:
        while name and name not in names:
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def import_graph(root: Path = PACKAGE) -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source (parent packages left out)."""
    names = module_names(root)
    graph = {}
    for module, path in names.items():
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _targets(module, path.name == "__init__.py", node, names)
        graph[module] = {t for t in edges if t != module and not module.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of two or more modules (Tarjan), each sorted; every import circle lies
    in one.

    >>> circles({"a": {"b"}, "b": {"a", "c"}, "c": set(), "d": {"c"}})
    [['a', 'b']]
    >>> circles({"a": {"b"}, "b": {"c"}, "c": {"a"}})
    [['a', 'b', 'c']]
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def test_the_graph_sees_module_level_function_level_and_type_checking_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "trl_padfree"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("def f():\n    from .sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..a import f\n")
    (pkg / "sub" / "c.py").write_text("from .. import sub\nimport trl_padfree.a\n")
    graph = import_graph(pkg)
    assert graph == {
        "trl_padfree": {"trl_padfree.a"},
        "trl_padfree.a": {"trl_padfree.sub.b"},
        "trl_padfree.sub": set(),
        "trl_padfree.sub.b": {"trl_padfree.a"},
        "trl_padfree.sub.c": {"trl_padfree.a"},  # its parent packages left out
    }
    assert circles(graph) == [["trl_padfree.a", "trl_padfree.sub.b"]]


def test_the_package_has_no_import_circle() -> None:
    graph = import_graph()
    assert len(graph) > 40 and "trl_padfree.launch.config" in graph["trl_padfree.launch.validate"]
    found = [c for c in circles(graph) if frozenset(c) not in TOLERATED]
    assert not found, "import circles (break each: move what both need to a module of its own): " + "; ".join(
        " <-> ".join(c) for c in found
    )


@pytest.mark.parametrize("pair", sorted(TOLERATED, key=sorted), ids=lambda p: " <-> ".join(sorted(p)))
def test_a_tolerated_circle_is_still_there(pair: frozenset[str]) -> None:
    """Once broken, its entry goes (and a new circle between the two fails the test above again)."""
    assert sorted(pair) in circles(import_graph()), f"{' <-> '.join(sorted(pair))} is broken: remove it from TOLERATED"


#: The layers on top: the command line and the commands it runs (``check`` is ``trl-padfree check``). The core (every
#: other module) never imports them.
TOP_LAYERS = ("trl_padfree.cli", "trl_padfree.check", "trl_padfree.launch", "trl_padfree.bench")


def _in(module: str, layers: tuple[str, ...]) -> bool:
    return any(module == layer or module.startswith(layer + ".") for layer in layers)


def upward_imports(graph: dict[str, set[str]], top: tuple[str, ...] = TOP_LAYERS) -> list[str]:
    """``"core -> top"`` for every import of a top layer by a module of the core (sorted).

    >>> upward_imports({"trl_padfree.trainer": {"trl_padfree.launch.defaults"}, "trl_padfree.launch": {"trl_padfree.trainer"}})
    ['trl_padfree.trainer -> trl_padfree.launch.defaults']
    """
    return sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if not _in(module, top)
        for target in targets
        if _in(target, top)
    )


def test_an_upward_import_is_found_in_a_function_too(tmp_path: Path) -> None:
    pkg = tmp_path / "trl_padfree"
    (pkg / "launch").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "trainer.py").write_text("def f():\n    from .launch import defaults\n")
    (pkg / "launch" / "__init__.py").write_text("from .. import trainer\n")
    (pkg / "launch" / "defaults.py").write_text("")
    assert upward_imports(import_graph(pkg)) == ["trl_padfree.trainer -> trl_padfree.launch.defaults"]


def test_the_core_never_imports_the_launch_or_the_bench() -> None:
    graph = import_graph()
    assert "trl_padfree.threads" in graph["trl_padfree.launch.defaults"]  # the launch sits on the core
    found = upward_imports(graph)
    assert not found, (
        "modules below the launch import it or the bench (move what they need below, e.g. into "
        "trl_padfree/threads.py for the thread policy): " + "; ".join(found)
    )
