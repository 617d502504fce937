"""No import cycles among the package's modules, and the layers' direction (checked statically, ast).

Direction: op_rules -> registry, op_rules -> costs, registry -> costs, testing -> the product. So:
costs never imports the registry or op_rules; the registry never imports op_rules; the planner
(redistribute) imports none of the rule machinery; and the product
(everything but the test kit ``testing/`` and the face ``cli/``) never imports the test kit: a
rule's sample suite is a plain function beside it, so the product carries it without the kit. Beyond
that, no module may reach itself through imports (``import_cycles``). Every import counts,
function-level ones included (a lazy import is still a cycle).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "src" / "dtensor_rules"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """(line, module) for every import in ``path`` (or ``source`` as if it lived there);
    ``from a import b`` yields ``a`` and ``a.b``, relative imports are resolved."""
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if source is None else source, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def offending(paths: list[Path], forbidden: tuple[str, ...]) -> list[str]:
    out = []
    for path in paths:
        for line, name in imported_modules(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                out.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {name}")
    return out


# every part of the package but the test kit and the face (cli/, which imports the kit to run ``validate``)
PRODUCT = sorted(p.name for p in PACKAGE.iterdir() if p.name not in ("testing", "cli", "__pycache__")
                 and (p.is_dir() or p.suffix == ".py"))


def test_the_product_list_holds_the_rules() -> None:
    assert {"op_rules", "registry.py", "ep", "costs", "__init__.py"} <= set(PRODUCT), PRODUCT


def _files(sub: str) -> list[Path]:
    target = PACKAGE / sub
    return sorted(target.rglob("*.py")) if target.is_dir() else [target]


@pytest.mark.parametrize(
    "files, forbidden",
    [
        ("costs", ("dtensor_rules.registry", "dtensor_rules.op_rules")),
        ("registry.py", ("dtensor_rules.op_rules",)),
        # the planner registers its torch patches through dtensor_rules.patches, not the rule registry
        ("redistribute", ("dtensor_rules.registry", "dtensor_rules.op_rules", "dtensor_rules.dispatch")),
        *[(part, ("dtensor_rules.testing",)) for part in PRODUCT],
    ],
)
def test_no_import_against_the_direction(files: str, forbidden: tuple[str, ...]) -> None:
    assert offending(_files(files), forbidden) == []


def test_the_checker_sees_lazy_relative_and_from_package_imports() -> None:
    # negative control: the three spellings a cycle hides behind are all caught
    probe = (
        "def f():\n    import dtensor_rules.registry\n"
        "def g():\n    from dtensor_rules import registry\n"
        "def h():\n    from ..registry import rules\n"
    )
    found = imported_modules(PACKAGE / "costs" / "probe.py", probe)
    assert sorted({line for line, name in found if name.startswith("dtensor_rules.registry")}) == [2, 4, 6]



# --------------------------------------------------------------------------- no import cycles at all
# Cycles allowed, each with its reason: (sorted module names) -> why. None today; keep it so.
ALLOWED_CYCLES: dict[tuple[str, ...], str] = {}


def _targets(path: Path, node: ast.stmt, modules: set[str]) -> list[str]:
    """The package modules one import statement needs: the deepest module each name spells
    (``from a import b``: ``a.b`` when that is a module, else ``a``)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        assert isinstance(node, ast.ImportFrom)
        module = _module_name(path)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join(anchor + ([base] if base else []))
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
    out = []
    for name in names:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            out.append(name)
    return out


def import_graph(sources: dict[Path, str] | None = None) -> dict[str, dict[str, int]]:
    """``module -> {package module it imports -> first line}``, for every module of the package.

    Every import counts: module level, inside functions, under ``TYPE_CHECKING`` (a lazy or
    type-only import is still a circle in the design). The parent packages Python also runs
    for ``import a.b`` are not edges, or every submodule would "cycle" with its own package's
    ``__init__``. ``sources`` replaces some files' text (for the negative control).
    """
    sources = sources or {}
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph: dict[str, dict[str, int]] = {}
    for module, path in paths.items():
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(sources[path] if path in sources else path.read_text())):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in _targets(path, node, set(paths)):
                    if target != module:
                        edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def _describe(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    inside = set(cycle)
    edges = [f"{m}:{line} -> {t}" for m in cycle for t, line in sorted(graph[m].items()) if t in inside]
    return " | ".join(edges)


def test_no_import_cycles_among_package_modules() -> None:
    graph = import_graph()
    assert len(graph) > 50 and graph["dtensor_rules.cli.demo"], "the walk saw the package"
    cycles = [c for c in import_cycles(graph) if tuple(c) not in ALLOWED_CYCLES]
    assert not cycles, "import cycles:\n" + "\n".join(_describe(graph, c) for c in cycles)
    stale = [c for c in ALLOWED_CYCLES if list(c) not in import_cycles(graph)]
    assert not stale, f"ALLOWED_CYCLES lists cycles that no longer exist: {stale}"


def test_the_cycle_finder_sees_a_lazy_cycle_through_a_package_init() -> None:
    # negative control: a function-level import back from a module its package's __init__ imports
    path = PACKAGE / "costs" / "op_cost.py"
    probe = path.read_text() + "\n\ndef _probe():\n    from dtensor_rules.costs import estimate\n"
    cycles = import_cycles(import_graph({path: probe}))
    assert any({"dtensor_rules.costs", "dtensor_rules.costs.op_cost"} <= set(c) for c in cycles), cycles
