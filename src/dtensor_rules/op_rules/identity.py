"""Sharding rules that keep a DTensor's shard order through identity-layout ops (detach, alias).

Upstream's ``propagate_single_input_strategy`` (detach, alias, ...) builds the output spec from
the placements alone, so the output claims DTensor's default left-to-right order; and the
sharding propagator decides "no redistribute needed" by comparing placements only, so the
*data* stays in the input's order. For an input with a non-default ``shard_order`` (ours, or
upstream's own ``redistribute(..., shard_order=...)``) the result is silently wrong metadata:
``full_tensor()`` / checkpoint offsets read the wrong rows. ``AccumulateGrad`` detaches every
gradient, so ``a.grad`` of an ordered leaf hits exactly this.

=====================  =========================  ==========================================
op                     strategy                   why it is valid
=====================  =========================  ==========================================
detach, alias,         output spec = input spec   the op returns the same values (a view /
detach_                (placements AND order)     alias of the local shard), so every rank's
                                                  shard of the output is its shard of the
                                                  input: the layout is exactly preserved
=====================  =========================  ==========================================

Samples: uneven shapes, bf16, int64.
"""

from __future__ import annotations

import torch

from dtensor_rules._upstream import DTensorSpec, OpSchema, OpSpec, OpStrategy
from dtensor_rules.op_rules._common import generator, Samples
from dtensor_rules.op_rules._gaps import ALIASED_UNPRICED, VIEW
from dtensor_rules.registry import register

aten = torch.ops.aten

__all__ = ["identity_layout_strategy"]


# --------------------------------------------------------------------------- sample suites

def identity_samples() -> Samples:
    g = generator(2)
    return [
        ((torch.randn(5, 3, generator=g),), {}),
        ((torch.randn(3, 4, 2, generator=g).to(torch.bfloat16),), {}),
        ((torch.randint(0, 9, (7,), generator=g),), {}),
    ]


def _same_spec(spec: DTensorSpec) -> DTensorSpec:
    return DTensorSpec(spec.mesh, spec.placements, tensor_meta=spec.tensor_meta, shard_order=spec.shard_order,
                       use_strided_shard_as_shard_order=spec.use_strided_shard_as_shard_order)


@register([aten.detach.default, aten.alias.default], kind="op_strategy", samples=identity_samples, gaps=VIEW)
@register(aten.detach_.default, kind="op_strategy", gaps=ALIASED_UNPRICED)
def identity_layout_strategy(op_schema: OpSchema) -> OpStrategy:
    """One strategy per input strategy: the input's spec, unchanged, in and out (zero cost)."""
    (inp,) = [a for a in op_schema.args_schema if isinstance(a, OpStrategy)]
    return OpStrategy([
        OpSpec(output_specs=_same_spec(s.output_spec), input_specs=(_same_spec(s.output_spec),),
               redistribute_cost=[[0.0 if t is s else float("inf") for t in inp.strategies]])
        for s in inp.strategies
    ])
