"""A user's first run is clean: the README and docs/index.md quick starts print nothing on stderr
(no fake-tensor ERROR tracebacks from ``_grouped_mm``'s fp32 meta fallback)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests._fresh import ROOT, run_python

pytestmark = pytest.mark.slow  # see pyproject.toml


def _first_python_block(path: Path) -> str:
    match = re.search(r"```python\n(.*?)```", path.read_text(), re.S)
    assert match, f"{path} has no python block"
    return match.group(1)


@pytest.mark.parametrize("doc", ["README.md", "docs/index.md"])
def test_quick_start_runs_without_errors_on_stderr(doc: str) -> None:
    proc = run_python(_first_python_block(ROOT / doc))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ERROR" not in proc.stderr and "Traceback" not in proc.stderr and ":E1" not in proc.stderr, proc.stderr[:3000]


def test_a_rejected_call_still_raises_torch_error_without_log_noise() -> None:
    """The quieted log is only for failures the fallback handles: torch's error still reaches the caller."""
    code = """
import torch, dtensor_rules
from torch.distributed.tensor import Replicate, distribute_tensor
from dtensor_rules.testing import simulated_mesh
with simulated_mesh((2,)) as mesh:
    rep = lambda t: distribute_tensor(t, mesh, [Replicate()])
    try:
        torch._grouped_mm(rep(torch.randn(6, 8)), rep(torch.randn(2, 7, 8)), offs=rep(torch.tensor([2, 6], dtype=torch.int32)))
    except RuntimeError as e:
        assert "contraction" in str(e), e
    else:
        raise SystemExit("no error")
"""
    proc = run_python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[:3000]


# --------------------------------------------------------------------------- the src/ layout
def _find_package(cwd: Path, installed: bool) -> str:
    """Where ``import dtensor_rules`` resolves for a script run in ``cwd``: the origin file, "namespace",
    or "missing". ``-S`` drops site-packages (no other install can answer); ``installed`` stands for
    the editable install, which for a src/ layout is one ``.pth`` path entry to ``src/``: on sys.path
    after the script's folder, exactly where ``PYTHONPATH`` puts it."""
    code = ("import importlib.util as u; s = u.find_spec('dtensor_rules'); "
            "print('missing' if s is None else s.origin if s.origin else 'namespace')")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if installed:
        env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([sys.executable, "-S", "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_a_checkout_named_like_the_package_never_shadows_the_install(tmp_path: Path) -> None:
    """A script beside a clone called dtensor_rules/ (or inside the clone) imports the installed package."""
    checkout = tmp_path / "dtensor_rules"  # the folder `git clone .../dtensor_rules` makes, beside the script
    (checkout / "src" / "dtensor_rules").mkdir(parents=True)
    (checkout / "setup.py").write_text("")
    real = str(ROOT / "src" / "dtensor_rules" / "__init__.py")
    assert _find_package(tmp_path, installed=True) == real
    assert _find_package(ROOT, installed=True) == real
    # the control: nothing installed, that same folder is what Python would import (an empty namespace);
    # the src/ layout is why the install above wins (a regular package on sys.path beats a namespace portion)
    assert _find_package(tmp_path, installed=False) == "namespace"


def test_inside_a_checkout_without_install_the_import_fails_clearly() -> None:
    """From the repo root, not installed: ModuleNotFoundError naming the package, not the source tree
    half-imported and not an empty namespace (the repo root holds no dtensor_rules/ folder)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-S", "-c", "import dtensor_rules"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "ModuleNotFoundError: No module named 'dtensor_rules'" in proc.stderr, proc.stderr
    assert _find_package(ROOT, installed=False) == "missing"


def test_subprocesses_of_tests_and_benchmarks_import_this_checkout() -> None:
    """PYTHONPATH=<repo root> imports nothing of a src/ layout: such a subprocess would silently test
    whatever copy of the package is installed instead of this checkout."""
    pattern = re.compile(r"PYTHONPATH[\"']?\s*[:=,]\s*str\(ROOT\)(?!\s*/\s*\"src\")")
    bad = [f"{p.relative_to(ROOT)}:{i}" for p in sorted([*(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")])
           for i, ln in enumerate(p.read_text().splitlines(), 1) if pattern.search(ln)]
    assert not bad, bad
    assert pattern.search("env = dict(os.environ, PYTHONPATH=" + "str(ROOT))")  # the control: the spelling without src/ is caught
