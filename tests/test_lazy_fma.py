"""``import dtensor_rules`` does not import inductor; prims.fma's rule and cost formula arrive when
inductor defines the op (installed if our rules are), and uninstall gives upstream's rule back."""

from __future__ import annotations

import os
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
    assert estimate(fma, a, a, a).flops == 24  # our cost API prices it
    from torch.utils.flop_counter import FlopCounterMode
    with FlopCounterMode(display=False) as c:
        fma(a, a, a)
    assert c.get_total_flops() == 0  # torch's convention: pointwise work is not counted there
    dtensor_rules.uninstall()
    assert dtensor_rules.status()[fma]["active"] == "upstream"
    print("OK")
    """
)


def test_fma_rule_arrives_with_inductor_and_not_before() -> None:
    proc = run_python(CODE)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


# the deferred install runs at someone else's import (torch.compile imports inductor): it must not
# crash there when a profiler or logging tool has wrapped DTensor's propagator, nor for any other reason.
WRAPPED = textwrap.dedent(
    """
    import warnings
    import torch
    import dtensor_rules
    from dtensor_rules._upstream import propagator
    from torch.distributed.tensor import Shard, distribute_tensor
    from dtensor_rules.testing import simulated_mesh

    prop = propagator()
    inner = prop.propagate_op_sharding
    seen = []
    def profile(f):  # a tool's plain decorator: the result has no cache_clear and no __wrapped__
        def traced(op_schema):
            seen.append(op_schema.op)
            return f(op_schema)
        return traced
    traced = profile(inner)
    class Profiled:  # hides what it wraps from everything but itself
        def __init__(self, f):
            self._f = f
        def __call__(self, op_schema):
            seen.append(op_schema.op)
            return self._f(op_schema)
    wrapper = {"function": traced, "object": Profiled(inner), "failing install": traced}[KIND]
    prop.propagate_op_sharding = wrapper
    if KIND == "failing install":
        def boom(*a, **k):
            raise RuntimeError("boom")
        real_install, dtensor_rules.registry.install = dtensor_rules.registry.install, boom
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import torch._inductor.inductor_prims  # the unrelated import: must not raise
    fma = torch.ops.prims.fma.default
    assert prop.propagate_op_sharding is wrapper  # the tool's wrap stays
    words = [str(w.message) for w in caught]
    state = dtensor_rules.status().patches["deferred_fma"].state
    if KIND == "failing install":
        assert state.startswith("failed: RuntimeError: boom"), state
        assert any("deferred_fma" in w and "boom" in w for w in words), words
        assert dtensor_rules.status()[fma]["active"] == "upstream"
        dtensor_rules.registry.install = real_install
    else:
        assert state == "on", state
        assert dtensor_rules.status()[fma]["active"] == "ours", dtensor_rules.status()[fma]
        assert (KIND == "object") == any("propagate_op_sharding" in w for w in words), words
    a, b, c = (torch.randn(4, 6, generator=torch.Generator().manual_seed(i)) for i in range(3))
    with simulated_mesh((2,)) as mesh:
        out = fma(*(distribute_tensor(t, mesh, [Shard(0)]) for t in (a, b, c)))
        torch.testing.assert_close(out.full_tensor(), a * b + c)
    dtensor_rules.uninstall()
    dtensor_rules.install()  # clears DTensor's caches through the wrapper again: still no error
    assert prop.propagate_op_sharding is wrapper
    print("OK")
    """
)


@pytest.mark.parametrize("kind", ["function", "object", "failing install"])
def test_inductor_import_with_a_wrapped_propagator_never_raises(kind: str) -> None:
    env = dict(os.environ)
    env.pop("DTENSOR_RULES_NO_INSTALL", None)
    proc = run_python(f"KIND = {kind!r}\n" + WRAPPED, env=env)  # a fresh process (tests/_fresh.py)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
