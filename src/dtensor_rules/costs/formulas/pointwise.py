"""Fused pointwise ops with rules in dtensor_rules.ops: ``prims.fma`` and softmax backward.

- ``prims.fma(a, b, c)``: 2 flops (multiply, add) per output element; reads each
  operand's distinct memory once, writes the broadcast output in the promoted dtype.
- ``_softmax_backward_data(g, y, dim, input_dtype)``: ``y * (g - sum(g*y, dim))`` is
  4 flops per element (product, row-sum add, subtraction, product); reads g and y,
  writes grad_input in ``input_dtype``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules.costs._util import broadcast_shape, nbytes, numel
from dtensor_rules.costs.formulas._formula import formula
from dtensor_rules.costs.op_cost import OpCost


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> OpCost:
    out_shape = broadcast_shape(a.shape, b.shape, c.shape)
    dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), c.dtype)
    n = numel(out_shape)
    return OpCost(2 * n, nbytes(a) + nbytes(b) + nbytes(c), n * dtype.itemsize, dtype=dtype)


@formula(family="pointwise")
def fma_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    return _fma(b["a"], b["b"], b["c"])


def _softmax_backward(g: torch.Tensor, y: torch.Tensor, input_dtype: Any) -> OpCost:
    out_dtype = input_dtype if isinstance(input_dtype, torch.dtype) else g.dtype
    n = numel(g)
    return OpCost(4 * n, nbytes(g) + nbytes(y), n * out_dtype.itemsize, dtype=g.dtype)


@formula(family="reduction")
def softmax_backward_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    return _softmax_backward(b["grad_output"], b["output"], b["input_dtype"])

