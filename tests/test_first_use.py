"""A user's first run is clean: the README and docs/index.md quick starts print nothing on stderr
(no fake-tensor ERROR tracebacks from ``_grouped_mm``'s fp32 meta fallback)."""

from __future__ import annotations

import re
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
