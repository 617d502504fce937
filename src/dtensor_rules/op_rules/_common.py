"""Small helpers shared by the rule modules (placements over broadcasting, dims, bytes, sample suites)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false
from dtensor_rules.registry import tensor_metas as metas  # noqa: F401  (the rules' name for it)
from dtensor_rules._upstream import ShardingPlaceholder
from torch.distributed.tensor.placement_types import Placement, Replicate

PlacementOrHole = Placement | ShardingPlaceholder
Samples = list[tuple[tuple[Any, ...], dict[str, Any]]]  # a sample suite's value: ``[(args, kwargs), ...]``


def generator(seed: int) -> torch.Generator:
    """A seeded generator: every run of a sample suite sees the same data."""
    return torch.Generator().manual_seed(seed)


def normalize_dim(dim: int, ndim: int) -> int:
    """Python-style negative dims; a 0-d tensor accepts dim 0 and -1."""
    n = max(ndim, 1)
    if not -n <= dim < n:
        raise IndexError(f"dim {dim} out of range for a {ndim}-d tensor")
    return dim % n


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    return tuple(torch.broadcast_shapes(*[torch.Size(s) for s in shapes]))


def shard_through_broadcast(out_shape: Sequence[int], in_shapes: Sequence[Sequence[int]]) -> list[list[PlacementOrHole]]:
    """Per output dim d: ``[S(d), S(aligned dim) or R for each input]``.

    An input whose aligned dim is missing or of size 1 (broadcast) is replicated:
    every rank needs all of it to produce its slice of the output. An output dim that
    every input broadcasts (size 1) is not offered: each rank would compute the whole
    dim while the output claims to be split.
    """
    out: list[list[PlacementOrHole]] = []
    nd = len(out_shape)
    for d in range(nd):
        row: list[PlacementOrHole] = [ShardingPlaceholder(d)]
        for shape in in_shapes:
            k = d - (nd - len(shape))
            # a size not known to be 1 is not broadcast (no guard on an unbacked size; torch assumes the same)
            row.append(ShardingPlaceholder(k) if k >= 0 and not guard_or_false(shape[k] == 1) else Replicate())
        if any(isinstance(p, ShardingPlaceholder) for p in row[1:]):
            out.append(row)
    return out


def numel(t: Any) -> int:
    shape = t.shape if hasattr(t, "shape") else t
    n = 1
    for s in shape:
        n *= int(s)
    return n


def nbytes(t: torch.Tensor) -> int:
    """Bytes of the distinct memory a tensor's elements occupy (stride-0 dims count once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= int(size)
        elif size == 0:
            n = 0
    return n * t.element_size()


def size_is(size: Any, n: Any) -> bool | None:
    """``size == n`` when statically known (True / False), None when it depends on data.

    Rules branch on sizes; with symbolic (unbacked) sizes a plain ``==`` would guard on data.
    Callers treat None as "do not offer the strategy that needs the answer" (a safe, smaller set).
    """
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if statically_known_true(size == n):
        return True
    if statically_known_true(size != n):
        return False
    return None


def sym_numel(shape: Sequence[Any]) -> Any:
    """Product of a shape's sizes without specializing symbolic ones (``numel`` calls ``int``)."""
    n: Any = 1
    for s in shape:
        n = n * s
    return n
