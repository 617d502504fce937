"""The rule value is each op's one contract: strategy, cost formula, sample suite, doc.

Every shipped rule names its cost and samples or says why not; the samples run on plain
torch (the oracle) and costs.estimate prices them with the rule's own formula; a malformed
rule is rejected at registration with a RuleError naming the field.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import dtensor_rules
from dtensor_rules import registry
from dtensor_rules.cli.main import main
from dtensor_rules.costs import CostError, OpCost, estimate_call
from dtensor_rules.costs.user_formula import from_flops_bytes
from dtensor_rules.registry import Rule, RuleError
from dtensor_rules.testing.suites import find_op, samples_for

# defines prims.fma (dtensor_rules does not import inductor): its rule registers then, so it is shipped too
from dtensor_rules.ops.fma import fma as FMA  # noqa: E402

SHIPPED = sorted((r for r in registry.rules().values() if r.module.startswith("dtensor_rules.ops.")), key=lambda r: str(r.op))
WITH_SAMPLES = [r for r in SHIPPED if r.samples is not None]
MOE = torch.ops.dtensor_rules.moe_permute_indices.default


def test_every_shipped_rule_has_cost_and_samples_or_says_why() -> None:
    assert len(SHIPPED) >= 50
    incomplete = [str(r.op) for r in SHIPPED if (r.cost is None or r.samples is None) and not r.gaps.strip()]
    assert incomplete == []
    # a rule that is complete does not claim a gap
    assert [str(r.op) for r in SHIPPED if r.cost is not None and r.samples is not None and r.gaps] == []
    assert all(r.doc for r in SHIPPED), "each rule's strategy docstring is its doc"


@pytest.mark.parametrize("rule", WITH_SAMPLES, ids=lambda r: str(r.op))
def test_samples_run_on_plain_torch_and_estimate_uses_the_rules_formula(rule: Rule) -> None:
    samples = rule.samples()
    assert samples and all(isinstance(a, tuple) and isinstance(k, dict) for a, k in samples)
    for args, kwargs in samples:
        clones = [x.clone() if isinstance(x, torch.Tensor) else x for x in args]
        rule.op(*clones, **kwargs)  # the oracle accepts every sample
        if rule.cost is not None:
            cost = rule.cost(rule.op, args, kwargs)
            assert isinstance(cost, OpCost) and min(cost.flops, cost.bytes_read, cost.bytes_written) >= 0
            assert estimate_call(rule.op, args, kwargs) == cost  # estimate finds the formula through the rule


def test_samples_for_and_find_op_read_the_rule() -> None:
    assert find_op("moe_permute_indices") is MOE
    assert samples_for(MOE)[0][1] == {}
    with pytest.raises(KeyError, match=r"no sample suite for aten.cumsum.out \(out=/in-place overload"):
        samples_for(torch.ops.aten.cumsum.out)


def test_validate_finds_moe_permute_indices_through_its_rule(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--op", "moe_permute_indices", "--mesh", "2", "--json"]) == 0
    assert "dtensor_rules.moe_permute_indices.default" in capsys.readouterr().out


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("cost", 3, r"cost= must be callable \(cost\(op, args, kwargs\) -> OpCost"),
        ("samples", [((), {})], r"samples= must be callable \(samples\(\) ->"),
        ("gaps", None, "gaps= must be a str, got None"),
        ("flops", 2, r"flops= must be callable"),
        ("bytes", "8", r"bytes= must be callable"),
        ("schema_info", "static", "schema_info= must be a RuntimeSchemaInfo or None"),
        ("allow_uneven_sharding", "yes", "allow_uneven_sharding= must be a bool"),
        ("handler", 42, "handler= must be callable, got 42"),
        ("meta_fallback", 1, "meta_fallback= must be callable, got 1"),
        ("kind", "fancy", "unknown rule kind 'fancy'"),
    ],
)
def test_wrong_types_are_rejected_at_registration_naming_the_field(field: str, value: object, message: str) -> None:
    with pytest.raises(RuleError, match=message):
        registry.register(torch.ops.aten.neg.default, **{field: value})
    assert torch.ops.aten.neg.default not in registry.rules()


def test_rule_values_are_validated_too() -> None:
    strategy = registry.get_rule(FMA).strategy
    with pytest.raises(RuleError, match="Rule.op must be a torch OpOverload"):
        Rule(op="prims.fma.default", strategy=strategy)
    with pytest.raises(RuleError, match="samples= must be callable"):
        Rule(op=FMA, strategy=strategy, samples="fma_samples")
    with pytest.raises(RuleError, match="register_rule takes a Rule"):
        registry.register_rule("prims.fma.default")  # type: ignore[arg-type]


def test_cost_and_flops_bytes_are_exclusive() -> None:
    with pytest.raises(RuleError, match="cost= .* or flops=/bytes=, not both"):
        registry.register(torch.ops.aten.neg.default, cost=registry.get_rule(FMA).cost, flops=lambda x: 1)


def test_register_rule_puts_back_the_exact_value() -> None:
    original = registry.get_rule(FMA)
    dtensor_rules.register(FMA, replace=True)(lambda op, a, k: [])
    try:
        assert registry.get_rule(FMA).cost is None and registry.get_rule(FMA).samples is None
    finally:
        registry.register_rule(original, replace=True)
    assert registry.get_rule(FMA) is original


@given(
    flops=st.integers(0, 2**40),
    nbytes=st.one_of(
        st.integers(0, 2**40),
        st.tuples(st.integers(0, 2**40), st.integers(0, 2**40)),
    ),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.int64, torch.int8, torch.bool]),
    shape=st.lists(st.integers(0, 3), max_size=3),
)
def test_flops_bytes_short_form_becomes_one_formula(flops: int, nbytes: object, dtype: torch.dtype, shape: list[int]) -> None:
    x = torch.zeros(shape, dtype=dtype)
    cost = from_flops_bytes(lambda t: flops, lambda t: nbytes)(torch.ops.aten.neg.default, (x,), {})
    read, written = (nbytes, 0) if isinstance(nbytes, int) else nbytes
    assert (cost.flops, cost.bytes_read, cost.bytes_written, cost.source) == (flops, read, written, "rule")
    assert cost.exact == (not isinstance(nbytes, int))  # a bare total is split by assumption: noted
    assert cost.dtype == dtype  # the first float input's dtype, else the first input's (int, bool)


@pytest.mark.parametrize("bad, message", [(-1, "negative cost"), ([1, 2, 3], "expected int, \\(read, written\\) or OpCost")])
def test_flops_bytes_short_form_rejects_bad_values(bad: object, message: str) -> None:
    formula = from_flops_bytes(None, lambda t: bad)
    with pytest.raises(CostError, match=message):
        formula(torch.ops.aten.neg.default, (torch.zeros(2),), {})
