"""An MoE block written as plain DTensor code with RaggedShard placements (``models/ragged_moe.py``).

Oracle: the block on one device written with a Python loop over tokens and their top-k experts
(no grouped matmul, no sort). Checked: the output and every gradient (fp32, 1e-5), expert
gradients ``Shard(0)``, and the collectives of a forward + backward (no all-gather of anything).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import dtensor_rules
from dtensor_rules.models.ragged_moe import ragged_moe
from dtensor_rules.testing import simulated_mesh

from tests._collectives import Collectives

T, D, H, K = 16, 16, 8, 2


@pytest.fixture(autouse=True)
def _installed():
    dtensor_rules.install()
    yield


def _reference(x, router, w1, w3, w2):
    weights, ids = torch.topk(F.softmax(x @ router, -1), K, -1)
    rows = []
    for t in range(x.shape[0]):
        acc = torch.zeros_like(x[t])
        for j in range(K):
            e = ids[t, j]
            acc = acc + weights[t, j] * ((F.silu(x[t] @ w1[e]) * (x[t] @ w3[e])) @ w2[e])
        rows.append(acc)
    return torch.stack(rows)


def _params(E: int, silent: int):
    """Random block; the last ``silent`` experts are never chosen (empty partitions; at ep=4 with
    ``silent=2`` the last rank's experts receive nothing)."""
    torch.manual_seed(E + silent)
    x, router = torch.randn(T, D), torch.randn(D, E)
    x[:, 0] = 1.0
    if silent:
        router[0, E - silent:] = -50.0
    return [x, router, torch.randn(E, D, H) / 4, torch.randn(E, D, H) / 4, torch.randn(E, H, D) / 4]


def _collective(name: str) -> bool:
    return name.startswith(("c10d", "_c10d", "dtensor_rules")) and "wait" not in name and "wrap" not in name


def _Collectives() -> Collectives:
    return Collectives(_collective)


@pytest.mark.parametrize("ep,E,silent", [(2, 4, 0), (2, 4, 1), (4, 8, 2)])
def test_ragged_moe_equals_one_device(ep, E, silent):
    full = _params(E, silent)
    grad = torch.randn(T, D)
    with simulated_mesh(ep) as mesh:
        layouts = [[Shard(0)], [Replicate()], [Shard(0)], [Shard(0)], [Shard(0)]]
        ds = [distribute_tensor(t, mesh, p).requires_grad_() for t, p in zip(full, layouts)]
        g = distribute_tensor(grad, mesh, [Shard(0)])
        with _Collectives() as log:
            out = ragged_moe(*ds, K)
            (out * g).sum().backward()
        one = [t.clone().requires_grad_() for t in full]
        want = _reference(*one)
        (want * grad).sum().backward()
        assert out.placements == (Shard(0),)
        torch.testing.assert_close(out.full_tensor(), want, atol=1e-5, rtol=1e-5)
        for d, o in zip(ds, one):
            torch.testing.assert_close(d.grad.full_tensor(), o.grad, atol=1e-5, rtol=1e-5)
        for w in ds[2:]:
            assert w.grad.placements == (Shard(0),)
    assert not [s for s in log.seen if "gather" in s], log.seen
    # forward: counts all-to-all, dispatch, all-reduce of E ints (offs), combine; backward: combine, dispatch
    assert log.seen == ["all_to_all_single", "ragged_exchange", "all_reduce", "ragged_exchange",
                        "ragged_exchange", "ragged_exchange"], log.seen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_shard_moe_ragged_equals_one_device_2x2(dtype):
    """The README block (``MoE``, shared expert, sigmoid router with bias) with ``shard_moe(ragged=True)``."""
    import copy

    from dtensor_rules.models.moe import shard_moe
    from tests.test_moe_model import _assert_matches, _single_device

    model, x, cot, want = _single_device(dtype)
    with simulated_mesh((2, 2), names=("ep", "tp")) as mesh:
        sharded = shard_moe(copy.deepcopy(model), mesh, ragged=True)
        xd = distribute_tensor(x, mesh, (Shard(0), Replicate())).requires_grad_()
        with _Collectives() as log:
            out = sharded(xd)
            grads = torch.autograd.grad(out, [xd, *sharded.parameters()], distribute_tensor(cot, mesh, out.placements))
        for name in ("w1", "w3", "w2"):
            g = grads[1 + [n for n, _ in sharded.named_parameters()].index(name)]
            assert g.placements[0] == Shard(0), (name, g.placements)
        got = [t.full_tensor() for t in (out, *grads)]
    assert not [s for s in log.seen if "gather" in s], log.seen
    _assert_matches(got, want, dtype)


@pytest.mark.parametrize("mesh_shape", [(2, 1), (2, 2)])
def test_shard_moe_ragged_moves_no_more_bytes_than_expert_parallel(mesh_shape):
    """Issue 19 item 4's budget: per forward+backward, at most 5% more bytes than ``expert_parallel``
    (rank 0, ``CommBytesMode``, which counts the ragged custom ops as the all-to-alls they are), on
    ep alone and on ep x tp (where the tp reductions of the row gradients count too)."""
    import copy

    from dtensor_rules.models import MoE, MoEConfig, expert_parallel, shard_moe, token_placements
    from dtensor_rules.testing.comm import CommBytesMode

    model = MoE(MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2))
    x = torch.randn(24, 16, generator=torch.Generator().manual_seed(3))
    measured = {}
    with simulated_mesh(mesh_shape, names=("ep", "tp")) as mesh:
        for path in ("ragged", "ep"):
            m = copy.deepcopy(model)
            m = shard_moe(m, mesh, ragged=True) if path == "ragged" else expert_parallel(m, mesh)
            xd = distribute_tensor(x, mesh, token_placements(mesh)).requires_grad_()
            with CommBytesMode() as comm:
                m(xd).sum().backward()
            measured[path] = comm
    ragged_bytes, ep_bytes = measured["ragged"].total_bytes(), measured["ep"].total_bytes()
    assert measured["ragged"].total_bytes("all_gather") == 0
    assert measured["ragged"].total_bytes("all_to_all") > 0
    assert ragged_bytes <= 1.05 * ep_bytes, (measured["ragged"].bytes, measured["ep"].bytes)
