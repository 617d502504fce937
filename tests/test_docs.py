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


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_no_machine_specific_paths(path: Path) -> None:
    """Commands must run from any checkout: no absolute paths into one machine's directories."""
    bad = [ln for ln in path.read_text().splitlines() if re.search(r"(?<![\w.])/(work|home|tmp|Users)/", ln)]
    assert not bad, f"{path.name}: machine-specific paths: {bad}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_named_test_files_exist(path: Path) -> None:
    named = set(re.findall(r"tests/[\w/]+\.py", path.read_text()))
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"{path.name} names test files that do not exist: {missing}"


@pytest.mark.parametrize("path", DOCS, ids=lambda p: p.name)
def test_documented_cli_commands_parse(path: Path) -> None:
    """Every `python -m dtensor_rules ...` / `./run.sh ...` line shown is accepted by the CLI's parser."""
    import shlex

    from dtensor_rules.cli.main import build_parser

    text = re.sub(r"python\s+-m\s+dtensor_rules\s+", "python -m dtensor_rules ", path.read_text())  # wrapped lines
    commands = re.findall(r"(?:python -m dtensor_rules|\./run\.sh) ([a-z][^`#\n]*)", text)
    for cmd in commands:
        argv = [a for a in shlex.split(cmd.strip()) if a not in ("...",)]
        if not argv or argv[0] in ("test", "COMMAND"):
            continue
        argv = [("cumsum" if a in ("NAME", "OP") else a) for a in argv]
        try:
            build_parser().parse_args(argv)
        except SystemExit as e:
            raise AssertionError(f"{path.name}: documented command rejected by the CLI: {cmd!r}") from e
