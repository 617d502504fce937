"""Generic families for ops without a table entry or torch flop formula.

=============  =====================================================  ============  ===================  ==============
family         which ops                                              flops         bytes read           bytes written
=============  =====================================================  ============  ===================  ==============
view           returns a read-only alias of an input (schema), or     0             0                    0
               ``_unsafe_view`` / ``_reshape_alias`` (views without
               alias annotations)
factory        ``new_*``, ``*_like``, ``zeros/ones/full/empty/...``,   0             tensor args other    outputs
               ``fill_``, ``zero_``: the input gives only metadata                  than ``self``        (``empty*``: 0)
copy           ``_to_copy``, ``clone``, ``copy(_)``, ``contiguous``,  0             inputs (``copy_``:   outputs
               ``torch.Tag.view_copy`` ops: data movement, dtype                    not ``self``)
               conversion included; the backward of a view
               (``select_backward``, ``slice_backward``, ...): the
               gradient written into zeros of the input's shape
pointwise      ``torch.Tag.pointwise``                                1 per output  inputs               outputs
reduction      ``torch.Tag.reduction`` or a known reduction name      1 per input   inputs               outputs
pointwise      an aten op without the tag whose every output has the  1 per output  inputs               outputs
(inferred)     broadcast shape of the tensor inputs, with no ``dim``
               argument and no tensor list (e.g. ``floor_divide``);
               ``exact=False`` with a note (custom ops are never
               guessed: register a formula)
=============  =====================================================  ============  ===================  ==============

"inputs" are each tensor argument's distinct bytes (stride-0 dims once); "outputs" are the
output elements times their element size, shapes from the op's meta kernel. 1 op per
element is an estimate for transcendental pointwise ops, which cost several.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules.costs._util import CostError, broadcast_shape, first_float_dtype, nbytes, numel
from dtensor_rules.costs.op_cost import OpCost, _tensors, run_on_meta

REDUCTIONS = frozenset(
    "sum mean nansum prod amax amin max min aminmax var std var_mean std_mean norm linalg_vector_norm "
    "any all argmax argmin logsumexp count_nonzero".split()
)
VIEW_LIKE = frozenset({"_unsafe_view", "_reshape_alias"})
FACTORIES = frozenset(
    "zeros ones full empty empty_strided empty_permuted scalar_tensor arange linspace logspace eye "
    "rand randn randint randperm fill_ zero_".split()
)
EMPTY = frozenset({"empty", "empty_strided", "empty_permuted", "new_empty", "new_empty_strided", "empty_like"})
COPIES = frozenset({"_to_copy", "clone", "copy", "copy_", "contiguous", "lift_fresh_copy", "_copy_from"})
VIEW_BACKWARDS = frozenset({"select_backward", "slice_backward", "diagonal_backward"})
_INFERRED_NOTE = "no pointwise tag: assumed elementwise (outputs have the broadcast shape of the inputs)"


def _name(op: OpOverload) -> str:
    return op._schema.name.split("::")[-1]


def is_view(op: OpOverload) -> bool:
    returns = op._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _inferred_pointwise(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    schema = op._schema
    if op.namespace != "aten":  # custom ops are opaque: their authors register a formula
        return False
    if any(a.name in ("dim", "dims") for a in schema.arguments):
        return False
    if not schema.returns or any(not isinstance(r.type, torch.TensorType) for r in schema.returns):
        return False
    if any(isinstance(a.type, torch.ListType) and "Tensor" in str(a.type) for a in schema.arguments):
        return False
    ins = _tensors(args, kwargs)
    if not ins:
        return False
    try:
        shape = broadcast_shape(*[t.shape for t in ins])
    except RuntimeError:
        return False
    try:
        outs = run_on_meta(op, args, kwargs)
    except CostError:  # data-dependent output shape (nonzero, unique): not elementwise
        return False
    return all(tuple(o.shape) == shape for o in outs)


def family(op: OpOverload, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> str | None:
    """The generic family of ``op`` (see the module table); ``args`` are needed only to infer pointwise."""
    name = _name(op)
    if is_view(op) or name in VIEW_LIKE:
        return "view"
    if name in FACTORIES or name.startswith("new_") or name.endswith("_like"):
        return "factory"
    if name in COPIES or name in VIEW_BACKWARDS or torch.Tag.view_copy in op.tags:
        return "copy"
    if torch.Tag.pointwise in op.tags:
        return "pointwise"
    if torch.Tag.reduction in op.tags or name in REDUCTIONS:
        return "reduction"
    if _inferred_pointwise(op, args, dict(kwargs or {})):
        return "pointwise?"
    return None


def _self_arg(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    params = op._schema.arguments
    if params and params[0].name == "self":
        return args[0] if args else kwargs.get("self")
    return None


def generic_cost(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpCost | None:
    """The family cost of ``op``, or None when it is in no family."""
    fam = family(op, args, kwargs)
    if fam is None:
        return None
    if fam == "view":
        return OpCost(0, 0, 0, source="view", family="view")
    ins = _tensors(args, kwargs)
    outs = run_on_meta(op, args, kwargs)
    written = sum(numel(t) * t.dtype.itemsize for t in outs)
    dtype = first_float_dtype(outs) or first_float_dtype(ins)
    if fam in ("factory", "copy"):
        self = _self_arg(op, args, kwargs)
        skip_self = fam == "factory" or _name(op) == "copy_"
        read = sum(nbytes(t) for t in ins if not (skip_self and t is self))
        if fam == "factory" and _name(op) in EMPTY:
            written = 0
        return OpCost(0, read, written, dtype=dtype, source=fam, family=fam)
    read = sum(nbytes(t) for t in ins)
    if fam == "reduction":
        return OpCost(numel(ins[0]) if ins else 0, read, written, dtype=first_float_dtype(ins), source=fam, family=fam)
    flops = sum(numel(t) for t in outs)
    if fam == "pointwise?":
        return OpCost(flops, read, written, dtype=dtype, exact=False, source="pointwise", note=_INFERRED_NOTE,
                      family="pointwise")
    return OpCost(flops, read, written, dtype=dtype, source=fam, family=fam)
