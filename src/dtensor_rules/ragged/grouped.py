"""``_grouped_mm`` on aligned ragged tokens with experts ``Shard(0)``: the expert MLP of an EP block.

After the dispatch, rank ``r`` holds whole partitions of its ``E_l`` experts (``RaggedShard(0, E,
aligned=True)``) and the expert weights are ``Shard(0)`` on the same mesh dim: its own experts.
So the grouped matmul is local, with this rank's group ends. Two forms (forward and backward):

- ``(M, K) RA(0)`` x ``(E, K, N) S(0)`` -> ``(M, N) RA(0)`` (forward; ``grad_a`` in backward, with
  the weights transposed);
- ``(K, M) RA(1)`` x ``(M, N) RA(0)`` -> ``(E, K, N) S(0)`` (``grad_b``: the rows are the grouped
  contraction, each rank holds whole groups of its own experts, so expert gradients stay
  ``Shard(0)`` and nothing is reduced across EP ranks).

``offs`` must be a ``Replicate`` DTensor of the GLOBAL group ends (``cumsum`` of the per-expert
row counts summed over senders: what one device would pass); each rank rebases its slice,
``offs[r*E_l:(r+1)*E_l] - offs[r*E_l - 1]``, so the same ``offs`` serves forward and backward
(autograd hands the forward's ``offs`` to the backward calls, whose ragged inputs carry no context).
Other mesh dims (TP) follow the matmul: per mesh dim ``(R, R) -> R``, a free dim sharded on one
operand -> sharded result, the contraction dim sharded on both -> ``Partial(sum)``,
``Partial`` on one operand with ``Replicate`` on the other -> ``Partial``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard

from dtensor_rules._upstream import DTensorSpec, TensorMeta, wrap_result
from dtensor_rules._upstream.ragged import RaggedPlacementError, coordinate_tensor, other_dim_step
from dtensor_rules.core.grouped_mm_checks import aligned_copy
from dtensor_rules.ragged.context import attach, context_of
from dtensor_rules.ragged.placement import RaggedShard, is_ragged, other_dims_move

__all__ = ["is_ragged_call", "ragged_grouped_mm"]


def is_ragged_call(args: Any, kwargs: Any) -> bool:
    """Whether a ``_grouped_mm`` call has a ragged operand."""
    return any(isinstance(a, DTensor) and any(is_ragged(p) for p in a.placements)
               for a in (*args, *kwargs.values()))


def _refuse(a: DTensor, b: DTensor, offs: Any, why: str) -> RaggedPlacementError:
    got = f"a {tuple(a.shape)} {a.placements}, b {tuple(b.shape)} {b.placements}"
    if isinstance(offs, DTensor):
        got += f", offs {offs.placements}"
    return RaggedPlacementError(
        f"_grouped_mm on a ragged operand ({got}): {why}. Supported: (M, K) RaggedShard(0, E, aligned=True) x (E, K, N) "
        "Shard(0) on the same mesh dim with offs a Replicate DTensor of the global group ends (and its backward "
        "forms); dispatch unaligned tokens first (x.redistribute(mesh, [RaggedShard(0, E, aligned=True)]))")


def _other_dim(pa: Placement, pb: Placement, a_free: int | None, b_free: int, a_k: int, b_k: int, b_out: int,
               a_out: int | None) -> Placement | None:
    """One non-ragged mesh dim: the result's placement, or None if the pair is not a matmul layout."""
    if pa.is_replicate() and pb.is_replicate():
        return Replicate()
    if isinstance(pa, Shard) and isinstance(pb, Shard) and pa.dim == a_k and pb.dim == b_k:
        return Partial()
    if isinstance(pa, Partial) and pb.is_replicate() and pa.reduce_op == "sum":
        return Partial()
    if pa.is_replicate() and isinstance(pb, Partial) and pb.reduce_op == "sum":
        return Partial()
    if pa.is_replicate() and isinstance(pb, Shard) and pb.dim == b_free:
        return Shard(b_out)
    if a_free is not None and a_out is not None and isinstance(pa, Shard) and pa.dim == a_free and pb.is_replicate():
        return Shard(a_out)
    return None


def _to_replicate(t: DTensor, local: torch.Tensor | None, i: int, m: int) -> torch.Tensor | None:
    """``t``'s local tensor made ``Replicate`` on mesh dim ``i`` (not the ragged one ``m``), or None if unsafe.

    The FSDP unshard of an expert weight (``Shard(j)`` on a data-parallel mesh dim: an all-gather), or an
    all-reduce of a ``Partial``: ranks of one ragged shard, a move off the ragged tensor dim (sizes never read).
    """
    p = t.placements[i]
    if local is None or p.is_replicate():
        return local
    target = list(t.placements)
    target[i] = Replicate()
    if not other_dims_move(t.placements, target):
        return None
    return other_dim_step(local, t.device_mesh, i, p, Replicate(), t.shape, t.placements)


def _local_offs(offs: DTensor, m: int, E: int) -> torch.Tensor:
    """This rank's group ends from the global ones (``offs[r*E_l:(r+1)*E_l] - offs[r*E_l-1]``)."""
    ep = offs.device_mesh.size(m)
    if E % ep:
        raise ValueError(f"{E} experts do not split over {ep} EP ranks")
    E_l = E // ep
    full = offs.to_local()
    padded = torch.cat([full.new_zeros(1), full])
    coord = coordinate_tensor(offs.device_mesh, m).to(full.device)
    sel = padded.index_select(0, coord * E_l + torch.arange(E_l + 1, device=full.device))
    return (sel[1:] - sel[:1]).to(full.dtype)


def ragged_grouped_mm(op: Any, args: Any, kwargs: Any) -> DTensor:
    """DTensor dispatch of a ``_grouped_mm`` call with a ragged operand (module docstring)."""
    names = ("self", "mat2", "offs", "bias", "out_dtype")
    bound = dict(zip(names, args)) | kwargs
    a, b, offs = bound["self"], bound["mat2"], bound.get("offs")
    bias, out_dtype = bound.get("bias"), bound.get("out_dtype")
    if not (isinstance(a, DTensor) and isinstance(b, DTensor)) or a.device_mesh != b.device_mesh:
        raise RaggedPlacementError("_grouped_mm with a ragged operand needs both operands as DTensors on one mesh")
    if bias is not None:
        raise _refuse(a, b, offs, "bias is not supported")
    dims = {m for t in (a, b) for m, p in enumerate(t.placements) if is_ragged(p)}
    if len(dims) != 1:
        raise _refuse(a, b, offs, "the ragged dims of the operands lie on different mesh dims")
    (m,) = dims
    pa, pb = a.placements[m], b.placements[m]
    if a.dim() == 2 and b.dim() == 3:
        ok = is_ragged(pa) and pa.dim == 0 and pa.aligned and type(pb) is Shard and pb.dim == 0 and pa.num_partitions == b.shape[0]
        E, shape, a_free, b_free, a_k, b_k, a_out, b_out = b.shape[0], (a.shape[0], b.shape[2]), None, 2, 1, 1, None, 1
        out_m: Placement = RaggedShard(0, pa.num_partitions, True) if ok else Replicate()
    elif a.dim() == 2 and b.dim() == 2:
        ok = (is_ragged(pa) and is_ragged(pb) and pa.dim == 1 and pb.dim == 0 and pa.aligned and pb.aligned
              and pa.num_partitions == pb.num_partitions)
        E = pa.num_partitions if is_ragged(pa) else 0
        shape, a_free, b_free, a_k, b_k, a_out, b_out = (E, a.shape[0], b.shape[1]), 0, 1, 1, 0, 1, 2
        out_m = Shard(0)
    else:
        ok = False
    if not ok:
        raise _refuse(a, b, offs, f"mesh dim {m} has {pa} x {pb}, not an aligned ragged grouped matmul")
    if not (isinstance(offs, DTensor) and all(p.is_replicate() for p in offs.placements) and offs.shape == (E,)):
        raise _refuse(a, b, offs, "offs must be a Replicate DTensor of the global group ends (shape (E,))")
    placements: list[Placement] = []
    la, lb = a.to_local(), b.to_local()
    for i, (qa, qb) in enumerate(zip(a.placements, b.placements)):
        if i == m:
            placements.append(out_m)
            continue
        q = _other_dim(qa, qb, a_free, b_free, a_k, b_k, b_out, a_out)
        if q is None:  # not a matmul layout here (e.g. FSDP-sharded experts): gather this mesh dim first
            la, lb = _to_replicate(a, la, i, m), _to_replicate(b, lb, i, m)
            if la is None or lb is None:
                raise _refuse(a, b, offs, f"mesh dim {i} has {qa} x {qb}, not a matmul layout")
            q = Replicate()
        placements.append(q)
    local = torch._grouped_mm(aligned_copy(la), aligned_copy(lb), _local_offs(offs, m, E), out_dtype=out_dtype)
    stride = torch.empty(shape, device="meta").stride()
    meta = TensorMeta(torch.Size(shape), stride, out_dtype or a.dtype)
    out = wrap_result(local, DTensorSpec(a.device_mesh, tuple(placements), tensor_meta=meta))
    ctx = context_of(a)
    if ctx is not None and is_ragged(out_m) and not torch.compiler.is_compiling():
        attach(out, ctx)
    return out
