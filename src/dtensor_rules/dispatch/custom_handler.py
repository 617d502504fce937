"""DTensor dispatch for ops whose output SHAPE depends on data (``bincount``), driven by our rule.

DTensor computes an op's output metadata with fake tensors before it consults any rule;
for a data-dependent shape that raises ``DynamicOutputShapeException``, so the op cannot
run at all. Upstream's extension point for ops needing custom dispatch is
``DTensor._op_dispatcher._custom_op_handlers`` (``aten.convolution``, ``aten.is_same_size``,
``argmax`` use it); :func:`rule_dispatch` is such a handler, installed by
``dtensor_rules.install()`` for rules registered with ``handler=``. It:

1. expands our single-dim rule to the mesh with ``expand_to_full_mesh_op_strategy`` (the
   same expansion dispatch uses, ``out=`` filtering included) and picks the cheapest
   strategy with upstream's ``select_min_cost_strategy``; the choice is cached on (op, rule,
   input specs, non-tensor arguments) as DTensor caches its own propagation, so a repeated
   call costs a dict lookup;
2. redistributes the inputs to it (an ``out=`` tensor is never redistributed: the
   expansion only offers strategies whose output is laid out like it);
3. runs the op on the local tensors and wraps the result with the strategy's output
   placements and the LOCAL result's shape as the global one.

Step 3 is only right when no output is sharded (every rank holds a full-size result or a
Partial of it), so the handler refuses a strategy with a Shard output instead of guessing.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor import DTensor
from dtensor_rules._upstream import (
    DTensorSpec,
    expand_to_mesh,
    local_tensor,
    OpSchema,
    OpSpec,
    OpStrategy,
    select_min_cost_strategy,
    set_spec,
    ShardingPlaceholder,
    spec_of,
    TensorMeta,
)
from torch.distributed.tensor.placement_types import Replicate, Shard
from torch.utils import _pytree as pytree

__all__ = ["rule_dispatch"]


def _out_arg_names(op: OpOverload) -> list[str]:
    return [a.name for a in op._schema.arguments if a.is_out]


def _functional(op: OpOverload) -> OpOverload:
    """``bincount.out`` -> ``bincount.default``: the same arguments without the out= ones."""
    want = [(a.name, str(a.type)) for a in op._schema.arguments if not a.is_out]
    for name in op.overloadpacket.overloads():
        cand = getattr(op.overloadpacket, name)
        if [(a.name, str(a.type)) for a in cand._schema.arguments] == want:
            return cand
    raise RuntimeError(f"{op}: no functional overload to compute the result with")


_CHOICES: dict[Hashable, OpSpec] = {}
_MAX_CHOICES = 4096


def _cache_key(op_call: OpOverload, rule: Any, leaves: list[Any], dtensors: list[DTensor], kwargs: dict[str, object]) -> Hashable | None:
    """What the chosen strategy depends on: op, rule, every DTensor's spec (placements, shape,
    stride, dtype), every non-tensor argument; None (do not cache) if any is unhashable (SymInt)."""
    key = (op_call, rule.strategy, tuple(spec_of(d) for d in dtensors), tuple(kwargs),
           tuple(None if isinstance(x, torch.Tensor) else (type(x), x) for x in leaves))
    try:
        hash(key)
    except TypeError:
        return None
    return key


def _choose(op_call: OpOverload, rule: Any, mesh: Any, leaves: list[Any], dtensors: list[DTensor],
            kwargs: dict[str, object], swap: Any) -> OpSpec:
    """The cheapest full-mesh strategy of our rule for these inputs, cached like DTensor's propagation."""
    key = _cache_key(op_call, rule, leaves, dtensors, kwargs)
    if key is not None and key in _CHOICES:
        return _CHOICES[key]
    from dtensor_rules import registry

    n_out = sum(1 for r in op_call._schema.returns if "Tensor" in str(r.type))
    meta_args, meta_kwargs = swap(lambda d: spec_of(d).tensor_meta)
    rows = registry._checked_single_dim(rule)(op_call, meta_args, meta_kwargs)
    rows = [[Shard(p.dim) if isinstance(p, ShardingPlaceholder) else p for p in r] for r in rows]
    rows.insert(0, [Replicate()] * (n_out + len(dtensors)))
    s_args, s_kwargs = swap(lambda d: OpStrategy([OpSpec(spec_of(d))]))
    strategy = expand_to_mesh(
        mesh,
        OpSchema(op_call, tuple(s_args), s_kwargs),
        rows,
        input_index=n_out,
        allow_uneven_sharding=rule.allow_uneven_sharding,
    )
    if not strategy.strategies:
        outs = [f"{k}={tuple(v.placements)}" for k, v in kwargs.items() if k in _out_arg_names(op_call)]
        offered = sorted({str(r[0]) for r in rows})
        raise RuntimeError(
            f"{op_call}: its rule offers no output laid out like the out= tensor ({', '.join(outs)}); "
            f"pass an out= DTensor laid out as the result can be (per mesh dim one of {offered}), "
            "or call the functional op"
        )
    chosen = select_min_cost_strategy(strategy)
    if key is not None:
        if len(_CHOICES) >= _MAX_CHOICES:
            _CHOICES.clear()
        _CHOICES[key] = chosen
    return chosen


def rule_dispatch(op_call: OpOverload, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
    """Run ``op_call`` on DTensors through our registered single-dim rule (see module docstring)."""
    from dtensor_rules import registry

    rule = registry.get_rule(op_call)
    if rule.kind != "single_dim":
        raise registry.RuleError(f"rule_dispatch needs a single-dim rule; {op_call} has a {rule.kind} rule")
    leaves, tree = pytree.tree_flatten((args, kwargs))
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    dtensors = [x for x in tensors if isinstance(x, DTensor)]
    if len(dtensors) != len(tensors):
        raise RuntimeError(
            f"{op_call}: got a mix of DTensor and plain torch.Tensor arguments; "
            "make every tensor argument a DTensor (e.g. distribute_tensor(t, mesh, [Replicate()]))"
        )
    mesh = dtensors[0].device_mesh
    if any(d.device_mesh != mesh for d in dtensors):
        raise RuntimeError(f"{op_call}: all DTensor arguments must be on the same DeviceMesh")

    def swap(fn: Any) -> tuple[Any, Any]:
        return pytree.tree_unflatten([fn(x) if isinstance(x, DTensor) else x for x in leaves], tree)

    chosen = _choose(op_call, rule, mesh, leaves, dtensors, kwargs, swap)
    out_spec = chosen.output_spec
    if any(isinstance(p, Shard) for p in out_spec.placements):
        raise RuntimeError(f"{op_call}: rule_dispatch cannot size a sharded output ({out_spec.placements})")

    out_names = set(_out_arg_names(op_call))
    targets = iter(chosen.input_specs)
    out_tensors = [v for k, v in kwargs.items() if k in out_names]

    def local(d: DTensor) -> torch.Tensor:
        target = next(targets)
        if any(d is o for o in out_tensors):
            return local_tensor(d)  # written into, never redistributed
        if tuple(d.placements) != tuple(target.placements):
            d = d.redistribute(mesh, target.placements)
        return local_tensor(d)

    local_args, local_kwargs = swap(local)
    if not out_tensors:
        result = op_call(*local_args, **local_kwargs)
    else:
        # compute functionally, then write into out's local tensor: a DTensor (and the wrapper
        # around a simulated rank's tensor) cannot be resized, so the shape must already match
        result = _functional(op_call)(*local_args, **{k: v for k, v in local_kwargs.items() if k not in out_names})
        (out,) = out_tensors  # bincount.out / histc.out have one out= tensor
        if tuple(out.shape) != tuple(result.shape) or out.dtype != result.dtype:
            raise RuntimeError(
                f"{op_call}: the out= DTensor is {out.dtype}{list(out.shape)} but the result is "
                f"{result.dtype}{list(result.shape)}; a DTensor out= tensor cannot be resized, pass one like the result"
            )
        local_tensor(out).copy_(result)
    spec = DTensorSpec(
        mesh, tuple(out_spec.placements), tensor_meta=TensorMeta(result.shape, result.stride(), result.dtype)
    )
    if out_tensors:
        set_spec(out, spec)
        return out
    return DTensor(result, spec, requires_grad=False)
