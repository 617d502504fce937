"""Hypothesis strategies for ordered-mesh layouts (placements + device order) used by the planner tests."""

from __future__ import annotations

from hypothesis import strategies as st
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

__all__ = ["layout_args", "layout_pairs"]


@st.composite
def layout_args(draw: st.DrawFn, mesh_ndim: int, tensor_ndim: int, partial: bool = True,
                reduce_op: str = "sum") -> tuple[tuple[Placement, ...], tuple[int, ...]]:
    """(placements, device_order) with device_order a random permutation (mesh dims, major first)."""
    options: list[Placement] = [Replicate()] + [Shard(d) for d in range(tensor_ndim)]
    if partial:
        options.append(Partial(reduce_op))
    pl = tuple(draw(st.sampled_from(options)) for _ in range(mesh_ndim))
    order = tuple(draw(st.permutations(list(range(mesh_ndim)))))
    return pl, order


@st.composite
def layout_pairs(draw: st.DrawFn, mesh_shapes=((2, 2), (2, 4), (2, 2, 2)), max_tensor_ndim: int = 3, max_side: int = 9,
                 partial: bool = True, reduce_ops: tuple[str, ...] = ("sum",)):
    """(mesh_shape, tensor shape, (src placements, src order), (dst placements, dst order)).

    Sides run from 1 (smaller than the mesh) to ``max_side`` (often not divisible: uneven shards).
    Both sides' Partials use one reduce op drawn from ``reduce_ops``.
    """
    op = draw(st.sampled_from(list(reduce_ops)))
    mesh_shape = draw(st.sampled_from(list(mesh_shapes)))
    ndim = draw(st.integers(1, max_tensor_ndim))
    shape = tuple(draw(st.lists(st.integers(1, max_side), min_size=ndim, max_size=ndim)))
    src = draw(layout_args(len(mesh_shape), ndim, partial, op))
    dst = draw(layout_args(len(mesh_shape), ndim, partial, op))
    return mesh_shape, shape, src, dst
