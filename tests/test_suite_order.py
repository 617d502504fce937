"""tests/conftest.py's longest-first schedule: every HEAVIEST entry still names a test, so the list
cannot silently stop scheduling the tests it was written for (a renamed test would fall back to the
slow default and could again start last under ``-n 2``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import HEAVIEST, expected_seconds, xdist_group_of

ROOT = Path(__file__).resolve().parent.parent


def test_every_heaviest_entry_names_a_test_function_and_the_list_is_heaviest_first() -> None:
    missing = []
    for prefix, _ in HEAVIEST:
        path, _, rest = prefix.partition("::")
        names = [n for n in re.split(r"::|\[", rest) if n and not n.endswith("]")]
        source = (ROOT / path).read_text() if (ROOT / path).is_file() else ""
        if not source or any(not re.search(rf"^\s*(def|class) {re.escape(n)}\b", source, re.M) for n in names):
            missing.append(prefix)
    assert not missing, f"HEAVIEST entries that name no test (renamed or removed? update tests/conftest.py): {missing}"
    seconds = [s for _, s in HEAVIEST]
    assert seconds == sorted(seconds, reverse=True)


def test_the_schedule_puts_listed_then_slow_then_fast_tests() -> None:
    giant = HEAVIEST[0][0]
    assert expected_seconds(giant, slow=True) == HEAVIEST[0][1] > expected_seconds("tests/test_x.py::t", slow=True)
    assert expected_seconds("tests/test_x.py::t", slow=True) > expected_seconds("tests/test_x.py::t", slow=False) == 0
    # a parametrized id is matched by its prefix: every case of the listed function
    assert expected_seconds("tests/test_torchtitan_ops.py::test_rule_matches_ground_truth[fused_mla_k_rope-2]", True) == 16


def test_xdist_group_marks_and_the_schedulers_table_agree(request: pytest.FixtureRequest) -> None:
    """Every collected test's ``xdist_group`` mark is the group conftest.XDIST_GROUPS schedules it in
    (and no unmarked test is grouped): the table stands in for the marks pytest-xdist drops."""
    items = request.session.items
    wrong = []
    for item in items:
        marks = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default")) for m in item.iter_markers("xdist_group")})
        if marks != ([g] if (g := xdist_group_of(item.nodeid)) else []):
            wrong.append((item.nodeid, marks, g))
    assert not wrong, f"(node id, xdist_group marks, XDIST_GROUPS' group) that disagree; update tests/conftest.py: {wrong[:10]}"
    if any("test_expert_parallel.py::" in i.nodeid for i in items):  # the table is not vacuous
        assert any(xdist_group_of(i.nodeid) for i in items)
