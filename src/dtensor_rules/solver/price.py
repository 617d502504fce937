"""Prices for the solver: a row's compute time and an edge's redistribution time, in microseconds.

Compute: the package's flop/byte formulas (:func:`dtensor_rules.costs.estimate_call`) on the
local shapes of the largest shard (rank 0: uneven shards round up there) and the roofline
runtime of a hardware profile. Redistribution: the ordered-mesh planner's cheapest chain of
collectives (:func:`dtensor_rules.redistribute.plan`, alpha-beta model), DTensor's own
``redistribute_cost`` where the planner has no plan; a switch of Partial kind as the all-reduce
that performs it (:func:`partial_switch_dims`). Both sides of a comparison (our rules,
upstream's) are priced by these same functions, so their objectives are comparable.
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
from dtensor_rules.ragged.placement import is_ragged
from dtensor_rules.redistribute import plan
from dtensor_rules.redistribute.ragged_steps import has_ragged, ragged_plan
from dtensor_rules.redistribute.topology import Topology
from dtensor_rules.solver.query import Layout, Row

__all__ = ["Pricer", "local_bytes", "partial_switch_dims"]

INF = math.inf
# the dispatch's one device-to-host sync (the counts, for the token all-to-all's sizes) and the stall it
# causes: an assumed order of magnitude, not a measurement; pass Pricer(sync_us=...) measured on the target
SYNC_US = 20.0


def local_shape(meta: TensorMeta, mesh: DeviceMesh, layout: Layout) -> tuple[int, ...]:
    """Rank 0's local shape: the largest shard of ``meta`` laid out as ``layout``.

    A ``RaggedShard`` dim is read as an even ``Shard`` of it (expected-uniform routing: no
    routing is known on fake tensors; upstream's local-shape function refuses an unaligned one)."""
    layout = tuple(Shard(p.dim) if is_ragged(p) else p for p in layout)
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
        if has_ragged(src) or has_ragged(dst):  # dispatch / combine / all_gather_v / select
            try:
                return float(ragged_plan(tuple(self.mesh.shape), tuple(meta.shape), meta.dtype, src, dst,
                                         Topology.uniform(self.mesh.ndim), plan, skew=1.0, sync_us=self.sync_us).cost_us)
            except Exception:  # noqa: BLE001  e.g. ragged on two mesh dims, or other mesh dims changed by a dispatch
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
        """Roofline time of ``node`` on rank 0's local inputs under ``row``."""
        ins = _ragged_index_ins(row, metas)
        locals_ = tuple(local_shape(m, self.mesh, lay) for m, lay in zip(metas, ins))
        key = (node.target, locals_, tuple(m.dtype for m in metas), _static_args(node))
        cost = self._compute.get(key)
        if cost is None:
            cost = self._compute[key] = self._compute_uncached(node, locals_, metas)
        return cost

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


def _ragged_index_ins(row: Row, metas: tuple[TensorMeta, ...]) -> tuple[Layout, ...]:
    """``row.ins`` with each integer input that is ``Replicate`` on a mesh dim where the row is ragged
    read as ``Shard(0)`` there.

    The expert-parallel rows (``solver/ragged_rows.py``) describe the ragged region, where a rank
    permutes, pads and combines only its own partition rows: the token ids, destinations and group
    offsets it uses are its own share, not the replicated whole the row names (a row cannot say
    "the same index, cut to my rows"). Priced at the whole, every rank would pay ep times the
    gather / index_put / scatter_add work it does."""
    ragged = {m for lay in (*row.ins, *(o for o in row.outs if o is not None)) for m, p in enumerate(lay) if is_ragged(p)}
    if not ragged:
        return row.ins
    return tuple(
        tuple(Shard(0) if m in ragged and p.is_replicate() else p for m, p in enumerate(lay))
        if len(meta.shape) and not (meta.dtype.is_floating_point or meta.dtype.is_complex or meta.dtype == torch.bool)
        else lay
        for lay, meta in zip(row.ins, metas))


def _static_args(node: fx.Node) -> Any:
    leaves = pytree.tree_leaves((node.args, node.kwargs))
    return tuple(None if isinstance(a, fx.Node) else (a if isinstance(a, (int, float, bool, str, type(None))) else str(a))
                 for a in leaves)
