"""Prices of the moves to and from the solver's expert-parallel labels (``solver/ep_rows.py``).

A :class:`~dtensor_rules.solver.ep_rows.RoutedRows` label sits on exactly one mesh dim ``m``
(group size ``n = ep``). Per rank, with ``N`` global rows, ``w`` bytes per local row, ``E``
experts and ``skew >= 1`` (largest / mean rows a rank holds; 1 = the expected-value model),
priced with the :class:`~dtensor_rules.redistribute.topology.Topology` formulas on mesh dim ``m``
(what ``expert_parallel``'s region runs: ``ep/local.py``):

==============================  ========================================================  ====================================
move                            collectives                                               cost
==============================  ========================================================  ====================================
dispatch TokenRows->ExpertRows  counts all-to-all (``8E`` bytes), one host sync, tokens   a2a(8E) + sync + a2a(N w / n * skew)
combine ExpertRows->TokenRows   tokens back (counts reused: no exchange, no sync)         a2a(N w / n * skew)
all_gather_v ->R                counts all-gather (``8 n E``), padded all-gather of rows  ag(8 n E) + ag(N w * skew)
select R->TokenRows/ExpertRows  local rows of this rank                                   0
==============================  ========================================================  ====================================

``sync`` is ``Topology``-independent here: pass ``sync_us`` (the device-to-host round trip and
the stall it causes, to be measured on the target). Other mesh dims are priced by the ordinary
planner with ``Replicate`` on ``m``: after the all-gather, or before the select.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard

from dtensor_rules.redistribute.steps import NoPlanError, Plan
from dtensor_rules.redistribute.topology import Topology
from dtensor_rules.solver.ep_rows import is_routed

__all__ = ["ep_move_us", "has_routed", "routed_move_us"]

_COUNT_BYTES = 8  # int64 counts


def has_routed(placements: Sequence[Placement]) -> bool:
    return any(is_routed(p) for p in placements)


def routed_move_us(kind: str, topology: Topology, mesh_shape: Sequence[int], mesh_dim: int, rows: int,
                   row_bytes: int, num_experts: int, *, skew: float = 1.0, sync_us: float = 0.0) -> float:
    """Cost of ``kind`` (dispatch | combine | all_gather_v | select) on ``mesh_dim`` (module table)."""
    n, bw, lat = topology.group(mesh_shape, (mesh_dim,))
    if skew < 1:
        raise ValueError(f"skew is max/mean rows per rank, so >= 1; got {skew}")
    per_rank = int(math.ceil(rows * row_bytes / n * skew))
    if kind == "select" or n == 1:
        return 0.0
    if kind in ("dispatch", "combine"):
        tokens = topology.cost("all_to_all", n, bw, lat, per_rank)
        if kind == "combine":
            return tokens
        return topology.cost("all_to_all", n, bw, lat, _COUNT_BYTES * num_experts) + sync_us + tokens
    if kind == "all_gather_v":
        out = int(math.ceil(rows * row_bytes * skew))
        counts = topology.cost("all_gather", n, bw, lat, _COUNT_BYTES * n * num_experts)
        return counts + topology.cost("all_gather", n, bw, lat, out)
    raise ValueError(f"unknown expert-parallel move {kind!r}; expected dispatch, combine, all_gather_v or select")


def _local_row_bytes(shape: Sequence[int], dtype: torch.dtype, placements: Sequence[Placement],
                     mesh_shape: Sequence[int], rows_dim: int) -> int:
    width = math.prod(s for d, s in enumerate(shape) if d != rows_dim)
    split = math.prod(mesh_shape[m] for m, p in enumerate(placements) if isinstance(p, Shard) and p.dim != rows_dim)
    return max(1, width // max(1, split)) * torch.empty((), dtype=dtype).element_size()


def ep_move_us(mesh_shape: Sequence[int], shape: Sequence[int], dtype: torch.dtype, src: Sequence[Placement],
               dst: Sequence[Placement], topology: Topology, plain_plan: Callable[..., Plan], *, skew: float = 1.0,
               sync_us: float = 0.0) -> float:
    """The cost between layouts where either side has a :class:`RoutedRows` label (on one mesh dim).

    ``plain_plan``: the ordinary ``redistribute.plan()``, for the other mesh dims. Raises
    :class:`~dtensor_rules.redistribute.steps.NoPlanError` for labels on two mesh dims, or a
    dispatch/combine that also changes another mesh dim or the tensor dim."""
    src, dst, mesh_shape, shape = tuple(src), tuple(dst), tuple(mesh_shape), tuple(shape)
    dims = sorted({m for m, p in enumerate(src) if is_routed(p)} | {m for m, p in enumerate(dst) if is_routed(p)})
    if len(dims) != 1:
        raise NoPlanError(f"routed rows are split by exactly one mesh dim; {src} -> {dst} uses {dims}")
    m = dims[0]
    a, b = src[m], dst[m]
    routed = a if is_routed(a) else b

    def move(kind: str, before: tuple[Placement, ...]) -> float:
        row_bytes = _local_row_bytes(shape, dtype, before, mesh_shape, routed.dim)
        return routed_move_us(kind, topology, mesh_shape, m, shape[routed.dim], row_bytes, routed.num_experts,
                              skew=skew, sync_us=sync_us)

    def plain(x: tuple[Placement, ...], y: tuple[Placement, ...]) -> float:
        return 0.0 if x == y else plain_plan(mesh_shape, shape, dtype, x, y, topology=topology).cost_us

    if is_routed(a) and is_routed(b):
        if any(p != q for i, (p, q) in enumerate(zip(src, dst)) if i != m) or a.dim != b.dim:
            raise NoPlanError(f"{src} -> {dst}: a dispatch/combine keeps the tensor dim and the other mesh dims")
        return 0.0 if a == b else move("dispatch" if b.aligned else "combine", src)
    if is_routed(a):
        mid = src[:m] + (Replicate(),) + src[m + 1:]
        return move("all_gather_v", src) + plain(mid, dst)
    mid = dst[:m] + (Replicate(),) + dst[m + 1:]
    return plain(src, mid) + move("select", mid)
