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
from dtensor_rules._upstream import (
    DTensorSpec,
    expand_to_mesh,
    is_tensor_shardable,
    OpSchema,
    OpSpec,
    OpStrategy,
    propagator,
    RuntimeSchemaInfo,
    ShardingPlaceholder,
    SingleDimStrategyInfo,
    TensorMeta,
    TupleStrategy,
)
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard
from torch.utils import _pytree as pytree

from dtensor_rules.op_rules._solver_rows import full_enumeration
from dtensor_rules.testing.aliasing import Aliasing, aliasing, is_inplace
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


def _input_strategies(
    mesh: DeviceMesh, tensors: Sequence[torch.Tensor], all_candidates: bool, fixed: dict[int, NDPlacement] | None = None
) -> list[OpStrategy]:
    """One OpStrategy per tensor input: all-Replicate, or every placement; ``fixed`` pins some inputs."""
    strategies = []
    for i, t in enumerate(tensors):
        meta = tensor_meta(t)
        if fixed and i in fixed:
            specs = [OpSpec(DTensorSpec(mesh, tuple(fixed[i]), tensor_meta=meta))]
        elif all_candidates:
            per_dim = candidate_placements(t)
            # layouts DTensor strategies can hold: no mixed Partial, no dim split into more
            # shards than it has elements (upstream rules raise on those rather than answer)
            specs = [
                OpSpec(spec)
                for pl in itertools.product(per_dim, repeat=mesh.ndim)
                if _no_mixed_partial(pl)
                and is_tensor_shardable(t.shape, spec := DTensorSpec(mesh, tuple(pl), tensor_meta=meta))
            ]
        else:
            specs = [OpSpec(DTensorSpec(mesh, (Replicate(),) * mesh.ndim, tensor_meta=meta))]
        strategies.append(OpStrategy(specs))
    return strategies


def _no_mixed_partial(pl: Sequence[Placement]) -> bool:
    ops = {p.reduce_op for p in pl if isinstance(p, Partial)}
    return len(ops) <= 1 or ops == {"sum", "avg"}


def _out_meta(op: OpOverload, sample: Sample) -> Any:
    from dtensor_rules._upstream import DynamicOutputShapeException, FakeTensorMode

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            out = op(*sample.args, **sample.kwargs)
    except DynamicOutputShapeException:
        # data-dependent output shape (bincount, nonzero, ...): the sample holds real data;
        # on copies, so an in-place / out= op leaves the sample alone
        args, kwargs = sample.replace_tensors([t.clone() for t in sample.tensors()])
        out = op(*args, **kwargs)
    if isinstance(out, torch.Tensor):
        return tensor_meta(out)
    return tuple(tensor_meta(o) if isinstance(o, torch.Tensor) else None for o in out)


def active_strategy(op: OpOverload) -> tuple[str, Any] | None:
    """The strategy DTensor's dispatch would use for ``op`` right now, as (kind, fn).

    Read from the propagator in dispatch's order (single-dim before op-strategy before
    output-sharding rules), so it is ours while installed and upstream's otherwise.
    """
    prop = propagator()
    for kind, registry_name in (
        ("single_dim", "op_single_dim_strategy_funcs"),
        ("op_strategy", "op_strategy_funcs"),
        ("prop_rule", "op_to_rules"),
    ):
        fn = getattr(prop, registry_name).get(op)
        if fn is not None:
            return kind, fn
    return None


def emitted_combos(kind: str, fn: Any, op: OpOverload, sample: Sample, mesh: DeviceMesh,
                   inputs_follow_output: bool = False, full: bool = True) -> set[Combo]:
    """All (inputs, outputs) placement combos the strategy function offers for ``sample``, under
    the full enumeration (``op_rules._solver_rows``): what is proven is every row, not a solver's trim.
    ``full=False``: what a solver's query gets (an op-strategy rule is asked with every candidate
    layout per input: the trimmed rows)."""
    with full_enumeration(full):
        return _emitted_combos(kind, fn, op, sample, mesh, inputs_follow_output)


def _emitted_combos(kind: str, fn: Any, op: OpOverload, sample: Sample, mesh: DeviceMesh,
                    inputs_follow_output: bool = False) -> set[Combo]:
    """All (inputs, outputs) placement combos the strategy function offers for ``sample``.

    For ``out=`` / in-place ops the aliased tensor's runtime placement decides what dispatch
    may choose (only strategies whose output is laid out like the out tensor / self), so the
    strategy is queried once per candidate placement of the aliased tensor(s) and the union
    is returned. An ``out=`` tensor is never redistributed (dispatch writes the local result
    into it and relabels it), so its placement in a combo is always its output's.
    ``inputs_follow_output``: count an op strategy that states no input specs as dispatch runs
    it (every tensor input laid out like the output); by default such strategies are skipped.
    """
    tensors = sample.tensors()
    n_out = _num_outputs(op)
    alias = aliasing(op, sample)
    if kind == "single_dim":
        info = fn if isinstance(fn, SingleDimStrategyInfo) else SingleDimStrategyInfo(func=fn)
        args_meta, kwargs_meta = _schema_with(sample, [tensor_meta(t) for t in tensors])
        per_dim = info.func(op, args_meta, kwargs_meta)
        filled = [[Shard(p.dim) if isinstance(p, ShardingPlaceholder) else p for p in s] for s in per_dim]
        width = n_out + len(tensors)
        replicate = [Replicate()] * width
        if not any(all(isinstance(p, Replicate) or p is None for p in s) for s in filled):
            filled.insert(0, replicate)
        out_meta = _out_meta(op, sample)
        combos: set[Combo] = set()
        for fixed in _aliased_candidates(alias, filled, n_out, mesh.ndim):
            schema = _strategy_schema(op, sample, _input_strategies(mesh, tensors, all_candidates=False, fixed=fixed))
            try:
                strategy = expand_to_mesh(
                    mesh,
                    schema,
                    filled,
                    output_tensor_meta=out_meta,
                    input_index=n_out,
                    inplace_op=is_inplace(op),
                    allow_uneven_sharding=info.allow_uneven_sharding,
                )
            except RuntimeError as e:
                if "in-place operations that require placement changes" in str(e):
                    continue  # no strategy keeps self's placement: dispatch would refuse this layout
                raise
            combos |= _combos_from(strategy, n_out)
    elif kind == "op_strategy":
        combos = set()
        for fixed in _all_aliased_candidates(alias, tensors, mesh.ndim):
            try:
                strategy = fn(_strategy_schema(op, sample, _input_strategies(mesh, tensors, all_candidates=True, fixed=fixed)))
            except RuntimeError as e:
                if fixed and "in-place operations that require placement changes" in str(e):
                    continue  # no strategy keeps self's placement: dispatch would refuse this layout
                raise
            for ins, outs in _combos_from(strategy, n_out, len(tensors) if inputs_follow_output else None):
                for i in alias.inplace:
                    if ins[i] != fixed[i]:
                        raise ValueError(
                            f"{op}: a strategy redistributes in-place input {i} from {fixed[i]} to {ins[i]}; "
                            "the result would be written into a copy (use expand_to_mesh "
                            "with inplace_op=True)"
                        )
                combos.add((ins, outs))
    else:
        raise ValueError(f"cannot query a rule of kind {kind!r}")
    return {_out_follows_output(c, alias) for c in combos}


def _out_follows_output(combo: Combo, alias: Aliasing) -> Combo:
    ins, outs = combo
    if not alias.out:
        return combo
    return tuple(outs[alias.out[i]] if i in alias.out else pl for i, pl in enumerate(ins)), outs


def _aliased_candidates(alias: Aliasing, rows: list[list[Any]], n_out: int, ndim: int) -> list[dict[int, NDPlacement]]:
    """Runtime placements of the aliased tensors worth querying: every per-mesh-dim choice the rows make."""
    if not alias:
        return [{}]
    idxs = sorted(alias.all)
    per_dim: set[tuple[Placement, ...]] = {(Replicate(),) * len(idxs)}
    for row in rows:
        for col in ([n_out + i for i in idxs], [alias.all[i] for i in idxs]):
            choice = tuple(row[c] for c in col)
            if all(isinstance(p, Placement) for p in choice):
                per_dim.add(choice)
    out = []
    for combo in itertools.product(sorted(per_dim, key=str), repeat=ndim):
        fixed = {i: tuple(c[k] for c in combo) for k, i in enumerate(idxs)}
        if all(_no_mixed_partial(pl) for pl in fixed.values()):
            out.append(fixed)
    return out


def _all_aliased_candidates(alias: Aliasing, tensors: Sequence[torch.Tensor], ndim: int) -> list[dict[int, NDPlacement]]:
    """Every N-D placement of each aliased tensor (op-strategy rules see the mesh, so ask them all)."""
    if not alias:
        return [{}]
    idxs = sorted(alias.all)
    choices = [
        [pl for pl in itertools.product(candidate_placements(tensors[i]), repeat=ndim) if _no_mixed_partial(pl)]
        for i in idxs
    ]
    return [dict(zip(idxs, pick)) for pick in itertools.product(*choices)]


def _combos_from(strategy: Any, n_out: int, n_in: int | None = None) -> set[Combo]:
    combos: set[Combo] = set()
    if isinstance(strategy, TupleStrategy):
        return combos  # list-in/list-out strategies are validated per child elsewhere
    for spec in strategy.strategies:
        if spec.input_specs is None:
            if n_in is not None and isinstance(spec.output_specs, DTensorSpec):  # dispatch: inputs as the output
                combos.add(((tuple(spec.output_specs.placements),) * n_in, (tuple(spec.output_specs.placements),)))
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
