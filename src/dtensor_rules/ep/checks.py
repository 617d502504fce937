"""What :func:`~dtensor_rules.ep.expert_parallel` refuses, each with one line naming the fix.

- an adapter whose ``experts()`` are not three stacked (E, ., .) tensors (experts in a ``ModuleList``:
  ``stacked_experts.stack_experts`` stacks them);
- a block already distributed (``expert_parallel`` applied twice, or after ``shard_moe``): its
  parameters are DTensors, and distributing them again would leave a block whose next forward mixes
  plain tensors and DTensors;
- a mesh whose dim names are not the ep (and optional tp) dims;
- tokens that are not a DTensor (every parameter is one after ``expert_parallel``, so plain tokens
  fail in the first matmul with upstream's "mixed torch.Tensor and DTensor"), or of another dtype
  than the router's weight (upstream: "expected m1 and m2 to have the same dtype"). A forward
  pre-hook checks them before the block runs; not while compiling (a traced check would only add guards,
  and compiled code meets the same errors), and the dtype not under autocast, which casts for the matmul.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from dtensor_rules.ep.adapters import EPAdapter, ExpertWeights

__all__ = ["check_block", "mesh_name_error", "check_tokens_before_forward"]


def check_block(module: nn.Module, adapter: EPAdapter) -> None:
    """TypeError unless the adapter's experts are three (E, ., .) tensors; ValueError if any tensor
    ``adapter.roles()`` names is a DTensor already."""
    experts = adapter.experts()
    if not isinstance(experts, ExpertWeights) or any(not isinstance(w, torch.Tensor) or w.ndim != 3
                                                     for w in experts[:3]):
        got = type(experts).__name__ if not isinstance(experts, ExpertWeights) else \
            [type(w).__name__ if not isinstance(w, torch.Tensor) else f"{w.ndim}-D tensor" for w in experts[:3]]
        raise TypeError(
            f"the adapter's experts() must be ExpertWeights(w1, w3, w2, layout) of three (E, ., .) tensors, got {got}; "
            "experts held as an nn.ModuleList: stack them with dtensor_rules.models.stacked_experts.stack_experts "
            "(docs/expert_parallel.md, 'Any MoE module')"
        )
    for name in adapter.roles():
        owner_name, _, attr = name.rpartition(".")
        t = getattr(module.get_submodule(owner_name), attr, None)
        if isinstance(t, DTensor):
            raise ValueError(
                f"{type(module).__qualname__} is already expert parallel (or distributed: its {name} is a DTensor "
                f"{t.placements}); expert_parallel distributes a block once, in place: call it on the unparallelized "
                "block (e.g. a copy.deepcopy taken before)"
            )


def mesh_name_error(mesh: DeviceMesh, ep_dim: str, tp_dim: str | None) -> ValueError:
    """The error for a mesh whose dims are not ``ep_dim`` and optionally ``tp_dim``."""
    names = tuple(mesh.mesh_dim_names or ())
    wanted = f"{ep_dim!r}" + (f" and optionally {tp_dim!r}" if tp_dim is not None else "")
    if ep_dim not in names:
        fix = (f"no dim is named {ep_dim!r}: name the expert-parallel dim so (init_device_mesh(..., mesh_dim_names=...)) "
               "or pass ep_dim=<its name>")
    else:
        extra = tuple(n for n in names if n not in (ep_dim, tp_dim))
        sub = tuple(n for n in names if n in (ep_dim, tp_dim))
        index = repr(sub[0]) if len(sub) == 1 else ", ".join(map(repr, sub))
        fix = (f"{', '.join(map(repr, extra))} {'is not an expert-parallel dim' if len(extra) == 1 else 'are not expert-parallel dims'}: "
               f"pass the submesh mesh[{index}] (with FSDP2 give the other dims to fully_shard), or ep_dims=(...) to "
               "let EP borrow dims of a data-parallel mesh (torchtitan's model)")
    return ValueError(f"expert_parallel needs a mesh whose dims are {wanted}, got dims {names}; {fix}")


def _check_tokens(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], *, router_weight: str | None,
                  placements: str) -> None:
    if torch.compiler.is_compiling():
        return
    x = args[0] if args else next(iter(kwargs.values()), None)
    if not isinstance(x, DTensor):
        raise TypeError(
            f"{type(module).__qualname__} is expert parallel: its tokens must be a DTensor, got {type(x).__name__}; "
            f"distribute them with distribute_tensor(x, mesh, {placements}) on the mesh given to expert_parallel"
        )
    if router_weight is None or torch.is_autocast_enabled(x.device.type):
        return
    w = module.get_parameter(router_weight)
    if x.dtype != w.dtype:
        raise TypeError(
            f"the tokens are {x.dtype} but {type(module).__qualname__}'s router weight {router_weight} is {w.dtype}: "
            f"pass {w.dtype} tokens (x.to({w.dtype})), or convert the block before expert_parallel"
        )


def check_tokens_before_forward(module: nn.Module, adapter: EPAdapter, placements: str) -> None:
    """Register the token check (module docstring) as a forward pre-hook; ``placements`` is the call to name."""
    params = dict(module.named_parameters())
    router_weight = next((n for n, role in adapter.roles().items() if role == "replicate" and n in params), None)
    module.register_forward_pre_hook(
        functools.partial(_check_tokens, router_weight=router_weight, placements=placements), with_kwargs=True)
