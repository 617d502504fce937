"""Simulated masked-partial layouts: an index moved into each rank's chunk of a sharded table.

A masked partial (upstream's ``_MaskPartial``, our ``IndexMaskPartial``) on an INPUT says the
rank holds the index values shifted into its chunk of a table sharded along ``offset_dim``,
entries outside the chunk set to 0 and remembered; on an OUTPUT, that the results of those
entries are zeroed before the Partial sum. The two classes differ as their code does:

- upstream's moves the index one mesh dim at a time, each time as if that mesh dim alone
  split the whole ``offset_shape[offset_dim]``, and keeps ONE mask per placement object: a
  second, different mask (the table split on two mesh dims) makes the layout fail, as the
  buffer raises; the mask is applied at every mesh dim the output is reduced over;
- ours moves it once into the rank's nested chunk over all mesh dims carrying it, runs the
  lookup on one zero slice where that chunk is empty, and masks the output once.

Chunks are computed with ``compute_local_shape_and_global_offset``, as the shards are cut.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from dtensor_rules._upstream import IndexMaskPartial, MaskPartial, compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import Placement, Shard

__all__ = ["Masks", "as_layout", "is_mask", "mask_inputs", "mask_outputs"]

Masks = dict[Placement, torch.Tensor]  # mask placement -> where this rank's index fell outside its chunk


def is_mask(p: Placement) -> bool:
    return isinstance(p, MaskPartial)


def as_layout(p: Placement) -> Placement:
    """One placement per masked layout, whichever class offers it (upstream's or ours): counted once."""
    return IndexMaskPartial(p.offset_shape, p.offset_dim) if is_mask(p) else p


def _chunk(p: MaskPartial, mesh_sizes: Sequence[int], coord: Sequence[int]) -> tuple[int, int]:
    """(size, offset) of the rank's chunk of the table's ``offset_dim`` split over these mesh dims."""
    shape, offset = compute_local_shape_and_global_offset(
        torch.Size(p.offset_shape), tuple(mesh_sizes), list(coord), [Shard(p.offset_dim)] * len(mesh_sizes)
    )
    return shape[p.offset_dim], offset[p.offset_dim]


def _move(index: torch.Tensor, size: int, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
    mask = (index < offset) | (index >= offset + size)
    return (index - offset).masked_fill(mask, 0), mask


def _mask_index(
    index: torch.Tensor, placements: Sequence[Placement], mesh_shape: Sequence[int], coord: Sequence[int], masks: Masks
) -> tuple[torch.Tensor, int | None]:
    """The rank's index under its mask placements; the chunk size for ours (None without)."""
    ours = [k for k, p in enumerate(placements) if isinstance(p, IndexMaskPartial)]
    size = None
    if ours:
        size, offset = _chunk(placements[ours[0]], [mesh_shape[k] for k in ours], [coord[k] for k in ours])
        index, masks[placements[ours[0]]] = _move(index, size, offset)
    for k, p in enumerate(placements):
        if is_mask(p) and not isinstance(p, IndexMaskPartial):
            index, mask = _move(index, *_chunk(p, [mesh_shape[k]], [coord[k]]))
            if p in masks and not torch.equal(masks[p], mask):
                raise ValueError("MaskBuffer has been materialized with conflicting data")
            masks[p] = mask
    return index, size


def _is_table(t: torch.Tensor, placements: Sequence[Placement], mask: IndexMaskPartial, dims: Sequence[int]) -> bool:
    return tuple(t.shape) == tuple(mask.offset_shape) and all(placements[k] == Shard(mask.offset_dim) for k in dims)


def mask_inputs(
    full: Sequence[torch.Tensor],
    local: list[torch.Tensor],
    placements: Sequence[Sequence[Placement] | None],
    mesh_shape: Sequence[int],
    coord: Sequence[int],
) -> Masks:
    """Rewrite (in ``local``) each input laid out as a masked partial; returns the rank's masks."""
    masks: Masks = {}
    for i, pl in enumerate(placements):
        if pl is None or not any(is_mask(p) for p in pl):
            continue
        local[i], size = _mask_index(local[i], pl, mesh_shape, coord, masks)
        if size == 0:  # ours looks up in one zero slice of the table: every entry is masked anyway
            mask = next(p for p in pl if isinstance(p, IndexMaskPartial))
            dims = [k for k, p in enumerate(pl) if p == mask]
            for j, t in enumerate(full):
                if j != i and placements[j] is not None and _is_table(t, placements[j], mask, dims):
                    shape = list(local[j].shape)
                    shape[mask.offset_dim] = 1
                    local[j] = local[j].new_zeros(shape)
    return masks


def mask_outputs(
    values: list[torch.Tensor], mags: list[Any], p: MaskPartial, masks: Sequence[Mapping[Placement, torch.Tensor]], done: set[Placement]
) -> str | None:
    """Zero every rank's masked entries (value and magnitude) before a reduction over ``p``;
    why not, if a rank has no input mask for it."""
    if isinstance(p, IndexMaskPartial) and p in done:
        return None  # ours masks once, before the first mesh dim it is reduced over
    done.add(p)
    for r in range(len(values)):
        mask = masks[r].get(p) if r < len(masks) else None
        if mask is None or mask.shape != values[r].shape:
            return f"{p} output: no input mask of its shape on rank {r}"
        values[r] = values[r].masked_fill(mask, 0)
        if mags[r] is not None:
            mags[r] = mags[r].masked_fill(mask, 0)
    return None
