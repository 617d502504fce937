"""The registry: install/uninstall restore DTensor exactly, duplicates and bad input are rejected."""

from __future__ import annotations

import textwrap

import pytest
import torch
from torch.distributed.tensor import DTensor
from dtensor_rules._upstream import ShardingPlaceholder
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

import dtensor_rules
from dtensor_rules import registry
from dtensor_rules._upstream import TORCH_VERSION
from dtensor_rules.registry import RuleError
from tests._fresh import run_python

from dtensor_rules.op_rules.fma import fma as FMA  # noqa: E402  (defines prims.fma: inductor, imported lazily by dtensor_rules)
SBD = torch.ops.aten._softmax_backward_data.default
SBD_OUT = torch.ops.aten._softmax_backward_data.out
ARGSORT = torch.ops.aten.argsort.default

REGISTRIES = registry._ALL_REGISTRIES + (registry._HANDLERS,)


def snapshot() -> dict[str, dict]:
    return {name: dict(registry._registry(name)) for name in REGISTRIES}


def assert_same(a: dict[str, dict], b: dict[str, dict]) -> None:
    for name in REGISTRIES:
        assert a[name].keys() == b[name].keys(), name
        for k in a[name]:
            assert a[name][k] is b[name][k], (name, k)


@pytest.fixture
def restore_install():
    """Leave the process as import left it: our rules installed."""
    yield
    dtensor_rules.uninstall()
    dtensor_rules.install()


def test_import_installs_our_rules():
    prop = DTensor._op_dispatcher.sharding_propagator
    assert set(registry.active_ops()) >= {FMA, SBD, SBD_OUT}
    # single-dim rules go in as op strategies (compact at dispatch, dtensor_rules.dispatch)
    assert prop.op_strategy_funcs[FMA].__wrapped__ is registry.get_rule(FMA).strategy
    assert prop.op_strategy_funcs[SBD].__wrapped__ is registry.get_rule(SBD).strategy
    assert SBD not in prop.op_single_dim_strategy_funcs and FMA not in prop.op_single_dim_strategy_funcs  # upstream's are out of the way


def test_uninstall_restores_registries_exactly(restore_install):
    dtensor_rules.uninstall()
    pristine = snapshot()
    dtensor_rules.install()
    assert snapshot() != pristine
    dtensor_rules.uninstall()
    assert_same(snapshot(), pristine)


def test_install_is_idempotent(restore_install):
    first = snapshot()
    assert set(dtensor_rules.install()) == set(registry.active_ops())
    assert_same(snapshot(), first)


def test_round_trip_install_uninstall_install(restore_install):
    dtensor_rules.uninstall()
    pristine = snapshot()
    for _ in range(2):
        dtensor_rules.install()
        installed = snapshot()
        dtensor_rules.uninstall()
        assert_same(snapshot(), pristine)
    dtensor_rules.install()
    assert snapshot().keys() == installed.keys()
    for name in REGISTRIES:
        assert snapshot()[name].keys() == installed[name].keys()


# where upstream keeps its softmax-backward rule: 2.13 an op-strategy rule with no rule for
# .out; 2.14 moved both overloads to single-dim rules
UPSTREAM_SBD_REGISTRY = {(2, 13): "op_strategy_funcs", (2, 14): "op_single_dim_strategy_funcs"}[TORCH_VERSION]
UPSTREAM_HAS_SBD_OUT = {(2, 13): False, (2, 14): True}[TORCH_VERSION]


def test_fill_policy_keeps_upstream_rules(restore_install):
    dtensor_rules.uninstall()
    prop = DTensor._op_dispatcher.sharding_propagator
    upstream_sbd = getattr(prop, UPSTREAM_SBD_REGISTRY)[SBD]
    active = dtensor_rules.install(policy="fill")
    assert ARGSORT in active  # upstream has no argsort rule on any tested torch
    assert SBD not in active and FMA not in active
    assert getattr(prop, UPSTREAM_SBD_REGISTRY)[SBD] is upstream_sbd
    kept = "upstream: ours not installed"
    if registry.measured_verdict(SBD).keep == "upstream":
        kept = registry.measured_verdict(SBD).why
    assert dtensor_rules.status()[SBD] == {"has": "both", "active": "upstream", "why": kept}
    assert dtensor_rules.status()[ARGSORT] == {"has": "ours", "active": "ours", "why": "ours: upstream has no rule"}
    assert (SBD_OUT in active) is not UPSTREAM_HAS_SBD_OUT
    assert dtensor_rules.status()[SBD_OUT]["has"] == ("both" if UPSTREAM_HAS_SBD_OUT else "ours")


def test_installed_context_manager_restores_previous_state(restore_install):
    dtensor_rules.uninstall()
    before = snapshot()
    with dtensor_rules.installed() as ops:
        assert FMA in ops
        assert dtensor_rules.status()[FMA]["active"] == "ours"
    assert_same(snapshot(), before)


def _collectives_for_partial_softmax_backward() -> int:
    """Run softmax backward with a Partial(sum) gradient; count the collectives dispatch issued."""
    from torch.distributed.tensor.debug import CommDebugMode

    from dtensor_rules.testing import simulated_mesh
    from dtensor_rules.testing.dispatch import to_dtensor

    g, y = torch.randn(4, 6), torch.randn(4, 6).softmax(-1)
    with simulated_mesh(2) as mesh:
        gd = to_dtensor(g, mesh, [Partial("sum")])
        yd = to_dtensor(y, mesh, [Replicate()])
        with CommDebugMode() as comm:
            SBD(gd, yd, -1, torch.float32)
    return comm.get_total_counts()


def test_switching_rules_never_reuses_a_cached_decision(restore_install):
    # upstream has no Partial strategy: it all-reduces the gradient first
    dtensor_rules.uninstall()
    assert _collectives_for_partial_softmax_backward() == 1
    # ours keeps Partial(sum) (linearity): no collective; a stale cached decision would still all-reduce
    dtensor_rules.install()
    assert _collectives_for_partial_softmax_backward() == 0
    dtensor_rules.uninstall()
    assert _collectives_for_partial_softmax_backward() == 1


def test_failed_install_leaves_nothing_half_patched(restore_install, monkeypatch):
    dtensor_rules.uninstall()
    before = snapshot()
    calls = {"n": 0}
    real = registry._checked_op_strategy

    def explode(rule):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return real(rule)

    monkeypatch.setattr(registry, "_checked_op_strategy", explode)
    with pytest.raises(RuntimeError, match="boom"):
        dtensor_rules.install()
    assert_same(snapshot(), before)
    assert registry.active_ops() == []


def test_duplicate_registration_is_an_error():
    with pytest.raises(RuleError, match=r"prims.fma.default already has a rule .*replace=True"):
        dtensor_rules.register(FMA)(lambda op, a, k: [])


def test_replace_swaps_the_rule_and_restores(restore_install):
    original = registry.get_rule(FMA)

    def only_replicate(op, args, kwargs):
        return []

    dtensor_rules.register(FMA, replace=True)(only_replicate)
    try:
        prop = DTensor._op_dispatcher.sharding_propagator
        assert prop.op_strategy_funcs[FMA].__wrapped__ is only_replicate
    finally:
        registry.register_rule(original, replace=True)
    assert registry.get_rule(FMA).strategy is original.strategy


@pytest.mark.parametrize(
    "bad, message",
    [
        ("aten.add", r"cannot register a rule for 'aten.add'"),
        (torch.ops.aten.add, r"overload packet.*register each overload, e.g. aten.add.default"),
        (torch.add, r"expected a torch OpOverload"),
    ],
)
def test_registering_a_non_op_names_the_problem(bad, message):
    with pytest.raises(RuleError, match=message):
        dtensor_rules.register(bad)


def test_invalid_policy_and_kind_are_rejected():
    with pytest.raises(RuleError, match="unknown install policy 'sometimes'"):
        dtensor_rules.install(policy="sometimes")
    with pytest.raises(RuleError, match="unknown rule kind 'fancy'"):
        dtensor_rules.register(torch.ops.aten.neg.default, kind="fancy")


def test_install_of_an_op_without_rule_is_rejected():
    with pytest.raises(RuleError, match=r"no dtensor_rules rule for \['aten.neg.default'\]"):
        dtensor_rules.install(ops=[torch.ops.aten.neg.default])


def test_rules_carry_doc_module_cost_and_samples():
    rule = registry.get_rule(FMA)
    assert rule.module == "dtensor_rules.op_rules.fma"
    assert "Pointwise" in rule.doc
    a = torch.empty(4, 6, device="meta")
    assert rule.cost(FMA, (a, a, a), {}).flops == 2 * 24
    args, kwargs = rule.samples()[0]
    assert FMA(*args, **kwargs).shape == torch.broadcast_shapes(*(t.shape for t in args))


@pytest.mark.slow
def test_import_without_install_and_old_torch_message():
    code = textwrap.dedent(
        """
        import torch
        import torch._inductor.inductor_prims  # defining prims.fma registers upstream's fma rule
        from torch.distributed.tensor import DTensor
        prop = DTensor._op_dispatcher.sharding_propagator
        names = %r
        get = lambda n: getattr(DTensor._op_dispatcher if n == "_custom_op_handlers" else prop, n)
        before = {n: dict(get(n)) for n in names}
        import dtensor_rules
        from dtensor_rules import registry
        assert registry.active_ops() == [], registry.active_ops()
        after = {n: dict(get(n)) for n in names}
        assert all(before[n].keys() == after[n].keys() for n in names)
        assert all(before[n][k] is after[n][k] for n in names for k in before[n])
        torch.__version__ = "2.12.1"
        try:
            dtensor_rules._check_torch()
        except ImportError as e:
            print("ERR", e)
        """
        % (REGISTRIES,)
    )
    env = {"DTENSOR_RULES_NO_INSTALL": "1", "PATH": ""}
    proc = run_python(code, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert "ERR dtensor_rules needs torch >= 2.13, found 2.12.1" in out
    assert "pip install 'torch==2.13.0'" in out


def test_malformed_strategy_is_reported_with_the_rule_name(restore_install):
    def wrong_width(op, args, kwargs):
        return [[Replicate(), Replicate()]]  # fma has 1 output + 3 inputs

    original = registry.get_rule(FMA)
    dtensor_rules.register(FMA, replace=True)(wrong_width)
    try:
        info = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs[FMA]
        meta = torch.distributed.tensor._dtensor_spec.TensorMeta(torch.Size([2]), (1,), torch.float32)
        with pytest.raises(RuleError, match=r"rule for prims.fma.default returned strategy .*expected a list of 4"):
            info.rows(FMA, (meta, meta, meta), {})
        dtensor_rules.register(FMA, replace=True)(lambda op, a, k: [[Shard(0), Shard(5), Replicate(), Replicate()]])
        info = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs[FMA]
        with pytest.raises(RuleError, match="shards input 0 on dim 5, but that input has 1 dims"):
            info.rows(FMA, (meta, meta, meta), {})
        dtensor_rules.register(FMA, replace=True)(lambda op, a, k: [["S(0)", Replicate(), Replicate(), Replicate()]])
        info = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs[FMA]
        with pytest.raises(RuleError, match="returned 'S\\(0\\)' .*not a Placement"):
            info.rows(FMA, (meta, meta, meta), {})
    finally:
        registry.register_rule(original, replace=True)


def test_placeholder_strategies_pass_validation():
    info = DTensor._op_dispatcher.sharding_propagator.op_strategy_funcs[FMA]
    meta = torch.distributed.tensor._dtensor_spec.TensorMeta(torch.Size([2, 3]), (3, 1), torch.float32)
    rows = info.rows(FMA, (meta, meta, meta), {})
    assert [ShardingPlaceholder(0).dim] == [rows[0][0].dim]


def test_custom_dispatch_handler_installed_and_restored_exactly(restore_install):
    """bincount's handler goes into DTensor's custom-op handlers with the rule and comes out with it,
    putting back whatever was there before (here: a user's own handler)."""
    bincount = torch.ops.aten.bincount.default
    handlers = DTensor._op_dispatcher._custom_op_handlers
    assert handlers[bincount] is registry.get_rule(bincount).handler
    dtensor_rules.uninstall()
    assert bincount not in handlers
    assert torch.ops.aten.is_same_size.default in handlers  # upstream's own handlers are untouched

    def users_handler(op, args, kwargs):  # noqa: ANN001, ANN202
        raise NotImplementedError

    handlers[bincount] = users_handler
    try:
        dtensor_rules.install()
        assert handlers[bincount] is registry.get_rule(bincount).handler
        dtensor_rules.uninstall([bincount])
        assert handlers[bincount] is users_handler
    finally:
        handlers.pop(bincount, None)


def test_handler_must_be_callable():
    with pytest.raises(RuleError, match="handler= must be callable, got 42"):
        registry.register(torch.ops.aten.bincount.default, handler=42, replace=True)


def test_meta_fallback_wrapper_is_the_patch_and_its_table_follows_installed_rules(restore_install):
    """The output-metadata wrapper exists exactly while the ``meta_fallback`` patch is applied
    (a full install applies it, a full uninstall restores the class method exactly); a rule's
    fallback is in its table only while the rule is installed."""
    from dtensor_rules.dispatch.meta_fallback import FALLBACKS

    grouped_mm = torch.ops.aten._grouped_mm.default
    prop = DTensor._op_dispatcher.sharding_propagator
    assert "_propagate_tensor_meta_non_cached" in vars(prop) and grouped_mm in FALLBACKS
    dtensor_rules.uninstall()
    assert "_propagate_tensor_meta_non_cached" not in vars(prop)  # the class method again, exactly
    assert not FALLBACKS
    dtensor_rules.install(ops=[FMA], patches=["meta_fallback"])
    assert "_propagate_tensor_meta_non_cached" in vars(prop) and not FALLBACKS  # fma has no fallback
    dtensor_rules.install(ops=[grouped_mm])
    assert grouped_mm in FALLBACKS
    dtensor_rules.uninstall([grouped_mm])
    assert grouped_mm not in FALLBACKS


def test_first_symbol_record_patch_is_applied_and_restored_exactly(restore_install):
    """While installed, a symbolic trace keeps the first proxy recorded per symbol (tests/test_moe_compile.py
    shows what breaks without it); uninstall puts upstream's tracker initializer back, the same object."""
    import torch.fx.experimental.proxy_tensor as proxy_tensor

    def tracker_after_two_records(x: torch.Tensor) -> bool:
        trackers = {}

        def f(t: torch.Tensor) -> torch.Tensor:
            tracer = proxy_tensor.get_proxy_mode().tracer
            symbol = t.shape[0].node.expr
            tracker = tracer.sympy_expr_tracker
            first = tracker[symbol]
            tracker[symbol] = "a later record"
            trackers["kept"] = tracker[symbol] is first
            return t * 2

        proxy_tensor.make_fx(f, tracing_mode="symbolic")(x)
        return trackers["kept"]

    dtensor_rules.uninstall()
    original = proxy_tensor._init_proxy_trackers
    assert tracker_after_two_records(torch.randn(5)) is False  # upstream: the last record wins
    dtensor_rules.install()
    assert proxy_tensor._init_proxy_trackers is not original
    assert tracker_after_two_records(torch.randn(5)) is True
    dtensor_rules.uninstall()
    assert proxy_tensor._init_proxy_trackers is original
