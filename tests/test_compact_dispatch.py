"""Compact dispatch of single-dim rules (dtensor_rules.dispatch): dispatch prices at most two
strategies, queries still see every row over every mesh dim, and whatever dispatch picks gives
the single-device result (plain torch on the full tensors is the oracle)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor.debug import CommDebugMode

import dtensor_rules
from dtensor_rules._upstream import (
    DTensorSpec,
    OpSchema,
    OpSpec,
    OpStrategy,
    TensorMeta,
    TupleStrategy,
    clear_sharding_caches,
    propagate,
    recording_strategy_counts,
    unwrap_to_op_info,
)
from dtensor_rules.dispatch.greedy import key, transition_weight
from dtensor_rules.dispatch.single_dim import aliased_inputs
from dtensor_rules.op_rules.fma import fma, fma_strategy
from dtensor_rules.op_rules.softmax import SOFTMAX_BACKWARD
from dtensor_rules.registry import get_rule
from dtensor_rules.testing import fake_world, simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor
from tests._examples import scaled

aten = torch.ops.aten
SBD = SOFTMAX_BACKWARD[0]
PLACEMENTS = [Replicate(), Shard(0), Shard(1), Partial("sum"), Partial("avg"), Partial("max")]


def _meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(t.shape, t.stride(), t.dtype)


def _meta_dt(mesh, shape, placements, dtype=torch.float32) -> DTensor:  # noqa: ANN001
    """A DTensor on meta storage (no data): for sharding propagation on a fake mesh."""
    from dtensor_rules._upstream import compute_local_shape_and_global_offset

    local, _ = compute_local_shape_and_global_offset(shape, mesh.shape, [0] * mesh.ndim, placements)
    t = torch.empty(local, dtype=dtype, device="meta")
    return DTensor.from_local(t, mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=torch.empty(shape, device="meta").stride())


CALLS = {  # op -> builder(mesh) of a call whose inputs need no move on a (2, 2, 2) mesh
    "fma": lambda m: (fma, (_meta_dt(m, (64, 32), [Shard(0), Partial(), Replicate()]),
                            _meta_dt(m, (64, 32), [Shard(0), Replicate(), Replicate()]),
                            _meta_dt(m, (64, 32), [Shard(0), Partial(), Replicate()])), {}),
    "scatter.src": lambda m: (aten.scatter.src, (_meta_dt(m, (64, 32), [Shard(0), Replicate(), Replicate()]), 1,
                                                 _meta_dt(m, (64, 8), [Shard(0), Replicate(), Replicate()], torch.int64),
                                                 _meta_dt(m, (64, 8), [Shard(0), Replicate(), Replicate()])), {}),
    "index_put": lambda m: (aten.index_put.default, (_meta_dt(m, (64, 32), [Replicate()] * 3),
                                                     [_meta_dt(m, (128,), [Shard(0), Replicate(), Replicate()], torch.int64)],
                                                     _meta_dt(m, (128, 32), [Shard(0), Replicate(), Replicate()]), True), {}),
    "cumsum": lambda m: (aten.cumsum.default, (_meta_dt(m, (64, 32), [Shard(0), Shard(0), Replicate()]), 1), {}),
}


@pytest.mark.parametrize("name", sorted(CALLS))
def test_dispatch_prices_at_most_two_strategies_queries_see_all(name: str) -> None:
    with fake_world(8):
        mesh = init_device_mesh("cpu", (2, 2, 2))
        op, args, kwargs = CALLS[name](mesh)
        info = unwrap_to_op_info(op, args, kwargs)
        clear_sharding_caches()
        with recording_strategy_counts() as counts:
            propagate(info)
        assert counts and counts[-1] <= 2, counts
        # a query with several candidate layouts per input (what solvers and the validator pass)
        # gets upstream's expansion of every row over every mesh dim
        strategy = dtensor_rules.registry._checked_op_strategy(get_rule(op))
        candidates = [Replicate(), Shard(0)]
        schema = info.schema
        specs = [a for a in schema.args_schema if isinstance(a, DTensorSpec)]

        def many(spec: DTensorSpec) -> OpStrategy:
            return OpStrategy([OpSpec(DTensorSpec(mesh, (p,) * 3, tensor_meta=spec.tensor_meta)) for p in candidates])

        args_s = tuple(many(a) if isinstance(a, DTensorSpec) else
                       (TupleStrategy([many(x) for x in a]) if isinstance(a, (list, tuple)) and a and isinstance(a[0], DTensorSpec) else a)
                       for a in schema.args_schema)
        full = strategy(OpSchema(op, args_s, {}, schema_info=schema.schema_info))
        assert len(full.strategies) > 8, (name, len(full.strategies), len(specs))


def test_fma_on_512_ranks_prices_two_strategies_not_a_thousand() -> None:
    with fake_world(512):
        mesh = init_device_mesh("cpu", (8, 8, 8))
        op, args, kwargs = CALLS["fma"](mesh)
        clear_sharding_caches()
        with recording_strategy_counts() as counts:
            propagate(unwrap_to_op_info(op, args, kwargs))
        assert counts[-1] <= 2


def test_transition_weights_prefer_no_move_then_local_then_one_collective() -> None:
    R, S0, P = key(Replicate()), key(Shard(0)), key(Partial("sum"))
    assert transition_weight(S0, S0, False) == 0
    assert 0 < transition_weight(R, S0, False) < transition_weight(S0, R, False) < transition_weight(P, R, False)


def test_aliased_inputs_of_out_and_inplace_calls() -> None:
    x = OpStrategy([])
    assert aliased_inputs(aten.cumsum_.default, OpSchema(aten.cumsum_.default, (x, 0), {})) == {0: 0}
    assert aliased_inputs(aten.cumsum.out, OpSchema(aten.cumsum.out, (x, 0), {"out": x})) == {1: 0}
    schema = OpSchema(aten.sort.values, (x,), {"values": x, "indices": x})
    assert aliased_inputs(aten.sort.values, schema) == {1: 0, 2: 1}
    assert aliased_inputs(aten.cumsum.default, OpSchema(aten.cumsum.default, (x, 0), {})) == {}


def _exact_rows_exist(rows, placements) -> bool:  # noqa: ANN001
    """Every mesh dim has a row (or all-Replicate) taking the inputs exactly as they are, and the
    output does not mix Partial kinds across mesh dims (sum with avg only: docs/dispatch.md)."""
    def fill(p):  # noqa: ANN001, ANN202
        return Shard(p.dim) if type(p).__name__ == "_ShardingPlaceholder" else p
    table = {tuple(fill(p) for p in r[1:]): fill(r[0]) for r in reversed(rows)}
    outs = []
    for m in range(len(placements[0])):
        here = tuple(p[m] for p in placements)
        if all(isinstance(p, Replicate) for p in here):
            outs.append(Replicate())
        elif here in table:
            outs.append(table[here])
        else:
            return False
    kinds = {p.reduce_op for p in outs if isinstance(p, Partial)}
    return len(kinds) <= 1 or kinds == {"sum", "avg"}


@given(pa=st.lists(st.sampled_from(PLACEMENTS), min_size=2, max_size=2),
       pc=st.lists(st.sampled_from(PLACEMENTS), min_size=2, max_size=2), seed=st.integers(0, 1000))
def test_fma_dispatch_matches_single_device_and_exact_layouts_do_not_communicate(pa, pc, seed) -> None:  # noqa: ANN001
    for pl in (pa, pc):  # DTensor refuses mixed Partial reduce ops in one placement list
        assume(len({p.reduce_op for p in pl if isinstance(p, Partial)}) <= 1)
    g = torch.Generator().manual_seed(seed)
    a, b, c = torch.randn(5, 6, generator=g), torch.randn(6, generator=g), torch.randn(5, 6, generator=g)
    with simulated_mesh((2, 2)) as mesh:
        da, db, dc = to_dtensor(a, mesh, pa), to_dtensor(b, mesh, [Replicate()] * 2), to_dtensor(c, mesh, pc, salt=1)
        rows = fma_strategy(fma, (_meta(a), _meta(b), _meta(c)), {})
        exact = _exact_rows_exist(rows, [da.placements, db.placements, dc.placements])
        with CommDebugMode() as comm:
            out = fma(da, db, dc)
        if exact:
            assert comm.get_total_counts() == 0, (pa, pc, comm.get_comm_counts())
        torch.testing.assert_close(full_value(out), fma(full_value(da), full_value(db), full_value(dc)), atol=1e-5, rtol=1e-5)


GATHER_LIKE = [Replicate(), Shard(0), Shard(1), Partial("sum"), Partial("max")]


@pytest.mark.slow  # ten dispatches on a simulated 8-rank mesh an example
@given(ps=st.lists(st.sampled_from(GATHER_LIKE), min_size=3, max_size=3),
       pi=st.lists(st.sampled_from([Replicate(), Shard(0), Shard(1)]), min_size=3, max_size=3),
       src_dtype=st.sampled_from([torch.float32, torch.int64]), seed=st.integers(0, 1000))
def test_scatter_add_dispatch_on_3d_mesh_matches_single_device(ps, pi, src_dtype, seed) -> None:  # noqa: ANN001
    """Whatever the greedy choice is, the result is plain torch's (uneven 5 and 3 rows on 2 ranks per dim)."""
    assume(len({p.reduce_op for p in ps if isinstance(p, Partial)}) <= 1)
    assume(src_dtype.is_floating_point or not any(isinstance(p, Partial) and p.reduce_op != "sum" for p in ps))
    g = torch.Generator().manual_seed(seed)
    self_ = (torch.randn(5, 3, generator=g) * 4).to(src_dtype)
    index = torch.randint(0, 5, (5, 3), generator=g)
    src = (torch.randn(5, 3, generator=g) * 4).to(src_dtype)
    with simulated_mesh((2, 2, 2)) as mesh:
        ds = to_dtensor(self_, mesh, ps)
        di, dsrc = to_dtensor(index, mesh, pi), to_dtensor(src, mesh, pi, salt=2)
        out = torch.scatter_add(ds, 0, di, dsrc)
        want = torch.scatter_add(full_value(ds), 0, full_value(di), full_value(dsrc))
        torch.testing.assert_close(full_value(out), want)


def test_integer_token_counts_take_the_exact_partial_not_an_all_gather() -> None:
    """zeros(E, long).scatter_add(0, idx, ones) with idx sharded: self goes R -> P(sum) (exact for
    integers under the installed partition), the tokens stay where they are."""
    idx = torch.randint(0, 4, (13,), generator=torch.Generator().manual_seed(0))
    with simulated_mesh((2, 2)) as mesh:
        counts = to_dtensor(torch.zeros(4, dtype=torch.long), mesh, [Replicate(), Replicate()])
        di = to_dtensor(idx, mesh, [Shard(0), Shard(0)])
        ones = to_dtensor(torch.ones(13, dtype=torch.long), mesh, [Shard(0), Shard(0)])
        with CommDebugMode() as comm:
            out = counts.scatter_add(0, di, ones)
        assert comm.get_total_counts() == 0, comm.get_comm_counts()
        assert out.dtype == torch.long
        torch.testing.assert_close(full_value(out), torch.bincount(idx, minlength=4))


def test_inplace_self_keeps_its_layout_and_out_tensor_is_written_as_laid_out() -> None:
    x = torch.randn(6, 5)
    with simulated_mesh((2, 2)) as mesh:
        d = to_dtensor(x, mesh, [Shard(0), Replicate()])
        d.cumsum_(1)
        assert d.placements == (Shard(0), Replicate())
        torch.testing.assert_close(full_value(d), x.cumsum(1))
        o = to_dtensor(torch.empty(6, 5), mesh, [Replicate(), Shard(0)])
        torch.cumsum(to_dtensor(x, mesh, [Shard(1), Replicate()]), 1, out=o)
        assert o.placements == (Replicate(), Shard(0))
        torch.testing.assert_close(full_value(o), x.cumsum(1))


@pytest.mark.parametrize("pg, py", [((Shard(1), Replicate()), (Shard(0), Replicate())), ((Partial("sum"), Shard(0)), (Replicate(), Shard(0)))])
def test_softmax_backward_dispatch(pg, py) -> None:  # noqa: ANN001
    grad, y = torch.randn(6, 5), torch.randn(6, 5).softmax(1)
    with simulated_mesh((2, 2)) as mesh:
        dg, dy = to_dtensor(grad, mesh, list(pg)), to_dtensor(y, mesh, list(py))
        out = SBD(dg, dy, 1, torch.float32)
        torch.testing.assert_close(full_value(out), SBD(full_value(dg), full_value(dy), 1, torch.float32), atol=1e-5, rtol=1e-5)


def _reference_greedy(inputs, ndim, rows, n_out, fixed):  # noqa: ANN001, ANN202
    """The documented choice, scored in full: per mesh dim the first row of least finite total
    transition weight x bytes (all-Replicate first), skipping rows that break an aliased input or would make
    a tensor Partial over different reduce ops across mesh dims."""
    replicate = [Replicate()] * (n_out + len(inputs))
    picked = []
    for m in range(ndim):
        current = [key(i.current.placements[m]) for i in inputs]
        best, best_cost = None, float("inf")
        for row in [replicate, *rows]:
            keys = [key(p) for p in row]
            if any(keys[n_out + i] != current[i] or keys[o] != current[i] for i, o in fixed.items()):
                continue
            ops = [{k[1] for k in [key(r[j]) for r in picked] + [keys[j]] if k[0] == "P"} for j in range(len(keys))]
            if any(len(o) > 1 and o != {"sum", "avg"} for o in ops):
                continue
            cost = sum(transition_weight(c, t, i.integral) * i.nbytes for c, t, i in zip(current, keys[n_out:], inputs))
            if cost < best_cost:  # an infinite cost (a move DTensor does not run) never wins
                best, best_cost = row, cost
        if best is None:
            return None
        picked.append(best)
    return picked


@scaled(10)  # scoring logic on tiny tables, ~10 ms an example: ten times the profile's count
@given(data=st.data())
def test_greedy_scoring_shortcuts_keep_the_documented_choice(data) -> None:  # noqa: ANN001
    """Dispatch stops scoring a row once it cannot win and a mesh dim at a row that moves nothing;
    it must still pick exactly the rows a full scoring picks (ties: the first), Partial kinds unmixed."""
    from types import SimpleNamespace

    from dtensor_rules.dispatch.greedy import ExactIntegerPartial, Input, greedy_rows

    all_pl = PLACEMENTS + [Partial("min"), Shard(2)]
    ndim, n_in, n_out = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 5)), data.draw(st.integers(1, 2))
    inputs = [Input(None, SimpleNamespace(placements=data.draw(st.lists(st.sampled_from(all_pl), min_size=ndim, max_size=ndim))),
                    float(data.draw(st.sampled_from([0, 2, 8, 4096]))), data.draw(st.booleans()))
              for _ in range(n_in)]
    rows = data.draw(st.lists(st.lists(st.sampled_from(all_pl), min_size=n_in + n_out, max_size=n_in + n_out), max_size=14))
    fixed = data.draw(st.sampled_from([{}, {0: 0}, {n_in - 1: n_out - 1}]))
    before = ExactIntegerPartial.active
    try:
        ExactIntegerPartial.active = data.draw(st.booleans())
        want = _reference_greedy(inputs, ndim, rows, n_out, fixed)
        got = greedy_rows(inputs, ndim, lambda current: rows, n_out, fixed)
    finally:
        ExactIntegerPartial.active = before

    def which(sel):  # noqa: ANN001, ANN202  (row identity: "R" for all-Replicate)
        return None if sel is None else [next((i for i, r in enumerate(rows) if r is x), "R") for x in sel]

    assert which(got) == which(want)


@pytest.mark.parametrize("dim", [0, 1])
def test_cat_of_many_inputs_that_must_all_move_matches_torch(dim: int) -> None:
    """The propagation-cost outlier of benchmarks/propagation_cost.py: 7 inputs sharded on the cat dim
    (uneven on 2 ranks), Partial on another mesh dim, mixed dtypes (promotion): every input is redistributed."""
    g = torch.Generator().manual_seed(dim)
    shapes = [[5, 3] for _ in range(7)]
    for i, s in enumerate(shapes):
        s[dim] = 1 + i % 4
    dtypes = [torch.float32, torch.float64] * 3 + [torch.float32]
    tensors = [torch.randn(*s, generator=g, dtype=d) for s, d in zip(shapes, dtypes)]
    with simulated_mesh((2, 2, 2)) as mesh:
        layout = [Shard(dim), Partial("sum"), Replicate()]
        xs = [to_dtensor(t, mesh, layout, salt=i) for i, t in enumerate(tensors)]
        got = full_value(torch.cat(xs, dim))
    torch.testing.assert_close(got, torch.cat(tensors, dim))
