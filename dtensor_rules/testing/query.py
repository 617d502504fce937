"""Ask a strategy function (ours or upstream's) which shardings it emits for one call.

The answer is a set of combos ``(input_placements, output_placements)``, each an
N-D placement tuple per tensor, produced by the same expansion DTensor uses at
dispatch (``expand_to_full_mesh_op_strategy`` for single-dim rules, the rule itself
for op-strategy rules), so what we validate is what dispatch would choose from.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._op_schema import OpSchema, OpSpec, OpStrategy, RuntimeSchemaInfo, TupleStrategy
from torch.distributed.tensor._ops.single_dim_strategy import _ShardingPlaceholder, _SingleDimStrategyInfo
from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard
from torch.utils import _pytree as pytree

from dtensor_rules.testing.simulate import NDPlacement, Sample

Combo = tuple[tuple[NDPlacement, ...], tuple[NDPlacement, ...]]
PARTIAL_OPS = ("sum", "avg", "max", "min")


def candidate_placements(t: torch.Tensor, partial_ops: Sequence[str] = PARTIAL_OPS) -> list[Placement]:
    """Every 1-D placement a tensor could have: R, S(d) for each dim, P(op) where the dtype allows."""
    out: list[Placement] = [Replicate()] + [Shard(d) for d in range(t.ndim)]
    if t.dtype != torch.bool:
        out += [Partial(op) for op in partial_ops if op != "avg" or t.is_floating_point()]
    return out


def tensor_meta(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(shape=t.shape, stride=t.stride(), dtype=t.dtype)


def _num_outputs(op: OpOverload) -> int:
    return sum(1 for r in op._schema.returns if "Tensor" in str(r.type))


def _schema_with(sample: Sample, per_tensor: Sequence[Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    it = iter(per_tensor)
    return pytree.tree_map(lambda x: next(it) if isinstance(x, torch.Tensor) else x, (sample.args, sample.kwargs))


def _strategy_schema(op: OpOverload, sample: Sample, per_tensor: Sequence[OpStrategy]) -> OpSchema:
    """The OpSchema dispatch would build: tensor lists become TupleStrategy (as in
    ``ShardingPropagator._wrap_with_op_strategy``) and are flattened by ``needs_pytree``."""
    args, kwargs = _schema_with(sample, per_tensor)

    def wrap(x: Any) -> Any:
        if isinstance(x, (list, tuple)) and x and all(isinstance(c, OpStrategy) for c in x):
            return TupleStrategy(list(x))
        return x

    has_list = any(isinstance(a, (list, tuple)) for a in list(args) + list(kwargs.values()))
    if not has_list:
        return OpSchema(op, args, kwargs)
    return OpSchema(
        op,
        tuple(wrap(a) for a in args),
        {k: wrap(v) for k, v in kwargs.items()},
        schema_info=RuntimeSchemaInfo(needs_pytree=True),
    )


def _input_strategies(mesh: DeviceMesh, tensors: Sequence[torch.Tensor], all_candidates: bool) -> list[OpStrategy]:
    strategies = []
    for t in tensors:
        meta = tensor_meta(t)
        if all_candidates:
            per_dim = candidate_placements(t)
            specs = [
                OpSpec(DTensorSpec(mesh, tuple(pl), tensor_meta=meta))
                for pl in itertools.product(per_dim, repeat=mesh.ndim)
                if _no_mixed_partial(pl)
            ]
        else:
            specs = [OpSpec(DTensorSpec(mesh, (Replicate(),) * mesh.ndim, tensor_meta=meta))]
        strategies.append(OpStrategy(specs))
    return strategies


def _no_mixed_partial(pl: Sequence[Placement]) -> bool:
    ops = {p.reduce_op for p in pl if isinstance(p, Partial)}
    return len(ops) <= 1 or ops == {"sum", "avg"}


def _out_meta(op: OpOverload, sample: Sample) -> Any:
    from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            out = op(*sample.args, **sample.kwargs)
    except DynamicOutputShapeException:
        # data-dependent output shape (bincount, nonzero, ...): the sample holds real data
        out = op(*sample.args, **sample.kwargs)
    if isinstance(out, torch.Tensor):
        return tensor_meta(out)
    return tuple(tensor_meta(o) if isinstance(o, torch.Tensor) else None for o in out)


def emitted_combos(kind: str, fn: Any, op: OpOverload, sample: Sample, mesh: DeviceMesh) -> set[Combo]:
    """All (inputs, outputs) placement combos the strategy function offers for ``sample``."""
    tensors = sample.tensors()
    n_out = _num_outputs(op)
    if kind == "single_dim":
        info = fn if isinstance(fn, _SingleDimStrategyInfo) else _SingleDimStrategyInfo(func=fn)
        args_meta, kwargs_meta = _schema_with(sample, [tensor_meta(t) for t in tensors])
        per_dim = info.func(op, args_meta, kwargs_meta)
        filled = [[Shard(p.dim) if isinstance(p, _ShardingPlaceholder) else p for p in s] for s in per_dim]
        width = n_out + len(tensors)
        replicate = [Replicate()] * width
        if not any(all(isinstance(p, Replicate) or p is None for p in s) for s in filled):
            filled.insert(0, replicate)
        schema = _strategy_schema(op, sample, _input_strategies(mesh, tensors, all_candidates=False))
        strategy = expand_to_full_mesh_op_strategy(
            mesh,
            schema,
            filled,
            output_tensor_meta=_out_meta(op, sample),
            input_index=n_out,
            allow_uneven_sharding=info.allow_uneven_sharding,
        )
    elif kind == "op_strategy":
        strategy = fn(_strategy_schema(op, sample, _input_strategies(mesh, tensors, all_candidates=True)))
    else:
        raise ValueError(f"cannot query a rule of kind {kind!r}")
    return _combos_from(strategy, n_out)


def _combos_from(strategy: Any, n_out: int) -> set[Combo]:
    combos: set[Combo] = set()
    if isinstance(strategy, TupleStrategy):
        return combos  # list-in/list-out strategies are validated per child elsewhere
    for spec in strategy.strategies:
        if spec.input_specs is None:
            continue
        outs = spec.output_specs
        if isinstance(outs, DTensorSpec):
            out_pl = (tuple(outs.placements),) * max(n_out, 1)
        else:
            if any(o is None for o in outs):
                continue
            out_pl = tuple(tuple(o.placements) for o in outs)
        in_pl = tuple(tuple(s.placements) for s in spec.input_specs)
        combos.add((in_pl, out_pl))
    return combos
