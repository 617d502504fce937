"""Doc blocks that are whole programs run as the reader would run them: ``python NAME.py``.

A ```python block whose first line is ``# script: NAME.py`` is a program to save and run,
e.g. one that spawns gloo ranks with ``run_gloo``: spawned ranks import their function from
the launching file, so it cannot run inside ``tests/test_docs.py``'s ``exec`` namespace (there
its ``if __name__ == "__main__":`` launch is skipped and the block only defines names). Here it
is saved as NAME.py in a fresh folder and run in a fresh process with this checkout's package.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_docs import BLOCK, DOCS, ROOT

pytestmark = pytest.mark.slow  # starts processes (see pyproject.toml)

SCRIPT = re.compile(r"# script: (\w+\.py)\n")


def script_blocks() -> list[tuple[Path, str, str]]:
    """(doc, file name, code) of every ``# script: NAME.py`` block."""
    return [(p, m.group(1), b) for p in DOCS for b in BLOCK.findall(p.read_text()) if (m := SCRIPT.match(b))]


def test_the_compile_recipes_are_scripts() -> None:
    """Both runnable recipes of docs/compile.md (the gather-path block, compiled expert parallelism)
    are found, so test_script_blocks_run runs them as a user would."""
    assert [(p.name, name) for p, name, _ in script_blocks()] == [("compile.md", "compile_moe.py"), ("compile.md", "compile_ep.py")]


@pytest.mark.parametrize("path,name,code", script_blocks(), ids=[name for _, name, _ in script_blocks()])
def test_script_blocks_run(path: Path, name: str, code: str, tmp_path: Path) -> None:
    (tmp_path / name).write_text(code)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, f"{path.name}: python {name} exited {run.returncode}:\n{run.stdout}\n{run.stderr[-4000:]}"
    assert "Traceback" not in run.stderr, f"{path.name}: python {name} printed a traceback:\n{run.stderr[-4000:]}"
    errors = [ln for ln in run.stderr.splitlines() if re.match(r"(\[rank\d+\]:)?E\d{4} ", ln)]
    assert not errors, f"{path.name}: python {name} logged errors:\n" + "\n".join(errors[:10])
