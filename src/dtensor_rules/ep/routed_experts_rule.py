"""``dtensor_rules::routed_experts`` and its backward (``ep/routed_experts_op.py``): the rows a solver is offered.

Forward, per mesh dim ([out, x, idx, weights, w1, w3, w2]; ``w1``/``w3`` ``(E, D, H)``, ``w2`` ``(E, H, D)``):

=======  ======  ======  ======  =====  =====  =====  ==============================================
out      x       idx     weights w1     w3     w2     why
=======  ======  ======  ======  =====  =====  =====  ==============================================
R        R       R       R       R      R      R      implied: every rank computes every token
S(0)     S(0)    S(0)    S(0)    R      R      R      data parallel: each token's output is its own
P(sum)   R       R       R       S(2)   S(2)   S(1)   expert TP: SwiGLU is per hidden unit, ``w2``'s
                                                      rowwise product sums the hidden slices
S(0)     S(0)    S(0)    S(0)    S(0)   S(0)   S(0)   EXPERT PARALLEL: each rank owns E/n experts,
                                                      its tokens go to the owners and come back
=======  ======  ======  ======  =====  =====  =====  ==============================================

Backward ([gx, gweights, gw1, gw3, gw2, grad, x, idx, weights, w1, w3, w2]): the same four,
with the gradients laid out as what they are gradients of, except that a replicated
parameter's gradient is ``P(sum)`` under data parallelism (each rank's tokens' part) and the
input gradients are ``P(sum)`` under expert TP (each hidden slice's part).

The first three rows are the op on each rank's shards (the kernel's math holds there).
The expert-parallel row is not: its tokens must travel to the ranks owning their experts,
which ``expert_parallel`` does (the ep group is the mesh dim(s) of this row; several dims: their
flattened group, ``expert_parallel(..., ep_dims=...)``). It is offered so that a solver that
only reads strategies can choose expert parallelism; the kernel refuses to run it on local
shards (one clear error naming ``expert_parallel`` / ``solver.apply_choice``), and
``dtensor_rules.solver.price`` adds its all-to-alls and host sync to its compute
(``ep_exchange_us``), which a plain strategy has no field for. Hence ``gaps``: the validator's
"op on every rank's shards" is the wrong oracle for that row.

Costs (per call at local shapes, expected-uniform routing: a rank receives as many
assignments as it sends): three grouped matmuls on the padded rows (``T*k + E_l*A``),
``6 * rows * D * H_l`` flops forward, twice that backward; bytes: the tokens, the gathered
and padded rows, the hidden activations and the local experts, once each.
"""

from __future__ import annotations

import contextlib
import math
import threading
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.ep.routed_experts_op import routed_experts_backward_op, routed_experts_op
from dtensor_rules.op_rules._common import PlacementOrHole
from dtensor_rules.registry import register

__all__ = ["ROUTED_EXPERTS", "ROUTED_EXPERTS_BACKWARD", "EXPERT_ARGS", "expert_parallel_rows",
           "routed_experts_strategy", "routed_experts_backward_strategy"]

ROUTED_EXPERTS = routed_experts_op._opoverload
ROUTED_EXPERTS_BACKWARD = routed_experts_backward_op._opoverload
# where w1 sits among each op's tensor arguments (the solver finds the expert layout there)
EXPERT_ARGS = {ROUTED_EXPERTS: 3, ROUTED_EXPERTS_BACKWARD: 4}
R, S0, P = Replicate(), Shard(0), Partial("sum")

_GAPS = ("the expert-parallel row is not the op on each rank's shards (tokens travel to the experts' owners: "
         "expert_parallel runs it), so the validator's oracle does not apply to it; "
         "tests/test_routed_experts_op.py runs the other rows on a simulated mesh against one device")


_FORWARD_ROWS = [[S0, S0, S0, S0, R, R, R], [P, R, R, R, Shard(2), Shard(2), Shard(1)], [S0] * 7]
_BACKWARD_ROWS = [
    [S0, S0, P, P, P, S0, S0, S0, S0, R, R, R],
    [P, P, Shard(2), Shard(2), Shard(1), R, R, R, R, Shard(2), Shard(2), Shard(1)],
    [S0] * 12,
]


_offered = threading.local()


@contextlib.contextmanager
def expert_parallel_rows(offered: bool) -> Iterator[None]:
    """Offer (default) or withhold the expert-parallel row, e.g. to price what it adds to a solver's choice."""
    before = getattr(_offered, "value", True)
    _offered.value = offered
    try:
        yield
    finally:
        _offered.value = before


def _rows(rows: list[list[PlacementOrHole]]) -> list[list[PlacementOrHole]]:
    return [list(r) for r in (rows if getattr(_offered, "value", True) else rows[:-1])]


def routed_experts_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """[out, x, idx, weights, w1, w3, w2] per mesh dim (module table)."""
    return _rows(_FORWARD_ROWS)


def routed_experts_backward_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """[gx, gweights, gw1, gw3, gw2, grad, x, idx, weights, w1, w3, w2] per mesh dim (module table)."""
    return _rows(_BACKWARD_ROWS)


def _cost(backward: bool) -> Any:
    def cost(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpCost:
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        x, idx, _weights, w1, w3, w2 = tensors[1:7] if backward else tensors[:6]
        rest = [a for a in args if not isinstance(a, torch.Tensor)] + list(kwargs.values())
        alignment = int(rest[1]) if len(rest) > 1 else 8
        gmm_dtype = rest[2] if len(rest) > 2 and isinstance(rest[2], torch.dtype) else x.dtype
        E_l, D, H_l = int(w1.shape[0]), int(x.shape[-1]), int(w1.shape[-1])
        rows = int(idx.numel()) + E_l * alignment
        b, g = x.element_size(), torch.empty((), dtype=gmm_dtype).element_size()
        flops = 6 * rows * D * H_l
        read = sum(t.numel() * t.element_size() for t in (x, idx, w1, w3, w2)) + 2 * rows * D * g + 3 * rows * H_l * g
        written = rows * D * g + 3 * rows * H_l * g + math.prod(x.shape) * b
        scale = 2 if backward else 1
        return OpCost(scale * flops, scale * read, scale * written, dtype=gmm_dtype, unit="tensor", exact=False,
                      source="rule", note="expected-uniform routing", family="matmul")

    cost.__name__ = "routed_experts_backward_cost" if backward else "routed_experts_cost"
    return cost


register(ROUTED_EXPERTS, cost=_cost(False), gaps=_GAPS, allow_uneven_sharding=False)(routed_experts_strategy)
register(ROUTED_EXPERTS_BACKWARD, cost=_cost(True), gaps=_GAPS, allow_uneven_sharding=False)(
    routed_experts_backward_strategy)
