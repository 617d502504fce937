"""The protocol :func:`~dtensor_rules.ep.expert_parallel` reads an MoE module through.

``expert_parallel`` needs five things from a block, whatever its attribute names:

1. the three routed-expert weights (gate ``w1``, up ``w3``, down ``w2``) and their layout:
   ``"EDH"`` (``w1/w3`` (E, D, H), ``w2`` (E, H, D), this package's ``MoE``) or ``"EHD"``
   (``w1/w3`` (E, H, D), ``w2`` (E, D, H), torchtitan's ``w1_EFD``/``w2_EDF``);
2. every other parameter and buffer by role (:data:`Role`): replicated (router), colwise
   or rowwise Linear weight (shared expert), or a per-rank counter;
3. how the experts compute: the per-rank expert math on local tensors (the block's own, so
   casts round where its single-device run does), the group alignment and the combine's
   summation dtype;
4. the seam where the block calls its routed experts with the tokens and the router's top-k
   expert ids and weights: :meth:`EPAdapter.install` replaces what runs there by the
   all-to-all region;
5. the sizes ``n_experts`` and ``hidden`` (to check the mesh divides them).

Built in: :class:`OwnMoEAdapter` (``dtensor_rules.models.MoE``) and
:class:`TorchtitanMoEAdapter` (torchtitan 0.3.0's ``torchtitan.models.common.moe.MoE``, the
DeepSeek-V3 block; torchtitan is not imported here, the class is recognised by name). For
another block, write an object with these members (``typing.Protocol``: no base class) and
pass it as ``expert_parallel(module, mesh, adapter=...)``, or give the module a method
``ep_adapter() -> EPAdapter``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["Role", "ExpertWeights", "Region", "EPAdapter", "OwnMoEAdapter", "TorchtitanMoEAdapter", "adapter_for",
           "resolve_adapter"]

# "expert_in": w1/w3, "expert_out": w2 (placements follow ExpertWeights.layout);
# "replicate": every rank the same (router gate, biases); "colwise"/"rowwise": a Linear
# weight (out, in) split over tp on out/in; "counter": a buffer each rank adds its own
# tokens' counts to (Partial on ep: its sum over ep ranks is the global count)
Role = Literal["expert_in", "expert_out", "replicate", "colwise", "rowwise", "counter"]

# region(x (..., D), idx (..., k) int64, weights (..., k)) -> (..., D), all DTensors with the
# tokens Shard(0) on ep; what the block's routed experts must compute
Region = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ExpertWeights(NamedTuple):
    """The routed experts' SwiGLU weights, as the module holds them now, and their layout."""

    w1: torch.Tensor  # gate projection
    w3: torch.Tensor  # up projection
    w2: torch.Tensor  # down projection
    layout: Literal["EDH", "EHD"]


@runtime_checkable
class EPAdapter(Protocol):
    """What ``expert_parallel`` reads from an MoE block (see the module docstring)."""

    module: nn.Module
    n_experts: int
    hidden: int
    gmm_dtype: torch.dtype | None  # None: the experts compute in the tokens' dtype
    sum_dtype_is_input: bool  # True: the combine sums in the tokens' dtype (torchtitan), False: the weights'

    def roles(self) -> dict[str, Role]:
        """Qualified names (``module.get_parameter``/``get_buffer`` paths) -> role; names not listed are left alone."""
        ...

    def experts(self) -> ExpertWeights:
        ...

    def alignment(self, dtype: torch.dtype) -> int:
        """Rows per expert group for ``_grouped_mm`` at ``dtype``."""
        ...

    def local_experts(self, x_grouped: torch.Tensor, offs: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                      w2: torch.Tensor) -> torch.Tensor:
        """This rank's experts on plain tensors: rows grouped per local expert (group ends ``offs``,
        int32, padded rows zero), the LOCAL weights in the module's layout -> (rows, dim).

        The block's own expert math, so casts and accumulation round as its single-device
        forward and backward do."""
        ...

    def install(self, region: Region) -> None:
        """Make the module's forward compute its routed experts with ``region``."""
        ...


# the protocol's data members and methods, in declaration order (for the error naming what is missing)
_PROTOCOL_MEMBERS = (*EPAdapter.__annotations__,
                     *(n for n, v in vars(EPAdapter).items() if callable(v) and not n.startswith("_")))


class OwnMoEAdapter:
    """``dtensor_rules.models.MoE``: layout EDH, routed experts through ``routed_region``."""

    sum_dtype_is_input = False

    def __init__(self, module: nn.Module) -> None:
        c = module.config
        self.module, self.n_experts, self.hidden, self.gmm_dtype = module, c.n_experts, c.hidden, c.gmm_dtype

    def roles(self) -> dict[str, Role]:
        return {"w1": "expert_in", "w3": "expert_in", "w2": "expert_out", "gate": "replicate",
                "shared_w1": "colwise", "shared_w3": "colwise", "shared_w2": "rowwise", "expert_bias": "replicate"}

    def experts(self) -> ExpertWeights:
        m = self.module
        return ExpertWeights(m.w1, m.w3, m.w2, "EDH")

    def alignment(self, dtype: torch.dtype) -> int:
        return self.module.alignment(dtype)

    def local_experts(self, x_grouped, offs, w1, w3, w2):
        from dtensor_rules.ep.local import local_experts

        return local_experts(x_grouped, offs, w1, w3, w2, self.gmm_dtype)

    def install(self, region: Region) -> None:
        self.module.routed_region = lambda _moe, x, idx, weights: region(x, idx, weights)


class TorchtitanMoEAdapter:
    """torchtitan 0.3.0's ``MoE`` (``torchtitan.models.common.moe``, DeepSeek-V3, Qwen3, Llama 4).

    Its ``GroupedExperts`` computes in bf16 with ``w1_EFD``/``w3_EFD`` (E, H, D) and
    ``w2_EDF`` (E, D, H) (layout EHD); its combine casts each expert row to the tokens' dtype,
    weights it in fp32 and ``scatter_add``\\s in the tokens' dtype. The router
    (``TokenChoiceTopKRouter``: softmax or sigmoid, node-limited groups, route norm and scale,
    ``expert_bias_E``) and the shared expert (``FeedForward``) stay torchtitan's own code on
    DTensors; ``routed_experts.forward`` (the ``local_map`` region with its token dispatcher) is
    replaced by the all-to-all region. ``tokens_per_expert_E`` becomes ``Partial`` on ep (each
    rank counts its own tokens, as under torchtitan's EP; reading it sums over ep).
    """

    gmm_dtype = torch.bfloat16
    sum_dtype_is_input = True

    def __init__(self, module: nn.Module) -> None:
        inner = module.routed_experts.inner_experts
        self.module, self.n_experts, self.hidden = module, inner.num_experts, inner.w1_EFD.shape[1]

    def roles(self) -> dict[str, Role]:
        r: dict[str, Role] = {
            "routed_experts.inner_experts.w1_EFD": "expert_in",
            "routed_experts.inner_experts.w3_EFD": "expert_in",
            "routed_experts.inner_experts.w2_EDF": "expert_out",
            "tokens_per_expert_E": "counter",
        }
        r |= {f"router.{n}": "replicate" for n, _ in self.module.router.named_parameters()}
        if self.module.expert_bias_E is not None:
            r["expert_bias_E"] = "replicate"
        if self.module.shared_experts is not None:
            for n, _ in self.module.shared_experts.named_parameters():
                # FeedForward: w1/w3 colwise, w2 rowwise; a bias of a colwise Linear is split with it
                lin, _, kind = n.rpartition(".")
                role: Role = "rowwise" if lin == "w2" else "colwise"
                r[f"shared_experts.{n}"] = "replicate" if (lin == "w2" and kind == "bias") else role
        return r

    def experts(self) -> ExpertWeights:
        inner = self.module.routed_experts.inner_experts
        return ExpertWeights(inner.w1_EFD, inner.w3_EFD, inner.w2_EDF, "EHD")

    def alignment(self, dtype: torch.dtype) -> int:
        from dtensor_rules.models.moe import alignment_for

        return alignment_for(dtype)  # torchtitan's ALIGN_SIZE_M; padding rows change no result

    def local_experts(self, x_grouped, offs, w1, w3, w2):
        """``GroupedExperts.forward``'s math on the local weights, through its ``_grouped_mm`` seam
        (an MXFP8 converter's override applies); one bf16 cast of the tokens per matmul, as there."""
        gmm = self.module.routed_experts.inner_experts._grouped_mm
        h = F.silu(gmm(A=x_grouped.bfloat16(), B_t=w1.bfloat16().transpose(-2, -1), offs=offs))
        h = h * gmm(A=x_grouped.bfloat16(), B_t=w3.bfloat16().transpose(-2, -1), offs=offs)
        return gmm(A=h, B_t=w2.bfloat16().transpose(-2, -1), offs=offs).type_as(x_grouped)

    def install(self, region: Region) -> None:
        def routed(x, topk_scores, topk_ids, _num_local_tokens_per_expert):
            return region(x, topk_ids, topk_scores)

        self.module.routed_experts.forward = routed


def _is_torchtitan_moe(module: nn.Module) -> bool:
    t = type(module)
    return t.__name__ == "MoE" and t.__module__.startswith("torchtitan.") and hasattr(module, "routed_experts")


def resolve_adapter(module: nn.Module, adapter: object | None) -> EPAdapter:
    """``adapter`` checked against the :class:`EPAdapter` protocol, or :func:`adapter_for` ``(module)`` if None.

    A TypeError naming the fix for a class passed instead of an instance, and for an object that
    lacks members of the protocol."""
    if adapter is None:
        return adapter_for(module)
    if isinstance(adapter, type):
        raise TypeError(f"adapter={adapter.__qualname__} is a class: pass an instance, "
                        f"adapter={adapter.__qualname__}(module)")
    if not isinstance(adapter, EPAdapter):
        missing = [m for m in _PROTOCOL_MEMBERS if not hasattr(adapter, m)]
        raise TypeError(f"adapter={type(adapter).__qualname__} lacks {missing} of "
                        "dtensor_rules.ep.adapters.EPAdapter (docs/expert_parallel.md, 'Any MoE module')")
    return adapter


def adapter_for(module: nn.Module) -> EPAdapter:
    """The adapter of a known block: ``module.ep_adapter()``, ours, or torchtitan's; else a TypeError naming the fix."""
    from dtensor_rules.models.moe import MoE

    if hasattr(module, "ep_adapter"):
        return module.ep_adapter()
    if isinstance(module, MoE):
        return OwnMoEAdapter(module)
    if _is_torchtitan_moe(module):
        return TorchtitanMoEAdapter(module)
    raise TypeError(
        f"expert_parallel does not know {type(module).__module__}.{type(module).__qualname__}: pass "
        "adapter=<an object following dtensor_rules.ep.adapters.EPAdapter> (docs/expert_parallel.md, "
        "'Any MoE module'), or give the module an ep_adapter() method"
    )
