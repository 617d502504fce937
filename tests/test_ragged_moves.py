"""The ragged expert placement's moves against plain torch on the full tensor (simulated meshes).

Oracle: ``tests/_ragged_oracle.rows_of`` (Python loops over the routing matrix) says which global
rows each rank holds in each layout; every local shard, ``full_tensor()`` and gradient is
compared with the full tensor indexed by it, or with torch's gradient of the same function on
one device.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

import dtensor_rules
from dtensor_rules import patches, ragged
from dtensor_rules._upstream import DTensorSpec, rank_map, rank_tensors, spec_of
from dtensor_rules._upstream.ragged import RaggedPlacementError
from dtensor_rules.ragged import RaggedShard
from dtensor_rules.testing import simulated_mesh

from tests._collectives import Collectives
from tests._ragged_oracle import CASES, rows_of

DTYPES = [torch.float32, torch.bfloat16, torch.int64]


def _full(n: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    t = torch.arange(n * d).reshape(n, d)
    return t.to(dtype) if dtype == torch.int64 else (t.to(torch.float32) / 7).to(dtype)


def _ep_coord(mesh, mesh_dim: int, rank: int) -> int:
    return int((mesh.mesh == rank).nonzero()[0][mesh_dim])


def _counts(mesh, mesh_dim: int, C: list[list[int]]) -> DTensor:
    return ragged.counts_from_local(rank_map(lambda r: torch.tensor(C[_ep_coord(mesh, mesh_dim, r)])), mesh, mesh_dim)


def _assert_locals(dt: DTensor, full: torch.Tensor, C, mesh, mesh_dim: int, aligned: bool, dim: int = 0,
                   tp: tuple[int, int] | None = None) -> None:
    """Each rank's local shard == the oracle's rows of ``full`` (and its tp column chunk if ``tp``)."""
    for r, local in rank_tensors(dt.to_local()).items():
        want = full.index_select(dim, torch.tensor(rows_of(C, _ep_coord(mesh, mesh_dim, r), aligned), dtype=torch.long))
        if tp is not None:
            tp_dim, tensor_dim = tp
            want = torch.tensor_split(want, mesh.size(tp_dim), dim=tensor_dim)[_ep_coord(mesh, tp_dim, r)]
        assert torch.equal(local, want), (r, local, want)


def _replicated(t: DTensor) -> torch.Tensor:
    pieces = list(rank_tensors(t).values()) if rank_tensors(t) is not None else [t]
    for p in pieces[1:]:
        assert torch.equal(p, pieces[0])
    return pieces[0]


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize("aligned", [False, True])
def test_distribute_cuts_each_ranks_rows_and_full_tensor_gives_them_back(ep: int, aligned: bool) -> None:
    C = CASES[ep]
    full = _full(sum(map(sum, C)), 3, torch.float32)
    with simulated_mesh(ep) as mesh:
        x = ragged.distribute(full, mesh, _counts(mesh, 0, C), 0, aligned=aligned)
        assert x.placements == (RaggedShard(0, len(C[0]), aligned),) and x.shape == full.shape
        _assert_locals(x, full, C, mesh, 0, aligned)
        assert torch.equal(_replicated(x.full_tensor()), full)
        assert torch.equal(_replicated(ragged.gather(x).to_local()), full)


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dispatch_and_combine_move_rows_like_the_oracle(ep: int, dtype: torch.dtype) -> None:
    C = CASES[ep]
    E = len(C[0])
    full = _full(sum(map(sum, C)), 5, dtype)
    with simulated_mesh(ep) as mesh:
        x = ragged.distribute(full, mesh, _counts(mesh, 0, C), 0)
        y = ragged.dispatch(x)
        assert y.placements == (RaggedShard(0, E, True),) and y.shape == full.shape and y.dtype == dtype
        _assert_locals(y, full, C, mesh, 0, aligned=True)
        assert torch.equal(_replicated(y.full_tensor()), full)
        back = ragged.combine(y)
        assert back.placements == x.placements
        _assert_locals(back, full, C, mesh, 0, aligned=False)
        # the same moves through DTensor.redistribute (the ragged_redistribute patch)
        y2 = x.redistribute(mesh, (RaggedShard(0, E, True),))
        _assert_locals(y2, full, C, mesh, 0, aligned=True)
        _assert_locals(y2.redistribute(mesh, (RaggedShard(0, E, False),)), full, C, mesh, 0, aligned=False)


@pytest.mark.parametrize("ep", [2, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_gradient_through_select_dispatch_combine_gather_equals_one_device(ep: int, dtype: torch.dtype) -> None:
    C = CASES[ep]
    full = _full(sum(map(sum, C)), 4, dtype)
    w = torch.linspace(-1, 1, full.numel()).reshape(full.shape).to(dtype)
    leaf = full.clone().requires_grad_()
    (leaf.sin() * w).sum().backward()
    with simulated_mesh(ep) as mesh:
        rep = distribute_tensor(full, mesh, [Replicate()]).requires_grad_()
        x = ragged.distribute(rep, mesh, _counts(mesh, 0, C), 0)  # select (backward: all-gather)
        y = ragged.dispatch(x)  # backward: combine
        z = ragged.dispatch(ragged.combine(y))  # backward: combine, then dispatch
        out = z.full_tensor()  # all-gather with sizes (backward: select)
        (out.sin() * w).sum().backward()
        assert rep.grad.placements == (Replicate(),)
        torch.testing.assert_close(_replicated(rep.grad.to_local()), leaf.grad)


@pytest.mark.parametrize("aligned", [False, True])
def test_gradient_of_a_ragged_leaf_comes_back_in_its_layout(aligned: bool) -> None:
    C = CASES[4]
    full = _full(sum(map(sum, C)), 3, torch.float32)
    w = torch.randn(full.shape)
    with simulated_mesh(4) as mesh:
        counts = _counts(mesh, 0, C)
        x0 = ragged.distribute(full, mesh, counts, 0, aligned=aligned)
        x = ragged.attach(x0.detach().requires_grad_(), ragged.context_of(x0))
        moved = ragged.combine(x) if aligned else ragged.dispatch(x)
        (moved.full_tensor() * w).sum().backward()
        assert x.grad.placements == x.placements
        _assert_locals(x.grad, w, C, mesh, 0, aligned)


@pytest.mark.parametrize("ep_dim", [0, 1])
def test_ep_by_tp_mesh_moves_rows_and_keeps_the_tp_shards(ep_dim: int) -> None:
    tp_dim = 1 - ep_dim
    C = CASES[2]
    E = len(C[0])
    full = _full(sum(map(sum, C)), 6, torch.float32)
    w = torch.randn(full.shape)
    leaf = full.clone().requires_grad_()
    (leaf.square() * w).sum().backward()
    with simulated_mesh((2, 2)) as mesh:
        placements = [Replicate(), Replicate()]
        placements[tp_dim] = Shard(1)
        rep = distribute_tensor(full, mesh, [Replicate(), Replicate()]).requires_grad_()
        x = ragged.distribute(rep.redistribute(mesh, placements), mesh, _counts(mesh, ep_dim, C), ep_dim)
        assert x.placements[ep_dim] == RaggedShard(0, E, False) and x.placements[tp_dim] == Shard(1)
        _assert_locals(x, full, C, mesh, ep_dim, False, tp=(tp_dim, 1))
        y = ragged.dispatch(x)
        assert y.placements[tp_dim] == Shard(1)
        _assert_locals(y, full, C, mesh, ep_dim, True, tp=(tp_dim, 1))
        _assert_locals(ragged.combine(y), full, C, mesh, ep_dim, False, tp=(tp_dim, 1))
        out = y.full_tensor()
        assert torch.equal(_replicated(out), full)
        (out.square() * w).sum().backward()
        torch.testing.assert_close(_replicated(rep.grad.full_tensor()), leaf.grad)


def test_ragged_dim_other_than_zero() -> None:
    C = CASES[2]
    full = _full(sum(map(sum, C)), 3, torch.float32).t().contiguous()  # (3, N): ragged dim 1
    with simulated_mesh(2) as mesh:
        x = ragged.distribute(full, mesh, _counts(mesh, 0, C), 0, dim=1)
        _assert_locals(x, full, C, mesh, 0, False, dim=1)
        y = ragged.dispatch(x)
        assert y.placements == (RaggedShard(1, 4, True),)
        _assert_locals(y, full, C, mesh, 0, True, dim=1)
        assert torch.equal(_replicated(y.full_tensor()), full)


def test_replicated_counts_and_replicate_to_ragged_by_redistribute() -> None:
    C = CASES[2]
    full = _full(sum(map(sum, C)), 2, torch.float32)
    with simulated_mesh(2) as mesh:
        counts = distribute_tensor(torch.tensor(C), mesh, [Replicate()])
        rep = distribute_tensor(full, mesh, [Replicate()])
        x = ragged.redistribute(rep, (RaggedShard(0, 4, True),), counts=counts)
        _assert_locals(x, full, C, mesh, 0, True)
        s = x.redistribute(mesh, (Shard(0),))  # via Replicate (gather), then upstream
        assert s.placements == (Shard(0),) and torch.equal(_replicated(s.full_tensor()), full)


_Collectives = Collectives


def test_dispatch_runs_two_all_to_alls_then_combine_reuses_the_counts() -> None:
    C = CASES[4]
    full = _full(sum(map(sum, C)), 2, torch.float32)
    with simulated_mesh(4) as mesh:
        x = ragged.distribute(full, mesh, _counts(mesh, 0, C), 0)
        with _Collectives() as log:
            y = ragged.dispatch(x)
        assert log.seen == ["all_to_all_single", "ragged_exchange"], log.seen  # counts, then the token op
        with _Collectives() as log:
            ragged.combine(y)
        assert log.seen == ["ragged_exchange"], log.seen  # tokens only: the counts are reused


# --- clear errors instead of silently wrong results ---

def _unaligned(mesh, C):
    full = _full(sum(map(sum, C)), 2, torch.float32)
    return ragged.distribute(full, mesh, _counts(mesh, 0, C), 0), full


def test_a_ragged_dtensor_without_context_names_the_fix() -> None:
    with simulated_mesh(2) as mesh:
        x, full = _unaligned(mesh, CASES[2])
        bare = DTensor.from_local(x.to_local(), mesh, x.placements, run_check=False, shape=full.shape,
                                  stride=full.stride())
        with pytest.raises(RaggedPlacementError, match="counts="):
            bare.redistribute(mesh, (RaggedShard(0, 4, True),))
        with pytest.raises(RaggedPlacementError, match="counts="):
            bare.full_tensor()
        y = ragged.dispatch(bare, ragged.context_of(x).counts)  # the fix: pass the counts
        assert y.placements == (RaggedShard(0, 4, True),)


def test_upstream_cannot_relabel_or_cut_ragged_shards() -> None:
    with simulated_mesh(2) as mesh:
        x, full = _unaligned(mesh, CASES[2])
        # an op now runs by the ragged lift rule (tests/test_ragged_rules.py); a redistribute that reaches
        # upstream with a ragged spec (what an op without a ragged rule would do) is refused, not relabelled
        from torch.distributed.tensor import _redistribute

        spec = spec_of(x)
        with pytest.raises(RaggedPlacementError, match="relabel"):
            _redistribute.redistribute_local_tensor(x.to_local(), spec, DTensorSpec(mesh, (Shard(0),), spec.tensor_meta))
        with pytest.raises(RaggedPlacementError, match="dtensor_rules.ragged.distribute"):
            # looked up at call time: a name imported before ``import dtensor_rules`` keeps upstream's function
            torch.distributed.tensor.distribute_tensor(full, mesh, [RaggedShard(0, 4, False)])


def test_unaligned_has_no_checkpoint_box() -> None:
    from torch.distributed.checkpoint.planner_helpers import _create_write_items

    with simulated_mesh(2) as mesh:
        x, _ = _unaligned(mesh, CASES[2])
        with pytest.raises(RaggedPlacementError, match="DCP"):
            _create_write_items("x", x)


def test_bad_counts_are_refused() -> None:
    with simulated_mesh(2) as mesh:
        full = torch.zeros(11, 2)
        with pytest.raises(ValueError, match="E a multiple of ep"):
            ragged.distribute(full, mesh, distribute_tensor(torch.ones(2, 3, dtype=torch.int64), mesh, [Replicate()]), 0)
        with pytest.raises(TypeError, match="integer"):
            ragged.distribute(full, mesh, distribute_tensor(torch.ones(2, 4), mesh, [Replicate()]), 0)
        with pytest.raises(ValueError, match="route 11"):
            ragged.distribute(torch.zeros(10, 2), mesh, _counts(mesh, 0, CASES[2]), 0)
        with pytest.raises(ValueError, match="num_partitions"):
            RaggedShard(0, 0, False)


def test_without_the_redistribute_patch_the_guard_refuses_and_explicit_moves_still_work() -> None:
    others = [n for n in patches.defaults() if n != "ragged_redistribute"]
    with simulated_mesh(2) as mesh, dtensor_rules.installed(patches=others):
        x, full = _unaligned(mesh, CASES[2])
        with pytest.raises(RaggedPlacementError, match="relabel"):
            x.redistribute(mesh, (RaggedShard(0, 4, True),))
        _assert_locals(ragged.dispatch(x), full, CASES[2], mesh, 0, aligned=True)


@pytest.mark.parametrize("ep_dim", [0, 1, 2])
def test_three_d_mesh_with_ep_on_each_mesh_dim(ep_dim: int) -> None:
    others = [m for m in range(3) if m != ep_dim]  # first: Shard(1) of the rows, second: Replicate
    C = CASES[2]
    full = _full(sum(map(sum, C)), 4, torch.float32)
    w = torch.randn(full.shape)
    leaf = full.clone().requires_grad_()
    (leaf.exp() * w).sum().backward()
    with simulated_mesh((2, 2, 2)) as mesh:
        placements = [Replicate()] * 3
        placements[others[0]] = Shard(1)
        rep = distribute_tensor(full, mesh, [Replicate()] * 3).requires_grad_()
        x = ragged.distribute(rep.redistribute(mesh, placements), mesh, _counts(mesh, ep_dim, C), ep_dim)
        _assert_locals(x, full, C, mesh, ep_dim, False, tp=(others[0], 1))
        y = ragged.dispatch(x)
        _assert_locals(y, full, C, mesh, ep_dim, True, tp=(others[0], 1))
        out = ragged.combine(y).full_tensor()
        assert torch.equal(_replicated(out), full)
        (out.exp() * w).sum().backward()
        torch.testing.assert_close(_replicated(rep.grad.full_tensor()), leaf.grad)
