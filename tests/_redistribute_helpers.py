"""Shared checks for the redistribute tests: expected per-rank shard from nested chunking."""

from __future__ import annotations

import itertools
import math

import torch

from dtensor_rules.redistribute import Layout, local_shard_offsets


def coords(mesh_shape):
    return list(itertools.product(*[range(s) for s in mesh_shape]))


def rank_of(coord, mesh_shape) -> int:
    r = 0
    for c, s in zip(coord, mesh_shape):
        r = r * s + c
    return r


_COMBINE = {"sum": torch.add, "avg": torch.add, "max": torch.maximum, "min": torch.minimum}


def check_locals(locals_by_rank: dict, x: torch.Tensor, layout: Layout, mesh_shape) -> None:
    """Every rank holds exactly its nested-chunk shard; Partial groups reduce (``layout.reduce_op``) to it."""
    pdims = [m for m in range(len(mesh_shape)) if layout.partial >> m & 1]
    for c in coords(mesh_shape):
        if any(c[m] != 0 for m in pdims):
            continue
        size, off = local_shard_offsets(layout, mesh_shape, x.shape, c)
        exp = x[tuple(slice(o, o + s) for o, s in zip(off, size))]
        total, n = None, 0
        for sub in itertools.product(*[range(mesh_shape[m]) for m in pdims]):
            cc = list(c)
            for m, v in zip(pdims, sub):
                cc[m] = v
            t = locals_by_rank[rank_of(cc, mesh_shape)]
            assert tuple(t.shape) == tuple(exp.shape), f"rank {cc}: shape {tuple(t.shape)} != {tuple(exp.shape)}"
            total = t if total is None else _COMBINE[layout.reduce_op](total, t)
            n += 1
        if layout.reduce_op == "avg":
            total = total / n
        torch.testing.assert_close(total, exp, rtol=0, atol=0, msg=lambda m: f"coord {c} layout {layout}: {m}")


def int_tensor(shape, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, tuple(shape), generator=g).float()


def world(mesh_shape) -> int:
    return math.prod(mesh_shape)
