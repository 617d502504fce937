"""Upstream's masked-partial placement, and ours that is safe to keep, reduce twice or nest.

Upstream answers ``gather`` / ``embedding`` on a table sharded along the looked-up dim with
``_MaskPartial``: the index is moved into each rank's chunk (entries outside it point at 0
and are remembered in a mask buffer shared by the index and output placements), and the
output is masked and summed when it is reduced. The buffer lives in the placement object,
which DTensor's sharding cache hands to every call with the same layouts, and is released
by the first reduction: reducing an output twice (autograd saved it), summing it first
(``out.sum()`` keeps the placement on a scalar) or keeping two outputs of different indices
fails, and a table sharded along the dim on two mesh dims conflicts in the buffer.

:class:`IndexMaskPartial` keeps upstream's type (``isinstance(p, MaskPartial)``) and the meaning
of its strategy columns, but holds no buffer: gather's dispatch (``op_rules/gather_mask.py``) makes
the mask from the table's layout (nested mesh dims included), zeroes the masked results at once, and
the result is then an ordinary ``Partial("sum")`` in value: every rank holds its own lookups
and zeros elsewhere, so it reduces and reduce-scatters exactly like one. Nothing is ever
redistributed INTO it (that would cut an index as a value), so that raises.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Partial, Placement
from torch.distributed.tensor.placement_types import _MaskPartial as MaskPartial

__all__ = ["IndexMaskPartial", "MaskPartial", "assert_async"]


class IndexMaskPartial(MaskPartial):
    """Partial(sum) of lookups into a table sharded on ``offset_dim`` (``offset_shape``: its shape).

    As a strategy column of the index it means "moved into this rank's chunk of the table, the
    entries outside it pointing at 0"; of the output, "those entries' results zeroed". Gather's
    dispatch realises both; as a DTensor's placement the values are already masked.
    Equal by dim alone (no buffer, no sizes): cacheable, and hashable with symbolic sizes.
    """

    def __init__(self, offset_shape: Any = None, offset_dim: int = 0) -> None:
        super().__init__("sum", None, offset_shape, offset_dim)

    def _partition_value(self, tensor: torch.Tensor, mesh: DeviceMesh, mesh_dim: int) -> torch.Tensor:
        """Refused: the only tensor made one is an index, by dispatch, which DTensor's generic
        redistribution would cut as a value (wrong lookups); no rule asks it of a value."""
        raise RuntimeError(
            "a replicated tensor cannot be redistributed to IndexMaskPartial: only dtensor_rules' gather "
            "dispatch lays an index out this way (a full dtensor_rules.install() applies it)"
        )

    # as a value it is Partial("sum") (Partial's methods, looked up at call time)

    def _reduce_value(self, tensor: torch.Tensor, mesh: DeviceMesh, mesh_dim: int) -> torch.Tensor:
        return Partial._reduce_value(self, tensor, mesh, mesh_dim)

    def _reduce_shard_value(
        self, tensor: torch.Tensor, mesh: DeviceMesh, mesh_dim: int, shard_spec: Placement
    ) -> torch.Tensor:
        return Partial._reduce_shard_value(self, tensor, mesh, mesh_dim, shard_spec)

    def __eq__(self, other: object) -> bool:
        return type(other) is IndexMaskPartial and other.offset_dim == self.offset_dim

    def __hash__(self) -> int:
        return hash((IndexMaskPartial, self.offset_dim))

    def __repr__(self) -> str:
        return f"IndexMaskPartial(offset_dim={self.offset_dim})"

    def __str__(self) -> str:
        return f"MaskP(sum, {self.offset_dim})"


def assert_async(cond: torch.Tensor, message: str) -> None:
    """Fail with ``message`` where ``cond`` is False, without a host sync on an accelerator
    (a device-side assert, as torch's own indexing kernels raise an out-of-range index)."""
    torch._assert_async(cond, message)
