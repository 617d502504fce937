"""``import dtensor_rules`` loads no heavy module, and what it adds to one arrives at the user's import.

DCP (``torch.distributed.checkpoint``: FSDP, elastic, sharded tensors), ``torch.utils.flop_counter``
(triton on CUDA builds), triton and our test kit (``dtensor_rules.testing``: not one module of it, not even for a rule's sample suite) load
only when used; the shard-order fix of DCP and
our flop formulas are in place as soon as the user imports those modules, and ``uninstall()`` still
puts upstream's functions back. Each scenario runs in a fresh process that has imported only torch
(``tests/_fresh.py``; ``sys.modules`` is the oracle, not time).
"""

from __future__ import annotations

import os
import textwrap

import pytest

from tests._fresh import run_python

pytestmark = pytest.mark.slow  # see pyproject.toml

LAZY = ("torch.distributed.checkpoint", "torch.distributed.fsdp", "torch.utils.flop_counter", "triton",
        "dtensor_rules.testing.validator", "dtensor_rules.testing.mesh")

PRELUDE = f"""
import sys
import torch.distributed.tensor
import dtensor_rules
LAZY = {LAZY!r}
def loaded():
    return sorted(m for m in sys.modules if m.startswith(LAZY))
from dtensor_rules.redistribute import order_patches as op
"""

SCENARIOS = {
    "nothing heavy, rules installed": """
        assert loaded() == [], loaded()
        assert dtensor_rules.status()[torch.ops.aten.cumsum.default]["active"] == "ours"
        """,
    "DCP imported later gets the shard-order fix": """
        import torch.distributed.checkpoint.planner_helpers as ph
        assert (ph._create_write_items_for_dtensor, ph._create_chunk_from_dtensor) == (op._write_items, op._chunk)
        originals = (op._orig["write"], op._orig["chunk"])
        assert all(f.__module__ == ph.__name__ for f in originals), originals
        dtensor_rules.uninstall()
        assert (ph._create_write_items_for_dtensor, ph._create_chunk_from_dtensor) == originals
        """,
    "uninstalled before DCP is imported: DCP stays upstream's": """
        dtensor_rules.uninstall()
        import torch.distributed.checkpoint.planner_helpers as ph
        assert ph._create_write_items_for_dtensor.__module__ == ph.__name__, ph._create_write_items_for_dtensor
        assert ph._create_chunk_from_dtensor.__module__ == ph.__name__
        dtensor_rules.install()  # and a later install patches the imported module at once
        assert ph._create_chunk_from_dtensor is op._chunk
        """,
    "flop formulas arrive with torch.utils.flop_counter": """
        from torch.utils.flop_counter import FlopCounterMode, flop_registry
        from dtensor_rules.costs.flop_counter import registered_flop_formulas
        assert torch.ops.aten._grouped_mm in registered_flop_formulas()
        from dtensor_rules.costs import estimate
        a, b = torch.randn(6, 16), torch.randn(2, 16, 8)
        offs = torch.tensor([2, 6], dtype=torch.int32)
        with FlopCounterMode(display=False) as counter:
            torch._grouped_mm(a, b, offs=offs)
        ours = estimate(torch.ops.aten._grouped_mm.default, a, b, offs=offs).flops
        assert counter.get_total_flops() == ours == 2 * 6 * 16 * 8, (counter.get_total_flops(), ours)  # torch alone counts 0
        """,
    "the product imports no module of its test kit, calling a rule's samples included": """
        kit = sorted(m for m in sys.modules if m.startswith("dtensor_rules.testing"))
        assert kit == [], kit
        rule = dtensor_rules.get_rule(torch.ops.aten.cumsum.default)
        assert rule.samples.__name__ == "cumsum_samples"
        args, kwargs = rule.samples()[0]
        assert isinstance(args[0], torch.Tensor)
        kit = sorted(m for m in sys.modules if m.startswith("dtensor_rules.testing"))
        assert kit == [], kit  # the suite is a function of the rule's own module
        """,
    "testing names load at first use": """
        from dtensor_rules.testing import check_rule, simulated_mesh
        from dtensor_rules.testing.mesh import simulated_mesh as direct
        assert simulated_mesh is direct and "check_rule" in dir(dtensor_rules.testing)
        assert "dtensor_rules.testing.validator" in sys.modules
        try:
            dtensor_rules.testing.no_such_name
        except AttributeError as e:
            assert "no_such_name" in str(e)
        else:
            raise SystemExit("no AttributeError")
        """,
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_lazy_import_scenario(name: str) -> None:
    code = PRELUDE + "import torch\n" + textwrap.dedent(SCENARIOS[name]) + "print('OK')\n"
    env = dict(os.environ)
    env.pop("DTENSOR_RULES_NO_INSTALL", None)
    proc = run_python(code, env=env)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr[-3000:]
