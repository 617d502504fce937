"""DTensor internals of one tensor: its local tensor and spec, local shapes, simulated ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed._local_tensor import (
    LocalTensor,
    LocalTensorMode,
    enabled_local_tensor_mode,
    maybe_disable_local_tensor_mode,
    maybe_run_for_local_tensor,
    rank_map,
)
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._utils import (
    _compute_local_shape_and_global_offset as compute_local_shape_and_global_offset,
    compute_local_stride,
)

__all__ = [
    "LocalTensor",
    "LocalTensorMode",
    "compute_local_shape_and_global_offset",
    "compute_local_stride",
    "enabled_local_tensor_mode",
    "local_tensor",
    "maybe_disable_local_tensor_mode",
    "maybe_run_for_local_tensor",
    "mesh_coordinate",
    "num_devices_per_host",
    "per_rank_copies",
    "rank_map",
    "rank_tensors",
    "set_spec",
    "spec_of",
]


def local_tensor(dt: Any) -> Any:
    """A DTensor's local shard, without ``to_local()``'s autograd node."""
    return dt._local_tensor


def spec_of(dt: Any) -> Any:
    """A DTensor's ``DTensorSpec`` (mesh, placements, shard order, tensor meta)."""
    return dt._spec


def set_spec(dt: Any, spec: Any) -> None:
    """Replace a DTensor's spec in place (``out=`` results written through a handler)."""
    dt._spec = spec


def mesh_coordinate(mesh: DeviceMesh, mesh_dim: int) -> Any:
    """This rank's coordinate on one mesh dim (per-rank under LocalTensorMode)."""
    return mesh._sym_get_coordinate(mesh_dim)


def num_devices_per_host(device_type: str) -> int:
    """Devices per host as DeviceMesh assumes it (``device_count()``; 1 on CPU)."""
    from torch.distributed.device_mesh import _mesh_resources

    return _mesh_resources.num_devices_per_host(device_type)


def rank_tensors(t: Any) -> dict[int, Any] | None:
    """rank -> that rank's tensor of a simulated (LocalTensor) tensor; None for a plain tensor."""
    return dict(t._local_tensors) if isinstance(t, LocalTensor) else None


def per_rank_copies(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a simulated tensor with its own copy on every rank, under an enabled ``LocalTensorMode``.

    Why: a plain tensor made outside the mode stays ONE tensor when upstream's
    ``distribute_tensor`` replicates it (the broadcast is a no-op on it), so every simulated
    rank's shard is the same storage and an in-place update (an optimizer step) lands once per
    rank. A ``LocalTensor`` is returned as it is; outside the mode (a real process group) ``t``.
    """
    mode = enabled_local_tensor_mode()
    if mode is None or isinstance(t, LocalTensor):
        return t
    value = t.detach()
    return mode.rank_map(lambda _rank: value.clone(memory_format=torch.preserve_format))
