"""The optional load-balancing loss for an MoE block whose router is its own module (torchtitan's).

torchtitan 0.3.0's ``MoE`` has no auxiliary loss (only the auxiliary-loss-free ``expert_bias_E``
step), but its ``TokenChoiceTopKRouter`` returns what the loss reads: ``(topk_scores_BLK,
topk_expert_ids_BLK, scores_BLE)``. :func:`add_balance_loss` hooks that router (forward hooks
only: torchtitan's code runs unchanged) and leaves :func:`~dtensor_rules.models.routing.balance_loss`
of those scores and ids in ``module.aux_loss`` after each forward, as ``MoEConfig(balance_loss=...)``
does for the package's own ``MoE``. Under ``expert_parallel`` the router runs on token-sharded
DTensors, so the loss is the global one on every rank (docs/expert_parallel.md).

The hooks read the modules they are called with (no closure over the block), so a
``copy.deepcopy`` of a hooked block computes its own loss. A loss is part of its forward's autograd
graph, which ``deepcopy`` cannot copy (only graph leaves support it), so a hooked block gets an
instance ``__deepcopy__`` that copies it without its last loss (the copy's ``aux_loss`` is None until
its own forward). ``remove()`` clears ``aux_loss``: a loss left from the last hooked forward would
otherwise be added to a later step's loss (a second backward through a freed graph, or a stale
gradient).
"""

from __future__ import annotations

import copy
import functools
from typing import Literal, NamedTuple

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from dtensor_rules.models.routing import balance_loss

__all__ = ["add_balance_loss", "BalanceLossHooks"]

_STASH = "_dtensor_rules_aux_loss"  # the router's last loss, until the block's hook takes it


class BalanceLossHooks(NamedTuple):
    """The two hooks :func:`add_balance_loss` registered; ``remove()`` turns the loss off and clears
    ``module.aux_loss``."""

    router: RemovableHandle
    block: RemovableHandle
    module: nn.Module

    def remove(self) -> None:
        self.router.remove()
        self.block.remove()
        self.module.__dict__.pop("__deepcopy__", None)
        self.module.router.__dict__.pop(_STASH, None)
        self.module.aux_loss = None


def _deepcopy_without_loss(module: nn.Module, memo: dict[int, object]) -> nn.Module:
    """``copy.deepcopy(module)`` with its last loss (and the router's stash) left out of the copy."""
    held = {k: module.__dict__.pop(k) for k in ("__deepcopy__", "aux_loss") if k in module.__dict__}
    stash = module.router.__dict__.pop(_STASH, None)
    try:
        twin = copy.deepcopy(module, memo)
    finally:
        module.__dict__.update(held)
        if stash is not None:
            setattr(module.router, _STASH, stash)
    twin.aux_loss = None
    twin.__deepcopy__ = functools.partial(_deepcopy_without_loss, twin)
    return twin


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

    if "__deepcopy__" in module.__dict__:
        raise ValueError(f"{type(module).__qualname__} already has a balance loss from add_balance_loss: call "
                         "remove() on the hooks it returned before adding another")
    module.aux_loss = None
    # copy.deepcopy looks __deepcopy__ up on the instance: the copy leaves the loss's graph behind
    module.__deepcopy__ = functools.partial(_deepcopy_without_loss, module)
    return BalanceLossHooks(router.register_forward_hook(on_router), module.register_forward_hook(on_block), module)
