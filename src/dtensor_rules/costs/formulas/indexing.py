"""Gather/scatter/index families and ``cat``: memory-bound, priced by the elements touched.

Model (``k`` = number of indexed positions, ``isz`` = element size of the data tensor):

=================================  ==========================================  =========================  =================
op                                 bytes read                                  bytes written              flops
=================================  ==========================================  =========================  =================
cat(tensors, dim)                  every input                                 output (promoted dtype)    0
gather(self, dim, index)           index + k * isz  (k = index.numel())        k * isz                    0
scatter(self, dim, index, src)     self (copy) + index + k * src isz           self (copy) + k * isz      0
scatter.value                      self (copy) + index                         self (copy) + k * isz      0
scatter_add / scatter_reduce       as scatter + k * isz (read-modify-write)    as scatter                 k (mean: + self)
in-place variants (``..._``)       as above without the copy of self           k * isz                    as above
index(self, indices)               indices + k_out * isz (+ mask cost)         k_out * isz (+ coords)     0
index_put(self, indices, values)   self (copy) + indices + values (+ mask)     self (copy) + k * isz (+)  0
index_put(accumulate=True)         as index_put + k * isz                      as index_put               k
slice_scatter(self, src, ...)      self + src                                  self (copy) + src          0
=================================  ==========================================  =========================  =================

"index", "values", "src" counts are the distinct bytes of the tensor (stride-0 dims once).
For ``index``/``index_put``, ``k`` is the number of positions the indices select
(broadcast of integer indices, count of True in boolean masks) and ``k_out = k *``
the non-indexed dims. Boolean masks are counted from the data when concrete; on fake/meta
tensors every element is assumed True (an upper bound, ``exact=False``). A mask is first
converted to int64 coordinates (``nonzero``): "mask cost" = the mask's bytes read plus
``k * mask.ndim * 8`` bytes of coordinates written and the same read back.

Families (``OpCost.family``, for per-family hardware efficiency): ``gather``/``scatter``
for element-granular access (gather, scatter*, and index/index_put selecting fewer than
16 contiguous elements per position), ``index`` for row-granular index/index_put
(>= 16 contiguous elements per position: the kernel streams runs), ``copy`` for cat and
slice_scatter.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules.costs._util import CostError, broadcast_shape, is_concrete, nbytes, numel
from dtensor_rules.costs.formulas._formula import formula
from dtensor_rules.costs.op_cost import OpCost

aten = torch.ops.aten
_MASK_NOTE = "boolean mask values unknown (fake/meta): all True assumed (upper bound)"


@formula(family="copy")
def cat_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    tensors = [t for t in b["tensors"] if not (t.dim() == 1 and t.shape[0] == 0)]  # legacy empty inputs are skipped
    if not tensors:
        return OpCost(0, 0, 0)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    out = sum(numel(t) for t in tensors) * dtype.itemsize
    return OpCost(0, sum(nbytes(t) for t in tensors), out, dtype=dtype)


@formula(family="gather")
def gather_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, index = b["self"], b["index"]
    k, isz = numel(index), self.dtype.itemsize
    return OpCost(0, nbytes(index) + k * isz, k * isz, dtype=self.dtype)


_SCATTER_OUT = (aten.scatter.src, aten.scatter.value, aten.scatter_add.default, aten.scatter_reduce.two)
_SCATTER_INPLACE = (aten.scatter_.src, aten.scatter_.value, aten.scatter_add_.default, aten.scatter_reduce_.two)


@formula(family="scatter")
def scatter_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, index = b["self"], b["index"]
    src = b.get("src")
    k, isz = numel(index), self.dtype.itemsize
    name = op._schema.name.split("::")[1].rstrip("_")
    reduces = name in ("scatter_add", "scatter_reduce")
    read = nbytes(index) + (k * src.dtype.itemsize if isinstance(src, torch.Tensor) else 0)
    written = k * isz
    flops = 0
    if reduces:
        read += k * isz
        flops = k
        if b.get("reduce") == "mean":
            flops += numel(self)  # the final division by the counts
    if op in _SCATTER_OUT:
        read += nbytes(self)
        written += numel(self) * isz
    return OpCost(flops, read, written, dtype=self.dtype)


ROW_ELEMS = 16  # elements per indexed position from which a kernel copies contiguous runs ("index" family)


def _indexed_positions(self: torch.Tensor, indices: list[Any], op: OpOverload) -> tuple[int, int, bool, int, int]:
    """(k positions, elements per position from non-indexed dims, exact, mask bytes read, mask bytes written).

    A boolean mask is first turned into int64 coordinates (``nonzero``): its cost is the
    mask read plus ``k * mask.ndim`` int64 coordinates written and read back.
    """
    shapes: list[tuple[int, ...]] = []
    kept: list[int] = []
    d, exact, mask_read, mask_written = 0, True, 0, 0
    for idx in indices:
        if idx is None:
            if d >= self.dim():
                raise CostError(f"{op}: too many indices for a {self.dim()}-d tensor")
            kept.append(int(self.shape[d]))
            d += 1
        elif idx.dtype in (torch.bool, torch.uint8):
            if is_concrete(idx):
                true = int(torch.count_nonzero(idx))
            else:
                true = numel(idx)
                exact = False
            shapes.append((true,))
            coords = true * idx.dim() * torch.int64.itemsize
            mask_read += nbytes(idx) + coords
            mask_written += coords
            d += idx.dim()
        else:
            shapes.append(tuple(idx.shape))
            d += 1
    if d > self.dim():
        raise CostError(f"{op}: indices address {d} dims of a {self.dim()}-d tensor")
    kept += [int(s) for s in self.shape[d:]]
    k = numel(broadcast_shape(*shapes)) if shapes else 1
    return k, math.prod(kept), exact, mask_read, mask_written


def _index_family(per: int) -> str:
    """Row-granular indexing (>= ROW_ELEMS contiguous elements per position) vs element-granular."""
    return "index" if per >= ROW_ELEMS else "gather"


def _idx_bytes(indices: list[Any]) -> int:
    return sum(nbytes(i) for i in indices if i is not None and i.dtype not in (torch.bool, torch.uint8))


@formula(family="index")
def index_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, indices = b["self"], list(b["indices"])
    k, per, exact, mask_read, mask_written = _indexed_positions(self, indices, op)
    out = k * per * self.dtype.itemsize
    return OpCost(0, _idx_bytes(indices) + mask_read + out, out + mask_written, dtype=self.dtype, exact=exact,
                  note="" if exact else _MASK_NOTE, family=_index_family(per))


@formula(family="index")
def index_put_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, indices, values = b["self"], list(b["indices"]), b["values"]
    k, per, exact, mask_read, mask_written = _indexed_positions(self, indices, op)
    isz = self.dtype.itemsize
    elems = k * per
    read = _idx_bytes(indices) + mask_read + nbytes(values)
    written = elems * isz + mask_written
    flops = 0
    if b["accumulate"]:
        read += elems * isz
        flops = elems
    if op is aten.index_put.default:
        read += nbytes(self)
        written += numel(self) * isz
    family = "scatter" if per < ROW_ELEMS else "index"
    return OpCost(flops, read, written, dtype=self.dtype, exact=exact, note="" if exact else _MASK_NOTE, family=family)


@formula(family="copy")
def slice_scatter_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    self, src = b["self"], b["src"]
    isz = self.dtype.itemsize
    return OpCost(0, nbytes(self) + nbytes(src), (numel(self) + numel(src)) * isz, dtype=self.dtype)
