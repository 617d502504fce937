"""``sort`` / ``argsort`` of routed expert ids: token order -> the unaligned layout (design §5.3).

========================================  ====================================  ==========================
input (ep mesh dim; other mesh dims R)     output (values, indices)              why it is valid
========================================  ====================================  ==========================
routed ids ``(T*k,)`` ``RU`` in token      ``RU``, ``RU``; indices are GLOBAL    the global stable sort of
order (``ragged.route``), ``dim=0``,       flat positions (local + the rank's    the token-major ids orders
``stable=True``, ascending                 first token-major row)                rows partition-major and,
                                                                                 inside an expert, by
                                                                                 position, i.e. sender-
                                                                                 minor: restricted to rank
                                                                                 ``s`` it is ``s``'s local
                                                                                 stable sort, which is the
                                                                                 ``RU`` order of its rows
========================================  ====================================  ==========================

Refused (:class:`RaggedPlacementError`, naming the fix): ``stable=False`` (ties may reorder, so the
restriction argument fails), ``descending=True`` (the layout is ascending by expert), a sort
over another dim (that is row-preserving: not a layout change, and ids are 1-D), and ids already
in the layout's order (no token order left to sort from; sorting them again would only be right
if their values were their partition numbers, which a rule cannot see). ``argsort`` without
``stable=True`` reaches ``sort.default`` and is refused the same way. Ids have no gradient.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

from dtensor_rules.ragged.rulekit import ragged_operand, refuse, wrap
from dtensor_rules.ragged.table import ragged_rule

__all__ = ["ragged_sort"]

aten = torch.ops.aten

_FIX = ("Sort routed ids with torch.sort(ids, stable=True) / torch.argsort(ids, stable=True) on the ids "
        "dtensor_rules.ragged.route returned (token order, RaggedShard unaligned)")


@ragged_rule(aten.sort.default, aten.sort.stable, aten.argsort.default, aten.argsort.stable)
def ragged_sort(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """The table above: a local stable sort; indices translated to global flat positions."""
    names = ("self", "stable", "dim", "descending") if op in (aten.sort.stable, aten.argsort.stable) else (
        "self", "dim", "descending")
    bound = dict(zip(names, args)) | kwargs
    x: DTensor = bound["self"]
    stable = bool(bound.get("stable") or False)
    dim, descending = bound.get("dim", -1), bool(bound.get("descending", False))
    r = ragged_operand(op, x)
    if x.dim() != 1 or dim not in (0, -1):
        raise refuse(op, [x], "only 1-D routed ids sort into the ragged layout", _FIX)
    if not stable or descending:
        raise refuse(op, [x], "only an ascending stable sort restricts to each rank's local sort", _FIX)
    if r.ctx is None or r.ctx.row_offset is None:
        raise refuse(op, [x], "these rows are already in the ragged layout's order (not token order)", _FIX)
    if any(not p.is_replicate() for i, p in enumerate(x.placements) if i != r.mesh_dim):
        raise refuse(op, [x], "the ids must be Replicate on every mesh dim but the ragged one", _FIX)
    values, local_idx = torch.sort(x.to_local(), stable=True)
    idx = local_idx + r.ctx.row_offset.to(local_idx.device)
    ctx = r.ctx._replace(row_offset=None)
    placements = x.placements
    out_idx = wrap(idx, x.device_mesh, placements, x.shape, torch.int64, ctx)
    if op in (aten.argsort.default, aten.argsort.stable):
        return out_idx
    return wrap(values, x.device_mesh, placements, x.shape, x.dtype, ctx), out_idx
