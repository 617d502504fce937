"""The ``exact_int_partition`` patch: an integer or bool ``Replicate -> Partial(sum)`` stays exact.

Upstream turns a replicated value into ``Partial(sum)`` as ``v / n`` on every rank, a FLOAT for an
integer tensor (``scatter_add`` of an int64 self then fails on the dtype mismatch, other ops
silently promote). For integer and bool dtypes the patch keeps the value on mesh coordinate 0 and
zeros elsewhere: the sum is exactly ``v``, wraparound included. Floating dtypes keep upstream's
``v / n``. While it is applied, dispatch's greedy choice may move an integer ``R -> P(sum)``
(:class:`~dtensor_rules.dispatch.greedy.ExactIntegerPartial`).
"""

from __future__ import annotations

from typing import Any

import torch

from dtensor_rules._upstream import maybe_run_for_local_tensor, mesh_coordinate, swap_partial_partition
from dtensor_rules.dispatch.greedy import ExactIntegerPartial
from dtensor_rules.patches import Patch, register


@maybe_run_for_local_tensor
def _keep_on_first(tensor: torch.Tensor, coordinate: int) -> torch.Tensor:
    """Rank-local: the value on coordinate 0, zeros elsewhere (per simulated rank under LocalTensorMode)."""
    return tensor if coordinate == 0 else torch.zeros_like(tensor)


_upstream_partition: list[Any] = []


def _exact_partition(self: Any, tensor: torch.Tensor, mesh: Any, mesh_dim: int) -> torch.Tensor:
    if self.reduce_op == "sum" and not (tensor.is_floating_point() or tensor.is_complex()):
        return _keep_on_first(tensor, mesh_coordinate(mesh, mesh_dim))
    return _upstream_partition[0](self, tensor, mesh, mesh_dim)


def _apply_exact_partition() -> None:
    _upstream_partition.append(swap_partial_partition(_exact_partition))
    ExactIntegerPartial.active = True  # dispatch's greedy choice may now move an integer R -> P(sum)


def _restore_exact_partition() -> None:
    swap_partial_partition(_upstream_partition.pop())
    ExactIntegerPartial.active = False


register(Patch(
    name="exact_int_partition",
    apply=_apply_exact_partition,
    restore=_restore_exact_partition,
    changes="Partial._partition_value (Replicate -> Partial(sum)): integer and bool tensors keep the "
    "value on mesh coordinate 0 and zeros elsewhere; floating tensors keep upstream's v / n",
    reason="upstream's v / n is a float for an integer tensor: scatter_add of an int64 self fails on "
    "the dtype, other ops silently promote",
    upstream="defect: Partial._partition_value (Replicate -> Partial(sum)) divides by the mesh size, so an "
    "integer or bool tensor comes back floating (checked: torch 2.13.0, 2.14.1)",
    required=True,
))
