"""Two upstream bug fixes that keep a DTensor's ``shard_order`` honest (applied by ``install()``).

1. ``DTensorSpec.shallow_copy_with_tensor_meta`` drops ``shard_order``; the sharding propagator
   wraps every output spec with it, so even an op whose strategy keeps the input's order (our
   ``dtensor_rules.op_rules.identity`` for detach / alias) would come out claiming the default order while the data
   is in the ordered layout. The fix copies ``shard_order`` when the spec stores it explicitly
   (``use_strided_shard_as_shard_order=False``); specs a strategy built from placements alone
   carry the default order, exactly as before.
2. DCP's ``_create_write_items_for_dtensor`` / ``_create_chunk_from_dtensor`` (what
   ``DTensor.__create_write_items__`` / ``__create_chunk_list__`` call) compute offsets from the
   placements alone (``compute_local_shape_and_global_offset``), i.e. for the default order. For
   a spec with a non-default order the fix takes (sizes, offsets) from ``local_shard_offsets``
   (nested chunking in the recorded order); every other DTensor goes to the original function.
   DCP is heavy to import (~70 ms), so this half waits for the user's first import of it
   (``_upstream.checkpoint.on_planner_helpers_imported``) when ``install()`` runs before that.

They are the named patches ``shard_order`` and ``checkpoint_shard_order`` (docs/patches.md): a full
``dtensor_rules.install()`` applies them, ``uninstall()`` puts the original function objects back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType

import torch

from dtensor_rules._upstream import DTensorSpec, spec_of, TensorMeta
from dtensor_rules._upstream.checkpoint import (
    CHUNK,
    PLANNER_HELPERS,
    WRITE_ITEMS,
    chunk_metadata,
    metadata_index,
    on_planner_helpers_imported,
)

from dtensor_rules.patches import Patch, guarded, register

__all__ = ["has_custom_order", "checkpoint_shape_and_offset"]

_orig: dict[str, object] = {}  # what _apply replaced: "shallow"; once DCP is patched, "helpers", "write", "chunk"
_cancel_dcp: list[Callable[[], None]] = []  # while applied: forgets the DCP half if DCP is not imported yet


def has_custom_order(spec: DTensorSpec) -> bool:
    """True when ``spec`` records a shard order other than DTensor's default left-to-right one."""
    if spec.use_strided_shard_as_shard_order or not spec.shard_order:
        return False
    return tuple(spec.shard_order) != tuple(DTensorSpec.compute_default_shard_order(spec.placements))


def checkpoint_shape_and_offset(spec: DTensorSpec) -> tuple[torch.Size, torch.Size]:
    """(local shape, global offset) of this rank's shard in the recorded order."""
    from dtensor_rules.redistribute.api import layout_of, local_shard_offsets

    sizes, offs = local_shard_offsets(layout_of(spec), tuple(spec.mesh.shape), tuple(spec.shape), spec.mesh.get_coordinate())
    return torch.Size(sizes), torch.Size(offs)


def _shallow_copy_with_tensor_meta(self: DTensorSpec, tensor_meta: TensorMeta | None) -> DTensorSpec:
    if tensor_meta is None:
        raise AssertionError("shallow copy with no tensor_meta!")
    if self.use_strided_shard_as_shard_order:
        return DTensorSpec(self.mesh, self.placements, tensor_meta=tensor_meta, use_strided_shard_as_shard_order=True)
    return DTensorSpec(self.mesh, self.placements, tensor_meta=tensor_meta, shard_order=self.shard_order,
                       use_strided_shard_as_shard_order=False)


def _write_items(fqn, tensor):
    item = _orig["write"](fqn, tensor)
    if not has_custom_order(spec_of(tensor)):
        return item
    sizes, offs = checkpoint_shape_and_offset(spec_of(tensor))
    return dataclasses.replace(
        item, index=metadata_index(fqn, offs),
        tensor_data=dataclasses.replace(item.tensor_data, chunk=chunk_metadata(offs, sizes)))


def _chunk(tensor):
    if not has_custom_order(spec_of(tensor)):
        return _orig["chunk"](tensor)
    sizes, offs = checkpoint_shape_and_offset(spec_of(tensor))
    return chunk_metadata(offs, sizes)


def _patch_dcp(ph: ModuleType) -> None:
    _orig.update(helpers=ph, write=getattr(ph, WRITE_ITEMS), chunk=getattr(ph, CHUNK))
    setattr(ph, WRITE_ITEMS, _write_items)
    setattr(ph, CHUNK, _chunk)


def _apply_spec() -> None:
    _orig["shallow"] = DTensorSpec.__dict__["shallow_copy_with_tensor_meta"]
    DTensorSpec.shallow_copy_with_tensor_meta = _shallow_copy_with_tensor_meta


def _restore_spec() -> None:
    DTensorSpec.shallow_copy_with_tensor_meta = _orig.pop("shallow")


def _apply_dcp() -> None:
    # now if DCP is imported, else at the user's import of it (a failure there warns, never raises)
    _cancel_dcp.append(on_planner_helpers_imported(guarded("checkpoint_shard_order", _patch_dcp)))


def _restore_dcp() -> None:
    _cancel_dcp.pop()()
    if "helpers" in _orig:
        ph = _orig.pop("helpers")
        setattr(ph, WRITE_ITEMS, _orig.pop("write"))
        setattr(ph, CHUNK, _orig.pop("chunk"))


register(Patch(
    name="shard_order",
    changes="DTensorSpec.shallow_copy_with_tensor_meta: keeps a spec's explicit shard_order",
    reason="upstream drops it, so an op whose strategy keeps the input's order (detach, alias) would claim "
    "the default order while the data is in the ordered layout: wrong full_tensor()",
    upstream="defect: DTensorSpec.shallow_copy_with_tensor_meta drops an explicit shard_order (the copy has the "
    "default order) (checked: torch 2.13.0, 2.14.1)",
    required=True,
    apply=_apply_spec,
    restore=_restore_spec,
))
register(Patch(
    name="checkpoint_shard_order",
    changes=f"{PLANNER_HELPERS}.{WRITE_ITEMS} and .{CHUNK}: chunk offsets of a DTensor with a non-default "
    "shard order follow that order (every other DTensor goes to the original function)",
    reason="DCP computes offsets for the default order only: a checkpoint of an ordered DTensor would "
    "save rows at the wrong offsets",
    upstream="defect: DCP's _create_chunk_from_dtensor / _create_write_items_for_dtensor compute offsets from the "
    "placements alone, ignoring spec.shard_order (checked: torch 2.13.0, 2.14.1)",
    required=True,
    apply=_apply_dcp,
    restore=_restore_dcp,
    waits_for=PLANNER_HELPERS,
    pending=lambda: "helpers" not in _orig,
))
