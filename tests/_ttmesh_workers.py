"""One gloo rank of "ours vs torchtitan's own EP path" on the same weights and tokens.

Used by ``benchmarks/moe_vs_torchtitan.py`` (repo root on sys.path) and ``tests/test_expert_parallel_ttmesh.py``
(through :func:`~dtensor_rules.testing.run_gloo`). torchtitan's path is its own code, run as its
``local_map`` region would run it on each rank: its ``MoE.forward`` (router, shared expert)
on this rank's plain token shard, its ``AllToAllTokenDispatcher`` wired to the ep group, its
``GroupedExperts`` holding this rank's expert slice. Ours is ``expert_parallel`` on the same
module (``ep_dims``: torchtitan's mesh model; or ``"etp"``: our expert TP on an (ep, tp) mesh).
Needs the ``[torchtitan]`` extra.
"""

from __future__ import annotations

import copy
import statistics
import time
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["Sizes", "PathResult", "compare_rank"]

EXPERTS = ("w1_EFD", "w3_EFD", "w2_EDF")


class Sizes(NamedTuple):
    dim: int = 64
    hidden: int = 128
    n_experts: int = 8
    top_k: int = 2
    batch: int = 4
    seq: int = 64


class PathResult(NamedTuple):
    """One path on one rank: collectives over one forward+backward, expert bytes, step times."""

    calls: dict[str, int]
    bytes: dict[str, int]
    expert_bytes: int  # w1+w3+w2 parameter bytes this rank holds
    times: list[float]  # seconds per forward+backward step
    out_sum: float  # sum of this rank's output shard (same on ours and torchtitan's: same tokens per rank)


def _build(sizes: Sizes):
    from tests._torchtitan import torchtitan_moe

    return torchtitan_moe(dim=sizes.dim, hidden=sizes.hidden, n_experts=sizes.n_experts, top_k=sizes.top_k,
                          score_func="sigmoid")


def _torchtitan_path(model: nn.Module, mesh, ep_dims: tuple[str, ...], sizes: Sizes):
    from torchtitan.distributed.utils import set_spmd_backend
    from torchtitan.models.common.token_dispatcher import AllToAllTokenDispatcher

    from dtensor_rules._upstream import flatten_mesh

    set_spmd_backend("dtensor")  # its plain-collective branch (funcol all_to_all_single on the ep group)
    tt = copy.deepcopy(model)
    ep_mesh = mesh[ep_dims[0]] if len(ep_dims) == 1 else flatten_mesh(mesh, ep_dims)
    disp = AllToAllTokenDispatcher(AllToAllTokenDispatcher.Config(num_experts=sizes.n_experts, top_k=sizes.top_k))
    disp.wire_meshes(ep_mesh=ep_mesh)
    tt.routed_experts.token_dispatcher = disp
    inner = tt.routed_experts.inner_experts
    n_ep, r = ep_mesh.size(), ep_mesh.get_local_rank()
    for n in EXPERTS:
        w = getattr(inner, n).detach()
        e_l = w.shape[0] // n_ep
        setattr(inner, n, nn.Parameter(w[r * e_l:(r + 1) * e_l].clone()))
    return tt


def _step(model, x, cot):
    out = model(x)
    (out * cot).sum().backward()
    return out


def compare_rank(rank: int, world: int, mode: str, rounds: int, sizes: Sizes = Sizes()) -> dict[str, PathResult]:
    """``mode``: ``"ep<n>"`` (ep over all ``world`` ranks, mesh ("dp_shard", "tp") = (world//2, 2)),
    ``"ep2xtp2"`` (world 4: ep over "tp", efsdp "dp_shard"). Returns torchtitan's path, ours in
    its mesh model (``"ours"``) and, for ep2xtp2, our expert TP (``"ours_etp"``)."""
    import logging
    import warnings

    import dtensor_rules  # noqa: F401
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from dtensor_rules.ep import expert_param_bytes, expert_parallel, token_placements
    from dtensor_rules.testing.comm import CommBytesMode

    warnings.simplefilter("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    mesh = init_device_mesh("cpu", (world // 2, 2), mesh_dim_names=("dp_shard", "tp"))
    ep_dims = ("tp",) if mode == "ep2xtp2" else ("dp_shard", "tp")
    model = _build(sizes)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(sizes.batch, sizes.seq, sizes.dim, generator=g)
    cot = torch.randn(sizes.batch, sizes.seq, sizes.dim, generator=g)
    tok = (Shard(0), Shard(1))  # batch over dp_shard, sequence over tp: torchtitan's EP token layout
    paths: dict[str, tuple] = {}
    tt = _torchtitan_path(model, mesh, ep_dims, sizes)
    x_l, cot_l = (distribute_tensor(t, mesh, tok).to_local() for t in (x, cot))
    x_l.requires_grad_()  # a full training step: the token gradient goes on to the layer below
    paths["torchtitan"] = (tt, x_l, cot_l, sum(getattr(tt.routed_experts.inner_experts, n).numel() * 4 for n in EXPERTS))
    ours = expert_parallel(copy.deepcopy(model), mesh, ep_dims=ep_dims)
    paths["ours"] = (ours, distribute_tensor(x, mesh, tok).requires_grad_(), distribute_tensor(cot, mesh, tok),
                     expert_param_bytes(ours)[0])
    if mode == "ep2xtp2":
        etp_mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("ep", "tp"))
        etp = expert_parallel(copy.deepcopy(model), etp_mesh)
        place = token_placements(etp_mesh)
        paths["ours_etp"] = (etp, distribute_tensor(x, etp_mesh, place).requires_grad_(),
                             distribute_tensor(cot, etp_mesh, place),
                             expert_param_bytes(etp)[0])
    results: dict[str, PathResult] = {}
    for name, (m, xi, ci, held) in paths.items():
        with CommBytesMode() as comm:
            out = _step(m, xi, ci)
        calls = {k: comm.calls["forward"].get(k, 0) + comm.calls["backward"].get(k, 0)
                 for k in set(comm.calls["forward"]) | set(comm.calls["backward"])}
        nbytes = {k: comm.bytes["forward"].get(k, 0) + comm.bytes["backward"].get(k, 0) for k in calls}
        local = out.to_local() if hasattr(out, "to_local") else out
        results[name] = PathResult(calls, nbytes, held, [], float(local.detach().sum()))
    names = list(paths)
    for r in range(rounds):  # ABBA: each path runs first and last equally often
        order = names + names[::-1] if r % 2 == 0 else names[::-1] + names
        for name in order:
            m, xi, ci, _ = paths[name]
            m.zero_grad(set_to_none=True)
            dist.barrier()
            t0 = time.perf_counter()
            _step(m, xi, ci)
            dist.barrier()
            results[name].times.append(time.perf_counter() - t0)
    return {k: v._replace(times=[statistics.median(v.times)] if v.times else []) for k, v in results.items()}
