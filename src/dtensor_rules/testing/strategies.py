"""Hypothesis strategies for DTensor tests: meshes, placements, device orders, shapes, dtypes.

Shipped in the package so users can property-test their own rules::

    from hypothesis import given
    from dtensor_rules.testing import strategies as dst

    @given(dst.mesh_shapes(max_dims=2), dst.shapes(min_dims=1, max_dims=3))
    def test_my_rule(mesh_shape, shape): ...
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from hypothesis import strategies as st
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from dtensor_rules.testing.mesh import MAX_WORLD

__all__ = [
    "mesh_shapes",
    "shapes",
    "uneven_shapes",
    "dtypes",
    "placements",
    "placement_lists",
    "device_orders",
    "tensors",
    "FLOAT_DTYPES",
]

FLOAT_DTYPES = (torch.float32, torch.bfloat16)


@st.composite
def mesh_shapes(draw: st.DrawFn, min_dims: int = 1, max_dims: int = 3, max_world: int = MAX_WORLD) -> tuple[int, ...]:
    """Mesh shapes of 1..3 dims, each dim >= 2, at most ``max_world`` ranks."""
    ndim = draw(st.integers(min_dims, max_dims))
    shape: list[int] = []
    for i in range(ndim):
        budget = max_world // max(math.prod(shape), 1) // (2 ** (ndim - i - 1))
        shape.append(draw(st.sampled_from([s for s in (2, 3, 4) if s <= budget] or [2])))
    return tuple(shape)


def shapes(min_dims: int = 1, max_dims: int = 3, min_side: int = 1, max_side: int = 7) -> st.SearchStrategy[tuple[int, ...]]:
    """Tensor shapes; sides are small and often not divisible by the mesh (uneven shards)."""
    return st.lists(st.integers(min_side, max_side), min_size=min_dims, max_size=max_dims).map(tuple)


def uneven_shapes(mesh_size: int, min_dims: int = 1, max_dims: int = 3) -> st.SearchStrategy[tuple[int, ...]]:
    """Shapes with at least one side not divisible by ``mesh_size`` but at least as large."""
    side = st.integers(mesh_size, 3 * mesh_size + 1)
    return st.lists(side, min_size=min_dims, max_size=max_dims).filter(lambda s: any(x % mesh_size for x in s)).map(tuple)


def dtypes(*choices: torch.dtype) -> st.SearchStrategy[torch.dtype]:
    return st.sampled_from(choices or FLOAT_DTYPES)


def placements(ndim: int, partial: bool = True, reduce_ops: Sequence[str] = ("sum", "avg", "max", "min")) -> st.SearchStrategy[Placement]:
    """One placement for a tensor of ``ndim`` dims."""
    options: list[Placement] = [Replicate()] + [Shard(d) for d in range(ndim)]
    if partial:
        options += [Partial(op) for op in reduce_ops]
    return st.sampled_from(options)


def placement_lists(mesh_ndim: int, tensor_ndim: int, partial: bool = False) -> st.SearchStrategy[tuple[Placement, ...]]:
    """A placement per mesh dim; mixed Partial reduce ops (not representable) are excluded."""

    def representable(pl: tuple[Placement, ...]) -> bool:
        ops = {p.reduce_op for p in pl if isinstance(p, Partial)}
        return len(ops) <= 1

    return st.tuples(*[placements(tensor_ndim, partial) for _ in range(mesh_ndim)]).filter(representable)


def device_orders(mesh_ndim: int) -> st.SearchStrategy[tuple[int, ...]]:
    """A permutation of ``range(mesh_ndim)``: the mesh dims from major (splits first) to minor."""
    return st.permutations(list(range(mesh_ndim))).map(tuple)


@st.composite
def tensors(draw: st.DrawFn, shape: Sequence[int], dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A tensor with hypothesis-chosen seed; integers in a small range, floats standard normal."""
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, tuple(shape), generator=g).bool()
    if not dtype.is_floating_point:
        return torch.randint(-5, 6, tuple(shape), generator=g, dtype=dtype)
    return torch.randn(tuple(shape), generator=g).to(dtype)
