"""``expand`` of a ragged tensor: a view whose size argument is global (the lift rule cannot localise it).

Upstream localises a view's size argument with even ``Shard`` chunks; a ragged dim has data-dependent
local lengths. ``expand`` never changes a dim of size > 1, so every sharded dim (ragged or ``Shard``)
keeps its local length: the rule passes ``-1`` for it (keep), expands the rest locally, and shifts
placements by the new leading dims. A sharded dim of global size 1 that is expanded is refused (its
rows would be repeated across ranks). Reached in backward (``index_add``'s source gradient is
``grad.index_select(...).expand_as(source)``) and by user broadcasts.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Shard

from dtensor_rules.ragged.placement import RaggedShard, is_ragged
from dtensor_rules.ragged.rulekit import ragged_operand, refuse, wrap
from dtensor_rules.ragged.table import ragged_rule

__all__ = ["ragged_expand"]

aten = torch.ops.aten


@ragged_rule(aten.expand.default)
def ragged_expand(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DTensor:
    """Expand locally with every sharded dim kept (module docstring)."""
    x, size = args[0], list(args[1] if len(args) > 1 else kwargs["size"])
    r = ragged_operand(op, x)
    off = len(size) - x.dim()
    sharded = {p.dim for p in x.placements if isinstance(p, Shard)}
    local_size = list(size)
    for d in sharded:
        if size[d + off] not in (-1, x.shape[d]):
            raise refuse(op, [x], f"dim {d} is sharded and would be expanded to {size[d + off]}",
                         "Expand before sharding, or gather the tensor first (dtensor_rules.ragged.gather)")
        local_size[d + off] = -1
    out_shape = [x.shape[i - off] if s == -1 else s for i, s in enumerate(size)]
    placements = [RaggedShard(p.dim + off, p.num_partitions, p.aligned) if is_ragged(p)
                  else Shard(p.dim + off) if isinstance(p, Shard) else p for p in x.placements]
    return wrap(x.to_local().expand(local_size), x.device_mesh, placements, out_shape, x.dtype, r.ctx)
