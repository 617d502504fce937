"""The EP token moves (``dtensor_rules::ep_dispatch`` / ``ep_combine``) called with DTensors on a simulated mesh.

``LocalTensorMode`` (the simulated mesh) sees a custom op before the DTensor subclass does, so the
ops' simulated body must hand a DTensor call to the DTensor rule (``ep/all_to_all_rule.py``) and run
on the LocalTensors it passes down. Mesh ``("tp", "ep") = (2, 2)``: the ops' group is the 2-rank ep
dim (a real simulated all-to-all), the DTensor lives on the tp dim; ``CommDebugMode`` (another mode
that sees the op first) counts the one all-to-all. Oracle: the rows each ep rank
receives, cut from the senders' full rows in plain torch.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules._upstream import LocalTensor, rank_tensors
from dtensor_rules.ep.all_to_all import ep_combine_op, ep_dispatch_op
from dtensor_rules.testing import simulated_mesh

D = 6
# SENT[s][d]: rows ep rank s sends ep rank d; every rank sends 5 and receives 5 rows (a DTensor's
# global shape must be the same on every simulated rank), the splits themselves differ per rank
SENT = [[2, 3], [3, 2]]
ROWS = [torch.randn(sum(SENT[s]), D, generator=torch.Generator().manual_seed(s)) for s in range(2)]


def _received(d: int) -> torch.Tensor:
    """What ep rank ``d`` receives, sender-major: plain torch on the senders' full rows."""
    return torch.cat([ROWS[s][sum(SENT[s][:d]):sum(SENT[s][:d + 1])] for s in range(2)])


def _coords() -> dict[int, tuple[int, int]]:
    return {r: divmod(r, 2) for r in range(4)}  # rank -> (tp, ep) on the (2, 2) mesh


def _splits() -> torch.Tensor:
    return LocalTensor({r: torch.tensor([SENT[e], [SENT[0][e], SENT[1][e]]]) for r, (_, e) in _coords().items()})


def _layout(name: str, tp_mesh) -> DTensor:
    """Every ep rank's rows as a DTensor on tp in layout ``name``."""
    c = _coords()
    if name == "Shard(1)":
        local, pl = LocalTensor({r: ROWS[e].tensor_split(2, 1)[t] for r, (t, e) in c.items()}), Shard(1)
    elif name == "Partial":  # the two tp ranks' pieces sum to the rows
        local, pl = LocalTensor({r: ROWS[e] * (0.25 if t == 0 else 0.75) for r, (t, e) in c.items()}), Partial()
    else:
        local, pl = LocalTensor({r: ROWS[e].clone() for r, (t, e) in c.items()}), Replicate()
    return DTensor.from_local(local, tp_mesh, [pl], run_check=False, shape=(5, D), stride=(D, 1))


@pytest.mark.parametrize("layout", ["Shard(1)", "Partial", "Replicate"])
def test_dtensor_moves_on_a_simulated_mesh_equal_plain_torch(layout: str) -> None:
    with simulated_mesh((2, 2), names=("tp", "ep")) as mesh:
        group = mesh.get_group("ep").group_name
        xd = _layout(layout, mesh["tp"]).detach().requires_grad_()
        with CommDebugMode() as comm:
            got = ep_dispatch_op(xd, _splits(), group)
        assert got.placements == xd.placements
        assert {str(k): v for k, v in comm.get_comm_counts().items()} == {"c10d_functional.all_to_all_single": 1}
        full = got.full_tensor()
        back = ep_combine_op(got, _splits(), group, 5)  # the transposed move gives every rank its rows back
        back.pow(2).sum().backward()  # backward: combine -> dispatch, dispatch -> combine, on DTensors
        full_back, grad = back.full_tensor(), xd.grad.full_tensor()
    for r, (_, e) in _coords().items():
        torch.testing.assert_close(rank_tensors(full)[r], _received(e), rtol=0, atol=1e-6)
        torch.testing.assert_close(rank_tensors(full_back)[r], ROWS[e], rtol=0, atol=1e-6)
        torch.testing.assert_close(rank_tensors(grad)[r], 2 * ROWS[e], rtol=0, atol=1e-6)


def test_dtensor_on_the_groups_own_mesh_dim_is_refused_naming_the_fix() -> None:
    with simulated_mesh((2,), names=("ep",)) as mesh:
        group = mesh.get_group("ep").group_name
        xd = distribute_tensor(torch.randn(4, D), mesh, [Shard(0)])
        splits = torch.tensor([[1, 1], [1, 1]])
        with pytest.raises(ValueError, match=r"communicates over mesh dim 0 \(ep\) itself.*must be local.*to_local"):
            ep_dispatch_op(xd, splits, group)
        with pytest.raises(ValueError, match=r"communicates over mesh dim 0 \(ep\) itself.*must be local"):
            ep_combine_op(xd, splits, group, 4)
