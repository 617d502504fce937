"""Sorting and selection: comparisons counted as ops.

Model, per row of length ``n`` along ``dim`` (``rows = numel / n``):

- ``sort`` / ``argsort`` (all overloads, stable or not): ``n * ceil(log2 n)`` comparisons
  (comparison-sort bound; radix sorts on GPU do a similar count of passes x elements).
  Reads the input once, writes values and int64 indices (``argsort`` computes the
  values too: it is ``sort`` keeping the indices).
- ``topk(k)``: ``n`` comparisons to select, plus ``k * ceil(log2 k)`` to order the
  result when ``sorted=True``. Reads the input, writes ``k`` values and int64 indices per row.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules.costs._util import dim_size, nbytes, numel
from dtensor_rules.costs.formulas._formula import formula
from dtensor_rules.costs.op_cost import OpCost

aten = torch.ops.aten
INDEX_BYTES = torch.int64.itemsize


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


@formula(family="sort")
def sort_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self = b["self"]
    total = numel(self)
    n = dim_size(self, b["dim"])
    rows = total // n if n else 0
    flops = rows * n * _log2(n)
    return OpCost(flops, nbytes(self), total * (self.dtype.itemsize + INDEX_BYTES), dtype=self.dtype)


@formula(family="sort")
def topk_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, k = b["self"], int(b["k"])
    n = dim_size(self, b["dim"])
    rows = numel(self) // n if n else 0
    flops = rows * (n + (k * _log2(k) if b["sorted"] else 0))
    return OpCost(flops, nbytes(self), rows * k * (self.dtype.itemsize + INDEX_BYTES), dtype=self.dtype)
