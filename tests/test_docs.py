"""Every ```python block in README.md and docs/*.md runs as written, and every relative link resolves.

Blocks of one file run in order in one namespace (a later block may use an earlier one's
names), in a fresh subprocess-free namespace per file. Blocks assert their own results.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")

# Names a file's blocks must leave behind: proof its last block really ran.
MUST_DEFINE = {
    "custom_ops.md": {"out", "keep"},
    "README.md": {"out", "expected"},
    "index.md": {"report", "cost"},
}


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text())


def with_blocks() -> list[Path]:
    return [p for p in DOCS if python_blocks(p)]


def test_the_docs_exist_and_have_examples() -> None:
    names = {p.name for p in with_blocks()}
    assert {"README.md", "index.md", "writing_rules.md", "custom_ops.md", "device_order.md", "comparison.md"} <= names


@pytest.mark.parametrize("path", with_blocks(), ids=lambda p: p.name)
def test_python_blocks_run(path: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for i, code in enumerate(python_blocks(path)):
        exec(compile(code, f"{path}:block{i}", "exec"), namespace)  # noqa: S102
    missing = MUST_DEFINE.get(path.name, set()) - namespace.keys()
    assert not missing, f"{path.name}: the blocks did not define {missing}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_relative_links_resolve(path: Path) -> None:
    broken = [t for t in LINK.findall(path.read_text()) if "://" not in t and not (path.parent / t).exists()]
    assert not broken, f"{path.name}: broken links {broken}"
