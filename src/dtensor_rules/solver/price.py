"""Prices for the solver: a row's compute time and an edge's redistribution time, in microseconds.

Compute: the package's flop/byte formulas (:func:`dtensor_rules.costs.estimate_call`) on the
local shapes of the largest shard (rank 0: uneven shards round up there) and the roofline
runtime of a hardware profile. Redistribution: the ordered-mesh planner's cheapest chain of
collectives (:func:`dtensor_rules.redistribute.plan`, alpha-beta model), DTensor's own
``redistribute_cost`` where the planner has no plan; a switch of Partial kind as the all-reduce
that performs it (:func:`partial_switch_dims`). Both sides of a comparison (our rules,
upstream's) are priced by these same functions, so their objectives are comparable.

The routed-experts op (``ep/routed_experts_rule.py``) communicates inside itself under its
expert-parallel row (the token all-to-alls, and in the forward the count exchange and the
host sync): a strategy row has no field for that, so :meth:`Pricer.ep_exchange_us` adds it
to the row's compute (the ``expert_parallel`` step ``ep/costs.py`` describes).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
from torch.distributed.device_mesh import DeviceMesh
from torch.utils import _pytree as pytree

from dtensor_rules._upstream import DTensorSpec, TensorMeta, compute_local_shape_and_global_offset, redistribute_cost
from dtensor_rules.costs import OpCost, estimate_call, runtime
from dtensor_rules.redistribute import plan
from dtensor_rules.redistribute.topology import Topology
from dtensor_rules.solver.ep_moves import ep_move_us, has_routed
from dtensor_rules.solver.ep_rows import is_routed
from dtensor_rules.solver.query import Layout, Row

__all__ = ["Pricer", "local_bytes", "partial_switch_dims"]

INF = math.inf
# the dispatch's one device-to-host sync (the counts, for the token all-to-all's sizes) and the stall it
# causes: an assumed order of magnitude, not a measurement; pass Pricer(sync_us=...) measured on the target
SYNC_US = 20.0
_COUNT_BYTES = 8  # one int64 count per expert


def local_shape(meta: TensorMeta, mesh: DeviceMesh, layout: Layout) -> tuple[int, ...]:
    """Rank 0's local shape: the largest shard of ``meta`` laid out as ``layout``.

    A routed rows label (``solver/ep_rows.py``) is read as an even ``Shard`` of its dim
    (expected-uniform routing: no routing is known on fake tensors)."""
    layout = tuple(Shard(p.dim) if is_routed(p) else p for p in layout)
    shape, _ = compute_local_shape_and_global_offset(meta.shape, tuple(mesh.shape), [0] * mesh.ndim, layout)
    return tuple(shape)


def local_bytes(meta: TensorMeta, mesh: DeviceMesh, layout: Layout) -> int:
    """Bytes rank 0 holds of a tensor laid out as ``layout`` (what a memory cap counts)."""
    return math.prod(local_shape(meta, mesh, layout)) * meta.dtype.itemsize


class Pricer:
    """Memoized compute and edge prices on one mesh and hardware profile."""

    def __init__(self, mesh: DeviceMesh, hardware: str = "h100", sync_us: float = SYNC_US) -> None:
        self.mesh = mesh
        self.hardware = hardware
        self.sync_us = sync_us
        self._edge: dict[tuple, float] = {}
        self._compute: dict[tuple, float] = {}
        self._topology = Topology.uniform(mesh.ndim)

    def edge_us(self, meta: TensorMeta, src: Layout, dst: Layout) -> float:
        """Time to move a tensor from ``src`` to ``dst`` (0 when equal; inf when impossible)."""
        if src == dst:
            return 0.0
        key = (tuple(meta.shape), meta.dtype, src, dst)
        cost = self._edge.get(key)
        if cost is None:
            cost = self._edge[key] = self._edge_uncached(meta, src, dst)
        return cost

    def _edge_uncached(self, meta: TensorMeta, src: Layout, dst: Layout) -> float:
        if has_routed(src) or has_routed(dst):  # dispatch / combine / all_gather_v / select
            try:
                return float(ep_move_us(tuple(self.mesh.shape), tuple(meta.shape), meta.dtype, src, dst,
                                        Topology.uniform(self.mesh.ndim), plan, skew=1.0, sync_us=self.sync_us))
            except Exception:  # noqa: BLE001  e.g. labels on two mesh dims, or other mesh dims changed by a dispatch
                return INF
        switched = partial_switch_dims(src, dst)
        if switched:  # Partial(a) -> Partial(b): the all-reduce to Replicate, then the local partition
            via = tuple(Replicate() if m in switched else p for m, p in enumerate(dst))
            return self.edge_us(meta, src, via) + self.edge_us(meta, via, dst)
        try:
            return float(plan(self.mesh, tuple(meta.shape), meta.dtype, src, dst).cost_us)
        except Exception:  # noqa: BLE001  no plan (e.g. a Partial kind the planner does not move)
            pass
        try:
            return float(redistribute_cost(DTensorSpec(self.mesh, src, tensor_meta=meta),
                                           DTensorSpec(self.mesh, dst, tensor_meta=meta)))
        except Exception:  # noqa: BLE001  DTensor cannot move it either
            return INF

    def compute_us(self, node: fx.Node, row: Row, metas: tuple[TensorMeta, ...]) -> float:
        """Roofline time of ``node`` on rank 0's local inputs under ``row`` (plus the expert-parallel
        exchange of the routed-experts op, :meth:`ep_exchange_us`)."""
        ins = _routed_index_ins(row, metas)
        locals_ = tuple(local_shape(m, self.mesh, lay) for m, lay in zip(metas, ins))
        key = (node.target, locals_, tuple(m.dtype for m in metas), _static_args(node))
        cost = self._compute.get(key)
        if cost is None:
            cost = self._compute[key] = self._compute_uncached(node, locals_, metas)
        return cost + self.ep_exchange_us(node, row, metas)

    def ep_exchange_us(self, node: fx.Node, row: Row, metas: tuple[TensorMeta, ...]) -> float:
        """The all-to-alls a routed-experts node runs under an expert-parallel row (0 for any other row
        or node): the ep group is the mesh dims where the experts are ``Shard(0)``; each rank sends its
        ``T_l * k`` assignment rows (expected-uniform routing: it receives as many) at dispatch (token
        dtype) and combine (expert dtype); the forward also exchanges the per-expert counts and syncs
        once with the host (``sync_us``); the backward moves the gradients along the same routes."""
        from dtensor_rules.ep.routed_experts_rule import EXPERT_ARGS, ROUTED_EXPERTS

        w = EXPERT_ARGS.get(node.target)
        if w is None:
            return 0.0
        dims = tuple(m for m, p in enumerate(row.ins[w]) if isinstance(p, Shard) and p.dim == 0)
        if not dims:
            return 0.0
        n, bw, lat = self._topology.group(tuple(self.mesh.shape), dims)
        x = w - 3  # x, idx, weights, w1, ...
        rows = math.prod(local_shape(metas[x + 1], self.mesh, row.ins[x + 1]))
        D = metas[x].shape[-1]
        gmm = next((a for a in node.args if isinstance(a, torch.dtype)), metas[x].dtype)
        move = sum(self._topology.cost("all_to_all", n, bw, lat, rows * D * dt.itemsize) for dt in (metas[x].dtype, gmm))
        if node.target is not ROUTED_EXPERTS:
            return move
        counts = self._topology.cost("all_to_all", n, bw, lat, _COUNT_BYTES * metas[w].shape[0])
        return move + counts + self.sync_us

    def _compute_uncached(self, node: fx.Node, shapes: tuple, metas: tuple[TensorMeta, ...]) -> float:
        tensors = iter([torch.empty(s, dtype=m.dtype, device="meta") for s, m in zip(shapes, metas)])
        args, kwargs = pytree.tree_map(lambda a: next(tensors) if isinstance(a, fx.Node) else a, (node.args, node.kwargs))
        try:
            cost = estimate_call(node.target, args, kwargs, fallback=True)
        except Exception:  # noqa: BLE001  an op the formulas cannot price at these local shapes: memory-bound
            moved = sum(math.prod(s) * m.dtype.itemsize for s, m in zip(shapes, metas))
            cost = OpCost(flops=0, bytes_read=moved, bytes_written=moved)
        return runtime(cost, self.hardware) * 1e6


def partial_switch_dims(src: Layout, dst: Layout) -> frozenset[int]:
    """The mesh dims where ``src -> dst`` changes the kind of a Partial (``avg -> sum`` & co.).

    No collective switches a kind in place (DTensor refuses the redistribution); what performs it
    is an all-reduce to Replicate and the local partition into the new kind, so that is its price
    (AutoParallel prices it 0 and performs the all-reduce: docs/solver.md)."""
    return frozenset(m for m, (s, d) in enumerate(zip(src, dst))
                     if isinstance(s, Partial) and isinstance(d, Partial) and s.reduce_op != d.reduce_op)


def _routed_index_ins(row: Row, metas: tuple[TensorMeta, ...]) -> tuple[Layout, ...]:
    """``row.ins`` with each integer input that is ``Replicate`` on a mesh dim where the row holds
    routed rows read as ``Shard(0)`` there.

    The expert-parallel rows (``solver/ep_rows.py``) describe the EP region, where a rank
    permutes, pads and combines only its own partition rows: the token ids, destinations and group
    offsets it uses are its own share, not the replicated whole the row names (a row cannot say
    "the same index, cut to my rows"). Priced at the whole, every rank would pay ep times the
    gather / index_put / scatter_add work it does."""
    routed = {m for lay in (*row.ins, *(o for o in row.outs if o is not None)) for m, p in enumerate(lay) if is_routed(p)}
    if not routed:
        return row.ins
    return tuple(
        tuple(Shard(0) if m in routed and p.is_replicate() else p for m, p in enumerate(lay))
        if len(meta.shape) and not (meta.dtype.is_floating_point or meta.dtype.is_complex or meta.dtype == torch.bool)
        else lay
        for lay, meta in zip(row.ins, metas))


def _static_args(node: fx.Node) -> Any:
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    return tuple(None if isinstance(a, fx.Node) else (a if isinstance(a, (int, float, bool, str, type(None))) else str(a))
                 for a in leaves)
