"""``expert_parallel(..., dispatch="per_rank")``: each token crosses the wire once per destination rank.

Equal to one device (plain torch, the same block): the output and the gradients of the tokens and
of every parameter, eager on simulated meshes over the sweep of ``tests/test_ep_sweep.py`` (which runs
both dispatch modes: top-1 up to top-k = E; 0, 1, 2, ... rows on a rank, uneven shards; every token
to one expert, an expert nobody picks, an ep rank receiving no row; ep=2, ep=4, ep=2 x tp=2) and here
on torchtitan's mesh model (``ep_dims``), within ``1e-5 * (1 + max|want|)``:
the per-rank partial sums change only the fp32 summation order (each token's k weighted expert
rows are summed per destination rank first, then over ranks), an error of a few fp32 ulps of the
sum. The compiled runs (aot_eager, inductor) on real gloo ranks: ``test_compiled_per_rank_dispatch_is_one_graph``.

Bytes: the token rows that cross the wire, read per simulated rank from the tensors the token moves
exchange, add up to ``sum_t (distinct destination ranks of t)`` (bytes ``T * D * elt * mean distinct``)
in the dispatch, in the combine and in each of their backwards, and ``CommBytesMode`` counts rank 0's
larger direction, both computed independently from the one-device routing of the full batch;
per-expert dispatch moves ``T * k`` rows (the contrast: the routing is chosen so the two differ).
"""

from __future__ import annotations

import copy
from collections import defaultdict
from typing import Any

import pytest
import torch
from torch.distributed.tensor import distribute_tensor

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules._upstream import rank_tensors
from dtensor_rules.ep import expert_parallel, token_placements
from dtensor_rules.models import MoE, MoEConfig
from dtensor_rules.ep.local import ep_routed_experts
from dtensor_rules.testing import local_shards, run_gloo, simulated_mesh
from dtensor_rules.testing.comm import CommBytesMode
from tests._ep_sweep import E, Call, compiled_sweep_worker, data, oracle, problems, promised, reference


def test_borrowed_mesh_per_rank_dispatch_equals_one_device() -> None:
    """torchtitan's mesh model (``ep_dims``, 2 x 2, both dims borrowed: ep = 4), 16 tokens (even: see
    docs/expert_parallel.md, Limits, for upstream's ``full_tensor`` of uneven two-dim shards)."""
    ref = reference(2)
    x, cot = data(16)
    want = oracle(ref, x, cot)
    with simulated_mesh((2, 2), names=("dp_shard", "tp")) as mesh:
        model = expert_parallel(copy.deepcopy(ref), mesh, ep_dims=("dp_shard", "tp"), dispatch="per_rank")
        place = token_placements(mesh, ep_dims=("dp_shard", "tp"))
        xd = distribute_tensor(x, mesh, place).requires_grad_()
        out = model(xd)
        (out * distribute_tensor(cot, mesh, place)).sum().backward()
        got = {"output": local_shards(out.full_tensor()), "grad x": local_shards(xd.grad.full_tensor())}
        got |= {f"grad {n}": local_shards(p.grad.full_tensor()) for n, p in model.named_parameters()}
    assert not problems("ep_dims", got, want), problems("ep_dims", got, want)


class _RowsMode(CommBytesMode):
    """``CommBytesMode`` that also keeps, per EP token move, the rows that crossed the wire on each
    simulated rank, read from the tensors the all-to-all exchanged (not from its split sizes): the
    rows a dispatch RECEIVED (what its senders sent), the rows a combine is handed (all of which it
    sends back; its output is the sender's padded buffer)."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[tuple[str, tuple[int, ...], torch.dtype, dict[int, int], int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        phase = "backward" if self.advanced_module_tracker.is_bw else "forward"
        before = self.bytes[phase]["all_to_all"]
        out = super().__torch_dispatch__(func, types, args, kwargs)
        packet = str(getattr(func, "_overloadpacket", ""))
        if out is not NotImplemented and packet in ("dtensor_rules.ep_dispatch", "dtensor_rules.ep_combine"):
            moved = out if packet.endswith("dispatch") else args[0]
            pieces = rank_tensors(moved) or {0: moved}
            self.sent.append((phase, tuple(moved.shape[1:]), moved.dtype,
                              {r: int(t.shape[0]) for r, t in pieces.items()}, self.bytes[phase]["all_to_all"] - before))
        return out


EP, N_EXPERTS, TOP_K, TOKENS, DIM = 4, 8, 3, 18, 32  # 2 experts per rank; rank 0 holds tokens 0..4


def _one_device_ranks() -> tuple[torch.Tensor, MoE, torch.Tensor]:
    """(T, k) destination rank of each token's chosen experts, from the one-device routing of the full
    batch; the block; the batch."""
    ref = MoE(MoEConfig(dim=DIM, hidden=16, n_experts=N_EXPERTS, top_k=TOP_K))
    ref.init_weights(3)
    x = torch.randn(TOKENS, DIM, generator=torch.Generator().manual_seed(7))
    return ref.route(x)[0] // (N_EXPERTS // EP), ref, x


def _token_moves(dispatch: str, ref: MoE, x: torch.Tensor) -> dict[str, list[tuple[int, int]]]:
    """Per phase and token all-to-all: (rows moved over all ranks, the bytes ``CommBytesMode`` counted on rank 0)."""
    with simulated_mesh((EP,), names=("ep",)) as mesh:
        model = expert_parallel(copy.deepcopy(ref), mesh, tp_dim=None, dispatch=dispatch)
        xd = distribute_tensor(x, mesh, token_placements(mesh, tp_dim=None)).requires_grad_()
        with _RowsMode() as comm:
            model(xd).pow(2).sum().backward()
    moves: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for phase, row_shape, dtype, per_rank, counted in comm.sent:
        if row_shape == (DIM,) and dtype == torch.float32:  # the token rows (not the routing records)
            moves[phase].append((sum(per_rank.values()), counted))
    return moves


def test_token_bytes_are_distinct_ranks_per_token() -> None:
    dest, ref, x = _one_device_ranks()
    ranks = [set(r) for r in dest.tolist()]
    distinct = sum(len(r) for r in ranks)
    assert distinct < TOKENS * TOP_K, "the routing must put two of some token's experts on one rank"
    home0 = len(x.chunk(EP)[0])  # Shard(0): rank 0 holds torch.chunk's first piece
    elt = 4
    # each token move (dispatch, combine; their transposes in the backward) carries sum_t distinct(t)
    # rows in all = T * D * elt * mean(distinct) bytes; rank 0's count is its larger direction
    sent0, received0 = sum(len(r) for r in ranks[:home0]), sum(0 in r for r in ranks)
    want = [(distinct, DIM * elt * max(sent0, received0))] * 2
    assert _token_moves("per_rank", ref, x) == {"forward": want, "backward": want}
    # per expert (torchtitan's AllToAllTokenDispatcher): a row per (token, expert)
    sent0, received0 = home0 * TOP_K, int((dest == 0).sum())
    want = [(TOKENS * TOP_K, DIM * elt * max(sent0, received0))] * 2
    assert _token_moves("per_expert", ref, x) == {"forward": want, "backward": want}


def test_per_rank_dispatch_needs_the_custom_ops_and_a_known_mode() -> None:
    with simulated_mesh((2,), names=("ep",)) as mesh:
        with pytest.raises(ValueError, match=r"dispatch='per_token': use one of \('per_expert', 'per_rank'\)"):
            expert_parallel(reference(2), mesh, tp_dim=None, dispatch="per_token")
        group = mesh.get_group("ep")
        x, w = torch.randn(3, 4), torch.rand(3, 2)
        with pytest.raises(ValueError, match="custom_ops=True"):
            ep_routed_experts(x, torch.zeros(3, 2, dtype=torch.int64), w, *(torch.randn(2, 4, 4),) * 3, n_experts=4,
                              alignment=8, group=group, custom_ops=False, dispatch="per_rank")


# every call with an odd total (the same T % ep) and >= 2 rows per rank: ONE graph for all
COMPILED_PLAN = [("aot_eager", 2, [Call(21, "random"), Call(33, "empty_expert"), Call(7, "empty_rank"),
                                   Call(9, "all_to_one")]),
                 ("aot_eager", E, [Call(11, "random"), Call(5, "random")]),
                 ("inductor", 2, [Call(21, "random"), Call(7, "empty_rank")])]


@pytest.mark.slow  # 2 gloo rank processes, compiles
def test_compiled_per_rank_dispatch_is_one_graph() -> None:
    """``torch.compile(dynamic=True)``, aot_eager and inductor, 2 gloo ranks, no Dynamo setting: one
    graph, no break, over routings and token counts; each call equal to one device (expert matmuls in
    bf16 in both, see ``compiled_sweep_worker``; the same 1e-5 relative bound: the partial sums are fp32)."""
    results = run_gloo(compiled_sweep_worker, 2, COMPILED_PLAN, "per_rank", timeout=900)
    for rank, r in enumerate(results):
        for backend, top_k, calls in COMPILED_PLAN:
            got = r[f"{backend} top-{top_k}"]
            assert not promised(tuple(calls), top_k, got["counts"]), promised(tuple(calls), top_k, got["counts"])
            assert not got["problems"], f"rank {rank}, top-{top_k}:\n" + "\n".join(got["problems"])
            assert got["graphs"] == (1, 0), f"rank {rank}, top-{top_k}: (graphs, breaks) {got['graphs']}"
