"""cat / slice_scatter at dispatch: few strategies priced, rows polynomial in inputs, results exact.

Dispatch (one current layout per input) gets at most two strategies; solvers
get the full enumeration; whatever dispatch picks must reproduce plain torch.
"""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules._upstream import DTensorSpec, OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo, TensorMeta, TupleStrategy
from dtensor_rules.op_rules.slicing import CatCall, cat_rows, cat_strategy, slice_scatter_strategy
from dtensor_rules.testing import fake_world, simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor

aten = torch.ops.aten
R = Replicate()


def _strategy(mesh, shape, placements, dtype=torch.float32) -> OpStrategy:  # noqa: ANN001
    t = torch.empty(shape, dtype=dtype, device="meta")
    meta = TensorMeta(t.shape, t.stride(), t.dtype)
    return OpStrategy([OpSpec(DTensorSpec(mesh, tuple(placements), tensor_meta=meta))])


def _cat_schema(mesh, shapes, placements, dim=0) -> OpSchema:  # noqa: ANN001
    inputs = TupleStrategy([_strategy(mesh, s, p) for s, p in zip(shapes, placements)])
    return OpSchema(aten.cat.default, (inputs, dim), {}, schema_info=RuntimeSchemaInfo(1, needs_pytree=True))


def test_cat_dispatch_prices_at_most_two_strategies_for_many_inputs() -> None:
    """6 and 12 inputs on a (2, 2, 2) mesh: pricing the full enumeration would be 450+ strategies
    (minutes for 6 inputs)."""
    with fake_world(8):
        mesh = init_device_mesh("cpu", (2, 2, 2))
        P, S0 = Partial("max"), Shard(0)
        for n in (6, 12):
            layouts = [(P if i % 2 else R, S0, R) for i in range(n)]
            strategy = cat_strategy(_cat_schema(mesh, [(4, 3)] * n, layouts, dim=1))
            assert 1 <= len(strategy.strategies) <= 2
            best = strategy.strategies[0]
            # the layout the inputs already have is valid (max of a replicated value is itself): no move
            assert [tuple(s.placements) for s in best.input_specs] == layouts
            assert tuple(best.output_spec.placements) == (P, S0, R)


def test_slice_scatter_dispatch_prices_at_most_two_strategies() -> None:
    with fake_world(8):
        mesh = init_device_mesh("cpu", (2, 2, 2))
        x = _strategy(mesh, (8, 6), (Shard(0), Partial("sum"), R))
        src = _strategy(mesh, (8, 2), (Shard(0), Partial("sum"), R))
        strategy = slice_scatter_strategy(OpSchema(aten.slice_scatter.default, (x, src, 1, 0, 2), {}))
        assert len(strategy.strategies) <= 2
        assert tuple(strategy.strategies[0].output_spec.placements) == (Shard(0), Partial("sum"), R)


def test_cat_rows_polynomial_in_inputs() -> None:
    """Subsets only up to 3 eligible inputs; beyond, rows grow linearly (with the rows' width)."""
    def rows(n: int) -> int:
        call = CatCall((torch.float32,) * n, tuple(range(n)), (), (), 1, 2, torch.float32, False)
        return len(cat_rows(call))

    # S(0) (not S(1): the cat dim, with 3 non-empty inputs), P(sum), 7 subsets x avg/max/min
    assert rows(3) == 1 + 1 + 3 * 7
    for n in (8, 16, 64):
        assert rows(n) == 1 + 1 + 3 * (n + 1)


def test_full_enumeration_contains_what_dispatch_picks() -> None:
    with fake_world(4):
        mesh = init_device_mesh("cpu", (2, 2))
        layouts = [(Shard(1), Partial("min")), (R, Partial("min")), (Shard(1), R)]
        schema = _cat_schema(mesh, [(4, 3), (2, 3), (5, 3)], layouts)
        full = {
            (tuple(s.output_spec.placements), tuple(tuple(i.placements) for i in s.input_specs))
            for s in cat_strategy(schema, full=True).strategies
        }
        for s in cat_strategy(schema).strategies:
            assert (tuple(s.output_spec.placements), tuple(tuple(i.placements) for i in s.input_specs)) in full
        assert len(full) > 20


MESHES = [(2,), (4,), (2, 2), (2, 4), (2, 2, 2)]
PLACEMENTS = [R, Shard(0), Shard(1), Partial("sum"), Partial("avg"), Partial("max"), Partial("min")]


@st.composite
def layouts(draw, ndim: int, n: int):  # noqa: ANN001, ANN201
    out = []
    for _ in range(n):
        pl = [draw(st.sampled_from(PLACEMENTS)) for _ in range(ndim)]
        kinds = {p.reduce_op for p in pl if isinstance(p, Partial)}
        if len(kinds) > 1:  # DTensor refuses mixed Partial kinds on one tensor
            pl = [R if isinstance(p, Partial) else p for p in pl]
        out.append(pl)
    return out


@given(st.data())
def test_cat_dispatch_matches_torch_from_any_layout(data) -> None:  # noqa: ANN001
    """Whatever the inputs' current layouts (uneven, empty, Partial of every op), dispatch's pick is exact."""
    mesh_shape = data.draw(st.sampled_from(MESHES))
    n = data.draw(st.integers(1, 4))
    dim = data.draw(st.integers(-2, 1))
    rows = data.draw(st.integers(1, 5))
    tensors = []
    for _ in range(n):
        shape = [rows, 3]
        shape[dim] = data.draw(st.integers(0, 5))
        t = torch.randn(*shape)
        if data.draw(st.booleans()):  # a transposed (non-contiguous) operand
            t = torch.randn(*reversed(shape)).t()
        tensors.append(t)
    pls = data.draw(layouts(len(mesh_shape), n))
    with simulated_mesh(mesh_shape) as mesh:
        xs = [to_dtensor(t, mesh, p, salt=i) for i, (t, p) in enumerate(zip(tensors, pls))]
        got = full_value(torch.cat(xs, dim))
    torch.testing.assert_close(got, torch.cat(tensors, dim))


@given(st.data())
def test_slice_scatter_dispatch_matches_torch_from_any_layout(data) -> None:  # noqa: ANN001
    mesh_shape = data.draw(st.sampled_from(MESHES))
    size = data.draw(st.integers(1, 6))
    start, end = data.draw(st.one_of(st.none(), st.integers(-7, 7))), data.draw(st.one_of(st.none(), st.integers(-7, 7)))
    step = data.draw(st.integers(1, 3))
    length = len(range(*slice(start, end, step).indices(size)))
    x, src = torch.randn(size, 3), torch.randn(3, length).t()  # src transposed (non-contiguous)
    pls = data.draw(layouts(len(mesh_shape), 2))
    with simulated_mesh(mesh_shape) as mesh:
        dx, dsrc = (to_dtensor(t, mesh, p, salt=i) for i, (t, p) in enumerate(zip((x, src), pls)))
        got = full_value(aten.slice_scatter.default(dx, dsrc, 0, start, end, step))
    torch.testing.assert_close(got, aten.slice_scatter.default(x, src, 0, start, end, step))


def _priced_products(monkeypatch, run) -> int:  # noqa: ANN001
    """How many full-mesh products dispatch's search prices while ``run()`` runs (cold caches)."""
    from dtensor_rules.dispatch import greedy
    from dtensor_rules._upstream import clear_sharding_caches

    count = [0]
    real = greedy._cost

    def counting(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        count[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(greedy, "_cost", counting)
    clear_sharding_caches()
    run()
    return count[0]


def test_cat_of_many_shards_along_the_sharded_dim_prices_few_products_and_is_exact(monkeypatch) -> None:  # noqa: ANN001
    """Every input must move (token shards joined along their sharded dim). Where no input is
    Partial(op), a Partial(op) row only relabels Replicate inputs at the cost of all-Replicate, so
    dispatch scores none: 2 usable rows per mesh dim (Replicate, Shard(1)), 8 products on (2, 2, 2)
    searched exhaustively (every Partial variant would be 24 rows per mesh dim and a coordinate
    descent of ~100 pricings)."""
    for n in (6, 12):
        tensors = [torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(n)]
        with simulated_mesh((2, 2, 2)) as mesh:
            xs = [to_dtensor(t, mesh, (Shard(0), R, R)) for t in tensors]
            out = []
            priced = _priced_products(monkeypatch, lambda: out.append(torch.cat(xs, 0)))
            got = full_value(out[0])
        torch.testing.assert_close(got, torch.cat(tensors, 0))
        assert priced <= 8, (n, priced)


def test_partial_rows_are_scored_where_an_input_is_partial_now() -> None:
    """The one Partial(op) row kept for dispatch keeps the Partial(op) inputs as they are."""
    with fake_world(8):
        mesh = init_device_mesh("cpu", (2, 2, 2))
        A = Partial("avg")
        layouts = [(A, Shard(1), R) if i in (1, 3) else (R, Shard(1), R) for i in range(6)]
        strategy = cat_strategy(_cat_schema(mesh, [(4, 3)] * 6, layouts, dim=0))
        best = strategy.strategies[0]
        assert [tuple(s.placements) for s in best.input_specs] == layouts  # no move: the Partial(avg) row
        assert tuple(best.output_spec.placements) == (A, Shard(1), R)
        x = _strategy(mesh, (8, 6), (A, R, R))
        src = _strategy(mesh, (8, 2), (R, R, R))
        strategy = slice_scatter_strategy(OpSchema(aten.slice_scatter.default, (x, src, 1, 0, 2), {}))
        assert tuple(strategy.strategies[0].output_spec.placements) == (A, R, R)
        assert [tuple(s.placements) for s in strategy.strategies[0].input_specs] == [(A, R, R), (R, R, R)]
