"""The op-coverage tool: golden table for a tiny model, ops without a rule, the CLI entry point."""

from __future__ import annotations

import pytest
import torch
from expecttest import TestCase

import dtensor_rules  # noqa: F401
from dtensor_rules._upstream import TORCH_VERSION
from dtensor_rules.cli.coverage import EXCLUDED_OPS, coverage, coverage_main, rule_source


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


class TestCoverageTable(TestCase):
    def test_linear_relu_table(self) -> None:
        report = coverage(tiny_model(), (torch.randn(6, 8),), mesh_shape=(2, 2))
        table = report.table()
        # one golden per release: 2.14's autograd trace has alias where 2.13's had detach (same rule, same row)
        if TORCH_VERSION >= (2, 14):
            self.assertExpectedInline(table, """\
op                               calls  rule      strategies  cost
-------------------------------  -----  --------  ----------  ----------------------
aten.addmm.default               1      upstream  64          4 us (384 flop, 432 B)
aten.alias.default               2      ours      39          0 us (0 flop, 0 B)
aten.mm.default                  2      upstream  64          8 us (768 flop, 832 B)
aten.relu.default                1      upstream  23          4 us (24 flop, 192 B)
aten.sum.dim_IntList             1      upstream  16          4 us (24 flop, 112 B)
aten.t.default                   5      upstream  39          0 us (0 flop, 0 B)
aten.threshold_backward.default  1      upstream  9           4 us (24 flop, 288 B)
aten.view.default                1      upstream  26          0 us (0 flop, 0 B)
8 ops on mesh 2x2: 1 ours, 7 upstream, 0 decomp, 0 handler, 0 none""")
        else:
            self.assertExpectedInline(table, """\
op                               calls  rule      strategies  cost
-------------------------------  -----  --------  ----------  ----------------------
aten.addmm.default               1      upstream  64          4 us (384 flop, 432 B)
aten.detach.default              2      ours      39          0 us (0 flop, 0 B)
aten.mm.default                  2      upstream  64          8 us (768 flop, 832 B)
aten.relu.default                1      upstream  23          4 us (24 flop, 192 B)
aten.sum.dim_IntList             1      upstream  16          4 us (24 flop, 112 B)
aten.t.default                   5      upstream  39          0 us (0 flop, 0 B)
aten.threshold_backward.default  1      upstream  9           4 us (24 flop, 288 B)
aten.view.default                1      upstream  26          0 us (0 flop, 0 B)
8 ops on mesh 2x2: 1 ours, 7 upstream, 0 decomp, 0 handler, 0 none""")

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
    """#18.11: `coverage` showed "0" strategies unexplained. A strategy without input specs is counted
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


class TestMoEBlockGolden(TestCase):
    @pytest.mark.slow  # ~15 s: traces the MoE block twice (CLI and demo)
    def test_cli_and_demo_trace_the_same_named_model(self) -> None:
        """`coverage` and demo section 2 trace one model (`moe_example`) and both outputs name it (#13)."""
        import io

        from dtensor_rules.cli import demo
        from dtensor_rules.cli.coverage import describe_moe_example, moe_example

        self.assertExpectedInline(describe_moe_example(), """\
traced: the demo's MoE block (dim 32, hidden 64, 4 experts top-2, 1 shared, permute_impl='kernel'), bf16, tokens 66x32, forward+backward""")
        report = coverage(*moe_example(), mesh_shape=(2, 2))
        # #18.11: no bare "0" (slice_backward's rule states no input specs; dispatch lays inputs out as the output)
        assert not [r.name for r in report.rows if r.strategies.split("-")[0] == "0"], report.table()
        rows = "\n".join(f"{r.name}  {r.calls}  {r.rule}" for r in report.rows)
        # one golden per release: 2.14's autograd saves the router's detached scores as alias, 2.13 as detach
        if TORCH_VERSION >= (2, 14):
            self.assertExpectedInline(rows, """\
aten._grouped_mm.default  9  ours
aten._to_copy.default  9  upstream
aten.add.Tensor  9  upstream
aten.alias.default  2  ours
aten.cat.default  3  ours
aten.cumsum.default  1  ours
aten.div.Tensor  4  upstream
aten.expand.default  2  upstream
aten.full_like.default  1  upstream
aten.gather.default  2  ours
aten.histc.default  1  ours
aten.index.Tensor  4  ours
aten.index_put.default  5  ours
aten.lt.Scalar  1  upstream
aten.mm.default  12  upstream
aten.mul.Tensor  12  upstream
aten.neg.default  1  upstream
aten.new_full.default  1  upstream
aten.new_zeros.default  7  upstream
aten.ones_like.default  1  upstream
aten.remainder.Scalar  1  upstream
aten.scatter_add.default  2  ours
aten.sigmoid.default  1  upstream
aten.sigmoid_backward.default  1  upstream
aten.silu.default  2  upstream
aten.silu_backward.default  2  upstream
aten.slice.Tensor  8  upstream
aten.slice_backward.default  2  upstream
aten.sort.stable  1  upstream
aten.squeeze.dim  3  upstream
aten.sub.Tensor  1  upstream
aten.sum.dim_IntList  3  upstream
aten.t.default  20  upstream
aten.topk.default  1  ours
aten.transpose.int  6  upstream
aten.unsqueeze.default  3  upstream
aten.where.self  1  upstream
dtensor_rules.moe_permute_indices.default  1  ours""")
        else:
            self.assertExpectedInline(rows, """\
aten._grouped_mm.default  9  ours
aten._to_copy.default  9  upstream
aten.add.Tensor  9  upstream
aten.cat.default  3  ours
aten.cumsum.default  1  ours
aten.detach.default  2  ours
aten.div.Tensor  4  upstream
aten.expand.default  2  upstream
aten.full_like.default  1  upstream
aten.gather.default  2  ours
aten.histc.default  1  ours
aten.index.Tensor  4  ours
aten.index_put.default  5  ours
aten.lt.Scalar  1  upstream
aten.mm.default  12  upstream
aten.mul.Tensor  12  upstream
aten.neg.default  1  upstream
aten.new_full.default  1  upstream
aten.new_zeros.default  7  upstream
aten.ones_like.default  1  upstream
aten.remainder.Scalar  1  upstream
aten.scatter_add.default  2  ours
aten.sigmoid.default  1  upstream
aten.sigmoid_backward.default  1  upstream
aten.silu.default  2  upstream
aten.silu_backward.default  2  upstream
aten.slice.Tensor  8  upstream
aten.slice_backward.default  2  upstream
aten.sort.stable  1  upstream
aten.squeeze.dim  3  upstream
aten.sub.Tensor  1  upstream
aten.sum.dim_IntList  3  upstream
aten.t.default  20  upstream
aten.topk.default  1  ours
aten.transpose.int  6  upstream
aten.unsqueeze.default  3  upstream
aten.where.self  1  upstream
dtensor_rules.moe_permute_indices.default  1  ours""")
        out = io.StringIO()
        demo.section_coverage((2, 2), out)
        text = out.getvalue()
        assert describe_moe_example() in text and f"{len(report.rows)} ops:" in text
