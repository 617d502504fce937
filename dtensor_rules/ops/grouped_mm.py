"""``aten._grouped_mm(a, b, offs=None, bias=None, out_dtype=None)``: the MoE expert matmul.

``offs`` (int32, G entries) holds cumulative group ends along the *grouped* dim. Modes and the
strategies per mesh dim (``[out, a, b, offs]``; offs is always R: its values are global positions):

===========  ===============  ==========================  =========================================
mode         out              a, b                        why it is valid
===========  ===============  ==========================  =========================================
2-D x 3-D    (M, N)           a (M, K), b (G, K, N); M grouped by offs
             S(1)             R, S(2)                     columns are independent
             P(sum)           S(1), S(1)                  K is contracted
3-D x 2-D    (M, N)           a (G, M, K), b (K, N); N grouped by offs
             S(0)             S(1), R                     rows are independent
             P(sum)           S(2), S(0)                  K is contracted
2-D x 2-D    (G, M, N)        a (M, K), b (K, N); K grouped by offs
             S(1)             S(0), R                     rows are independent
             S(2)             R, S(1)                     columns are independent
3-D x 3-D    (G, M, N)        a (G, M, K), b (G, K, N); no offs (batched)
             S(0)             S(0), S(0)                  experts are independent
             S(1) / S(2)      S(1), R / R, S(2)           rows / columns are independent
             P(sum)           S(2), S(1)                  K is contracted
all modes    P(sum)           P(sum), R  /  R, P(sum)     linear in each operand
all modes    P(avg)           P(avg), R  /  R, P(avg)     idem for the mean
===========  ===============  ==========================  =========================================

Not offered: sharding the grouped dim (M of 2-D x 3-D, N of 3-D x 2-D, K of 2-D x 2-D) or the
expert dim G of b / a in the offs modes: a shard moves the group boundaries, and offs would
have to be rewritten per rank (an op of its own, not a placement); both operands Partial
(bilinear); P(max/min) (the other factor's sign flips the order).

Alignment. The kernel needs each operand's leading stride (row- or column-major) to be a
multiple of 16 bytes. A strategy is kept only if, on *every* rank (uneven shards included),
the local operand is accepted both in the layout DTensor hands over without redistribution
(the global strides cut to the local shape) and in the contiguous layout a redistribution
produces. This needs the mesh and the dtype, so this is an op-strategy rule.

fp32 / fp16 on CPU. The CPU kernel accepts fp32, fp16 and bf16, but the meta kernel (used by
DTensor to compute the output's global shape) only bf16. :func:`grouped_mm_meta_fallback`
(installed and uninstalled with the rule) lets DTensor's tensor-meta step compute the output from the shapes when
the only objection was the dtype; every other check (dims, K, offs dtype, alignment for the
real dtype, bias, out_dtype) is repeated, so inputs torch rejects still fail the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from dtensor_rules._upstream import (
    compute_local_shape_and_global_offset,
    compute_local_stride,
    DTensorSpec,
    expand_to_mesh,
    OpSchema,
    OpStrategy,
    TensorMeta,
)
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from dtensor_rules.costs.formulas.matmul import grouped_mm_cost
from dtensor_rules.registry import register
from dtensor_rules.testing.suites.grouped_mm import grouped_mm_samples

aten = torch.ops.aten
GROUPED_MM = aten._grouped_mm.default
CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def kernel_accepts_layout(shape: Sequence[int], stride: Sequence[int], itemsize: int) -> bool:
    """The stride check of ``_grouped_mm`` (meta and CPU kernels) for one operand, for any dtype size."""
    end = len(shape) - 1
    align = max(16 // itemsize, 1)
    if stride[end - 1] == 1 and stride[end] >= max(1, shape[end - 1]):
        return stride[end] % align == 0
    if stride[end] == 1 and stride[end - 1] >= max(1, shape[end]):
        return stride[end - 1] % align == 0
    return False


def _contiguous_stride(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(torch.empty(tuple(shape), device="meta").stride())


def operand_ok(
    meta: TensorMeta, placements: Sequence[Placement], mesh_shape: Sequence[int], current: Sequence[Placement]
) -> bool:
    """True if every rank's local operand passes the kernel's stride check.

    Without redistribution (``placements == current``) the kernel gets the global strides cut to
    the local shape; after one it gets a contiguous shard (checked too: conservative either way).
    """
    shard_pl = [p if isinstance(p, Shard) else Replicate() for p in placements]
    seen: set[tuple[int, ...]] = set()
    for coord in itertools.product(*(range(s) for s in mesh_shape)):
        local, _ = compute_local_shape_and_global_offset(meta.shape, tuple(mesh_shape), list(coord), shard_pl)
        local = tuple(local)
        if local in seen:
            continue
        seen.add(local)
        kept = compute_local_stride(meta.stride, local)
        layouts = [kept] if tuple(placements) == tuple(current) else [kept, _contiguous_stride(local)]
        for stride in layouts:
            if not kernel_accepts_layout(local, stride, meta.dtype.itemsize):
                return False
    return True


def single_dim_strategies(a_ndim: int, b_ndim: int, has_offs: bool) -> list[list[Placement | None]]:
    """``[out, a, b, offs]`` rows per mesh dim (offs column only when offs is given)."""
    R, S, P, A = Replicate(), Shard, Partial("sum"), Partial("avg")
    o: list[Placement | None] = [R] if has_offs else []
    rows: list[list[Any]] = [[P, P, R], [P, R, P], [A, A, R], [A, R, A]]
    mode = (a_ndim, b_ndim)
    if mode == (2, 3):
        rows += [[S(1), R, S(2)], [P, S(1), S(1)]]
    elif mode == (3, 2):
        rows += [[S(0), S(1), R], [P, S(2), S(0)]]
    elif mode == (2, 2):
        rows += [[S(1), S(0), R], [S(2), R, S(1)]]
    elif mode == (3, 3):
        rows += [[S(0), S(0), S(0)], [S(1), S(1), R], [S(2), R, S(2)], [P, S(2), S(1)]]
    return [r + o for r in [[R, R, R]] + rows]


def _arg(op_schema: OpSchema, i: int, name: str) -> Any:
    if len(op_schema.args_schema) > i:
        return op_schema.args_schema[i]
    return op_schema.kwargs_schema.get(name)


def _meta(strategy: Any) -> TensorMeta:
    spec = strategy.strategies[0].output_spec
    assert isinstance(spec, DTensorSpec) and spec.tensor_meta is not None
    return spec.tensor_meta


def _current(strategy: Any, ndim: int) -> tuple[Placement, ...]:
    """The operand's placement as it arrives (dispatch passes exactly one spec per input; a query
    listing several candidates is answered as for replicated inputs)."""
    specs = strategy.strategies
    return tuple(specs[0].output_spec.placements) if len(specs) == 1 else (Replicate(),) * ndim


def output_meta(a: TensorMeta, b: TensorMeta, offs: TensorMeta | None, out_dtype: torch.dtype | None) -> TensorMeta:
    """The global output meta, from torch's own shape logic for grouped mm."""
    from dtensor_rules._upstream import create_grouped_mm_output_tensor

    def fake(m: TensorMeta | None) -> torch.Tensor | None:
        return None if m is None else torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta")

    out = create_grouped_mm_output_tensor(fake(a), fake(b), fake(offs), out_dtype)
    return TensorMeta(out.shape, out.stride(), out.dtype)


def grouped_mm_meta_fallback(op_schema: OpSchema, err: Exception) -> TensorMeta:
    """DTensor's output-meta step for fp32/fp16 grouped mm, which the meta kernel rejects (bf16 only).

    Installed through ``register(meta_fallback=...)``: only consulted when the fake-tensor
    step raised, and only answers when the CPU kernel itself would accept the inputs.
    """
    specs = [_arg(op_schema, i, n) for i, n in enumerate(("self", "mat2", "offs", "bias"))]
    a, b, offs, bias = [s.tensor_meta if isinstance(s, DTensorSpec) else None for s in specs]
    out_dtype = _arg(op_schema, 4, "out_dtype")
    if a is None or b is None or a.dtype == torch.bfloat16:
        raise err
    reason = cpu_kernel_check(a, b, offs, bias, out_dtype)
    if reason is not None:  # the kernel's own objection, not the meta kernel's dtype restriction
        raise RuntimeError(f"aten._grouped_mm: {reason}") from err
    return output_meta(a, b, offs, out_dtype)


@register(
    GROUPED_MM, kind="op_strategy", cost=grouped_mm_cost, samples=grouped_mm_samples,
    meta_fallback=grouped_mm_meta_fallback,
)
def grouped_mm_strategy(op_schema: OpSchema) -> OpStrategy:
    """Experts/M/N sharding and K -> P(sum) per mode (grouped dims never split), filtered by alignment per rank."""
    mesh = op_schema.get_mesh_from_args()
    a_s, b_s = _arg(op_schema, 0, "self"), _arg(op_schema, 1, "mat2")
    offs_s, bias_s = _arg(op_schema, 2, "offs"), _arg(op_schema, 3, "bias")
    a, b = _meta(a_s), _meta(b_s)
    offs = _meta(offs_s) if isinstance(offs_s, OpStrategy) else None
    rows = single_dim_strategies(len(a.shape), len(b.shape), offs is not None)
    if isinstance(bias_s, OpStrategy):  # the kernels reject bias; only all-Replicate, so torch raises its error
        rows = [[Replicate()] * (len(rows[0]) + 1)]
    out_dtype = _arg(op_schema, 4, "out_dtype")

    a_now, b_now = _current(a_s, mesh.ndim), _current(b_s, mesh.ndim)

    def aligned(input_specs: list[DTensorSpec], output_specs: Any) -> bool:
        return operand_ok(a, input_specs[0].placements, mesh.shape, a_now) and operand_ok(
            b, input_specs[1].placements, mesh.shape, b_now
        )

    out_meta = output_meta(a, b, offs, out_dtype)
    strategy = expand_to_mesh(
        mesh, op_schema, rows, output_tensor_meta=out_meta, input_index=1, allow_uneven_sharding=True,
        strategy_filter=aligned,
    )
    if not strategy.strategies:  # nothing the kernel accepts: all-Replicate, so torch raises its own stride error
        strategy = expand_to_mesh(
            mesh, op_schema, rows[:1], output_tensor_meta=out_meta, input_index=1, allow_uneven_sharding=True
        )
    return strategy


# --------------------------------------------------------------------------- meta fallback for DTensor
def cpu_kernel_check(a: Any, b: Any, offs: Any, bias: Any, out_dtype: torch.dtype | None) -> str | None:
    """None if the CPU kernel accepts these operands (shapes/strides/dtypes only), else why not."""
    if a.dtype not in CPU_DTYPES or b.dtype != a.dtype:
        return f"grouped mm needs matching fp32/fp16/bf16 operands, got {a.dtype} and {b.dtype}"
    if len(a.shape) not in (2, 3) or len(b.shape) not in (2, 3):
        return "Multiplicands must be 2D or 3D"
    if (len(a.shape) == 3 or len(b.shape) == 3) and a.shape[-1] != b.shape[-2]:
        return "contraction dimension of mat_a and mat_b must match"
    for m in (a, b):
        if not kernel_accepts_layout(m.shape, m.stride, m.dtype.itemsize):
            return "strides should be multiple of 16 bytes"
    if len(a.shape) == 2 or len(b.shape) == 2:
        if offs is None or len(offs.shape) != 1 or offs.dtype != torch.int32:
            return "Offsets tensor must be a 1-D int32 tensor for 2D multiplicand layouts"
    elif offs is not None:
        return "Offsets tensor provided, but is not needed for 3D/3D multiplicand layouts"
    if bias is not None:
        return "Bias not supported yet"
    if out_dtype is not None and out_dtype != a.dtype:
        return "Grouped gemm output dtype must match `mat_a` dtype"
    return None
