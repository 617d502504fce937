"""DCP checkpoints of an aligned ragged DTensor: its box, from the counts.

Aligned rank ``r`` holds a contiguous run of the global ragged dim (its experts' partitions),
so its shard is a box of the global tensor; only the box's offset and size on the ragged dim
are data (rows of lower experts, rows of its experts). DCP asks a DTensor for its box through
``__create_write_items__`` / ``__create_chunk_list__``, whose upstream versions compute it from
the placements alone (the ``RaggedShard`` hook refuses: it holds no sizes). The moves give each
aligned result its own two methods, which read the counts from its context. Unaligned stays
refused: a rank holds a slice of every partition, which is no box.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch.distributed.tensor import DTensor, Replicate

from dtensor_rules._upstream import compute_local_shape_and_global_offset
from dtensor_rules.ragged.context import RaggedContext, full_counts
from dtensor_rules.ragged.segments import rank_sizes

__all__ = ["aligned_box", "make_checkpointable"]


def aligned_box(x: DTensor, ctx: RaggedContext) -> tuple[torch.Size, torch.Size]:
    """(local sizes, global offsets) of this rank's shard of an aligned ragged DTensor."""
    m = ctx.mesh_dim
    p = x.placements[m]
    plain = list(x.placements)
    plain[m] = Replicate()
    mesh = x.device_mesh
    sizes, offsets = compute_local_shape_and_global_offset(x.shape, tuple(mesh.shape), mesh.get_coordinate(), plain)
    per_rank = rank_sizes(full_counts(ctx), True).tolist()
    r = mesh.get_local_rank(m)
    sizes, offsets = list(sizes), list(offsets)
    sizes[p.dim], offsets[p.dim] = per_rank[r], sum(per_rank[:r])
    return torch.Size(sizes), torch.Size(offsets)


def _write_items(self: DTensor, fqn: str, obj: Any, ctx: RaggedContext) -> list[Any]:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    sizes, offsets = aligned_box(self, ctx)
    if 0 in sizes:  # a rank whose experts got no rows: an empty box at the next rank's offset, which DCP's
        return []   # de-duplication (same MetadataIndex = a replica) would keep instead of the real one
    return [WriteItem(index=MetadataIndex(fqn, offsets), type=WriteItemType.SHARD,
                      tensor_data=TensorWriteData(chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                                                  properties=TensorProperties.create_from_tensor(self.to_local()),
                                                  size=self.size()))]


def _chunk_list(self: DTensor, ctx: RaggedContext) -> list[Any]:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    sizes, offsets = aligned_box(self, ctx)
    return [] if 0 in sizes else [ChunkStorageMetadata(offsets=offsets, sizes=sizes)]


def make_checkpointable(x: DTensor, ctx: RaggedContext) -> DTensor:
    """Give an aligned ragged DTensor (returned) the two DCP methods that know its box."""
    x.__create_write_items__ = types.MethodType(lambda self, fqn, obj: _write_items(self, fqn, obj, ctx), x)
    x.__create_chunk_list__ = types.MethodType(lambda self: _chunk_list(self, ctx), x)
    return x
