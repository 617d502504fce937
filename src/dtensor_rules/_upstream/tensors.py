"""DTensor internals of one tensor: its local tensor and spec, local shapes, simulated ranks."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed._local_tensor as _local_tensor_module
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
    "on_local_tensor_mode",
    "per_rank_copies",
    "per_rank_run_hooks",
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


class _PerRankRunHooks:
    """LocalTensorMode's per-rank loop, reached by two module globals it looks up at call time:
    ``_for_each_rank_run_func(func, ranks, args, kwargs, *, alias)`` runs ``func`` once per rank and
    ``_map_to_rank_local_val(value, rank)`` hands each argument to one rank's call (in rank order,
    right before that rank's call). :meth:`wrap` replaces both; :meth:`unwrap` puts back exactly the
    objects it replaced."""

    _NAMES = ("_for_each_rank_run_func", "_map_to_rank_local_val")

    def __init__(self) -> None:
        self._saved: tuple[Any, Any] | None = None

    def wrapped(self) -> bool:
        return self._saved is not None

    def wrap(self, make_run: Any, make_map: Any) -> None:
        """``make_run(original_run)`` / ``make_map(original_map)`` return the replacements."""
        if self._saved is not None:
            return
        run, map_ = (getattr(_local_tensor_module, n) for n in self._NAMES)
        self._saved = (run, map_)
        _local_tensor_module._for_each_rank_run_func = make_run(run)
        _local_tensor_module._map_to_rank_local_val = make_map(map_)

    def unwrap(self) -> None:
        if self._saved is None:
            return
        for name, original in zip(self._NAMES, self._saved):
            setattr(_local_tensor_module, name, original)
        self._saved = None


per_rank_run_hooks = _PerRankRunHooks()


def on_local_tensor_mode(op: Any, impl: Any) -> None:
    """Run custom op ``op`` under ``LocalTensorMode`` as ``impl(*args)`` on the LocalTensors themselves.

    LocalTensorMode runs an unknown op once per rank on that rank's tensor, which is wrong for an
    op that is a collective; ``impl`` (the op's own Python body, made of functional collectives
    that LocalTensorMode simulates across ranks) runs once for all ranks instead.
    """

    def rule(mode: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        # not ``with mode``: re-entering the same LocalTensorMode instance leaves it disabled on exit
        return impl(*args, **(kwargs or {}))

    torch.library.register_torch_dispatch(op, LocalTensorMode, rule)
