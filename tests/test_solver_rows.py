"""Solver-mode rows: a solver's query (several candidate specs per input) gets
the rows it can use and no dominated ones; dispatch is unaffected; the switch restores all rows."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard

from dtensor_rules._upstream import (
    DTensorSpec, OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo, TensorMeta, TupleStrategy, propagator,
)
from dtensor_rules.op_rules._solver_rows import full_enumeration, is_full_enumeration  # importing the package installs the rules
from dtensor_rules.testing import fake_world

aten = torch.ops.aten
R = Replicate()


@pytest.fixture(scope="module")
def mesh():
    with fake_world(2):
        yield init_device_mesh("cpu", (2,))


def _strategy(mesh, shape: Sequence[int], dtype: torch.dtype, layouts: Sequence) -> OpStrategy:
    meta = TensorMeta(torch.Size(shape), torch.empty(shape, device="meta").stride(), dtype)
    return OpStrategy([OpSpec(DTensorSpec(mesh, (p,), tensor_meta=meta)) for p in layouts])


def _rows(op, args: tuple) -> set[tuple]:
    """(output, *inputs) 1-D placements of every strategy the installed rule offers."""
    info = RuntimeSchemaInfo(needs_pytree=True) if any(isinstance(a, TupleStrategy) for a in args) else None
    schema = OpSchema(op, args, {}, schema_info=info) if info else OpSchema(op, args, {})
    strategy = propagator().op_strategy_funcs[op](schema)
    return {(s.output_spec.placements[0], *(i.placements[0] for i in s.input_specs)) for s in strategy.strategies}


def _gmm_args(mesh, candidates_a, candidates_b) -> tuple:
    bf = torch.bfloat16
    return (_strategy(mesh, (16, 16), bf, candidates_a), _strategy(mesh, (2, 16, 16), bf, candidates_b),
            _strategy(mesh, (2,), torch.int32, [R]))


def _cat_args(mesh, candidates) -> tuple:
    parts = [_strategy(mesh, (4, 8), torch.float32, candidates) for _ in range(3)]
    return (TupleStrategy(parts), 0)


def test_grouped_mm_linearity_rows_are_offered_to_a_solver(mesh) -> None:
    P = Partial("sum")
    rows = _rows(aten._grouped_mm.default, _gmm_args(mesh, [R, Shard(0), Shard(1)], [R, Shard(0)]))
    assert (P, P, R, R) in rows and (P, R, P, R) in rows  # (P(sum), R, R) -> P(sum) and (R, P(sum), R) -> P(sum)
    assert not any(isinstance(r[0], Partial) and r[0].reduce_op == "avg" for r in rows)


def test_partial_max_rows_only_where_a_candidate_carries_max(mesh) -> None:
    plain = _rows(aten.cat.default, _cat_args(mesh, [R, Shard(1)]))
    carried = _rows(aten.cat.default, _cat_args(mesh, [R, Shard(1), Partial("max")]))
    assert not any(isinstance(p, Partial) and p.reduce_op in ("avg", "max", "min") for r in plain for p in r)
    PM = Partial("max")
    assert (PM, PM, PM, PM) in carried
    # one part Partial(max), the others Replicate: dominated by the all-Partial row (R -> P(max) is free)
    assert (PM, PM, R, R) not in carried


def test_the_switch_restores_every_row_and_dispatch_is_unaffected(mesh) -> None:
    PM = Partial("max")
    args = _cat_args(mesh, [R, Shard(1), PM])
    trimmed = _rows(aten.cat.default, args)
    plain_args = _cat_args(mesh, [R, Shard(1)])
    assert not is_full_enumeration()
    with full_enumeration():
        full = _rows(aten.cat.default, args)
        full_plain = _rows(aten.cat.default, plain_args)
        gmm_full = _rows(aten._grouped_mm.default, _gmm_args(mesh, [R, Shard(0)], [R, Shard(0)]))
    assert not is_full_enumeration()
    assert trimmed < full and (PM, PM, R, R) in full
    assert any(p == Partial("avg") for r in full_plain for p in r)  # the dominated rows come back
    assert any(r[0] == Partial("avg") for r in gmm_full)
    # dispatch: one spec per input, the same strategies whichever the switch says
    for layouts in ([Shard(1)], [PM], [R]):
        one = _cat_args(mesh, layouts)
        before = _rows(aten.cat.default, one)
        with full_enumeration():
            assert _rows(aten.cat.default, one) == before
        gmm_one = _gmm_args(mesh, layouts if layouts != [PM] else [Partial("sum")], [R])
        before = _rows(aten._grouped_mm.default, gmm_one)
        with full_enumeration():
            assert _rows(aten._grouped_mm.default, gmm_one) == before
