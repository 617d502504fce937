"""``bincount`` / ``histc`` of ragged ids and ``cumsum`` on a ragged tensor (design §5.3).

==================================  ============  ===============================================
input (EP mesh dim; others ``R``)   result        why it is valid
==================================  ============  ===============================================
``bincount(ids, minlength=E)``,     ``P(sum)``    each rank counts the rows it holds; the layouts
ids ``RU`` (token or layout         ``(E,)``      split the rows over ranks (every row on exactly
order) or ``RA``                                  one rank), so the pieces sum to the global
                                                  counts. On ``RU`` rank ``s``'s piece is its row
                                                  ``C[s]`` of the routing matrix (the context's
                                                  counts); on ``RA`` the pieces are disjoint
                                                  (zeros outside the rank's experts). Every piece
                                                  must have length ``minlength`` (an id
                                                  ``>= minlength`` raises: the pieces would
                                                  differ in length)
``histc(x, bins, min, max)``,       ``P(sum)``    the same: fixed bin edges, each rank bins its
``min < max``, ``x`` ragged                       own rows
``cumsum(x, d)``, ``d`` not the     ragged        row-preserving: the lift rule
ragged dim
==================================  ============  ===============================================

Refused: ``bincount`` with weights (not needed between router and combine), without a
``minlength`` (piece lengths would be data: the largest id per rank), or on a ragged tensor that
is not Replicate on another mesh dim; ``histc`` with ``min == max`` (edges from each rank's own
data); ``cumsum`` along the ragged dim (a prefix over rows on earlier ranks: the global
positions the block needs are prefix sums of the ``P(sum)`` counts after one all-reduce,
``counts.sum(0).redistribute(..., Replicate).cumsum(0)``, which upstream's rules run).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial

from dtensor_rules._upstream import maybe_run_for_local_tensor
from dtensor_rules.ragged.rulekit import ragged_operand, refuse, wrap
from dtensor_rules.ragged.table import ragged_rule

__all__ = ["ragged_bincount", "ragged_histc", "ragged_cumsum"]

aten = torch.ops.aten

_FIX = ("Count routed ids with ids.bincount(minlength=num_experts) or histc(ids.float(), E, 0, E): the result is "
        "Partial(sum); redistribute it to Replicate (one all-reduce of E ints) for global counts")


@maybe_run_for_local_tensor
def _bincount(ids: torch.Tensor, minlength: int) -> torch.Tensor:
    if ids.numel() and (bool((ids < 0).any()) or bool((ids >= minlength).any())):
        raise ValueError(f"bincount of ragged ids: an id lies outside [0, minlength={minlength}), so the ranks' "
                         "Partial(sum) pieces would differ in length; pass minlength > every id")
    return torch.bincount(ids, minlength=minlength)


def _counted(op: Any, x: DTensor) -> int:
    r = ragged_operand(op, x)
    if any(not p.is_replicate() for i, p in enumerate(x.placements) if i != r.mesh_dim):
        raise refuse(op, [x], "the input must be Replicate on every mesh dim but the ragged one", _FIX)
    return r.mesh_dim


def _partial_out(local: torch.Tensor, x: DTensor, m: int, length: int) -> DTensor:
    placements = [Partial("sum") if i == m else p for i, p in enumerate(x.placements)]
    return wrap(local, x.device_mesh, placements, (length,), local.dtype)


@ragged_rule(aten.bincount.default)
def ragged_bincount(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DTensor:
    """``bincount`` of ragged ids: the table above."""
    b = dict(zip(("self", "weights", "minlength"), args)) | kwargs
    x, weights, minlength = b["self"], b.get("weights"), int(b.get("minlength", 0) or 0)
    if weights is not None:
        raise refuse(op, [x], "weights are not supported", _FIX)
    if minlength < 1 or x.dim() != 1:
        raise refuse(op, [x], "1-D ids and a minlength are needed (each rank's piece must have one length)", _FIX)
    m = _counted(op, x)
    return _partial_out(_bincount(x.to_local(), minlength), x, m, minlength)


@ragged_rule(aten.histc.default)
def ragged_histc(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DTensor:
    """``histc`` of a ragged tensor with fixed edges: the table above."""
    b = dict(zip(("self", "bins", "min", "max"), args)) | kwargs
    x, bins, lo, hi = b["self"], int(b.get("bins", 100)), b.get("min", 0), b.get("max", 0)
    if lo == hi:
        raise refuse(op, [x], "min == max takes the bin edges from each rank's own data", _FIX)
    m = _counted(op, x)
    return _partial_out(torch.histc(x.to_local(), bins, lo, hi), x, m, bins)


@ragged_rule(aten.cumsum.default, aten.cumsum_.default)
def ragged_cumsum(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``cumsum`` over a non-ragged dim is the lift rule's; over the ragged dim it is refused."""
    x = args[0]
    dim = args[1] if len(args) > 1 else kwargs["dim"]
    r = ragged_operand(op, x)
    if dim % max(x.dim(), 1) == r.placement.dim:
        raise refuse(op, [x], "a prefix sum along the ragged dim needs the rows of earlier ranks", _FIX.replace(
            "Count routed ids", "For group ends, count routed ids") + ", then cumsum(0)")
    return NotImplemented
