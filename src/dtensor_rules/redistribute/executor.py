"""Run a Plan on a local shard with torch.distributed collectives on the mesh's groups.

Each plan step is lowered to single-mesh-dim primitives executed by DTensor's own placement
methods (``Shard._to_replicate_tensor``, ``Shard._to_new_shard_dim``, ``Shard._replicate_to_shard``,
``Partial._reduce_value`` / ``_reduce_shard_value`` / ``_partition_value``): they already pad and
unpad uneven shards correctly for a *single* mesh dim given the per-rank logical shape, and they
work under ``LocalTensorMode``. We reuse them instead of re-writing collectives.

A flattened step (several non-trivial mesh dims) runs as ONE collective on the flattened group
(``flat.py``: nested pieces padded to the largest, collective, unpadded), as it was planned and
priced. Where ``flat.supported(mesh)`` is false (a mesh not spanning the world, or a rank tensor
not ascending) or with ``fused=False``, it is lowered to the equivalent single-dim sequence
(all_gather over a suffix = gathers minor-first; reduce_scatter over a group = one
reduce_scatter per dim, major first; all_to_all over a group = gathers then local chunks).
Both are data-exact for uneven shards — unlike upstream's flattened post-pass, which chunks the
flattened group evenly (``torch.chunk`` over n1*n2 pieces) and so disagrees with nested chunking.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Partial, Shard

from dtensor_rules._upstream import (
    mesh_coordinate,
    partial_partition,
    partial_reduce,
    partial_reduce_scatter,
    shard_all_gather,
    shard_all_to_all,
    shard_from_replicate,
)

from dtensor_rules.redistribute import flat
from dtensor_rules.redistribute.layout import State
from dtensor_rules.redistribute.planner import Plan

__all__ = ["execute", "lower", "lower_steps"]


def lower(plan: Plan) -> list[tuple]:
    """Single-mesh-dim primitives ``(op, mesh_dim, src_dim, dst_dim, state_before)`` for a plan."""
    return [p for step in lower_steps(plan) for p in step]


def lower_steps(plan: Plan) -> list[list[tuple]]:
    """``lower`` grouped by plan step."""
    steps: list[list[tuple]] = []
    prims: list[tuple] = []
    state = plan.src

    def emit(op: str, m: int, sd: int | None, dd: int | None) -> None:
        nonlocal state
        prims.append((op, m, sd, dd, state))
        orders, partial = state
        if op in ("gather", "a2a"):
            orders = orders[:sd] + (orders[sd][:-1],) + orders[sd + 1:]
        if op in ("a2a", "chunk", "rs"):
            orders = orders[:dd] + (orders[dd] + (m,),) + orders[dd + 1:]
        if op in ("reduce", "rs"):
            partial &= ~(1 << m)
        if op == "partition":
            partial |= 1 << m
        state = (orders, partial)

    for s in plan.steps:
        g = s.mesh_dims
        if s.collective == "all_gather":
            for m in reversed(g):
                emit("gather", m, s.src_dim, None)
        elif s.collective == "all_to_all":
            if len(g) == 1:
                emit("a2a", g[0], s.src_dim, s.dst_dim)
            else:
                for m in reversed(g):
                    emit("gather", m, s.src_dim, None)
                for m in g:
                    emit("chunk", m, None, s.dst_dim)
        elif s.collective == "reduce_scatter":
            for m in g:
                emit("rs", m, None, s.dst_dim)
        elif s.collective == "all_reduce":
            for m in g:
                emit("reduce", m, None, None)
        elif s.collective == "chunk":
            emit("chunk", g[0], None, s.dst_dim)
        elif s.collective == "partition":
            emit("partition", g[0], None, None)
        else:  # pragma: no cover - planner only emits the above
            raise ValueError(f"unknown step {s.collective}")
        if state != s.after:
            raise AssertionError(f"lowering of {s} reached {state}, expected {s.after}")
        steps.append(prims)
        prims = []
    return steps


def _logical_shape(mesh: DeviceMesh, shape: tuple[int, ...], state: State, skip: int) -> list:
    """Per-rank shape with every shard applied except mesh dim ``skip`` (nested, major first)."""
    out: list = list(shape)
    for d, ms in enumerate(state[0]):
        for m in ms:
            if m == skip:
                continue
            out[d], _ = Shard.local_shard_size_and_offset(out[d], mesh.size(m), mesh_coordinate(mesh, m))
    return out


def _run_prims(local: torch.Tensor, mesh: DeviceMesh, plan: Plan, prims: list[tuple]) -> torch.Tensor:
    partial = Partial(plan.reduce_op)
    for op, m, sd, dd, state in prims:
        if mesh.size(m) == 1:
            continue
        if op == "gather":
            local = shard_all_gather(local, mesh, m, sd, _logical_shape(mesh, plan.shape, state, m))
        elif op == "a2a":
            local = shard_all_to_all(local, mesh, m, sd, dd, _logical_shape(mesh, plan.shape, state, m))
        elif op == "chunk":
            local = shard_from_replicate(local, mesh, m, dd, mesh_coordinate(mesh, m))
        elif op == "rs":
            local = partial_reduce_scatter(partial, local, mesh, m, dd)
        elif op == "reduce":
            local = partial_reduce(partial, local, mesh, m)
        elif op == "partition":
            local = partial_partition(partial, local, mesh, m)
        if hasattr(local, "wait"):
            local = local.wait()
    return local


def _run_flat(local: torch.Tensor, mesh: DeviceMesh, plan: Plan, step, before: State) -> torch.Tensor:
    orders = before[0]
    g = step.mesh_dims
    if step.collective == "all_gather":
        o = orders[step.src_dim]
        return flat.all_gather(local, mesh, plan.shape, o[: len(o) - len(g)], g, step.src_dim)
    if step.collective == "all_to_all":
        return flat.all_to_all(local, mesh, plan.shape, orders, g, step.src_dim, step.dst_dim)
    if step.collective == "reduce_scatter":
        return flat.reduce_scatter(local, mesh, plan.shape, orders, g, step.dst_dim, plan.reduce_op)
    if step.collective == "all_reduce":
        return flat.all_reduce(local, mesh, g, plan.reduce_op)
    raise AssertionError(f"step {step.collective} is not a flattened collective")  # pragma: no cover


def execute(local: torch.Tensor, mesh: DeviceMesh, plan: Plan, fused: bool = True) -> torch.Tensor:
    """Apply ``plan`` to this rank's local shard; returns the new local shard.

    ``fused=True`` runs each flattened step as one collective on the flattened group
    (``flat.py``) when the mesh allows it (``flat.supported``); otherwise, and for single-mesh-dim
    steps, DTensor's own per-mesh-dim placement methods run the lowered sequence.
    """
    if tuple(mesh.shape) != plan.mesh_shape:
        raise ValueError(f"plan was made for mesh {plan.mesh_shape}, got mesh {tuple(mesh.shape)}")
    per_step = lower_steps(plan)
    use_flat = fused and any(len(s.mesh_dims) > 1 for s in plan.steps) and flat.supported(mesh)
    before = plan.src
    for step, prims in zip(plan.steps, per_step):
        if use_flat and sum(mesh.size(m) > 1 for m in step.mesh_dims) > 1:
            local = _run_flat(local, mesh, plan, step, before)
        else:
            local = _run_prims(local, mesh, plan, prims)
        before = step.after
    return local
