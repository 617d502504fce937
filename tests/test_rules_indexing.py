"""aten.index.Tensor / aten.index_put: every emitted strategy matches single-device torch (hypothesis,
1-D/2-D/3-D meshes), end-to-end DTensor runs forward and backward, plain-tensor mixing, golden tables."""

from __future__ import annotations

import itertools

import pytest
import torch
from expecttest import assert_expected_inline
from hypothesis import assume, given
from hypothesis import strategies as st
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication

import dtensor_rules  # noqa: F401  (installs our rules)
from dtensor_rules.testing import check_rule, check_samples, simulated_mesh
from dtensor_rules.testing.suites import samples_for
from dtensor_rules.testing.tables import strategy_table
from tests._examples import scaled
from tests._index_helpers import idx

aten = torch.ops.aten
MESHES = [(2,), (4,), (2, 2), (2, 4), (2, 2, 2)]
# share of the profile's examples per mesh: validating every combo of (2, 4) and the 3-D mesh (8 ranks)
# costs ~10x the 2-rank mesh, so they get a fifth of the examples
EXAMPLES = {(2,): 1.0, (4,): 0.8, (2, 2): 0.5, (2, 4): 0.2, (2, 2, 2): 0.2}


@st.composite
def index_calls(draw: st.DrawFn, masks: bool, need_mask: bool = False) -> tuple[torch.Tensor, list]:
    """self plus an indices list: None entries, broadcasting integer tensors (dups, negatives), masks.

    ``need_mask``: a floating self and at least one mask (generated, not filtered: filtering for
    them discarded most examples and failed hypothesis' filter_too_much health check)."""
    ndim = draw(st.integers(1, 3))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16] + ([] if need_mask else [torch.int64])))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g).to(dtype) if dtype.is_floating_point else torch.randint(-9, 9, shape, generator=g)
    bshape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=2)))
    kinds = draw(st.lists(st.sampled_from(["none", "int", "mask"] if masks else ["none", "int"]), min_size=1, max_size=ndim))
    if need_mask and "mask" not in kinds[:1]:
        kinds[0] = "mask"  # first, so the dims it covers are always there
    if all(k == "none" for k in kinds):
        kinds[draw(st.integers(0, len(kinds) - 1))] = "int"
    indices: list = []
    d = 0
    for k in kinds:
        if d >= ndim:
            break
        if k == "none":
            indices.append(None)
            d += 1
        elif k == "mask" and "mask" not in [getattr(i, "dtype", None) == torch.bool and "mask" for i in indices]:
            r = draw(st.integers(1, ndim - d))
            indices.append(torch.rand(shape[d : d + r], generator=g) > 0.5)
            d += r
        else:
            own = tuple(s if draw(st.booleans()) else 1 for s in bshape)[draw(st.integers(0, len(bshape) - 1)) :]
            indices.append(torch.randint(-shape[d], shape[d], own, generator=g))
            d += 1
    assume(any(i is not None for i in indices))
    has_mask = any(i is not None and i.dtype == torch.bool for i in indices)
    if has_mask:  # a mask and integer tensors must broadcast: keep the others 1-element
        indices = [i if i is None or i.dtype == torch.bool else i.reshape(-1)[:1] for i in indices]
    return x, indices


def _no_duplicates(x: torch.Tensor, indices: list) -> bool:
    marker = torch.zeros(x.shape, dtype=torch.int64)
    try:
        marker.index_put_(indices, torch.ones((), dtype=torch.int64), accumulate=True)
    except Exception:
        return False
    return int(marker.max()) <= 1


def _assert_correct(report) -> None:  # noqa: ANN001
    assert report.ours.error is None, report.ours.error
    assert report.ours.incorrect == 0, report.summary()


@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_index_every_strategy_correct(mesh) -> None:  # noqa: ANN001
    scaled(EXAMPLES[mesh])(given(call=index_calls(masks=False))(_index_case))(mesh)


def _index_case(mesh, call) -> None:  # noqa: ANN001
    x, indices = call
    try:
        aten.index.Tensor(x, indices)
    except (IndexError, RuntimeError):
        assume(False)
    _assert_correct(check_rule(aten.index.Tensor, (x, indices), {}, mesh, max_nd_combos=200))


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@pytest.mark.parametrize("mesh", MESHES, ids=str)
def test_index_put_every_strategy_correct(mesh) -> None:  # noqa: ANN001
    strategy = given(call=index_calls(masks=True), accumulate=st.booleans(), data=st.data())(_index_put_case)
    scaled(EXAMPLES[mesh])(strategy)(mesh)


def _index_put_case(mesh, call, accumulate, data) -> None:  # noqa: ANN001
    x, indices = call
    try:
        view = aten.index.Tensor(x, indices)
    except (IndexError, RuntimeError):
        assume(False)
    if not accumulate:
        assume(_no_duplicates(x, indices))
    vshape = tuple(s if data.draw(st.booleans()) else 1 for s in view.shape)[data.draw(st.integers(0, view.ndim)) :]
    values = (torch.randn(vshape) * 3).to(x.dtype)
    _assert_correct(check_rule(aten.index_put.default, (x, indices, values, accumulate), {}, mesh, max_nd_combos=200))


@pytest.mark.slow  # over ~9 s of the inner loop (pyproject.toml)
@pytest.mark.parametrize("mesh", [(2,), (4,), (2, 2)], ids=str)
@pytest.mark.parametrize("op", [aten.index.Tensor, aten.index_put.default], ids=str)
def test_suite_no_incorrect_and_beats_upstream(op, mesh) -> None:  # noqa: ANN001
    r = check_samples(op, samples_for(op), mesh)
    _assert_correct(r)
    assert r.ours.correct >= r.upstream.correct, r.summary()


def test_index_put_out_variants_correct() -> None:
    x, i, v = torch.randn(5, 4), idx(4, 0, 4), torch.randn(3, 4)
    _assert_correct(check_rule(aten.index_put.out, (x, [i], v, True), {"out": torch.empty(5, 4)}, (2,)))
    _assert_correct(check_rule(aten.index.Tensor_out, (x, [None, idx(3, 1)]), {"out": torch.empty(5, 2)}, (2,)))


@pytest.mark.parametrize("op", [aten.index_put_.default, aten._index_put_impl_.default], ids=str)
def test_inplace_strategies_are_the_functional_ones_that_keep_self(op) -> None:  # noqa: ANN001
    """The validator cannot run in-place ops (they mutate its reference inputs); the functional rule is
    validated above, and in-place offers exactly its strategies whose output placement is self's."""
    args = (torch.randn(5, 4), [idx(4, 0)], torch.randn(2, 4), True)
    extra = (False,) if op is aten._index_put_impl_.default else ()
    functional = strategy_table(aten.index_put.default, args).splitlines()
    keep = [line for line in functional if line.split(" -> ")[0][1:].split(", ")[0] == line.split(" -> ")[1][1:-1]]
    assert strategy_table(op, args + extra).splitlines() == keep
    assert len(keep) < len(functional)


def test_golden_index_table() -> None:
    table = strategy_table(aten.index.Tensor, (torch.randn(4, 3, 5), [idx(1, 2).reshape(2, 1), None, idx(0, 4, 2)]))
    assert_expected_inline(table, """\
(P(avg), R, R) -> (P(avg))
(P(max), R, R) -> (P(max))
(P(min), R, R) -> (P(min))
(P(sum), R, R) -> (P(sum))
(R, R, R) -> (R)
(R, R, S(0)) -> (S(1))
(R, S(0), R) -> (S(0))
(S(1), R, R) -> (S(2))""")


def test_golden_index_put_table() -> None:
    table = strategy_table(aten.index_put.default, (torch.randn(6, 4), [idx(1, 5, 1)], torch.randn(3, 4), True))
    assert_expected_inline(table, """\
(P(avg), R, P(avg)) -> (P(avg))
(P(avg), R, R) -> (P(avg))
(P(max), R, R) -> (P(max))
(P(min), R, R) -> (P(min))
(P(sum), R, P(sum)) -> (P(sum))
(P(sum), S(0), S(0)) -> (P(sum))
(R, R, P(avg)) -> (P(avg))
(R, R, R) -> (R)
(S(1), R, S(1)) -> (S(1))""")


# ----------------------------------------------------------------------------------------- DTensor end to end
def test_dtensor_index_with_sharded_indices_shards_output() -> None:
    x, i = torch.randn(6, 5), idx(5, 0, 3, 3, 1, -1, 2)
    with simulated_mesh((2,)) as mesh:
        dx = distribute_tensor(x, mesh, [Replicate()])
        di = distribute_tensor(i, mesh, [Shard(0)])
        out = aten.index.Tensor(dx, [di])
        assert out.placements == (Shard(0),)
        torch.testing.assert_close(out.full_tensor(), x[i])


def test_dtensor_index_put_accumulate_combine_2d_mesh() -> None:
    """Expert-parallel combine: indices and values split across ranks, result Partial(sum) then reduced."""
    a, b, i, v = torch.randn(5, 2), torch.randn(2, 4), idx(4, 0, 4, 1, 2, 0), torch.randn(6, 4)
    x = a @ b
    with simulated_mesh((2, 2)) as mesh:
        dx = distribute_tensor(a, mesh, [Shard(1), Replicate()]) @ distribute_tensor(b, mesh, [Shard(0), Shard(1)])
        assert dx.placements == (Partial(), Shard(1))
        di = distribute_tensor(i, mesh, [Shard(0), Replicate()])
        dv = distribute_tensor(v, mesh, [Shard(0), Shard(1)])
        out = aten.index_put.default(dx, [di], dv, True)
        assert out.placements == (Partial(), Shard(1))
        torch.testing.assert_close(out.full_tensor(), x.index_put([i], v, accumulate=True))


def test_dtensor_index_put_separated_indices_and_mask() -> None:
    x = torch.randn(4, 3, 5)
    i, j, m = idx(3, 0).reshape(2, 1), idx(4, 1, 0), torch.rand(4, 3) > 0.4
    with simulated_mesh((2,)) as mesh:
        dx = distribute_tensor(x, mesh, [Shard(1)])
        vals = torch.randn(2, 3, 3)
        out = aten.index_put.default(dx, [distribute_tensor(i, mesh, [Replicate()]), None, distribute_tensor(j, mesh, [Replicate()])],
                                     distribute_tensor(vals, mesh, [Shard(2)]), False)
        assert out.placements == (Shard(1),)
        torch.testing.assert_close(out.full_tensor(), aten.index_put.default(x, [i, None, j], vals))
        row = torch.randn(5)
        out = aten.index_put.default(dx, [distribute_tensor(m, mesh, [Shard(1)])], distribute_tensor(row, mesh, [Replicate()]), True)
        assert out.placements == (Shard(1),)
        torch.testing.assert_close(out.full_tensor(), x.index_put([m], row, accumulate=True))


def test_dtensor_index_backward_matches_single_device() -> None:
    """x[i, :, j] backward runs new_zeros + index_put(accumulate=True) on DTensors: grads must match."""
    x = torch.randn(5, 4, 6)
    i, j = idx(0, 2, 2, 4), idx(1, 1, 5, 0)
    ref = x.clone().requires_grad_()
    (ref[i, :, j] ** 2).sum().backward()
    with simulated_mesh((2, 2)) as mesh:
        dx = distribute_tensor(x, mesh, [Shard(1), Replicate()]).requires_grad_()
        di = distribute_tensor(i, mesh, [Replicate(), Shard(0)])
        dj = distribute_tensor(j, mesh, [Replicate(), Shard(0)])
        (aten.index.Tensor(dx, [di, None, dj]) ** 2).sum().backward()
        torch.testing.assert_close(dx.grad.full_tensor(), ref.grad)


def test_dtensor_index_put_backward_matches_single_device() -> None:
    """index_put's autograd formula builds a plain ``aten.zeros`` for the overwritten grad slots, which DTensor 2.13
    refuses to mix with DTensors; it is identical on every rank, so ``implicit_replication()`` is safe there."""
    x, v, i = torch.randn(6, 4), torch.randn(3, 4), idx(5, 1, 2)
    rx, rv = x.clone().requires_grad_(), v.clone().requires_grad_()
    (torch.index_put(rx, (i,), rv) ** 2).sum().backward()
    with simulated_mesh((2,)) as mesh:
        dx = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
        dv = distribute_tensor(v, mesh, [Shard(1)]).requires_grad_()
        di = distribute_tensor(i, mesh, [Replicate()])
        loss = (torch.index_put(dx, (di,), dv) ** 2).sum()
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
            loss.backward(retain_graph=True)
        with implicit_replication():
            loss.backward()
        torch.testing.assert_close(dx.grad.full_tensor(), rx.grad)
        torch.testing.assert_close(dv.grad.full_tensor(), rv.grad)


def test_plain_tensor_indices_are_rejected_with_instructions() -> None:
    """DTensor 2.13 refuses plain index tensors (they may differ per rank, e.g. routing): the error says to wrap them."""
    with simulated_mesh((2,)) as mesh:
        dx = distribute_tensor(torch.randn(4, 6), mesh, [Shard(1)])
        with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor, need to convert all torch.Tensor to DTensor"):
            aten.index.Tensor(dx, [idx(0, 2)])


def test_plain_tensor_indices_under_implicit_replication_are_replicated() -> None:
    x, i = torch.randn(4, 6), idx(3, 0, 3)
    with simulated_mesh((2,)) as mesh:
        dx = distribute_tensor(x, mesh, [Shard(1)])
        with implicit_replication():
            out = aten.index.Tensor(dx, [i])
        assert isinstance(out, DTensor) and out.placements == (Shard(1),)
        torch.testing.assert_close(out.full_tensor(), x[i])


@pytest.mark.parametrize("mesh", [(2,), (2, 2)], ids=str)
def test_dtensor_index_with_bool_masks_forward_and_backward(mesh) -> None:  # noqa: ANN001
    """x[mask] (any mask rank, mixed with None / integer indices) runs through DTensor with any
    layout of self and of the mask, and its gradient matches single device."""
    from dtensor_rules.testing import strategies as dst
    from dtensor_rules.testing.dispatch import full_value, to_dtensor

    ran = []

    @given(call=index_calls(masks=True, need_mask=True), data=st.data())
    def case(call, data) -> None:  # noqa: ANN001
        x, indices = call
        assume(any(i is not None and i.dtype == torch.bool for i in indices) and x.is_floating_point())
        ran.append(1)
        x = x.float()
        expected = aten.index.Tensor(x, indices)
        ref = x.clone().requires_grad_()
        (aten.index.Tensor(ref, indices) * 3).sum().backward()
        x_pl = data.draw(dst.placement_lists(len(mesh), x.ndim, partial=True))
        with simulated_mesh(mesh) as m:
            dx = to_dtensor(x, m, x_pl).requires_grad_()
            dind = [
                None if i is None else to_dtensor(i, m, data.draw(dst.placement_lists(len(mesh), i.ndim)))
                for i in indices
            ]
            out = aten.index.Tensor(dx, dind)
            torch.testing.assert_close(full_value(out), expected)
            (out * 3).sum().backward()
            torch.testing.assert_close(full_value(dx.grad), ref.grad)

    case()
    assert ran, "no example with a bool mask was generated"
