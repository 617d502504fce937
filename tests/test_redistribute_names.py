"""The planner package is importable under its documented path; no top-level name shadows it."""

from __future__ import annotations

import types

import pytest

import dtensor_rules
from tests._fresh import run_python


def test_package_path_is_the_package_not_the_function():
    import dtensor_rules.redistribute as rd

    assert isinstance(rd, types.ModuleType)
    assert isinstance(dtensor_rules.redistribute, types.ModuleType)
    assert callable(rd.plan) and callable(rd.redistribute) and callable(rd.distribute_tensor)


def test_top_level_functions_are_the_package_functions():
    from dtensor_rules.redistribute import distribute_tensor, plan, redistribute

    assert dtensor_rules.redistribute_with_order is redistribute
    assert dtensor_rules.plan is plan and dtensor_rules.distribute_tensor is distribute_tensor


@pytest.mark.slow
def test_fresh_interpreter_import_as_works():
    """``import dtensor_rules.redistribute as rd; rd.plan`` in a fresh process (what the docs title promises)."""
    code = "import dtensor_rules.redistribute as rd; print(rd.plan.__module__)"
    out = run_python(code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "dtensor_rules.redistribute.api"
