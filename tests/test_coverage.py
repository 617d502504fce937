"""The op-coverage tool: its rows are the ops make_fx traces, with hand-counted costs for a tiny model;
ops without a rule; the CLI entry point."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import pytest
import torch
from torch._ops import OpOverload
from torch.utils import _pytree as pytree
from expecttest import TestCase

import dtensor_rules  # noqa: F401
from dtensor_rules.cli.coverage import EXCLUDED_OPS, coverage, coverage_main, rule_source
from dtensor_rules.testing.query import active_strategy


@torch.library.custom_op("dtensor_rules_test::mystery", mutates_args=())
def mystery(x: torch.Tensor) -> torch.Tensor:
    """An op DTensor knows nothing about: no rule, no decomposition."""
    return x.sin()


@mystery.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def uses_mystery(x: torch.Tensor) -> torch.Tensor:
    return x * mystery(x.detach())


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU())


def traced_calls(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> Counter:
    """Calls per aten op of forward + ``autograd.grad`` wrt the parameters and floating inputs, traced by
    ``make_fx`` here (the cotangents are graph inputs, as coverage's trace takes them); the oracle for
    which ops the coverage report lists and how often."""
    from torch.fx.experimental.proxy_tensor import make_fx

    xs = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]

    def outputs(xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [o for o in pytree.tree_leaves(model(*xs)) if isinstance(o, torch.Tensor) and o.requires_grad]

    def joint(*flat: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        outs = outputs(flat[: len(xs)])
        wrt = [*(p for p in model.parameters() if p.requires_grad), *(x for x in flat[: len(xs)] if x.requires_grad)]
        return torch.autograd.grad(outs, wrt, flat[len(xs):], allow_unused=True)

    graph = make_fx(joint, tracing_mode="real")(*xs, *(torch.ones_like(o) for o in outputs(xs))).graph
    return Counter(n.target for n in graph.nodes
                   if n.op == "call_function" and isinstance(n.target, OpOverload) and n.target not in EXCLUDED_OPS)


def _assert_rows_are_the_traced_ops_with_their_rule_source(report, model, inputs) -> None:  # noqa: ANN001
    assert {r.op: r.calls for r in report.rows} == traced_calls(model, inputs)
    # "ours" exactly where the strategy DTensor's propagator holds for the op comes from this package
    def source(op: OpOverload) -> str:
        kind_fn = active_strategy(op)
        assert kind_fn is not None, f"{op}: DTensor has no strategy for it"
        return "ours" if getattr(kind_fn[1], "__module__", "").startswith("dtensor_rules") else "upstream"

    assert {r.op: r.rule for r in report.rows} == {r.op: source(r.op) for r in report.rows}


class TestCoverageTable(TestCase):
    def test_linear_relu_table(self) -> None:
        """Linear(8, 4) + ReLU on 6 tokens: the traced ops, their rules, and each op's flops and bytes
        counted by hand (fp32: 4 bytes an element; the mm calls are the two backward products)."""
        model, x = tiny_model(), torch.randn(6, 8)
        report = coverage(model, (x,), mesh_shape=(2, 2))
        _assert_rows_are_the_traced_ops_with_their_rule_source(report, model, (x,))
        aten = torch.ops.aten
        work = {  # op: (flops, bytes read + written) summed over its calls
            aten.addmm.default: (2 * 6 * 8 * 4, 4 * (4 + 6 * 8 + 8 * 4 + 6 * 4)),  # bias + x @ W.T
            aten.mm.default: (2 * (2 * 6 * 4 * 8), 2 * 4 * (6 * 4 + 4 * 8 + 6 * 8)),  # dx = g @ W, dW = g.T @ x
            aten.relu.default: (6 * 4, 4 * (6 * 4 + 6 * 4)),
            aten.threshold_backward.default: (6 * 4, 4 * (6 * 4 * 3)),  # reads g and the output, writes dx
            aten.sum.dim_IntList: (6 * 4, 4 * (6 * 4 + 4)),  # the bias gradient
        }
        for r in report.rows:
            flops, nbytes = work.get(r.op, (0, 0))  # views (t, view, detach/alias) move nothing
            assert r.cost.endswith(f" us ({flops} flop, {nbytes} B)"), (r.name, r.cost)
            assert int(r.strategies) > 0, r.name
        n = {k: sum(r.rule == k for r in report.rows) for k in ("ours", "upstream")}
        assert report.table().splitlines()[-1] == (
            f"{len(report.rows)} ops on mesh 2x2: {n['ours']} ours, {n['upstream']} upstream, 0 decomp, 0 handler, 0 none")

    def test_op_without_rule_is_none_and_listed_missing(self) -> None:
        op = torch.ops.dtensor_rules_test.mystery.default
        report = coverage(uses_mystery, (torch.randn(4, 4),), mesh_shape=(2,))
        row = next(r for r in report.rows if r.op == op)
        self.assertEqual((row.rule, row.strategies), ("none", "-"))
        self.assertEqual(report.missing, [op])
        self.assertEqual(rule_source(torch.ops.aten.mul.Tensor), "upstream")

    def test_excluded_ops_are_not_listed(self) -> None:
        report = coverage(tiny_model(), (torch.randn(6, 8),), mesh_shape=(2,))
        self.assertFalse({r.op for r in report.rows} & EXCLUDED_OPS)
        self.assertTrue(all(isinstance(r.op, torch._ops.OpOverload) for r in report.rows))


def test_strategies_count_what_dispatch_runs_and_explain_what_they_cannot_count(monkeypatch) -> None:
    """No unexplained "0" in the strategies column: a strategy without input specs is counted
    as dispatch runs it; an answer that is not countable shows "-*" with a note under the table."""
    from dtensor_rules._upstream import TupleStrategy
    from dtensor_rules.testing import query

    def sliced(x: torch.Tensor) -> torch.Tensor:
        return (x[1:3] * 2).sum()

    report = coverage(sliced, (torch.randn(6, 4),), mesh_shape=(2,))
    row = next(r for r in report.rows if r.op == torch.ops.aten.slice_backward.default)
    assert row.rule == "upstream" and int(row.strategies) > 1 and not row.note  # R and S(1) at least

    real = query.active_strategy
    tuple_rule = ("op_strategy", lambda schema: TupleStrategy([]))
    monkeypatch.setattr(query, "active_strategy", lambda op: tuple_rule if op == torch.ops.aten.mul.Tensor else real(op))
    report = coverage(sliced, (torch.randn(6, 4),), mesh_shape=(2,))
    row = next(r for r in report.rows if r.op == torch.ops.aten.mul.Tensor)
    assert (row.strategies, row.note) == ("-*", "a TupleStrategy (one strategy per element of a list argument): not counted as combos")
    assert report.table().splitlines()[-1] == f"-* aten.mul.Tensor: {row.note}"


def test_coverage_main_exits_nonzero_when_an_op_has_no_rule(capsys) -> None:
    rc = coverage_main(["--mesh", "2"], example=lambda: (uses_mystery, (torch.randn(4, 4),)))
    out = capsys.readouterr().out
    assert rc == 1
    assert "dtensor_rules_test.mystery.default" in out and "no sharding rule" in out


def test_coverage_main_exits_zero_when_every_op_has_a_rule(capsys) -> None:
    rc = coverage_main(["--mesh", "2x2"], example=lambda: (tiny_model(), (torch.randn(6, 8),)))
    assert rc == 0
    assert "0 none" in capsys.readouterr().out


def test_every_moe_op_gets_a_cost_on_each_profile() -> None:
    from dtensor_rules.cli.coverage import moe_example

    model, inputs = moe_example()
    h100 = coverage(model, inputs, mesh_shape=(2,), hardware="h100")
    a100 = coverage(model, inputs, mesh_shape=(2,), hardware="a100")
    assert not [r.name for r in h100.rows if not r.cost.lstrip("~")[0].isdigit()]
    costs = {r.name: (r.cost, s.cost) for r, s in zip(h100.rows, a100.rows)}
    # the same flops and bytes, priced on a slower device: the launch-bound mm differs in its launch only
    assert costs["aten.mm.default"][0].split(" us ")[1] == costs["aten.mm.default"][1].split(" us ")[1]
    assert costs["aten.mm.default"][0] != costs["aten.mm.default"][1]


class TestMoEBlockCoverage(TestCase):
    @pytest.mark.slow  # ~15 s: traces the MoE block twice (CLI and demo)
    def test_cli_and_demo_trace_the_same_named_model(self) -> None:
        """`coverage` and demo section 2 trace one model (`moe_example`) and both outputs name it."""
        import io

        from dtensor_rules.cli import demo
        from dtensor_rules.cli.coverage import describe_moe_example, moe_example

        self.assertExpectedInline(describe_moe_example(), """\
traced: the demo's MoE block (dim 32, hidden 64, 4 experts top-2, 1 shared, permute_impl='kernel'), bf16, tokens 66x32, forward+backward""")
        report = coverage(*moe_example(), mesh_shape=(2, 2))
        # no bare "0" (slice_backward's rule states no input specs; dispatch lays inputs out as the output)
        assert not [r.name for r in report.rows if r.strategies.split("-")[0] == "0"], report.table()
        _assert_rows_are_the_traced_ops_with_their_rule_source(report, *moe_example())
        ours = {r.name for r in report.rows if r.rule == "ours"}
        assert {"aten._grouped_mm.default", "dtensor_rules.moe_permute_indices.default"} <= ours, ours
        out = io.StringIO()
        demo.section_coverage((2, 2), out)
        text = out.getvalue()
        assert describe_moe_example() in text and f"{len(report.rows)} ops:" in text
