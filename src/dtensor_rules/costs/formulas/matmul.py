"""``aten._grouped_mm``: per-group matmuls, exact from ``offs`` when its values are known.

Modes (``offs`` holds cumulative group ends along the split dim; group g spans
``[offs[g-1], offs[g])``, with ``offs[-1]`` allowed below the full extent):

=============  ==============  ==============  ============  ===================================
mat_a          mat_b           split dim       out           flops
=============  ==============  ==============  ============  ===================================
(M, K)         (G, K, N)       M (rows of a)   (M, N)        sum_g 2 * m_g * K * N
(G, M, K)      (K, N)          N (cols of b)   (M, N)        sum_g 2 * M * K * n_g
(M, K)         (K, N)          K               (G, M, N)     sum_g 2 * M * k_g * N
(G, M, K)      (G, K, N)       none (bmm)      (G, M, N)     2 * G * M * K * N
=============  ==============  ==============  ============  ===================================

Bytes: the operand elements that take part
(rows/cols of empty groups and past ``offs[-1]`` are not read) plus ``offs``,
and the output elements produced, in ``out_dtype`` (default: mat_a's dtype).
When ``offs`` is fake/meta its values are unknown: groups are assumed balanced and to
cover the whole split dim (``exact=False``).

A call the op itself rejects (contraction sizes that differ, ``offs`` not 1-D int32, mismatched
dtypes, bias, a different ``out_dtype``, misaligned strides) raises the op's ``RuntimeError``
instead of being priced (the CPU kernel's checks, which accept fp32/fp16/bf16). Strides are
checked on the tensors given: price a rank's shard with the layout it will have.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules.costs._util import CostError, is_concrete, nbytes
from dtensor_rules.costs.formulas._formula import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.core.grouped_mm_checks import check_call

GROUPED_MM = torch.ops.aten._grouped_mm.default


def group_sizes(offs: torch.Tensor | None, groups: int, total: int) -> tuple[list[int], bool]:
    """Per-group extents along the split dim and whether they are exact (read from data)."""
    if offs is not None and is_concrete(offs):
        ends = [int(v) for v in offs.reshape(-1).tolist()]
        if len(ends) != groups:
            raise CostError(f"_grouped_mm: offs has {len(ends)} entries but there are {groups} groups")
        sizes, prev = [], 0
        for e in ends:
            if e < prev or e > total:
                raise CostError(f"_grouped_mm: offs {ends} must be non-decreasing and at most {total}")
            sizes.append(e - prev)
            prev = e
        return sizes, True
    q, r = divmod(total, groups) if groups else (0, 0)
    return [q + (1 if g < r else 0) for g in range(groups)], False


@formula(family="matmul")
def grouped_mm_cost(op: OpOverload, b: dict[str, Any]) -> OpCost:
    a, m2, offs, bias = b["self"], b["mat2"], b["offs"], b["bias"]
    check_call(a, m2, offs, bias, b["out_dtype"])  # what the op raises, estimate raises
    out_dtype = b["out_dtype"] or a.dtype
    ia, ib, io = a.dtype.itemsize, m2.dtype.itemsize, out_dtype.itemsize
    mode = (a.dim(), m2.dim())
    if mode != (3, 3) and offs is None:
        raise CostError(f"_grouped_mm with {mode[0]}-d x {mode[1]}-d inputs needs offs")
    if mode == (2, 3):
        (M, K), (G, _, N) = a.shape, m2.shape
        sizes, exact = group_sizes(offs, G, M)
        used, live = sum(sizes), sum(1 for s in sizes if s)
        flops = sum(2 * m * K * N for m in sizes)
        read, written = used * K * ia + live * K * N * ib, used * N * io
    elif mode == (3, 2):
        (G, M, K), (_, N) = a.shape, m2.shape
        sizes, exact = group_sizes(offs, G, N)
        used, live = sum(sizes), sum(1 for s in sizes if s)
        flops = sum(2 * M * K * n for n in sizes)
        read, written = live * M * K * ia + K * used * ib, M * used * io
    elif mode == (2, 2):
        (M, K), (_, N) = a.shape, m2.shape
        G = int(offs.shape[0])
        sizes, exact = group_sizes(offs, G, K)
        used = sum(sizes)
        flops = sum(2 * M * k * N for k in sizes)
        read, written = M * used * ia + used * N * ib, G * M * N * io
    elif mode == (3, 3):
        (G, M, K), (_, _, N) = a.shape, m2.shape
        flops, exact = 2 * G * M * K * N, True
        read, written = nbytes(a) + nbytes(m2), G * M * N * io
    else:
        raise CostError(f"_grouped_mm takes 2-d or 3-d inputs, got {mode[0]}-d and {mode[1]}-d")
    if offs is not None:
        read += nbytes(offs)
    note = "" if exact else "offs values unknown (fake/meta): balanced groups covering the split dim assumed"
    return OpCost(flops, read, written, dtype=a.dtype, unit="tensor", exact=exact, note=note)
