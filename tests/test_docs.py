"""Every ```python block in README.md and docs/*.md runs as written, and every relative link resolves.

Blocks of one file run in order in one namespace (a later block may use an earlier one's
names), in a fresh subprocess-free namespace per file. Blocks assert their own results; a
```text block right after a ```python block is that block's printed output, compared exactly.
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
BLOCK = re.compile(r"^```python\n(.*?)^```", flags=re.S | re.M)
# a python block and the ```text block that follows it (only blank lines between): its expected stdout
BLOCK_AND_OUTPUT = re.compile(r"^```python\n(.*?)^```\n(?:[ \t]*\n)*(?:```text\n(.*?)^```$)?", flags=re.S | re.M)
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")

# Names a file's blocks must leave behind: proof its last block really ran.
MUST_DEFINE = {
    "custom_ops.md": {"out", "keep"},
    "README.md": {"out", "expected"},
    "index.md": {"report", "cost"},
}


def python_blocks(path: Path) -> list[str]:
    return BLOCK.findall(path.read_text())


def blocks_with_output(path: Path) -> list[tuple[str, str | None]]:
    """(code, expected stdout or None) per python block, in order."""
    return [(code, out or None) for code, out in BLOCK_AND_OUTPUT.findall(path.read_text())]


def with_blocks() -> list[Path]:
    return [p for p in DOCS if python_blocks(p)]


def test_the_docs_exist_and_have_examples() -> None:
    names = {p.name for p in with_blocks()}
    assert {"README.md", "index.md", "writing_rules.md", "custom_ops.md", "device_order.md", "comparison.md"} <= names
    assert len(python_blocks(ROOT / "README.md")) == len(blocks_with_output(ROOT / "README.md"))


def test_the_readme_leads_with_expert_parallel_and_pins_its_output() -> None:
    """The first example is what a trainer should use, and what it prints is checked."""
    (code, expected), *_ = blocks_with_output(ROOT / "README.md")
    assert "expert_parallel(" in code and expected is not None
    paths = {ln.split()[0]: ln for ln in expected.splitlines() if ln.startswith("  ")}
    assert "all_to_all" in paths["expert_parallel"] and "all_gather" not in paths["expert_parallel"]
    assert "all_gather" in paths["shard_moe"] and set(paths) == {"expert_parallel", "shard_moe"}


def test_an_output_block_is_read_only_right_after_its_code() -> None:
    # negative control for the pairing: prose between them unpairs, blank lines do not
    text = "```python\nprint(1)\n```\n\n```text\n1\n```\n```python\nprint(2)\n```\nsays\n```text\n2\n```\n"
    assert [(c, o or None) for c, o in BLOCK_AND_OUTPUT.findall(text)] == [("print(1)\n", "1\n"), ("print(2)\n", None)]


@pytest.mark.parametrize("path", with_blocks(), ids=lambda p: p.name)
def test_python_blocks_run(path: Path) -> None:
    namespace: dict[str, object] = {"__name__": f"docs_{path.stem}"}
    for i, (code, expected) in enumerate(blocks_with_output(path)):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"{path}:block{i}", "exec"), namespace)  # noqa: S102
        if expected is not None:
            got = [ln.rstrip() for ln in printed.getvalue().rstrip("\n").split("\n")]
            assert got == [ln.rstrip() for ln in expected.rstrip("\n").split("\n")], (
                f"{path.name} block {i} printed:\n" + "\n".join(got) + "\nthe ```text block after it says:\n" + expected)
    missing = MUST_DEFINE.get(path.name, set()) - namespace.keys()
    assert not missing, f"{path.name}: the blocks did not define {missing}"


def _each_doc(find: Callable[[Path], list]) -> dict[str, list]:
    """``{doc name: what find(path) found}`` for every doc where it found something."""
    return {p.name: found for p in DOCS if (found := find(p))}


def test_relative_links_resolve() -> None:
    broken = _each_doc(lambda p: [t for t in LINK.findall(p.read_text()) if "://" not in t and not (p.parent / t).exists()])
    assert not broken, f"broken links: {broken}"


def test_no_machine_specific_paths() -> None:
    """Commands must run from any checkout: no absolute paths into one machine's directories."""
    bad = _each_doc(lambda p: [ln for ln in p.read_text().splitlines() if re.search(r"(?<![\w.])/(work|home|tmp|Users)/", ln)])
    assert not bad, f"machine-specific paths: {bad}"


def test_named_test_files_exist() -> None:
    missing = _each_doc(lambda p: sorted(n for n in set(re.findall(r"tests/[\w/]+\.py", p.read_text())) if not (ROOT / n).exists()))
    assert not missing, f"docs name test files that do not exist: {missing}"


def _rejected_commands(path: Path) -> list[str]:
    """The `python -m dtensor_rules ...` / `./run.sh ...` lines shown in one doc that the CLI's parser rejects."""
    import contextlib
    import io
    import shlex

    from dtensor_rules.cli.main import build_parser

    text = re.sub(r"python\s+-m\s+dtensor_rules\s+", "python -m dtensor_rules ", path.read_text())  # wrapped lines
    rejected = []
    for cmd in re.findall(r"(?:python -m dtensor_rules|\./run\.sh) ([a-z][^`#\n]*)", text):
        argv = [a for a in shlex.split(cmd.strip()) if a not in ("...",)]
        if not argv or argv[0] in ("test", "COMMAND"):
            continue
        argv = [("cumsum" if a in ("NAME", "OP") else a) for a in argv]
        try:
            with contextlib.redirect_stderr(io.StringIO()):
                build_parser().parse_args(argv)
        except SystemExit:
            rejected.append(cmd)
    return rejected


def test_documented_cli_commands_parse() -> None:
    """Every `python -m dtensor_rules ...` / `./run.sh ...` line shown is accepted by the CLI's parser."""
    rejected = _each_doc(_rejected_commands)
    assert not rejected, f"documented commands the CLI rejects: {rejected}"


def _unprefixed_pythonpath(path: Path) -> list[str]:
    """The package lives in src/ (src layout): `PYTHONPATH=$PWD` would import nothing of it."""
    return [ln for ln in path.read_text().splitlines() if re.search(r"PYTHONPATH=\$PWD(?!/src\b)", ln)]


def test_documented_pythonpath_points_at_src() -> None:
    bad = _each_doc(_unprefixed_pythonpath)
    assert not bad, f"PYTHONPATH must name src/: {bad}"


def test_a_doc_that_needs_the_test_extra_says_how_to_install_it() -> None:
    """writing_rules.md's examples import hypothesis, which only the [test] extra installs."""
    silent = {}
    for path in with_blocks():
        code = "\n".join(python_blocks(path))
        needs = sorted(m for m in ("hypothesis", "pytest", "expecttest") if re.search(rf"^\s*(from|import) {m}\b", code, re.M))
        if needs and 'pip install -e ".[test]"' not in path.read_text():
            silent[path.name] = needs
    assert not silent, f"docs import test-only packages without naming the [test] extra's pip command: {silent}"
