"""Shared pieces of the per-op ragged rules: finding the ragged layout, static offsets, wrapping, refusing.

Index values in every rule are GLOBAL coordinates (what one device holds), so ``full_tensor()`` of a
ragged index is the single-device index. A rule translates them to local coordinates with a
static offset: the first global row of this rank's ``Shard(0)`` chunk (``torch.chunk`` sizes).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from dtensor_rules._upstream import DTensorSpec, TensorMeta, maybe_run_for_local_tensor, wrap_result
from dtensor_rules._upstream.ragged import RaggedPlacementError, coordinate_tensor
from dtensor_rules.ragged.context import RaggedContext, attach, context_of
from dtensor_rules.ragged.placement import RaggedShard, is_ragged

__all__ = ["Ragged", "ragged_operand", "chunk_offset", "wrap", "refuse", "check_rows", "dtensors"]


class Ragged(NamedTuple):
    """The ragged layout of a call: its mesh dim, placement and sizes (``ctx`` may be None for a gradient)."""

    mesh_dim: int
    placement: RaggedShard
    ctx: RaggedContext | None


def dtensors(*xs: Any) -> list[DTensor]:
    return [x for x in xs if isinstance(x, DTensor)]


def ragged_operand(op: Any, *xs: Any) -> Ragged:
    """The one ragged layout shared by the DTensor operands ``xs`` (refuse mixed layouts)."""
    found = {(m, p) for x in dtensors(*xs) for m, p in enumerate(x.placements) if is_ragged(p)}
    if len(found) != 1:
        raise RaggedPlacementError(
            f"{op}: its ragged operands have different layouts {sorted(map(str, found))}; move them to one layout "
            "first (dtensor_rules.ragged.dispatch / combine)")
    (m, p), = found
    ctx = next((c for c in (context_of(x) for x in dtensors(*xs) if is_ragged(x.placements[m])) if c is not None), None)
    return Ragged(m, p, ctx)


def chunk_offset(mesh: DeviceMesh, mesh_dim: int, length: int) -> Tensor:
    """This rank's first row of a ``Shard(0)`` dim of ``length`` rows (0-d int64, per simulated rank)."""
    n = mesh.size(mesh_dim)
    chunk = -(-length // n) if length else 0
    return (coordinate_tensor(mesh, mesh_dim) * chunk).clamp(max=length)


@maybe_run_for_local_tensor
def _check_rows(index: Tensor, src: Tensor, dim: int, what: str) -> Tensor:
    rows = src.shape[dim]
    if index.numel() and (bool((index < 0).any()) or bool((index >= rows).any())):
        raise IndexError(f"{what}: an index points outside this rank's {rows} rows of the Shard(0) operand (each "
                         "rank may only index the rows it holds: the tokens of its own assignments). Use a Replicate "
                         "source, or index rows that came from this rank's routing (dtensor_rules.ragged.route)")
    return index


def check_rows(index: Tensor, src: Tensor, dim: int, what: str) -> Tensor:
    """``index`` (local, translated) if every value lies in ``[0, src.shape[dim])``; else a clear IndexError."""
    return _check_rows(index, src, dim, what)


def wrap(local: Any, mesh: DeviceMesh, placements: Any, shape: Any, dtype: torch.dtype,
         ctx: RaggedContext | None = None) -> DTensor:
    """A local result as a DTensor of global ``shape``; a ragged result gets ``ctx`` (if any)."""
    shape = torch.Size(shape)
    meta = TensorMeta(shape, torch.empty(shape, device="meta").stride(), dtype)
    out = wrap_result(local, DTensorSpec(mesh, tuple(placements), tensor_meta=meta))
    if ctx is not None and any(is_ragged(p) for p in placements) and not torch.compiler.is_compiling():
        attach(out, ctx)
    return out


def refuse(op: Any, xs: Any, why: str, fix: str) -> RaggedPlacementError:
    """The error for a layout a rule does not accept: the layouts, why, and what to do."""
    got = ", ".join(f"{tuple(x.shape)} {tuple(map(str, x.placements))}" for x in dtensors(*xs))
    return RaggedPlacementError(f"{op} on ragged operands ({got}): {why}. {fix}")
