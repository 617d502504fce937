"""The routed-experts op (``dtensor_rules::routed_experts`` and its backward): one device's math,
its rows under DTensor, the refusal of the expert-parallel row on local shards, and the rows a
solver's query gets."""

from __future__ import annotations

import itertools

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Partial, Replicate, Shard, distribute_tensor

from dtensor_rules._upstream import per_rank_copies
from dtensor_rules.ep.routed_experts_op import routed_experts_op
from dtensor_rules.models.moe import MoE, MoEConfig, distribute_params
from dtensor_rules.ep.routed_op import routed_experts_as_op
from dtensor_rules.ep.routed_experts_rule import ROUTED_EXPERTS, ROUTED_EXPERTS_BACKWARD
from dtensor_rules.solver import query_graph, trace_joint
from dtensor_rules.testing import fake_world, simulated_mesh

R = Replicate()


def _grads(model: MoE, x: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    out = model(x)
    names = ("gate", "w1", "w3", "w2", "shared_w1")
    grads = torch.autograd.grad(out, [x, *(getattr(model, n) for n in names)], g)
    return [out, *grads]


@pytest.mark.parametrize("top_k,n_experts,tokens", [(1, 4, 16), (2, 8, 33), (4, 4, 5), (2, 8, 1), (2, 4, 0)])
def test_the_op_equals_the_blocks_own_routed_experts_forward_and_backward(top_k, n_experts, tokens) -> None:
    """Top-1 to top-E, odd and tiny token counts (some experts empty): outputs and every gradient."""
    cfg = MoEConfig(dim=16, hidden=32, n_experts=n_experts, top_k=top_k)
    x = torch.randn(tokens, 16, generator=torch.Generator().manual_seed(1), requires_grad=True)
    g = torch.randn(tokens, 16, generator=torch.Generator().manual_seed(2))
    ref = _grads(MoE(cfg), x, g)
    op_model = MoE(cfg)
    op_model.routed_region = routed_experts_as_op
    got = _grads(op_model, x, g)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


LAYOUTS = {  # per mesh dim: (tokens, w1/w3, w2) of a row that runs the op on each rank's shards
    "replicated": ((R,), (R,), (R,)),
    "data parallel": ((Shard(0),), (R,), (R,)),
    "expert TP": ((R,), (Shard(2),), (Shard(1),)),
}


@pytest.mark.parametrize("dims", list(itertools.product(LAYOUTS, repeat=2)), ids=lambda d: "/".join(d))
def test_the_rows_on_shards_run_under_dtensor_and_equal_one_device(dims) -> None:
    """Every combination of the op's replicated / data-parallel / expert-TP rows on a (2, 2) mesh."""
    cfg = MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2)
    tokens = tuple(p for d in dims for p in LAYOUTS[d][0])
    w13 = tuple(p for d in dims for p in LAYOUTS[d][1])
    w2 = tuple(p for d in dims for p in LAYOUTS[d][2])
    x = torch.randn(32, 16, generator=torch.Generator().manual_seed(3))
    g = torch.randn(32, 16, generator=torch.Generator().manual_seed(4))
    ref_model = MoE(cfg)
    xr = x.clone().requires_grad_(True)
    ref = _grads(ref_model, xr, g)
    with simulated_mesh((2, 2)) as mesh:
        model = MoE(cfg)
        model.routed_region = routed_experts_as_op
        rest = {n: (R, R) for n in ("gate", "shared_w1", "shared_w3", "shared_w2")}
        distribute_params(model, mesh, {"w1": w13, "w3": w13, "w2": w2, **rest}, (R, R))
        xd = distribute_tensor(per_rank_copies(x), mesh, tokens).requires_grad_(True)
        gd = distribute_tensor(per_rank_copies(g), mesh, tokens)
        out = model(xd)
        names = ("gate", "w1", "w3", "w2", "shared_w1")
        grads = torch.autograd.grad(out, [xd, *(getattr(model, n) for n in names)], gd)
        got = [t.full_tensor() for t in (out, *grads)]
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_split_experts_on_local_shards_are_refused_naming_expert_parallel() -> None:
    """The expert-parallel row cannot run as the op on each rank's shards (tokens must travel)."""
    cfg = MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2)
    x = torch.randn(8, 16)
    with simulated_mesh((2,)) as mesh:
        model = MoE(cfg)
        model.routed_region = routed_experts_as_op
        rest = {n: (R,) for n in ("gate", "shared_w1", "shared_w3", "shared_w2")}
        distribute_params(model, mesh, {"w1": (Shard(0),), "w3": (Shard(0),), "w2": (Shard(0),), **rest}, (R,))
        with pytest.raises(ValueError, match="expert_parallel"):
            model(distribute_tensor(per_rank_copies(x), mesh, (Shard(0),)))
    m = MoE(cfg)
    idx, w = m.route(x)
    with pytest.raises(ValueError, match="2 of n_experts=4"):
        routed_experts_op(x, idx, w, m.w1[:2], m.w3[:2], m.w2[:2], 4, 8, None)


def test_a_solver_query_offers_expert_parallel_rows_on_every_mesh_dim() -> None:
    """Plain strategy enumeration (no graph pass): the traced step holds one forward and one backward
    routed-experts node, each offered experts ``Shard(0)`` on each mesh dim alone and on both."""
    cfg = MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2, gmm_dtype=torch.bfloat16)
    model = MoE(cfg)
    model.routed_region = routed_experts_as_op
    jg = trace_joint(model, torch.randn(16, 16))
    targets = [n.target for n in jg.graph.graph.nodes]
    assert targets.count(ROUTED_EXPERTS) == 1 and targets.count(ROUTED_EXPERTS_BACKWARD) == 1
    with fake_world(4):
        mesh = init_device_mesh("cpu", (2, 2))
        strategies = query_graph(jg.graph, mesh)
    assert strategies.fallbacks == ()
    for node in strategies.nodes.values():
        if node.target not in (ROUTED_EXPERTS, ROUTED_EXPERTS_BACKWARD):
            continue
        w = 3 if node.target is ROUTED_EXPERTS else 4
        experts = {r.ins[w] for r in node.rows}
        assert {(Shard(0), R), (R, Shard(0)), (Shard(0), Shard(0))} <= experts
        ep_rows = [r for r in node.rows if r.ins[w] == (R, Shard(0))]
        assert all(r.ins[w - 3][1] == Shard(0) for r in ep_rows)  # tokens follow their experts' dim
        assert not any(Partial() in r.ins[w - 3] for r in node.rows)


def test_only_the_expert_parallel_rows_pay_the_exchange_and_only_the_forward_pays_the_host_sync() -> None:
    """The solver's price of a routed-experts row: its roofline, plus for an EP row the all-to-alls;
    the host sync only in the forward."""
    from dtensor_rules.solver.price import Pricer

    cfg = MoEConfig(dim=64, hidden=64, n_experts=8, top_k=2, gmm_dtype=torch.bfloat16)
    model = MoE(cfg)
    model.routed_region = routed_experts_as_op
    jg = trace_joint(model, torch.randn(64, 64))
    nodes = {n.name: n for n in jg.graph.graph.nodes}
    with fake_world(8):
        mesh = init_device_mesh("cpu", (2, 4))
        strategies = query_graph(jg.graph, mesh)
        cheap, dear = Pricer(mesh, sync_us=0.0), Pricer(mesh, sync_us=1000.0)
        for nr in strategies.nodes.values():
            if nr.target not in (ROUTED_EXPERTS, ROUTED_EXPERTS_BACKWARD):
                continue
            w = 3 if nr.target is ROUTED_EXPERTS else 4
            node = nodes[nr.name]
            exchange = {r.ins[w]: cheap.ep_exchange_us(node, r, nr.metas) for r in nr.rows}
            for r in nr.rows:
                ep = any(p == Shard(0) for p in r.ins[w])
                assert (exchange[r.ins[w]] > 0) == ep
                sync = dear.compute_us(node, r, nr.metas) - cheap.compute_us(node, r, nr.metas)
                assert sync == pytest.approx(1000.0 if ep and nr.target is ROUTED_EXPERTS else 0.0)
