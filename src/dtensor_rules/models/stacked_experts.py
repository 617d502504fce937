"""Experts held as a ``ModuleList`` (one SwiGLU module per expert, Mixtral-style) stacked for ``expert_parallel``.

``expert_parallel`` places each routed-expert weight as ONE (E, ., .) tensor split over ep by its
expert dim, so a block whose experts are E separate modules has nothing to place. :func:`stack_experts`
replaces that ``ModuleList`` in place by a :class:`StackedExperts`: three parameters holding the
experts' ``nn.Linear`` weights stacked in their own layout (``"EHD"``: ``w1``/``w3`` (E, H, D),
``w2`` (E, D, H), as ``Linear.weight`` is (out, in)), which an
:class:`~dtensor_rules.ep.adapters.EPAdapter` reports and ``expert_parallel`` distributes.
Each expert must compute ``w2(silu(w1(x)) * w3(x))`` with bias-free Linears (what
:meth:`StackedExperts.local_experts` computes); anything else is refused naming the Linear. The
stacked module has no per-expert forward: call it from an adapter, so ``expert_parallel`` installs
the all-to-all region in the block's expert loop right after. Parameter names change
(``experts.0.w1.weight`` becomes ``experts.w1[0]``): load a checkpoint before stacking.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from dtensor_rules.ep.adapters import ExpertWeights
from dtensor_rules.models.moe import check_compiled_gmm_dtype

__all__ = ["StackedExperts", "stack_experts"]


class StackedExperts(nn.Module):
    """E SwiGLU experts as three stacked parameters, layout ``"EHD"`` (the module docstring)."""

    def __init__(self, experts: Sequence[nn.Module], w1: str = "w1", w3: str = "w3", w2: str = "w2") -> None:
        super().__init__()
        for mine, theirs in (("w1", w1), ("w3", w3), ("w2", w2)):
            linears = [getattr(e, theirs, None) for e in experts]
            for i, lin in enumerate(linears):
                if not isinstance(lin, nn.Linear) or lin.bias is not None:
                    got = "a Linear with a bias" if isinstance(lin, nn.Linear) else type(lin).__name__
                    raise TypeError(f"stack_experts: expert {i}'s {theirs!r} must be a bias-free nn.Linear, got {got}; "
                                    "name its SwiGLU Linears with w1=, w3=, w2= (gate, up, down)")
            weights = [lin.weight for lin in linears]
            stacked = torch.stack([w.detach() for w in weights])
            setattr(self, mine, nn.Parameter(stacked, requires_grad=weights[0].requires_grad))

    def weights(self) -> ExpertWeights:
        return ExpertWeights(self.w1, self.w3, self.w2, "EHD")

    @staticmethod
    def local_experts(x_grouped: torch.Tensor, offs: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                      w2: torch.Tensor) -> torch.Tensor:
        """``w2(silu(w1 x) * w3 x)`` per expert group on this rank's local weights: an adapter's ``local_experts``."""
        check_compiled_gmm_dtype(x_grouped.dtype)
        h = F.silu(torch._grouped_mm(x_grouped, w1.transpose(-2, -1), offs=offs))
        h = h * torch._grouped_mm(x_grouped, w3.transpose(-2, -1), offs=offs)
        return torch._grouped_mm(h, w2.transpose(-2, -1), offs=offs)


def stack_experts(module: nn.Module, name: str = "experts", w1: str = "w1", w3: str = "w3",
                  w2: str = "w2") -> StackedExperts:
    """Replace ``module.<name>`` (a ``ModuleList`` of SwiGLU experts) by a :class:`StackedExperts`, in place."""
    experts = module.get_submodule(name)
    if isinstance(experts, StackedExperts):
        return experts
    if not isinstance(experts, nn.ModuleList):
        raise TypeError(f"stack_experts: {type(module).__qualname__}.{name} is a {type(experts).__name__}, "
                        "not an nn.ModuleList of experts")
    stacked = StackedExperts(experts, w1, w3, w2)
    owner, _, attr = name.rpartition(".")
    setattr(module.get_submodule(owner), attr, stacked)
    return stacked
