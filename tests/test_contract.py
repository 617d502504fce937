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
from dtensor_rules.costs import CostError, estimate_call
from dtensor_rules.costs.user_formula import from_flops_bytes
from dtensor_rules.registry import Rule, RuleError
from dtensor_rules.testing.suites import find_op, samples_for

# defines prims.fma (dtensor_rules does not import inductor): its rule registers then, so it is shipped too
from dtensor_rules.op_rules.fma import fma as FMA  # noqa: E402

SHIPPED = sorted((r for r in registry.rules().values() if r.module.startswith("dtensor_rules.op_rules.")), key=lambda r: str(r.op))
WITH_SAMPLES = [r for r in SHIPPED if r.samples is not None]
MOE = torch.ops.dtensor_rules.moe_permute_indices.default


def test_every_shipped_rule_has_cost_and_samples_or_says_why() -> None:
    assert len(SHIPPED) >= 50
    incomplete = [str(r.op) for r in SHIPPED if (r.cost is None or r.samples is None) and not r.gaps.strip()]
    assert incomplete == []
    # a rule that is complete does not claim a gap
    assert [str(r.op) for r in SHIPPED if r.cost is not None and r.samples is not None and r.gaps] == []
    assert all(r.doc for r in SHIPPED), "each rule's strategy docstring is its doc"


def test_samples_run_on_plain_torch_and_are_priced() -> None:
    """Every shipped sample runs on plain torch (the oracle) and, where the rule has a cost, prices to
    non-negative counts; one failure lists every rule whose samples break."""
    problems = []
    for rule in WITH_SAMPLES:
        samples = rule.samples()
        if not samples or not all(isinstance(a, tuple) and isinstance(k, dict) for a, k in samples):
            problems.append(f"{rule.op}: samples() must return a non-empty list of (args tuple, kwargs dict)")
            continue
        for i, (args, kwargs) in enumerate(samples):
            try:
                rule.op(*[x.clone() if isinstance(x, torch.Tensor) else x for x in args], **kwargs)
                if rule.cost is not None:
                    cost = estimate_call(rule.op, args, kwargs)
                    assert min(cost.flops, cost.bytes_read, cost.bytes_written) >= 0, cost
            except Exception as e:  # noqa: BLE001  (reported per sample)
                problems.append(f"{rule.op} sample {i}: {type(e).__name__}: {e}")
    assert not problems, "\n".join(problems)


def _t(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.ones(shape, dtype=dtype)


_IDX = torch.tensor([[0, 2, 5]] * 4)  # (4, 3) int64 positions along dim 1 of a (4, 6) self
_ROWS = torch.tensor([4, 0, 4])  # (3,) int64 rows of a (5, 4) self (a duplicate)
# routed experts: x (4, 8), idx (4, 2) int64, weights (4, 2), w1 / w3 (2, 8, 16), w2 (2, 16, 8), 2 experts, A = 8
_ROUTED = (_t(4, 8), torch.tensor([[0, 1]] * 4), _t(4, 2), _t(2, 8, 16), _t(2, 8, 16), _t(2, 16, 8), 2, 8, None)


def _hand_derived() -> list[tuple[object, tuple, dict, tuple[int, int, int]]]:
    """(op, args, kwargs, (flops, bytes read, bytes written)) worked out by hand from docs/costs.md's
    table for concrete shapes (fp32 = 4 bytes, bf16 = 2, int32 = 4, int64 = 8), not from the formulas."""
    aten = torch.ops.aten
    a, w = _t(7, 8, dtype=torch.bfloat16), _t(3, 8, 8, dtype=torch.bfloat16)
    offs = torch.tensor([2, 2, 6], dtype=torch.int32)  # groups of 2, 0, 4 rows; row 6 of a unused
    x46, x54 = _t(4, 6), _t(5, 4)
    return [
        # 2 m_g K N over groups; read 6 used rows of a (96) + the 2 non-empty groups' weights (256) + offs (12)
        (aten._grouped_mm.default, (a, w, offs), {}, (2 * 6 * 8 * 8, 96 + 256 + 12, 6 * 8 * 2)),
        (FMA, (_t(3, 4), _t(4), _t(3, 1)), {}, (2 * 12, 48 + 16 + 12, 48)),  # broadcast operands read once
        (aten._softmax_backward_data.default, (_t(4, 5), _t(4, 5), 1, torch.float32), {}, (4 * 20, 160, 80)),
        (aten._softmax_backward_data.out, (_t(4, 5), _t(4, 5), 1, torch.float32), {"grad_input": _t(4, 5)},
         (4 * 20, 160, 80)),
        # sort: rows * L * ceil(log2 L) = 3 * 10 * 4; values + int64 indices written
        (aten.sort.default, (_t(3, 10), 1), {}, (120, 120, 30 * (4 + 8))),
        (aten.sort.stable, (_t(3, 10),), {"stable": True, "dim": 1}, (120, 120, 360)),
        (aten.argsort.default, (_t(3, 10), 1), {}, (120, 120, 360)),
        (aten.argsort.stable, (_t(3, 10),), {"stable": True, "dim": 1}, (120, 120, 360)),
        (aten.topk.default, (_t(4, 32), 5), {}, (4 * (32 + 5 * 3), 512, 4 * 5 * 12)),
        (aten.cumsum.default, (_t(4, 6, dtype=torch.int32), 1), {}, (24, 96, 24 * 8)),  # int32 -> int64 out
        (aten.cumsum_.default, (_t(4, 6), 0), {}, (24, 96, 96)),
        (aten.histc.default, (_t(100), 10, -1.0, 1.0), {}, (500, 400, 40)),
        # bincount: max 9 -> 10 bins of fp32 (fp32 weights); self read twice (max, then counts)
        (aten.bincount.default, (torch.tensor([0, 3, 3, 9]), _t(4), 5), {}, (8, 2 * 32 + 16, 40)),
        (aten.cat.default, ([_t(2, 3), _t(4, 3, dtype=torch.bfloat16)], 0), {}, (0, 24 + 24, 18 * 4)),
        (aten.gather.default, (x46, 1, _IDX), {}, (0, 96 + 48, 48)),  # k = 12 gathered
        (aten.slice_scatter.default, (x46, _t(4, 2), 1, 0, 2), {}, (0, 96 + 32, 96 + 32)),
        # scatter: self copied (96 read, 96 written), index (96) read, k = 12 elements
        (aten.scatter.src, (x46, 1, _IDX, _t(4, 5)), {}, (0, 96 + 96 + 48, 96 + 48)),
        (aten.scatter.value, (x46, 1, _IDX, 1.5), {}, (0, 96 + 96, 96 + 48)),
        (aten.scatter_.src, (x46.clone(), 1, _IDX, _t(4, 5)), {}, (0, 96 + 48, 48)),
        (aten.scatter_.value, (x46.clone(), 1, _IDX, 1.5), {}, (0, 96, 48)),
        (aten.scatter_add.default, (x46, 1, _IDX, _t(4, 3)), {}, (12, 96 + 96 + 48 + 48, 96 + 48)),
        (aten.scatter_add_.default, (x46.clone(), 1, _IDX, _t(4, 3)), {}, (12, 96 + 48 + 48, 48)),
        (aten.scatter_reduce.two, (x46, 1, _IDX, _t(4, 3), "mean"), {}, (12 + 24, 288, 144)),  # mean: + n(self)
        (aten.scatter_reduce.two, (x46, 1, _IDX, _t(4, 3), "amax"), {}, (12, 288, 144)),
        (aten.scatter_reduce_.two, (x46.clone(), 1, _IDX, _t(4, 3), "sum"), {}, (12, 192, 48)),
        # index: 3 rows of 4 selected (k_out = 12); indices 24 bytes
        (aten.index.Tensor, (x54, [_ROWS]), {}, (0, 24 + 48, 48)),
        (aten.index_put.default, (x54, [_ROWS], _t(3, 4), True), {}, (12, 24 + 48 + 48 + 80, 48 + 80)),
        (aten.index_put_.default, (x54.clone(), [_ROWS], _t(3, 4)), {}, (0, 24 + 48, 48)),
        (aten._index_put_impl_.default, (x54.clone(), [_ROWS], _t(3, 4), True), {}, (12, 24 + 48 + 48, 48)),
        # int32 counts (4 experts x 2 ranks) read; permuted_indices[40] + m_sizes[4] + m_offsets[4] (int32),
        # given as one total, which the short form books as read
        (MOE, (torch.tensor([4, 0, 2, 3, 1, 0, 0, 5], dtype=torch.int32), 4, 2, 40, 8), {}, (0, 32 + 48 * 4, 0)),
        # EP moves (short form, booked as read): fp32 rows of 16 bytes in and out, int64 (2, 1) splits (16);
        # dispatch without rows: out rows estimated as the input's (5); combine: rows = 6 given
        (torch.ops.dtensor_rules.ep_dispatch.default, (_t(5, 4), torch.tensor([[5], [5]]), "0"), {},
         (0, 80 + 16 + 80, 0)),
        (torch.ops.dtensor_rules.ep_combine.default, (_t(3, 4), torch.tensor([[6], [3]]), "0", 6), {},
         (0, 48 + 16 + 96, 0)),
        # routed experts (ep/routed_experts_rule.py), fp32: 4 tokens of D = 8, top-2 of 2 experts of H = 16, A = 8:
        # padded rows 4*2 + 2*8 = 24; flops 6 * 24 * 8 * 16; read x 128 + idx 64 + 3 experts 3 * 1024 + the
        # gathered rows twice 2 * 24 * 8 * 4 + three (24, 16) activations 3 * 1536; written the grouped output
        # 768 + the activations 4608 + the (4, 8) output 128; the backward twice each
        (torch.ops.dtensor_rules.routed_experts.default, _ROUTED, {},
         (6 * 24 * 8 * 16, 128 + 64 + 3 * 1024 + 1536 + 4608, 768 + 4608 + 128)),
        (torch.ops.dtensor_rules.routed_experts_backward.default, (_t(4, 8), *_ROUTED), {},
         (2 * 6 * 24 * 8 * 16, 2 * (128 + 64 + 3 * 1024 + 1536 + 4608), 2 * (768 + 4608 + 128))),
    ]


def test_estimate_prices_each_shipped_formula_as_derived_by_hand() -> None:
    """estimate_call reaches each rule's formula and the formula counts what docs/costs.md says."""
    cases = _hand_derived()
    covered = {op for op, *_ in cases}
    assert [str(r.op) for r in SHIPPED if r.cost is not None and r.op not in covered] == [], "add a hand-derived case"
    wrong = []
    for op, args, kwargs, want in cases:
        cost = estimate_call(op, args, kwargs)
        got = (cost.flops, cost.bytes_read, cost.bytes_written)
        if got != want:
            wrong.append(f"{op}: got {got}, derived by hand {want}")
    assert not wrong, "\n".join(wrong)


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
