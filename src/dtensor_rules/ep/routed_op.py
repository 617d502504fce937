"""The routed experts of :class:`~dtensor_rules.models.moe.MoE` as one op node, for solvers.

``moe.routed_region = routed_experts_as_op`` makes the block call ``dtensor_rules::routed_experts``
(``ep/routed_experts_op.py``) instead of its aten pipeline: the same outputs and
gradients on one device, and one node (forward) plus one (backward) in a traced training
step, whose DTensor rule offers expert parallelism as a row (``ep/routed_experts_rule.py``). A
solver that reads DTensor strategies then chooses between data, tensor and expert parallelism
for the experts like for any other op (docs/solver.md "Expert parallelism from strategies").
"""

from __future__ import annotations

import torch

from dtensor_rules.ep.routed_experts_op import routed_experts_op
from dtensor_rules.models.moe import MoE

__all__ = ["routed_experts_as_op"]


def routed_experts_as_op(moe: MoE, x2: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``MoE.routed_experts``'s result, computed by the one routed-experts op (a ``routed_region``)."""
    c = moe.config
    return routed_experts_op(x2, idx, weights, moe.w1, moe.w3, moe.w2, c.n_experts,
                             moe.alignment(c.gmm_dtype or x2.dtype), c.gmm_dtype)
