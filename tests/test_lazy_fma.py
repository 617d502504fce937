"""``import dtensor_rules`` does not import inductor; prims.fma's rule and cost formula arrive when
inductor defines the op (installed if our rules are), and uninstall gives upstream's rule back."""

from __future__ import annotations

import textwrap

import pytest

from tests._fresh import run_python

pytestmark = pytest.mark.slow  # see pyproject.toml

CODE = textwrap.dedent(
    """
    import sys
    import dtensor_rules
    from dtensor_rules import registry
    heavy = [m for m in sys.modules if m.startswith(("torch._inductor.inductor_prims", "torch._inductor.graph",
                                                   "torch._dynamo.convert_frame", "torch.distributed.tensor.debug",
                                                   "torch.distributed.checkpoint", "torch.utils.flop_counter", "triton"))]
    assert not heavy, heavy
    import torch
    import torch._inductor.inductor_prims  # defines prims.fma: upstream registers its rule, then ours is installed
    fma = torch.ops.prims.fma.default
    st = dtensor_rules.status()[fma]
    assert (st["has"], st["active"]) == ("both", "ours") and st["why"].startswith("ours:"), st
    from dtensor_rules.costs import estimate
    a = torch.randn(3, 4)
    assert estimate(fma, a, a, a).flops == 24
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as c:
        fma(a, a, a)
    assert c.get_total_flops() == 24
    dtensor_rules.uninstall()
    assert dtensor_rules.status()[fma]["active"] == "upstream"
    print("OK")
    """
)


def test_fma_rule_arrives_with_inductor_and_not_before() -> None:
    proc = run_python(CODE)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
