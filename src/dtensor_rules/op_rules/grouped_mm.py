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

Alignment. The kernels need each operand's leading stride (row- or column-major) to be a
multiple of 16 bytes, and they check it on the layout they are handed. Two mechanisms:

- the rule keeps a strategy only if every local shard passes the check in the layouts DTensor
  usually holds (dense in the global dim order, or contiguous after a redistribution). That is a
  question per (mesh dim, distinct local size) (at most 3 sizes per mesh dim: full chunk,
  remainder, empty), memoized on (operand meta, sharded dims, mesh shape): never per rank;
- layouts no rule can foresee (``distribute_tensor`` of a column-major weight gives contiguous
  row-major shards; an uneven all-gather un-pads with ``narrow()``, so a ``(1, 16)`` bf16 ``a``
  gathered over 3 ranks arrives with stride ``(18, 1)``) are fixed by the rule's DTensor handler
  (:func:`grouped_mm_handler`): any local operand the kernel would reject is copied into a
  padded, aligned buffer (:func:`~dtensor_rules.kernels.grouped_mm_checks.aligned_copy`) right before the local call.

Misaligned *global* operands still raise torch's own error (the meta step checks the global
layout). With symbolic sizes the check never guards on an unbacked size: an undecidable split
drops the strategy (``guard_or_false``).

Partial rows are offered only for the reduce ops some input carries (dispatch: usually none;
solver queries list every candidate, so they see all rows), and only when the output dtype is
the operands' dtype (a cast between parts would not be additive; the CPU kernel rejects a
different ``out_dtype`` anyway).

fp32 / fp16 on CPU. The CPU kernel accepts fp32, fp16 and bf16, but the meta kernel (used by
DTensor to compute the output's global shape) only bf16. :func:`grouped_mm_meta_fallback`
(installed and uninstalled with the rule) lets DTensor's tensor-meta step compute the output from the shapes when
the only objection was the dtype; every other check (dims, K, offs dtype, alignment for the
real dtype, bias, out_dtype) is repeated, so inputs torch rejects still fail the same way.

Cost (family ``matmul``): per-group matmuls, exact from ``offs`` when its values are known.

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

Samples: all four modes, fp32 and bf16, uneven groups, an empty group,
uneven M, a column-major (transposed) weight as the backward produces.

``offs[-1]`` always equals the grouped length: rows/columns past it are left uninitialized by
the kernel, so a single-device result there is not defined.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from dtensor_rules._upstream import (
    DTensorSpec,
    dispatch_with_local_fix,
    expand_to_mesh,
    maybe_run_for_local_tensor,
    OpSchema,
    OpStrategy,
    TensorMeta,
)
from dtensor_rules.kernels.grouped_mm_checks import (  # noqa: F401  (kernel_accepts_layout: re-exported)
    CPU_DTYPES,
    aligned_copy,
    check_call,
    cpu_kernel_check,
    kernel_accepts_layout,
    shards_accepted_cached,
)
from dtensor_rules.op_rules._solver_rows import is_full_enumeration, is_solver_query, trim_strategy
from dtensor_rules.costs._util import CostError, is_concrete, nbytes
from dtensor_rules.costs.formulas import formula
from dtensor_rules.costs.op_cost import OpCost
from dtensor_rules.op_rules._common import generator, Samples
from dtensor_rules.registry import register

aten = torch.ops.aten
GROUPED_MM = aten._grouped_mm.default


# --------------------------------------------------------------------------- cost formula

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


# --------------------------------------------------------------------------- sample suites

def _offs(*ends: int) -> torch.Tensor:
    return torch.tensor(ends, dtype=torch.int32)


def grouped_mm_samples() -> Samples:
    g = generator(20)
    r = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    bf = torch.bfloat16
    return [
        ((r(12, 8), r(3, 8, 8), _offs(3, 7, 12)), {}),  # 2-D x 3-D, M grouped
        ((r(12, 8), r(3, 8, 8), _offs(4, 4, 12)), {}),  # an empty group
        ((r(3, 6, 8), r(8, 12), _offs(4, 8, 12)), {}),  # 3-D x 2-D, N grouped
        ((r(6, 16, dtype=bf), r(16, 8, dtype=bf), _offs(5, 16)), {}),  # 2-D x 2-D, K grouped
        ((r(4, 5, 16, dtype=bf), r(4, 16, 8, dtype=bf)), {}),  # 3-D x 3-D batched, uneven M
        ((r(2, 3, 12), r(2, 8, 12).transpose(-2, -1)), {}),  # column-major weight
    ]


def single_dim_strategies(
    a_ndim: int, b_ndim: int, has_offs: bool, reduce_ops: tuple[str, ...] = ("sum", "avg")
) -> list[list[Placement | None]]:
    """``[out, a, b, offs]`` rows per mesh dim (offs column only when offs is given).

    ``reduce_ops``: which of the linear Partial rows (sum, avg) to offer."""
    R, S, P = Replicate(), Shard, Partial("sum")
    o: list[Placement | None] = [R] if has_offs else []
    rows: list[list[Any]] = []
    for op in ("sum", "avg"):
        if op in reduce_ops:
            Q = Partial(op)
            rows += [[Q, Q, R], [Q, R, Q]]
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


def _carried_reduce_ops(*strategies: Any) -> tuple[str, ...]:
    """Reduce ops of the Partial placements any candidate spec of these inputs carries."""
    ops = {
        p.reduce_op
        for st in strategies
        if isinstance(st, OpStrategy)
        for spec in st.strategies
        for p in spec.output_spec.placements
        if isinstance(p, Partial)
    }
    return tuple(sorted(ops))


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


@maybe_run_for_local_tensor
def _aligned_local(t: torch.Tensor) -> torch.Tensor:
    return aligned_copy(t) if t.dim() >= 2 and t.is_floating_point() else t


def grouped_mm_handler(op: Any, args: Any, kwargs: Any) -> Any:
    """DTensor dispatch for ``_grouped_mm``: upstream's path, plus an aligned copy of any local
    operand whose layout (after redistribution) the kernel would reject."""
    return dispatch_with_local_fix(op, args, kwargs, _aligned_local)


@register(
    GROUPED_MM, kind="op_strategy", cost=grouped_mm_cost, samples=grouped_mm_samples,
    meta_fallback=grouped_mm_meta_fallback, handler=grouped_mm_handler,
)
def grouped_mm_strategy(op_schema: OpSchema) -> OpStrategy:
    """Experts/M/N sharding and K -> P(sum) per mode (grouped dims never split), kept where the
    usual local layouts need no copy (checked per mesh dim and distinct local size, cached)."""
    mesh = op_schema.get_mesh_from_args()
    a_s, b_s = _arg(op_schema, 0, "self"), _arg(op_schema, 1, "mat2")
    offs_s, bias_s = _arg(op_schema, 2, "offs"), _arg(op_schema, 3, "bias")
    a, b = _meta(a_s), _meta(b_s)
    offs = _meta(offs_s) if isinstance(offs_s, OpStrategy) else None
    out_dtype = _arg(op_schema, 4, "out_dtype")
    same_dtype = out_dtype in (None, a.dtype) and a.dtype == b.dtype
    inputs = [x for x in (a_s, b_s, offs_s) if isinstance(x, OpStrategy)]
    reduce_ops = _carried_reduce_ops(a_s, b_s) if same_dtype else ()
    if same_dtype and is_solver_query(inputs):
        # a solver gets the P(sum) linearity rows upstream offers; P(avg) ones (a mean's partial kept
        # across the experts: no MoE step makes one) only under the full enumeration (op_rules._solver_rows)
        reduce_ops = ("sum", "avg") if is_full_enumeration() else ("sum",)
    rows = single_dim_strategies(len(a.shape), len(b.shape), offs is not None, reduce_ops)
    if isinstance(bias_s, OpStrategy):  # the kernels reject bias; only all-Replicate, so torch raises its error
        rows = [[Replicate()] * (len(rows[0]) + 1)]
    out_meta = output_meta(a, b, offs, out_dtype)
    mesh_shape = tuple(mesh.shape)

    def no_copy_needed(input_specs: list[DTensorSpec], output_specs: Any) -> bool:
        return all(
            shards_accepted_cached(m.shape, m.stride, m.dtype.itemsize, _shard_dims(spec.placements), mesh_shape)
            for m, spec in ((a, input_specs[0]), (b, input_specs[1]))
        )

    # allow_unbacked_sharding=False: an unbacked size not known to reach the shard count is not split
    kw = dict(output_tensor_meta=out_meta, input_index=1, allow_uneven_sharding=True, allow_unbacked_sharding=False)
    strategy = trim_strategy(expand_to_mesh(mesh, op_schema, rows, strategy_filter=no_copy_needed, **kw), inputs)
    if not strategy.strategies:  # nothing the kernel accepts: all-Replicate, so torch raises its own stride error
        strategy = expand_to_mesh(mesh, op_schema, rows[:1], **kw)
    return strategy


def _shard_dims(placements: Any) -> tuple[int | None, ...]:
    return tuple(p.dim if isinstance(p, Shard) else None for p in placements)
