"""Per-strategy cost table for an auto-sharding solver.

For each strategy our rule emits for one call (expanded to the mesh by DTensor's own
``expand_to_full_mesh_op_strategy``), :func:`strategy_costs` reports the placements, the
local compute cost on every rank (estimated on meta tensors of the local shapes from
``compute_local_shape_and_global_offset``), the compute runtime of the slowest rank, and
DTensor's per-input redistribute cost from the inputs' current placements.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.device_mesh import DeviceMesh
from dtensor_rules._upstream import (
    compute_local_shape_and_global_offset,
    DTensorSpec,
    OpSchema,
    OpSpec,
    OpStrategy,
    ShardingPlaceholder,
    TensorMeta,
    TupleStrategy,
)
from torch.distributed.tensor.placement_types import Placement, Replicate, Shard
from torch.utils import _pytree as pytree

from dtensor_rules.costs._util import CostError
from dtensor_rules.costs.hardware import Hardware, get_hardware
from dtensor_rules.costs.estimator import estimate_call
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.costs.rule_source import rule_for
from dtensor_rules.costs.runtime import runtime

__all__ = ["StrategyCost", "strategy_costs", "format_strategy_costs"]

US = 1e-6  # DTensor's redistribute_cost is in microseconds


@dataclass(frozen=True)
class StrategyCost:
    """One row of the table: placements, per-rank local costs, seconds."""

    output_placements: tuple[tuple[Placement, ...], ...]
    input_placements: tuple[tuple[Placement, ...], ...]
    rank_costs: tuple[OpCost, ...]
    compute_s: float
    redistribute_s: tuple[float, ...]

    @property
    def local_cost(self) -> OpCost:
        """The slowest rank's cost (by bytes, then flops)."""
        return max(self.rank_costs, key=lambda c: (c.bytes, c.flops))

    @property
    def total_s(self) -> float:
        return self.compute_s + sum(self.redistribute_s)


def _meta_of(t: torch.Tensor) -> TensorMeta:
    return TensorMeta(shape=t.shape, stride=t.stride(), dtype=t.dtype)


def _replace_tensors(tree: Any, values: Sequence[Any]) -> Any:
    it = iter(values)
    return pytree.tree_map(lambda x: next(it) if isinstance(x, torch.Tensor) else x, tree)


def _op_strategy(op: OpOverload, args: tuple, kwargs: dict, mesh: DeviceMesh, current: list[tuple[Placement, ...]]) -> OpStrategy:
    """Our rule's strategy for this call, built as DTensor's dispatch builds it.

    Every tensor leaf (tensors inside lists included, ``None`` skipped) becomes an
    ``OpStrategy`` holding its current placement; the schema is pytree-aware
    (``needs_pytree``) so list elements count as inputs. Single-dim rules are expanded
    with DTensor's own ``_expand_single_dim_strategy_to_mesh``, op-strategy rules are called.
    """
    from dtensor_rules._upstream import RuntimeSchemaInfo
    from dtensor_rules._upstream import expand_single_dim_rule, SingleDimStrategyInfo

    rule = rule_for(op)
    if rule is None:
        raise CostError(f"dtensor_rules has no rule for {op}: strategy_costs prices the strategies of our rules")
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    input_strats = [
        OpStrategy([OpSpec(DTensorSpec(mesh, tuple(pl), tensor_meta=_meta_of(t)))]) for t, pl in zip(tensors, current)
    ]
    s_args, s_kwargs = _replace_tensors((args, kwargs), input_strats)
    info = rule.schema_info  # the registry fills it (default_schema_info) when the rule gave none
    has_list = any(isinstance(a, (list, tuple)) for a in (*args, *kwargs.values()))
    if has_list and not info.needs_pytree:
        info = RuntimeSchemaInfo(info.static_argnum, info.static_kwargkey, needs_pytree=True)
    schema = OpSchema(op, s_args, s_kwargs, schema_info=info)
    if rule.kind == "op_strategy":
        # a rule that prices only a compact set at dispatch exposes its full enumeration for solvers
        result = getattr(rule.strategy, "full_enumeration", rule.strategy)(schema)
    else:
        def filled(o: OpOverload, a: Any, k: Any) -> list[list[Placement]]:
            # dispatch fills placeholders with the shard types its inputs use: plain Shard here
            return [[Shard(p.dim) if isinstance(p, ShardingPlaceholder) else p for p in st] for st in rule.strategy(o, a, k)]

        out = _output(op, args, kwargs, tensors)
        out_meta = _meta_of(out) if isinstance(out, torch.Tensor) else tuple(
            _meta_of(o) if isinstance(o, torch.Tensor) else None for o in out
        )
        m_args, m_kwargs = _replace_tensors((args, kwargs), [_meta_of(t) for t in tensors])
        info_fn = SingleDimStrategyInfo(func=filled, allow_uneven_sharding=rule.allow_uneven_sharding)
        result = expand_single_dim_rule(mesh, schema, info_fn, out_meta)(op, m_args, m_kwargs)
    if isinstance(result, TupleStrategy):
        raise CostError(
            f"{op}: the rule returned one strategy per list element (TupleStrategy, foreach-style); "
            "price each element's op separately with strategy_costs"
        )
    return result


def _output(op: OpOverload, args: tuple, kwargs: dict, tensors: list[torch.Tensor]) -> Any:
    """The op's output for its tensor metadata: on fake tensors, or run for real when the
    output shape depends on the data (``bincount``) and the inputs hold data."""
    from dtensor_rules._upstream import DynamicOutputShapeException, FakeTensorMode

    from dtensor_rules.costs._util import is_concrete

    try:
        with FakeTensorMode(allow_non_fake_inputs=True):
            return op(*args, **kwargs)
    except DynamicOutputShapeException:
        if all(is_concrete(t) for t in tensors):
            return op(*args, **kwargs)
        raise CostError(f"{op}: the output shape depends on the data; pass real tensors to strategy_costs") from None


def _local_meta(t: torch.Tensor, mesh_shape: tuple[int, ...], coord: list[int], placements: Sequence[Placement]) -> torch.Tensor:
    shape, _ = compute_local_shape_and_global_offset(t.shape, mesh_shape, coord, placements)
    return torch.empty(shape, dtype=t.dtype, device="meta")


def strategy_costs(
    op: OpOverload,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None,
    mesh: DeviceMesh,
    *,
    hardware: Hardware | str = "cpu",
    input_placements: Sequence[Sequence[Placement]] | None = None,
    fallback: bool = False,
) -> list[StrategyCost]:
    """The cost table of every strategy our rule offers for ``op(*args, **kwargs)`` on ``mesh``.

    ``args`` hold global tensors (real, fake or meta); ``input_placements`` are the tensor
    inputs' current placements (default all Replicate), from which redistribute costs are
    measured. ``fallback`` is passed to :func:`estimate_call` for ops without a formula.
    """
    hw = get_hardware(hardware)
    args, kwargs = tuple(args), dict(kwargs or {})
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    if input_placements is None:
        current = [(Replicate(),) * mesh.ndim for _ in tensors]
    else:
        current = [tuple(p) for p in input_placements]
        if len(current) != len(tensors) or any(len(p) != mesh.ndim for p in current):
            raise CostError(
                f"input_placements must give {mesh.ndim} placement(s) for each of the {len(tensors)} tensor inputs"
            )
    strategy = _op_strategy(op, args, kwargs, mesh, current)
    mesh_shape = tuple(mesh.shape)
    coords = [list(c) for c in itertools.product(*[range(s) for s in mesh_shape])]
    rows = []
    for spec in strategy.strategies:
        if spec.input_specs is None:
            continue
        in_pl = tuple(tuple(s.placements) for s in spec.input_specs)
        outs = spec.output_specs
        out_pl = (tuple(outs.placements),) if isinstance(outs, DTensorSpec) else tuple(
            tuple(o.placements) if o is not None else () for o in outs
        )
        rank_costs = []
        for coord in coords:
            local = [_local_meta(t, mesh_shape, coord, pl) for t, pl in zip(tensors, in_pl)]
            l_args, l_kwargs = _replace_tensors((args, kwargs), local)
            rank_costs.append(estimate_call(op, l_args, l_kwargs, fallback=fallback))
        compute = max(runtime(c, hw) for c in rank_costs)
        redist = tuple(float(c[0]) * US for c in (spec.redistribute_cost or [[0.0]] * len(tensors)))
        rows.append(StrategyCost(out_pl, in_pl, tuple(rank_costs), compute, redist))
    return rows


def _pl(ps: Sequence[Placement]) -> str:
    return "".join(str(p) for p in ps) if ps else "-"


def format_strategy_costs(rows: Sequence[StrategyCost]) -> str:
    """A fixed-width text table (times in microseconds), one line per strategy."""
    header = ["output", "inputs", "flops/rank", "bytes/rank", "compute_us", "redistribute_us", "total_us"]
    lines = [header]
    for r in rows:
        c = r.local_cost
        lines.append([
            ",".join(_pl(p) for p in r.output_placements),
            ",".join(_pl(p) for p in r.input_placements),
            str(c.flops),
            str(c.bytes),
            f"{r.compute_s / US:.3f}",
            ",".join(f"{x / US:.1f}" for x in r.redistribute_s),
            f"{r.total_s / US:.3f}",
        ])
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in lines)
