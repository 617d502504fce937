"""Run an op through real DTensor dispatch on a simulated mesh and bring the result back.

Inputs may be Partial: each rank's contribution is cut by the same splitter the validator
uses (``simulate.local_input``), wrapped as a ``LocalTensor`` and turned into a DTensor
with ``DTensor.from_local`` — so the dispatch path (our installed rule, redistribution,
the local kernel) is exercised exactly as in a real run.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch
from dtensor_rules._upstream import LocalTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Placement, Shard

from dtensor_rules.testing.masks import is_mask
from dtensor_rules.testing.simulate import Sample, coords, local_input

__all__ = ["to_dtensor", "full_value", "sharded_call", "layout_kinds", "pick_layouts"]


def to_dtensor(t: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement], salt: int = 0) -> DTensor:
    """``t`` laid out as ``placements`` on a simulated mesh (Partial allowed); call inside ``simulated_mesh``."""
    shape = tuple(mesh.shape)
    # cloned: a shard can be a view of ``t``, which an in-place op would overwrite
    locals_ = {r: local_input(t, tuple(placements), shape, c, salt).clone() for r, c in enumerate(coords(shape))}
    return DTensor.from_local(
        LocalTensor(locals_), mesh, tuple(placements), run_check=False, shape=t.shape, stride=t.stride()
    )


def full_value(x: Any) -> Any:
    """A DTensor's full value as a plain tensor (all simulated ranks must agree)."""
    if isinstance(x, (tuple, list)):
        return type(x)(full_value(v) for v in x)
    if not isinstance(x, DTensor):
        return x
    full = x.full_tensor()
    if isinstance(full, LocalTensor):
        values = list(full._local_tensors.values())
        for v in values[1:]:
            torch.testing.assert_close(v, values[0], rtol=0, atol=0, equal_nan=True)
        return values[0]
    return full


def sharded_call(op: Any, sample: Sample, mesh: DeviceMesh, placements: Sequence[Sequence[Placement]]) -> Any:
    """Run ``op`` on DTensors laid out as ``placements`` (one per tensor input, pytree order); full outputs."""
    tensors = sample.tensors()
    if len(placements) != len(tensors):
        raise ValueError(f"{len(placements)} placements given for {len(tensors)} tensor inputs")
    dts = [to_dtensor(t, mesh, pl, salt=3 * i) for i, (t, pl) in enumerate(zip(tensors, placements))]
    args, kwargs = sample.replace_tensors(dts)
    return full_value(op(*args, **kwargs))


def layout_kinds(ins: Sequence[Sequence[Placement]], tensors: Sequence[torch.Tensor],
                 mesh_shape: Sequence[int]) -> set[str]:
    """What a combo's input layouts exercise: "partial", "uneven" (a shard with a remainder),
    "shard"; none for a masked index (only gather's own dispatch makes one)."""
    kinds = set()
    for pl, t in zip(ins, tensors):
        for mesh_dim, p in enumerate(pl):
            if is_mask(p):
                return set()
            if isinstance(p, Partial):
                kinds.add("partial")
            elif isinstance(p, Shard):
                kinds.add("shard")
                if t.shape[p.dim] % mesh_shape[mesh_dim]:
                    kinds.add("uneven")
    return kinds


def pick_layouts(combos: Any, tensors: Sequence[torch.Tensor], mesh_shape: Sequence[int], seed: int) -> list[tuple]:
    """One (inputs, outputs) combo per kind the rule offers (Partial, uneven shard, shard), from a seeded shuffle."""
    order = sorted(combos, key=str)
    random.Random(seed).shuffle(order)
    picked: list[tuple] = []
    for kind in ("partial", "uneven", "shard"):
        for ins, outs in order:
            if kind in layout_kinds(ins, tensors, mesh_shape) and (ins, outs) not in picked:
                picked.append((ins, outs))
                break
    return picked
