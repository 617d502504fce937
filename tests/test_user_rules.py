"""A rule you register goes in, even where upstream already has one, and register(replace=True)
follows the same policy as install(); an explicit install that keeps upstream's rule says so loudly."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.distributed.tensor import Shard, distribute_tensor

import dtensor_rules
from dtensor_rules import registry
from dtensor_rules.testing import simulated_mesh

aten = torch.ops.aten
LCE = aten.logcumsumexp.default  # upstream has a rule for it on 2.13 and 2.14; the package ships none
calls: list[str] = []


def lce_samples():
    return [((torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), 1), {})]


def lce_strategy(op, args_meta, kwargs_meta):
    """A scan along ``dim``: any other dim can be sharded ([out, self] per mesh dim)."""
    calls.append("lce")
    x, dim = args_meta
    return [[Shard(d), Shard(d)] for d in range(len(x.shape)) if d != dim % len(x.shape)]


@pytest.fixture
def user_lce():
    assert registry.upstream_strategy(LCE) is not None  # the case: upstream already has a rule for the op
    before = {n: registry._registry(n).get(LCE) for n in registry._ALL_REGISTRIES}
    dtensor_rules.register(LCE, samples=lce_samples)(lce_strategy)  # as docs/writing_rules.md does it
    yield
    registry.unregister(LCE)
    assert {n: registry._registry(n).get(LCE) for n in registry._ALL_REGISTRIES} == before  # upstream's back exactly


def test_a_user_rule_wins_over_upstream_under_the_default_policy(user_lce) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # installed as asked: no warning
        assert dtensor_rules.install(ops=[LCE]) == [LCE]
    st = dtensor_rules.status()[LCE]
    assert (st["has"], st["active"]) == ("both", "ours") and "your rule" in st["why"] and "policy='fill'" in st["why"]
    x = torch.randn(4, 6)
    calls.clear()
    with simulated_mesh((2,)) as mesh:
        out = torch.logcumsumexp(distribute_tensor(x, mesh, [Shard(0)]), 1)
        torch.testing.assert_close(out.full_tensor(), torch.logcumsumexp(x, 1))
        assert out.placements == (Shard(0),)
    assert calls  # DTensor asked our rule


def test_fill_keeps_upstream_for_a_user_rule_too(user_lce) -> None:
    assert dtensor_rules.install("fill", ops=[LCE]) == []
    assert dtensor_rules.status()[LCE]["active"] == "upstream"


def test_replace_follows_the_install_policy() -> None:
    sort = aten.sort.default  # shipped, and installed by the measured policy
    shipped = registry.get_rule(sort)
    assert sort in registry.active_ops()
    try:
        dtensor_rules.register(sort, replace=True)(lce_strategy)  # a user's replacement of an active rule
        assert registry.get_rule(sort).strategy is lce_strategy and sort in registry.active_ops()
        assert "your rule" in dtensor_rules.status()[sort]["why"]  # decided by the policy, not forced
        registry.uninstall([sort])
        assert dtensor_rules.install("fill", [sort]) == []
        dtensor_rules.register(sort, replace=True)(lce_strategy)  # not active: replacing installs nothing
        assert sort not in registry.active_ops()
    finally:
        registry.register_rule(shipped, replace=True)
        registry.uninstall([sort])
        dtensor_rules.install(ops=[sort])
    assert registry.get_rule(sort) is shipped and sort in registry.active_ops()


def test_an_explicit_install_that_keeps_upstream_warns_with_the_fix() -> None:
    kept = [op for op, s in dtensor_rules.status().items() if s["active"] == "upstream" and s["has"] == "both"
            and registry.is_shipped(registry.get_rule(op))]
    assert kept  # on 2.13 and 2.14, e.g. aten.sort.stable (equal coverage)
    op = kept[0]
    with pytest.warns(UserWarning, match=rf"install\(ops=\[{op}\]\) kept upstream's rule under policy='measured'.*"
                                         r"policy='override'"):
        assert dtensor_rules.install(ops=[op]) == []
    try:
        assert dtensor_rules.install("override", [op]) == [op]
    finally:
        registry.uninstall([op])
