"""DCP's planner helpers (what ``DTensor.__create_write_items__`` / ``__create_chunk_list__`` call).

Nothing here imports ``torch.distributed.checkpoint`` (~70 ms and a few MiB: it pulls in FSDP,
elastic and sharded tensors): the fix is applied when the user's code imports DCP
(:func:`on_planner_helpers_imported`), and the metadata classes are reached only from code
that runs inside DCP.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from dtensor_rules._upstream.post_import import when_imported

__all__ = ["WRITE_ITEMS", "CHUNK", "PLANNER_HELPERS", "chunk_metadata", "metadata_index", "on_planner_helpers_imported"]

PLANNER_HELPERS = "torch.distributed.checkpoint.planner_helpers"
# the module attributes we replace (and restore) to make DCP honour a shard order
WRITE_ITEMS = "_create_write_items_for_dtensor"
CHUNK = "_create_chunk_from_dtensor"


def on_planner_helpers_imported(callback: Callable[[ModuleType], None]) -> Callable[[], None]:
    """``callback(planner_helpers)`` now if DCP is imported, else right after it is; returns ``cancel()``."""
    return when_imported(PLANNER_HELPERS, callback)


def chunk_metadata(offsets: Sequence[int], sizes: Sequence[int]) -> Any:
    """DCP's ``ChunkStorageMetadata`` (called from inside DCP: the import is already paid)."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    return ChunkStorageMetadata(offsets=offsets, sizes=sizes)


def metadata_index(fqn: str, offsets: Sequence[int]) -> Any:
    """DCP's ``MetadataIndex`` of one chunk."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    return MetadataIndex(fqn, offsets)
