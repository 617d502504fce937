"""``op(..., out=o)`` where no strategy of the op's rule writes its result laid out like ``o``.

Dispatch never redistributes an ``out=`` tensor, so every strategy must produce the result in
``o``'s layout. A full-mesh strategy of a single-dim rule is one row per mesh dim (the
all-Replicate row always among them), so that is possible only where, on every mesh dim, ``o``'s
placement is one some row gives that output (a placeholder stands for any shard of its dim,
strided included: upstream fills it with the shard types the inputs hold).
:func:`check_out_layouts` decides this from the rule's rows and the ``out=`` tensors' placements
before any expansion; :func:`unwritable_out_error` is the error it raises, also raised when the
expansion leaves nothing for an ``out=`` call (e.g. no such layout fits the shapes).
``cumsum(x, d, out=o)`` with ``o`` sharded on the scan dim needs a carry across ranks: no row.

The error is an :class:`OutLayoutError`; the ``cache_miss_hook`` patch re-raises it as is rather
than inside DTensor's "Sharding propagation failed" wrapper.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.distributed.tensor.placement_types import Placement, Replicate, Shard

from dtensor_rules._upstream import OpSchema, OpStrategy, ShardingPlaceholder, StridedShard

__all__ = ["OutLayout", "OutLayoutError", "check_out_layouts", "out_layouts", "unwritable_out_error"]

OutLayout = tuple[int, tuple[Placement, ...]]  # (output index, the out= tensor's placements)


class OutLayoutError(RuntimeError):
    """An ``out=`` DTensor laid out as no strategy of the op's rule writes the result."""


def out_layouts(op: Any, op_schema: OpSchema) -> list[OutLayout]:
    """Each ``out=`` DTensor of a call holding one layout, in keyword order: the output it
    receives (schema order of the out arguments) and its placements."""
    names = [a.name for a in op._schema.arguments if a.is_out]
    if not names:
        return []
    return [
        (names.index(name), tuple(value.strategies[0].output_spec.placements))
        for name, value in op_schema.kwargs_schema.items()
        if name in names and isinstance(value, OpStrategy) and len(value.strategies) == 1
    ]


def _writes(row_placement: Any, placement: Placement) -> bool:
    """Whether a row's output placement can be ``placement`` (a placeholder: any shard of its dim)."""
    if isinstance(row_placement, ShardingPlaceholder):
        return isinstance(placement, (Shard, StridedShard)) and placement.dim == row_placement.dim
    return row_placement is not None and row_placement == placement


def check_out_layouts(op: Any, outs: Sequence[OutLayout], rows: Sequence[Sequence[Any]]) -> None:
    """Raise :func:`unwritable_out_error` if some ``out=`` tensor holds, on some mesh dim, a
    placement no row gives its output (Replicate always can be)."""
    for index, placements in outs:
        for p in placements:
            if not isinstance(p, Replicate) and not any(len(r) > index and _writes(r[index], p) for r in rows):
                raise unwritable_out_error(op, outs, rows)


def unwritable_out_error(op: Any, outs: Sequence[OutLayout], rows: Sequence[Sequence[Any]]) -> OutLayoutError:
    """The error naming the ``out=`` layout, the layouts the rule's result can take per mesh dim, and the fix."""
    offered = ", ".join(sorted({"R"} | {f"S({r[0].dim})" if hasattr(r[0], "dim") else str(r[0]) for r in rows}))
    layout = ", ".join(str(placements) for _, placements in outs)
    return OutLayoutError(
        f"{op}: no strategy of its rule writes an output laid out like the out= DTensor ({layout}); per mesh dim "
        f"the result can be one of [{offered}]. Pass an out= DTensor with such a layout, or call the functional op "
        f"and redistribute its result."
    )
