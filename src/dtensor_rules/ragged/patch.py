"""The named patches that let plain DTensor calls reach the ragged moves (or refuse clearly).

- ``ragged_redistribute``: ``DTensor.redistribute`` runs :func:`dtensor_rules.ragged.redistribute`
  when either side has a ``RaggedShard`` (so ``x.redistribute(...)`` and ``x.full_tensor()`` work
  on a tensor that carries a ragged context); every other call goes to upstream's method.
  Needed because upstream cannot do these moves: a same-dim ``Shard -> Shard`` step is skipped
  (``_redistribute.py:1684`` / ``:1748``: data relabelled, not moved) and its placement hooks
  only see the local tensor, never the sizes.
- ``ragged_guard``: ``redistribute_local_tensor`` (bound by name in ``_redistribute``,
  ``_dispatch`` and ``_api``) raises when a spec holds a ``RaggedShard`` -- an op whose
  upstream rule wants the ragged input as ``Shard(d)`` would otherwise relabel it silently --,
  and ``distribute_tensor`` refuses a ``RaggedShard`` (upstream replaces it by ``Shard(d)``
  and cuts even chunks).

Both are required (on by default), listed by ``status()``, restored exactly by ``uninstall()``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch.distributed.tensor import DTensor

from dtensor_rules._upstream.ragged import (
    RaggedPlacementError,
    distribute_bindings,
    other_dim_step,
    redistribute_bindings,
)
from dtensor_rules.patches import Patch, register
from dtensor_rules.ragged.placement import is_ragged, other_dims_move

__all__: list[str] = []

_orig: dict[str, Any] = {}


def _has_ragged(placements: Sequence[Any] | None) -> bool:
    return placements is not None and any(is_ragged(p) for p in placements)


def _apply_redistribute() -> None:
    real = _orig["redistribute"] = DTensor.redistribute

    def redistribute(self: DTensor, device_mesh: Any = None, placements: Sequence[Any] | None = None,
                     **kwargs: Any) -> DTensor:
        if _has_ragged(self.placements) or _has_ragged(placements):
            from dtensor_rules.ragged.moves import redistribute as ragged_redistribute

            if device_mesh is not None and device_mesh != self.device_mesh:
                raise RaggedPlacementError("a ragged DTensor cannot change DeviceMesh in redistribute")
            return ragged_redistribute(self, placements if placements is not None else self.placements, **kwargs)
        return real(self, device_mesh, placements, **kwargs)

    redistribute.__doc__ = real.__doc__
    DTensor.redistribute = redistribute


def _restore_redistribute() -> None:
    DTensor.redistribute = _orig.pop("redistribute")


def _guarded_local(real: Callable[..., Any]) -> Callable[..., Any]:
    def redistribute_local_tensor(local: Any, current_spec: Any, target_spec: Any, *args: Any, **kwargs: Any) -> Any:
        if (_has_ragged(current_spec.placements) or _has_ragged(target_spec.placements)) and not other_dims_move(
                current_spec.placements, target_spec.placements):
            raise RaggedPlacementError(
                f"upstream redistribute {current_spec.placements} -> {target_spec.placements} would relabel ragged rows "
                "without moving them (same-dim Shard -> Shard is skipped upstream). An op on a ragged DTensor needs a "
                "ragged rule (none is installed for this op yet); explicit moves: dtensor_rules.ragged.dispatch / "
                "combine / gather / redistribute")
        if _has_ragged(current_spec.placements) or _has_ragged(target_spec.placements):
            for i, (p, q) in enumerate(zip(current_spec.placements, target_spec.placements)):
                if not is_ragged(p):
                    local = other_dim_step(local, current_spec.mesh, i, p, q, current_spec.shape, current_spec.placements)
            return local
        return real(local, current_spec, target_spec, *args, **kwargs)

    return redistribute_local_tensor


def _guarded_distribute(real: Callable[..., Any]) -> Callable[..., Any]:
    def distribute_tensor(tensor: Any, device_mesh: Any = None, placements: Any = None, *args: Any, **kwargs: Any) -> Any:
        if _has_ragged(placements):
            raise RaggedPlacementError(
                "distribute_tensor cannot cut a RaggedShard (upstream re-creates Shard(dim) and cuts even chunks; "
                "the partition sizes are data): use dtensor_rules.ragged.distribute(tensor, mesh, counts, mesh_dim)")
        return real(tensor, device_mesh, placements, *args, **kwargs)

    return distribute_tensor


def _apply_guard() -> None:
    for b in redistribute_bindings():
        real = getattr(b.module, b.name)
        _orig[f"{b.module.__name__}.{b.name}"] = real
        setattr(b.module, b.name, _guarded_local(real))
    for b in distribute_bindings():
        real = getattr(b.module, b.name)
        _orig[f"{b.module.__name__}.{b.name}"] = real
        setattr(b.module, b.name, _guarded_distribute(real))


def _restore_guard() -> None:
    for b in redistribute_bindings() + distribute_bindings():
        setattr(b.module, b.name, _orig.pop(f"{b.module.__name__}.{b.name}"))


register(Patch(
    name="ragged_redistribute",
    changes="DTensor.redistribute: a call with a RaggedShard on either side runs dtensor_rules.ragged.redistribute "
    "(dispatch / combine / all-gather with sizes / select); every other call goes to upstream's method",
    reason="upstream skips a same-dim Shard -> Shard step (the dispatch would be a relabel, not a move) and its "
    "placement hooks cannot see the partition sizes, so x.redistribute / x.full_tensor() of a ragged DTensor "
    "would be wrong",
    required=True,
    apply=_apply_redistribute,
    restore=_restore_redistribute,
))
register(Patch(
    name="ragged_guard",
    changes="redistribute_local_tensor (its 3 bindings: _redistribute, _dispatch, _api) and distribute_tensor "
    "(_api, torch.distributed.tensor): raise on a RaggedShard (a redistribute that keeps the ragged placements "
    "and only moves other mesh dims off the ragged tensor dims runs here instead); every other call goes to the original",
    reason="an op whose upstream rule wants a ragged input as Shard(d) would relabel its rows silently, and "
    "distribute_tensor would replace a RaggedShard by even Shard(d) chunks: both become clear errors",
    required=True,
    apply=_apply_guard,
    restore=_restore_guard,
))
