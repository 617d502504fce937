"""Planner moves of the ragged expert placement and their alpha-beta costs.

A ``RaggedShard`` (``dtensor_rules.ragged``) is sharded by exactly one mesh dim ``m`` (group
size ``n = ep``). Per rank, with ``N`` global rows, ``w`` bytes per local row, ``E`` experts and
``skew >= 1`` (largest / mean rows a rank holds; 1 = the expected-value model), priced with the
:class:`~dtensor_rules.redistribute.topology.Topology` formulas on mesh dim ``m``:

=================  =========================================================  ============
move               collectives                                                cost
=================  =========================================================  ============
dispatch RU->RA    counts all-to-all (``8E`` bytes), one host sync, tokens    a2a(8E) + sync + a2a(N w / n * skew)
combine  RA->RU    tokens back (counts reused: no exchange, no sync)          a2a(N w / n * skew)
all_gather_v ->R   counts all-gather (``8 n E``), padded all-gather of rows   ag(8 n E) + ag(N w * skew)
select   R->RU/RA  local rows of this rank                                    0
=================  =========================================================  ============

``sync`` is ``Topology``-independent here: pass ``sync_us`` (the device-to-host round trip and
the stall it causes, to be measured on the target). Other mesh dims are planned by the ordinary
planner with Replicate on ``m``: after the all-gather, or before the select.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard

from dtensor_rules.ragged.placement import is_ragged
from dtensor_rules.redistribute.layout import Layout
from dtensor_rules.redistribute.steps import NoPlanError, Plan, Step
from dtensor_rules.redistribute.topology import Topology

__all__ = ["RaggedMove", "ragged_move_cost", "ragged_plan", "has_ragged", "placements_text"]

_COUNT_BYTES = 8  # int64 counts
_RAGGED_KINDS = ("dispatch", "combine", "all_gather_v", "select")


class RaggedMove(NamedTuple):
    """One ragged step's bytes moved per rank (the token collective) and its cost."""

    bytes: int
    cost_us: float


def has_ragged(placements: Sequence[Placement]) -> bool:
    return any(is_ragged(p) for p in placements)


def ragged_move_cost(kind: str, topology: Topology, mesh_shape: Sequence[int], mesh_dim: int, rows: int,
                     row_bytes: int, num_partitions: int, *, skew: float = 1.0, sync_us: float = 0.0) -> RaggedMove:
    """Cost of ``kind`` (dispatch | combine | all_gather_v | select) on ``mesh_dim`` (module table)."""
    n, bw, lat = topology.group(mesh_shape, (mesh_dim,))
    if skew < 1:
        raise ValueError(f"skew is max/mean rows per rank, so >= 1; got {skew}")
    per_rank = int(math.ceil(rows * row_bytes / n * skew))
    if kind == "select" or n == 1:
        return RaggedMove(0 if kind == "select" else per_rank, 0.0)
    if kind in ("dispatch", "combine"):
        tokens = topology.cost("all_to_all", n, bw, lat, per_rank)
        if kind == "combine":
            return RaggedMove(per_rank, tokens)
        counts = topology.cost("all_to_all", n, bw, lat, _COUNT_BYTES * num_partitions)
        return RaggedMove(per_rank, counts + sync_us + tokens)
    if kind == "all_gather_v":
        out = int(math.ceil(rows * row_bytes * skew))
        counts = topology.cost("all_gather", n, bw, lat, _COUNT_BYTES * n * num_partitions)
        return RaggedMove(out, counts + topology.cost("all_gather", n, bw, lat, out))
    raise ValueError(f"unknown ragged move {kind!r}; expected dispatch, combine, all_gather_v or select")


def placements_text(placements: Sequence[Placement]) -> str:
    """One token per mesh dim: ``RU(d)``/``RA(d)`` ragged, ``S(d)``, ``R``, ``P`` (default device order)."""
    out = []
    for p in placements:
        if is_ragged(p):
            out.append(str(p))
        elif isinstance(p, Shard):
            out.append(f"S({p.dim})")
        else:
            out.append("R" if p.is_replicate() else "P")
    return "".join(out)


def _state(placements: Sequence[Placement], ndim: int):  # the planner's State with ragged read as Shard(d)
    plain = [Shard(p.dim) if is_ragged(p) else p for p in placements]
    lay = Layout.from_placements(plain, ndim, None)
    return (lay.orders, lay.partial)


def _local_row_bytes(shape: Sequence[int], dtype: torch.dtype, placements: Sequence[Placement],
                     mesh_shape: Sequence[int], ragged_dim: int) -> int:
    width = math.prod(s for d, s in enumerate(shape) if d != ragged_dim)
    split = math.prod(mesh_shape[m] for m, p in enumerate(placements)
                      if isinstance(p, Shard) and not is_ragged(p) and p.dim != ragged_dim)
    return max(1, width // max(1, split)) * torch.empty((), dtype=dtype).element_size()


def ragged_plan(mesh_shape: Sequence[int], shape: Sequence[int], dtype: torch.dtype, src: Sequence[Placement],
                dst: Sequence[Placement], topology: Topology, plain_plan: Callable[..., Plan], *, skew: float = 1.0,
                sync_us: float = 0.0) -> Plan:
    """The plan between layouts where either side has a ``RaggedShard`` (on one mesh dim).

    ``plain_plan``: the ordinary ``plan()``, for the other mesh dims (passed in: api imports this module).
    """
    src, dst, mesh_shape, shape = tuple(src), tuple(dst), tuple(mesh_shape), tuple(shape)
    dims = sorted({m for m, p in enumerate(src) if is_ragged(p)} | {m for m, p in enumerate(dst) if is_ragged(p)})
    if len(dims) != 1:
        raise NoPlanError(f"a ragged dim is sharded by exactly one mesh dim; {src} -> {dst} uses {dims}")
    m = dims[0]
    a, b = src[m], dst[m]
    ndim = len(shape)
    ragged = a if is_ragged(a) else b
    rows = shape[ragged.dim]
    steps: list[Step] = []

    def ragged_step(kind: str, after: tuple[Placement, ...], placements: tuple[Placement, ...]) -> None:
        row_bytes = _local_row_bytes(shape, dtype, placements, mesh_shape, ragged.dim)
        move = ragged_move_cost(kind, topology, mesh_shape, m, rows, row_bytes, ragged.num_partitions,
                                skew=skew, sync_us=sync_us)
        steps.append(Step(kind, (m,), ragged.dim if is_ragged(placements[m]) else None,
                          ragged.dim if is_ragged(after[m]) else None, move.bytes, move.cost_us,
                          _state(after, ndim), placements_text(after)))

    def plain_steps(x: tuple[Placement, ...], y: tuple[Placement, ...]) -> int:
        if x == y:
            return 0
        sub = plain_plan(mesh_shape, shape, dtype, x, y, topology=topology)
        steps.extend(sub.steps)
        return sub.peak_bytes

    peak = 0
    if is_ragged(a) and is_ragged(b):
        if any(p != q for i, (p, q) in enumerate(zip(src, dst)) if i != m) or a.dim != b.dim:
            raise NoPlanError(f"{src} -> {dst}: a dispatch/combine keeps the tensor dim and the other mesh dims")
        if a != b:
            ragged_step("dispatch" if b.aligned else "combine", dst, src)
    elif is_ragged(a):
        mid = src[:m] + (Replicate(),) + src[m + 1:]
        ragged_step("all_gather_v", mid, src)
        peak = plain_steps(mid, dst)
    else:
        mid = dst[:m] + (Replicate(),) + dst[m + 1:]
        peak = plain_steps(src, mid)
        ragged_step("select", dst, mid)
    # the largest buffer a ragged step materialises per rank: the received rows, or the gathered tensor
    peak = max([peak] + [s.bytes for s in steps if s.collective in _RAGGED_KINDS])
    return Plan(mesh_shape, shape, _state(src, ndim), _state(dst, ndim), tuple(steps),
                sum(s.cost_us for s in steps), peak, src_text=placements_text(src))
