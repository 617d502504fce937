"""DTensor rules for torchtitan 0.3.0's own ``torch.library`` ops, registered when torchtitan defines them.

torchtitan (an optional extra) defines 10 ops in its ``torchtitan::`` namespace; none has a
DTensor rule upstream, so its MoE written on DTensors stops at the first one
(``deterministic_scatter_add``: "does not have a sharding strategy registered"). Covered here:

======================================  =====================================  =====================================
op                                      module that defines it                 here
======================================  =====================================  =====================================
deterministic_scatter_add               torchtitan.ops.scatter_add             rule, cost, samples
silu_and_mul                            torchtitan.overrides.fused_swiglu      rule, cost, samples (CUDA-only op)
silu_and_mul_backward                   torchtitan.overrides.fused_swiglu      rule, cost, samples (CUDA-only op)
fused_mla_q_rope_, fused_mla_k_rope,    torchtitan.overrides.fused_mla         not covered (in-place MLA rope
fused_mla_kv_backward                                                          kernels; see docs/custom_ops.md)
helion_{cossin,complex}_rope_{fwd,bwd}  torchtitan.overrides.helion_rope       not covered (need helion)
======================================  =====================================  =====================================

deterministic_scatter_add(out, index, src) = ``out.scatter_add(0, index, src)`` with
deterministic algorithms on: exactly aten.scatter_add with ``dim=0``, so it takes that rule's
rows (``[result, out, index, src]``, docstring of :mod:`dtensor_rules.ops.gather_scatter`):

=======================  =====================  ==========================================================
result                   out, index, src        why it is valid
=======================  =====================  ==========================================================
S(d), d != 0             S(d), S(d), S(d)       only if out, index and src have equal size on d
P(sum)                   P(sum), R, P(sum)      linear in (out, src) jointly
P(sum)                   P(sum), S(0), S(0)     only if index.size(0) == src.size(0): each rank adds its
                                                rows of src (the MoE combine: tokens sharded over ranks)
P(avg)                   P(avg)|R, R, P(avg)|R  affine (not both R)
P(max) / P(min)          P(op), R, R            out + c with c identical on all ranks: monotone
=======================  =====================  ==========================================================

silu_and_mul(gate, up, offsets=None) = ``silu(gate) * up`` in float32, cast to gate's dtype,
for the rows before ``offsets[-1]`` (later rows are not written: whatever the output held, so no
layout may make a rank compute rows the single device does not, nor skip rows it does) —
``[out, gate, up(, offsets)]``; offsets is always R (its values are global row numbers):

=======================  =====================  ==========================================================
out                      gate, up (offsets)     why it is valid
=======================  =====================  ==========================================================
S(0)                     S(0), S(0)             rows are independent; only WITHOUT offsets (a row limit
                                                is a global row number: a shard would shift it)
S(1)                     S(1), S(1) (R)         columns are independent; offsets stay global rows
P(sum) / P(avg)          R, P(op) (R)           linear in up: silu(g) * sum_r(u_r) = sum_r(silu(g) * u_r)
=======================  =====================  ==========================================================

silu_and_mul_backward(grad, gate, up, offsets=None) -> (grad_gate, grad_up), with
``grad_gate = grad * up * silu'(gate)`` and ``grad_up = grad * silu(gate)`` —
``[grad_gate, grad_up, grad, gate, up(, offsets)]``:

=======================  =====================  ==========================================================
grad_gate, grad_up       grad, gate, up         why it is valid
=======================  =====================  ==========================================================
S(0), S(0)               S(0), S(0), S(0)       rows are independent; only without offsets
S(1), S(1)               S(1), S(1), S(1)       columns are independent (offsets R)
P(op), P(op)             P(op), R, R            both outputs are linear in grad (op sum or avg)
P(op), R|P(avg|max|min)  R, R, P(op)            grad_gate is linear in up; grad_up does not read up, so
                                                it is identical on every rank (R, or any mean/max/min)
=======================  =====================  ==========================================================

Not offered: gate Partial (silu is not linear), P(max/min) (the other factor's sign flips the
order), S(0) with offsets (above). Partial rows need floating inputs (``partial_ops``).

Registration: a post-import hook (:func:`dtensor_rules.core.post_import.when_imported`) on each
defining module, the named patch ``torchtitan_rules`` (docs/patches.md). Before torchtitan is
imported, ``status().deferred`` lists the three rules as waiting, like ``prims.fma``; importing
the module registers the rule (and installs it if the package's rules are installed).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from dtensor_rules.core.post_import import when_imported
from dtensor_rules.core.suite_ref import suite
from dtensor_rules.costs.formulas.indexing import scatter_cost
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.ops._common import PlacementOrHole, metas
from dtensor_rules.ops._partial import partial_ops
from dtensor_rules.ops.gather_scatter import scatter_add_strategy
from dtensor_rules.patches import guarded

__all__ = ["TORCHTITAN_OPS", "deterministic_scatter_add_strategy", "silu_and_mul_strategy",
           "silu_and_mul_backward_strategy"]

Row = list[PlacementOrHole]
R: Placement = Replicate()
SCATTER_ADD = "torchtitan.ops.scatter_add"
FUSED_SWIGLU = "torchtitan.overrides.fused_swiglu"


def deterministic_scatter_add_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """aten.scatter_add's rows at dim 0 (the op is ``out.scatter_add(0, index, src)``)."""
    out, index, src = args[:3]
    return scatter_add_strategy(torch.ops.aten.scatter_add.default, (out, 0, index, src), {})


def deterministic_scatter_add_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """aten.scatter_add's cost at dim 0: reads out, index and the src rows, writes the result."""
    out, index, src = args[:3]
    return scatter_cost(torch.ops.aten.scatter_add.default, (out, 0, index, src), {})


def silu_and_mul_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Rows and columns shard pointwise (rows only without offsets); linear in ``up``."""
    gate, up = metas(args)[:2]
    offs: list[PlacementOrHole] = [R] if len(args) > 2 and args[2] is not None else []
    rows: list[Row] = [] if offs else [[Shard(0), Shard(0), Shard(0)]]
    if len(gate.shape) == 2:
        rows.append([Shard(1), Shard(1), Shard(1), *offs])
    for reduce_op in ("sum", "avg"):
        if reduce_op in partial_ops([gate.dtype, up.dtype]):
            P = Partial(reduce_op)
            rows.append([P, R, P, *offs])
    return rows


def silu_and_mul_backward_strategy(op: Any, args: Any, kwargs: Any) -> list[Row]:
    """Pointwise shards; both outputs linear in grad; grad_gate linear in up (grad_up then R)."""
    grad, gate, up = metas(args)[:3]
    offs: list[PlacementOrHole] = [R] if len(args) > 3 and args[3] is not None else []
    rows: list[Row] = [] if offs else [[Shard(0)] * 5]
    if len(gate.shape) == 2:
        rows.append([Shard(1)] * 5 + offs)
    for reduce_op in ("sum", "avg"):
        if reduce_op in partial_ops([grad.dtype, gate.dtype, up.dtype]):
            P = Partial(reduce_op)
            rows.append([P, P, P, R, R, *offs])
            # grad_up does not read up: it is the same on every rank, R or any mean/max/min of itself
            for same in (R, Partial("avg"), Partial("max"), Partial("min")):
                rows.append([P, same, R, R, P, *offs])
    return rows


def silu_and_mul_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """Elementwise: ~5 flops per element (sigmoid as exp + add + div, two muls); reads gate and
    up, writes out (rows past ``offsets[-1]`` counted too: the limit is data, not shape)."""
    gate, up = args[:2]
    n = gate.numel()
    return OpCost(5 * n, gate.nbytes + up.nbytes, n * gate.element_size(), dtype=gate.dtype, family="pointwise")


def silu_and_mul_backward_cost(op: OpOverload, args: tuple, kwargs: dict) -> OpCost:
    """Elementwise: ~10 flops per element; reads grad, gate, up, writes grad_gate and grad_up."""
    grad, gate, up = args[:3]
    n = gate.numel()
    return OpCost(10 * n, grad.nbytes + gate.nbytes + up.nbytes, gate.nbytes + up.nbytes, dtype=gate.dtype,
                  family="pointwise")


class _Spec:
    """One torchtitan op: its name, the module whose import defines it, and its whole contract."""

    def __init__(self, name: str, module: str, strategy: Callable, cost: Callable, samples: str) -> None:
        self.name, self.module, self.strategy, self.cost, self.samples = name, module, strategy, cost, samples

    def op(self) -> OpOverload:
        return getattr(torch.ops.torchtitan, self.name).default

    def register(self) -> OpOverload:
        """Register the rule (idempotent); the op must be defined."""
        from dtensor_rules import registry

        op = self.op()
        if op not in registry.rules():
            registry.register(op, cost=self.cost, samples=suite("torchtitan", self.samples))(self.strategy)
        return op

    def define(self) -> OpOverload:
        """Import torchtitan's module (defines the op) and register the rule: what `validate --op` needs."""
        importlib.import_module(self.module)
        return self.register()


TORCHTITAN_OPS = (
    _Spec("deterministic_scatter_add", SCATTER_ADD, deterministic_scatter_add_strategy, deterministic_scatter_add_cost,
          "deterministic_scatter_add_samples"),
    _Spec("silu_and_mul", FUSED_SWIGLU, silu_and_mul_strategy, silu_and_mul_cost, "silu_and_mul_samples"),
    _Spec("silu_and_mul_backward", FUSED_SWIGLU, silu_and_mul_backward_strategy, silu_and_mul_backward_cost,
          "silu_and_mul_backward_samples"),
)


def _on_imported(module_name: str) -> Callable[[Any], None]:
    def run(_module: Any) -> None:
        from dtensor_rules import registry

        ops = [s.register() for s in TORCHTITAN_OPS if s.module == module_name]
        if registry.active_ops():  # our rules are installed: these too
            registry.install(ops=ops)

    return run


_cancel: list[Callable[[], None]] = []


def _apply() -> None:
    for module_name in sorted({s.module for s in TORCHTITAN_OPS}):
        _cancel.append(when_imported(module_name, guarded("torchtitan_rules", _on_imported(module_name))))


def _restore() -> None:
    while _cancel:
        _cancel.pop()()


def _pending() -> bool:
    return any(s.module not in sys.modules for s in TORCHTITAN_OPS)


def _announce() -> None:
    from dtensor_rules import registry

    for s in TORCHTITAN_OPS:
        registry.defer(f"torchtitan.{s.name}.default", s.module, s.define, patch="torchtitan_rules")
    registry.register_patch(
        "torchtitan_rules",
        _apply,
        _restore,
        changes="a post-import hook (sys.meta_path) on " + ", ".join(sorted({s.module for s in TORCHTITAN_OPS}))
        + ": when torchtitan defines its custom ops there, their DTensor rules are registered (and installed if "
        "ours are); nothing of torchtitan is imported by the package",
        reason="torchtitan's custom ops (deterministic_scatter_add in its MoE combine, silu_and_mul) have no "
        "sharding strategy, so its MoE written on DTensors stops at them",
        waits_for=", ".join(sorted({s.module for s in TORCHTITAN_OPS})),
        pending=_pending,
    )


_announce()
