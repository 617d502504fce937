"""What a package-owned ``Shard`` subclass needs from DTensor's internals (the ragged placement).

DTensor accepts a user placement only as a ``Shard`` subclass (a bare ``Placement`` is treated
as Replicate for local shapes). Three upstream facts need a shim, all kept here:

1. ``DTensorSpec`` (``_dtensor_spec.py:392`` on 2.13 and 2.14) asserts
   ``placements[m] != Shard(tensor_dim)`` is False for every sharded mesh dim, so a subclass
   that is unequal to ``Shard(d)`` cannot sit in a spec. :class:`ShardSubclass` answers
   ``!=`` with False against a plain ``Shard`` of the same dim only (``==`` stays strict, so
   the sharding cache and every placement comparison still tell them apart). Upstream fix:
   test ``p.is_shard() and p.dim == tensor_dim``.
2. The pybind base drops Python attributes when Dynamo deep-copies a placement to guard it:
   :class:`ShardSubclass` pickles through ``_ctor_args()``.
3. Upstream calls private hooks on a ``Shard`` (local shape/offset for DCP and
   ``compute_local_shape_and_global_offset``, ``-> Replicate``, ``Replicate ->``, shard-dim
   moves, reduce-scatter). A placement that holds structure only cannot answer them: each
   raises :class:`RaggedPlacementError` naming the package API that can.

Also here: the bindings of ``redistribute_local_tensor`` (three modules import it by name) and
of ``distribute_tensor`` (two), which the ragged patches wrap, and the rule that lets a custom
op run as one collective over all simulated ranks under ``LocalTensorMode``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, NamedTuple

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor import _api, _dispatch, _redistribute
import torch.distributed.tensor as dtensor_module
from torch.distributed._local_tensor import LocalTensor, LocalTensorMode, local_tensor_mode, maybe_run_for_local_tensor
from torch.distributed.device_mesh import DeviceMesh

__all__ = ["Binding", "RaggedPlacementError", "ShardSubclass", "distribute_bindings", "redistribute_bindings",
           "on_local_tensor_mode", "is_local_tensor", "coordinate_tensor", "other_dim_step"]


class RaggedPlacementError(RuntimeError):
    """A ragged placement reached code that needs its partition sizes, which it does not hold."""


class Binding(NamedTuple):
    """One module attribute a patch replaces (the module and the name bound in it)."""

    module: ModuleType
    name: str


def redistribute_bindings() -> tuple[Binding, ...]:
    """Every module that binds ``redistribute_local_tensor`` by name (2.13, 2.14)."""
    return tuple(Binding(m, "redistribute_local_tensor") for m in (_redistribute, _dispatch, _api))


def distribute_bindings() -> tuple[Binding, ...]:
    """The public and defining bindings of ``distribute_tensor``."""
    return (Binding(_api, "distribute_tensor"), Binding(dtensor_module, "distribute_tensor"))


# upstream's private hooks on Shard that need partition sizes; each is refused on a ShardSubclass
_SIZED_HOOKS = ("_local_shard_size_and_offset", "_to_replicate_tensor", "_replicate_to_shard", "_to_new_shard_dim",
                "_reduce_shard_tensor", "_split_tensor", "_shard_tensor")


class ShardSubclass(Shard):
    """Base of package-owned ``Shard`` subclasses that hold structure only (see the module docstring)."""

    def _ctor_args(self) -> tuple[Any, ...]:
        raise NotImplementedError

    def _refusal(self, hook: str) -> str:
        """The message for an upstream hook that needs sizes (subclasses name their API)."""
        return f"{self!r} holds no partition sizes; upstream's {hook} cannot run on it"

    def __ne__(self, other: object) -> bool:
        if type(other) is Shard and other.dim == self.dim:  # _dtensor_spec.py:392, see the module docstring
            return False
        return not self.__eq__(other)

    def __reduce__(self) -> tuple[type, tuple[Any, ...]]:
        return (type(self), self._ctor_args())


def _refuse(hook: str) -> Callable[..., Any]:
    def refused(self: ShardSubclass, *args: Any, **kwargs: Any) -> Any:
        raise RaggedPlacementError(self._refusal(hook))

    refused.__name__ = hook
    return refused


for _hook in _SIZED_HOOKS:
    setattr(ShardSubclass, _hook, _refuse(_hook))


def is_local_tensor(t: Any) -> bool:
    """True for a simulated (every rank in one process) local tensor."""
    return isinstance(t, LocalTensor)


def on_local_tensor_mode(op: Any, impl: Callable[..., Any]) -> None:
    """Run custom op ``op`` under ``LocalTensorMode`` as ``impl(*args)`` on the LocalTensors themselves.

    LocalTensorMode runs an unknown op once per rank on that rank's tensor, which is wrong for an
    op that is a collective; ``impl`` (the op's own Python body, made of functional collectives
    that LocalTensorMode simulates across ranks) runs once for all ranks instead.
    """

    def rule(mode: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        # not ``with mode``: re-entering the same LocalTensorMode instance leaves it disabled on exit
        return impl(*args, **(kwargs or {}))

    torch.library.register_torch_dispatch(op, LocalTensorMode, rule)


def coordinate_tensor(mesh: DeviceMesh, mesh_dim: int) -> torch.Tensor:
    """This rank's coordinate on ``mesh_dim`` as a 0-d int64 tensor (per simulated rank under LocalTensorMode).

    A tensor, not a SymInt: a simulated rank's SymInt cannot be saved for a custom op's backward.
    """
    lm = local_tensor_mode()
    if lm is None:
        return torch.tensor(mesh.get_local_rank(mesh_dim), dtype=torch.int64)
    shape = tuple(mesh.mesh.shape)
    coord = {rank: _unravel(i, shape)[mesh_dim] for i, rank in enumerate(mesh.mesh.flatten().tolist())}
    return lm.rank_map(lambda r: torch.tensor(coord[r], dtype=torch.int64))


@maybe_run_for_local_tensor
def _pad_chunk(local: torch.Tensor, coord: torch.Tensor, dim: int, n: int, length: int) -> torch.Tensor:
    chunk = -(-length // n) if length else 0
    start = min(int(coord) * chunk, length)
    shape = list(local.shape)
    shape[dim] = length
    out = local.new_zeros(shape)
    out.narrow(dim, start, local.shape[dim]).copy_(local)
    return out


def _unravel(index: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    out = []
    for size in reversed(shape):
        out.append(index % size)
        index //= size
    return tuple(reversed(out))


def other_dim_step(local: torch.Tensor, mesh: DeviceMesh, mesh_dim: int, current: Any, target: Any,
                   global_shape: Sequence[int], placements: Sequence[Any] = ()) -> torch.Tensor:
    """One move on a mesh dim that is not the ragged one: ``Partial <-> Replicate``, ``Shard(j) <-> Replicate``,
    ``Partial -> Shard(j)``, ``Shard(j) -> Partial(sum)`` (``ragged.placement.other_dims_move`` says which are safe).

    Upstream's own placement methods, called directly: its ``redistribute_local_tensor`` would first
    compute every mesh dim's local shape, which a ragged placement on another mesh dim cannot answer.
    ``global_shape``: the tensor's global shape; ``placements``: its placements (the earlier mesh dims that
    shard the step's tensor dim give its logical size here: their even chunk, else refused).
    """
    if mesh.size(mesh_dim) == 1 or current == target:  # one rank: nothing moves (upstream skips these dims too)
        return local
    shape = list(global_shape)
    for k, p in enumerate(placements[:mesh_dim]):
        if isinstance(p, Shard) and any(isinstance(t, Shard) and t.dim == p.dim for t in (current, target)):
            if shape[p.dim] % mesh.size(k):
                raise RaggedPlacementError(f"dim {p.dim} ({shape[p.dim]}) is sharded unevenly by mesh dim {k} and "
                                           f"again by mesh dim {mesh_dim}; gather it first")
            shape[p.dim] //= mesh.size(k)
    if current.is_partial() and target.is_replicate():
        return current._reduce_value(local, mesh, mesh_dim)
    if current.is_replicate() and target.is_partial():
        return target._partition_value(local, mesh, mesh_dim)
    if current.is_partial() and target.is_shard():
        return current._reduce_shard_value(local, mesh, mesh_dim, target)
    if current.is_shard() and target.is_partial() and target.reduce_op == "sum":
        # local: this rank's chunk in place, zeros elsewhere (the pieces sum to the whole, exactly)
        return _pad_chunk(local, coordinate_tensor(mesh, mesh_dim), current.dim, mesh.size(mesh_dim),
                          int(shape[current.dim]))
    if current.is_shard():
        local = current._to_replicate_tensor(local, mesh, mesh_dim, shape)
        if target.is_replicate():
            return local
        current = Replicate()
    if current.is_replicate() and target.is_shard():
        return target._replicate_to_shard(local, mesh, mesh_dim, mesh._sym_get_coordinate(mesh_dim))
    raise RaggedPlacementError(f"not a move on a non-ragged mesh dim: {current} -> {target}")
