"""The optional load-balancing loss for an MoE block whose router is its own module (torchtitan's).

torchtitan 0.3.0's ``MoE`` has no auxiliary loss (only the auxiliary-loss-free ``expert_bias_E``
step), but its ``TokenChoiceTopKRouter`` returns what the loss reads: ``(topk_scores_BLK,
topk_expert_ids_BLK, scores_BLE)``. :func:`add_balance_loss` hooks that router (forward hooks
only: torchtitan's code runs unchanged) and leaves :func:`~dtensor_rules.models.routing.balance_loss`
of those scores and ids in ``module.aux_loss`` after each forward, as ``MoEConfig(balance_loss=...)``
does for the package's own ``MoE``. Under ``expert_parallel`` the router runs on token-sharded
DTensors, so the loss is the global one on every rank (docs/expert_parallel.md).

The hooks read the modules they are called with (no closure over the block), so a
``copy.deepcopy`` of a hooked block computes its own loss.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from dtensor_rules.models.routing import balance_loss

__all__ = ["add_balance_loss", "BalanceLossHooks"]

_STASH = "_dtensor_rules_aux_loss"  # the router's last loss, until the block's hook takes it


class BalanceLossHooks(NamedTuple):
    """The two hooks :func:`add_balance_loss` registered; ``remove()`` turns the loss off."""

    router: RemovableHandle
    block: RemovableHandle

    def remove(self) -> None:
        self.router.remove()
        self.block.remove()


def add_balance_loss(module: nn.Module, mode: Literal["sequence", "batch"], alpha: float = 1e-4) -> BalanceLossHooks:
    """Give ``module`` (torchtitan's ``MoE``, or any block with a ``router`` submodule returning
    ``(topk_scores, topk_ids, scores)``) the load-balancing loss in ``module.aux_loss``.

    ``mode="sequence"``: DeepSeek-V3's sequence-wise loss, each row of the (B, L, D) input one
    sequence; ``"batch"``: the whole batch as one (Switch Transformer). ``alpha`` weights it.
    Add ``module.aux_loss`` to the training loss; its gradient reaches the router gate only.
    """
    from dtensor_rules.models.moe import MoE

    if mode not in ("sequence", "batch"):
        raise ValueError(f"add_balance_loss: mode={mode!r}: use 'sequence' or 'batch'")
    if isinstance(module, MoE):
        raise TypeError("the package's own MoE has the loss built in: MoEConfig(balance_loss=..., balance_alpha=...)")
    router = getattr(module, "router", None)
    if not isinstance(router, nn.Module):
        raise TypeError(f"add_balance_loss needs a block with a `router` submodule returning (topk_scores, topk_ids, "
                        f"scores), as torchtitan's MoE has; {type(module).__qualname__} has none")

    def on_router(router: nn.Module, args: tuple, output: tuple) -> None:
        x = args[0]
        _, ids, scores = output
        E, k = scores.shape[-1], ids.shape[-1]
        seq_len = x.shape[-2] if mode == "sequence" and x.ndim >= 3 else None
        setattr(router, _STASH, balance_loss(scores.reshape(-1, E), ids.reshape(-1, k), alpha, seq_len))

    def on_block(block: nn.Module, args: tuple, output: torch.Tensor) -> None:
        block.aux_loss = block.router.__dict__.pop(_STASH, None)

    module.aux_loss = None
    return BalanceLossHooks(router.register_forward_hook(on_router), module.register_forward_hook(on_block))
