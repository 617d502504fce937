"""Scans and histograms: ``cumsum``, ``histc``, ``bincount``.

- ``cumsum(self, dim, dtype)``: one add per element; writes in ``dtype``, else int64 for
  integer/bool inputs (torch's promotion), else the input dtype. In-place ``cumsum_``
  writes in the input dtype.
- ``histc(self, bins, min, max)``: 5 ops per element (2 range compares, subtract and
  scale to a bin, 1 count increment); when ``min == max`` the range is first found
  from the data (2 more compares per element and a second read of the input).
  Writes ``bins`` elements.
- ``bincount(self, weights, minlength)``: 2 ops per element (max scan, increment/add);
  reads the input twice (max pass, count pass) and the weights once; writes
  ``max(max(self) + 1, minlength)`` counts of int64 (no weights), float32 (float32
  weights) or float64 (other weights). The length needs the data: on fake/meta inputs
  it is assumed to be ``max(minlength, 1)`` (``exact=False``).

Families: ``scan`` (cumsum), ``histogram`` (histc: binning arithmetic per element), and
``scatter`` for bincount (``counts[x[i]] += 1`` is an indexed read-modify-write, the
access pattern of scatter_add).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules.costs._util import is_concrete, nbytes, numel
from dtensor_rules.costs.formulas._formula import formula
from dtensor_rules.costs.op_cost import OpCost

aten = torch.ops.aten


@formula(family="scan")
def cumsum_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, dtype = b["self"], b["dtype"]
    if op is aten.cumsum_.default:
        out_dtype = self.dtype
    elif dtype is not None:
        out_dtype = dtype
    elif self.dtype.is_floating_point or self.dtype.is_complex:
        out_dtype = self.dtype
    else:
        out_dtype = torch.int64
    n = numel(self)
    return OpCost(n, nbytes(self), n * out_dtype.itemsize, dtype=out_dtype)


@formula(family="histogram")
def histc_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, bins = b["self"], int(b["bins"])
    n = numel(self)
    find_range = float(b["min"]) == float(b["max"])
    flops = n * (5 + (2 if find_range else 0))
    read = nbytes(self) * (2 if find_range else 1)
    return OpCost(flops, read, bins * self.dtype.itemsize, dtype=self.dtype)


@formula(family="scatter")
def bincount_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, weights, minlength = b["self"], b["weights"], int(b["minlength"])
    n = numel(self)
    if weights is None:
        out_dtype = torch.int64
    else:
        out_dtype = torch.float32 if weights.dtype == torch.float32 else torch.float64
    exact = True
    if is_concrete(self):
        length = max(int(self.max()) + 1 if n else 0, minlength)
    else:
        length, exact = max(minlength, 1), False
    read = 2 * nbytes(self) + (nbytes(weights) if weights is not None else 0)
    note = "" if exact else "bincount length unknown (fake/meta): max(minlength, 1) assumed"
    return OpCost(2 * n, read, length * out_dtype.itemsize, dtype=out_dtype, exact=exact, note=note)
