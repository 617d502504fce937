"""Dispatch only chooses input moves DTensor runs, and takes the next best row where a
collective would make empty shards, on torch 2.13 and 2.14.

DTensor's dispatch moves an input Shard -> Partial only on 2.14 and only to Partial("sum"),
and never one Partial kind -> another. An ``out=`` tensor laid out Partial with a sharded input
must not get a strategy needing such a move (it would fail inside redistribution: "redistribute from
S(1) to P(min) not supported yet"): it runs where DTensor can (plain torch is the oracle) and
otherwise raises the out= layout error naming the fix.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard
from torch.distributed.tensor._dtensor_spec import DTensorSpec  # the move as dispatch runs it (upstream's own)
from torch.distributed.tensor._redistribute import redistribute_local_tensor
from torch.distributed.tensor.debug import CommDebugMode

from dtensor_rules._upstream import SHARD_TO_PARTIAL_SUM_RUNS
from dtensor_rules.dispatch.greedy import collective_shards_fit, key, transition_weight
from dtensor_rules.dispatch.runnable import runnable
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor

R, S0, S1 = key(Replicate()), key(Shard(0)), key(Shard(1))
P = {op: key(Partial(op)) for op in ("sum", "avg", "max", "min")}
G = torch.Generator().manual_seed(0)
X = torch.randn(6, 8, generator=G)
INDEX = torch.randint(0, 6, (4, 8), generator=G)
OUT_ERROR = "does not redistribute Shard to"


def test_greedy_never_weighs_a_move_dispatch_does_not_run_as_finite() -> None:
    for src in (S0, S1, *P.values()):
        for dst in P.values():
            if src != dst:
                assert transition_weight(src, dst, False) == float("inf"), (src, dst)
                assert not runnable((src,), (dst,)) or (src[0] == "S" and dst == P["sum"] and SHARD_TO_PARTIAL_SUM_RUNS)
    for src, dst in ((R, S0), (R, P["max"]), (S0, R), (S0, S1), (P["min"], R), (P["max"], S1)):
        assert transition_weight(src, dst, False) < float("inf") and runnable((src,), (dst,))


def test_collective_shards_fit_refuses_only_reduce_scatters_the_simulated_mesh_cannot_run() -> None:
    """Only a reduce-scatter whose ranks' local pieces chunk into different numbers of tensors,
    and only under the simulated mesh (real ranks each chunk their own piece)."""
    sizes = (2, 2)
    cases = [  # (shape, src, dst, fits on the simulated mesh)
        ((3,), (S0, S0), (S0, S0), True),  # already laid out so: nothing moves
        ((3,), (S0, R), (S0, S0), True),  # a local chunk of a replicated dim
        ((1, 4), (S1, R), (S0, R), True),  # an all-to-all into an empty shard
        ((1,), (P["max"], R), (S0, R), True),  # a reduce-scatter over one mesh dim into an empty shard
        ((1,), (R, P["sum"]), (S0, S0), False),  # 1 row cut 1 / 0, chunked in 2: 1 tensor vs 2 empty ones
        ((2,), (R, P["sum"]), (S0, S0), True),  # 1 / 1 rows: both chunk into 1 -> the same on every rank
        ((3,), (S0, P["max"]), (S0, S0), False),  # 2 / 1 rows chunked in 2: 2 tensors vs 1
        ((3,), (R, P["sum"]), (S0, S0), False),
        ((4,), (S0, P["sum"]), (S0, S0), True),  # 2 / 2 rows
        ((1, 3), (P["sum"], R), (S0, S0), True),  # the reduce-scatter comes first (mesh dim 0)
    ]
    for shape, src, dst, simulated in cases:
        assert collective_shards_fit(shape, src, dst, sizes), (shape, src, dst)  # real ranks run every one
    with simulated_mesh(sizes) as mesh:
        for shape, src, dst, simulated in cases:
            assert collective_shards_fit(shape, src, dst, sizes) == simulated, (shape, src, dst)
            assert _runs_as_dispatch_runs_it(mesh, shape, src, dst) == simulated, (shape, src, dst)


@pytest.mark.parametrize("mesh_shape", [(2, 2), (2, 3), pytest.param((2, 2, 2), marks=pytest.mark.slow)])
def test_collective_shards_fit_never_passes_a_move_the_simulated_mesh_fails(mesh_shape: tuple) -> None:
    """Every reduce-scatter of a 0..3-row dim from any Replicate/Shard/Partial layout to any
    Replicate/Shard one: a move the check passes runs as dispatch runs it (sound). On 2-D meshes
    it is also exact; on 3-D it refuses some moves that run (DTensor orders the steps of a dim
    sharded over three mesh dims in ways the check does not model), which costs bytes, never a crash."""
    sources, targets, rows = [R, S0, P["sum"]], [R, S0], range(4)
    if len(mesh_shape) == 3:  # 1 and 3 rows from replicated / Partial layouts: ~100 moves, not ~700
        sources, rows = [R, P["sum"]], (1, 3)
    with simulated_mesh(mesh_shape) as mesh:
        for n in rows:
            for src in itertools.product(sources, repeat=len(mesh_shape)):
                for dst in itertools.product(targets, repeat=len(mesh_shape)):
                    if not any(s[0] == "P" and d[0] == "S" for s, d in zip(src, dst)):
                        continue
                    fits = collective_shards_fit((n,), src, dst, mesh_shape)
                    if fits or len(mesh_shape) == 2:
                        assert _runs_as_dispatch_runs_it(mesh, (n,), src, dst) == fits, (n, src, dst)


def _runs_as_dispatch_runs_it(mesh: object, shape: tuple, src: tuple, dst: tuple) -> bool:
    """The move as DTensor's dispatch runs it on the simulated mesh: below autograd, where
    ``torch.chunk`` reaches LocalTensor as ``aten.chunk`` (whose per-rank lists LocalTensor does
    not pad, unlike ``aten.split``'s). ``x.redistribute()`` runs above autograd and always works."""
    x = torch.arange(float(math.prod(shape))).reshape(shape)
    d = to_dtensor(x, mesh, [_placement(k) for k in src])
    target = DTensorSpec(mesh, tuple(_placement(k) for k in dst), tensor_meta=d._spec.tensor_meta)
    try:
        with torch._C._AutoDispatchBelowAutograd():
            local = redistribute_local_tensor(d._local_tensor, d._spec, target)
    except (AttributeError, AssertionError) as e:  # a rank's chunk None / ranks disagreeing on a size
        assert "requires_grad" in str(e) or "equal for all ranks" in str(e), e
        return False
    moved = DTensor.from_local(local, mesh, target.placements, shape=x.shape, stride=x.stride(), run_check=False)
    torch.testing.assert_close(full_value(moved), x)
    return True


def _placement(k: tuple) -> object:
    if k[0] == "S":
        return Shard(k[1])
    return Partial(k[1]) if k[0] == "P" else Replicate()


@pytest.mark.parametrize("reduce_op", ["sum", "max", "min"])
@pytest.mark.parametrize("x_layout", [Shard(1), Shard(0), Replicate(), "same Partial"])
def test_gather_into_partial_out(reduce_op: str, x_layout: object) -> None:
    layout = Partial(reduce_op) if x_layout == "same Partial" else x_layout
    runs = not isinstance(layout, Shard) or (reduce_op == "sum" and SHARD_TO_PARTIAL_SUM_RUNS)
    with simulated_mesh((2,)) as mesh:
        x, index = to_dtensor(X, mesh, [layout]), to_dtensor(INDEX, mesh, [Replicate()])
        out = to_dtensor(torch.zeros(4, 8), mesh, [Partial(reduce_op)])
        if not runs:
            with pytest.raises(RuntimeError, match=OUT_ERROR):
                torch.gather(x, 0, index, out=out)
            return
        res = torch.gather(x, 0, index, out=out)
        assert res is out and out.placements == (Partial(reduce_op),)
        torch.testing.assert_close(full_value(out), torch.gather(X, 0, INDEX))


@pytest.mark.parametrize("x_layout", [(Shard(0), Shard(1)), (Replicate(), Shard(0)), (Partial(), Replicate()), (Replicate(), Replicate())])
def test_cumsum_into_partial_out(x_layout: tuple) -> None:
    runs = not any(isinstance(p, Shard) for p in x_layout) or SHARD_TO_PARTIAL_SUM_RUNS
    with simulated_mesh((2, 2)) as mesh:
        x = to_dtensor(X, mesh, list(x_layout))
        out = to_dtensor(torch.zeros(6, 8), mesh, [Partial(), Partial()])
        if not runs:
            with pytest.raises(RuntimeError, match=OUT_ERROR):
                torch.cumsum(x, 1, out=out)
            return
        torch.cumsum(x, 1, out=out)
        assert out.placements == (Partial(), Partial())
        torch.testing.assert_close(full_value(out), X.cumsum(1), atol=1e-5, rtol=1e-5)


def test_partial_self_of_an_inplace_op_with_a_sharded_operand() -> None:
    """``self`` Partial(max) written in place keeps its layout; the sharded ``src`` is moved in a
    way dispatch runs (never Shard -> Partial(max))."""
    index = torch.randint(0, 6, (6, 8), generator=G)
    with simulated_mesh((2,)) as mesh:
        s = to_dtensor(X.clone(), mesh, [Partial("max")])
        s.scatter_add_(0, to_dtensor(index, mesh, [Replicate()]), to_dtensor(X, mesh, [Shard(1)]))
        assert s.placements == (Partial("max"),)
        torch.testing.assert_close(full_value(s), X.clone().scatter_add_(0, index, X))


def test_uneven_inputs_keep_their_shards_where_upstream_moved_them() -> None:
    """cat of (3, 4096) laid out (S0, S0) and (S0, R) on 2x2: the (S0, R) one is chunked locally
    (empty shards are fine: nothing moves), not moved in 3 collectives (327,680 B)."""
    x, y = torch.randn(3, 4096, generator=G), torch.randn(3, 4096, generator=G)
    with simulated_mesh((2, 2)) as mesh:
        dx, dy = to_dtensor(x, mesh, [Shard(0), Shard(0)]), to_dtensor(y, mesh, [Shard(0), Replicate()])
        with CommDebugMode() as comm:
            out = torch.cat([dx, dy], 1)
        assert comm.get_total_counts() == 0 and out.placements == (Shard(0), Shard(0))
        torch.testing.assert_close(full_value(out), torch.cat([x, y], 1))
        # (S0, P(max)): a reduce-scatter into an empty shard is not run; one all-reduce on mesh dim 1
        px = to_dtensor(x, mesh, [Shard(0), Partial("max")])
        with CommDebugMode() as comm:
            out = torch.cumsum(px, 1)
        assert comm.get_total_counts() == 1 and out.placements == (Shard(0), Replicate())
        torch.testing.assert_close(full_value(out), x.cumsum(1))
