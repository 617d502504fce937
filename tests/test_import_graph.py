"""No import cycles between registry, ops, costs and the sample suites (checked statically, ast).

Direction: ops -> registry, ops -> costs, registry -> costs, testing -> the product. So:
costs never imports the registry or ops; the registry never imports ops; the suites never
import ops; and the product (everything but the test kit ``testing/`` and the face ``cli/``)
never imports the test kit: a rule names its samples (``core.suite_ref.suite``), loaded when a
checking tool calls them. Every import counts, function-level ones included (a lazy import is
still a cycle).
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
    assert {"ops", "registry.py", "core", "costs", "__init__.py"} <= set(PRODUCT), PRODUCT


def _files(sub: str) -> list[Path]:
    target = PACKAGE / sub
    return sorted(target.rglob("*.py")) if target.is_dir() else [target]


@pytest.mark.parametrize(
    "files, forbidden",
    [
        ("costs", ("dtensor_rules.registry", "dtensor_rules.ops")),
        ("registry.py", ("dtensor_rules.ops",)),
        ("testing/suites", ("dtensor_rules.ops",)),
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
