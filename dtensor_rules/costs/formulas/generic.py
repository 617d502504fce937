"""Generic families for ops without a table entry: views, pointwise ops, reductions.

- views (the op returns an alias of an input and writes nothing): free, ``OpCost(0, 0, 0)``.
- pointwise (``torch.Tag.pointwise``): 1 op per output element (an estimate for
  transcendental ops, which cost several); reads each input's distinct bytes, writes
  the outputs. Output shapes come from the op's meta kernel.
- reductions (sum, mean, amax, var, argmax, ...): 1 op per input element; reads the
  input, writes the outputs.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules.costs._util import first_float_dtype, nbytes, numel
from dtensor_rules.costs.op_cost import OpCost, _tensors, run_on_meta

REDUCTIONS = frozenset(
    "sum mean nansum prod amax amin max min aminmax var std var_mean std_mean norm linalg_vector_norm "
    "any all argmax argmin logsumexp count_nonzero".split()
)


def is_view(op: OpOverload) -> bool:
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def family(op: OpOverload) -> str | None:
    if is_view(op):
        return "view"
    if torch.Tag.pointwise in op.tags:
        return "pointwise"
    if op._schema.name.split("::")[-1] in REDUCTIONS:
        return "reduction"
    return None


def generic_cost(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpCost | None:
    """The family cost of ``op``, or None when it is in no family."""
    fam = family(op)
    if fam is None:
        return None
    if fam == "view":
        return OpCost(0, 0, 0, source="view")
    ins = _tensors(args, kwargs)
    outs = run_on_meta(op, args, kwargs)
    read = sum(nbytes(t) for t in ins)
    written = sum(numel(t) * t.dtype.itemsize for t in outs)
    if fam == "pointwise":
        flops = sum(numel(t) for t in outs)
        dtype = first_float_dtype(outs) or first_float_dtype(ins)
    else:
        flops = numel(ins[0]) if ins else 0
        dtype = first_float_dtype(ins)
    return OpCost(flops, read, written, dtype=dtype, source=fam)
