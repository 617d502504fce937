"""DCP's planner helpers (what ``DTensor.__create_write_items__`` / ``__create_chunk_list__`` call)."""

from __future__ import annotations

from types import ModuleType

from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

__all__ = ["ChunkStorageMetadata", "MetadataIndex", "WRITE_ITEMS", "CHUNK", "planner_helpers"]

# the module attributes we replace (and restore) to make DCP honour a shard order
WRITE_ITEMS = "_create_write_items_for_dtensor"
CHUNK = "_create_chunk_from_dtensor"


def planner_helpers() -> ModuleType:
    import torch.distributed.checkpoint.planner_helpers as ph

    return ph
