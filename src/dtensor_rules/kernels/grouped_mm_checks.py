"""What the ``_grouped_mm`` kernels accept, as plain predicates shared by the rule, its
DTensor handler, its meta fallback and its cost formula (``op_rules/grouped_mm.py``), and by
dispatch's choice of uneven shards (``chunk_sizes``).

Every predicate is safe on symbolic sizes: a condition that cannot be decided without guarding
on a data-dependent (unbacked) size counts as *not* accepted (``guard_or_false``), so callers
fall back to the safe choice (drop a strategy, copy an operand) instead of guarding.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false

CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def alignment(itemsize: int) -> int:
    """Elements per 16 bytes: the leading stride must be a multiple of this."""
    return max(16 // itemsize, 1)


def kernel_accepts_layout(shape: Sequence[Any], stride: Sequence[Any], itemsize: int) -> bool:
    """The stride check of ``_grouped_mm`` (meta and CPU kernels) for one operand, any dtype size.

    The kernels check the leading stride even for size-1 dims (a ``(1, 16)`` view with stride
    ``(18, 1)`` is rejected although ``.contiguous()`` returns it unchanged).
    """
    end = len(shape) - 1
    align = alignment(itemsize)
    s0, s1 = stride[end - 1], stride[end]
    if guard_or_false(s0 == 1) and guard_or_false(s1 >= torch.sym_max(1, shape[end - 1])):
        return guard_or_false(s1 % align == 0)
    if guard_or_false(s1 == 1) and guard_or_false(s0 >= torch.sym_max(1, shape[end])):
        return guard_or_false(s0 % align == 0)
    return False


def aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` if the kernel accepts its layout, else a copy in a row-major buffer whose leading
    stride is padded to 16 bytes (a plain ``contiguous()`` is not enough: see above).

    The padded stride is at least 16 bytes even for zero columns: a contiguous ``(16, 0)`` has
    strides ``(1, 1)``, which the kernel rejects (a rank with no tokens meets this in backward)."""
    if kernel_accepts_layout(t.shape, t.stride(), t.element_size()):
        return t
    align = alignment(t.element_size())
    cols = t.shape[-1]
    padded = max((cols + align - 1) // align, 1) * align
    buf = t.new_empty((*t.shape[:-1], padded))
    out = buf.narrow(-1, 0, cols)
    out.copy_(t)
    return out


def chunk_sizes(size: int, parts: int) -> set[int]:
    """The distinct local sizes ``torch.chunk`` semantics (DTensor's Shard) give ``parts`` ranks."""
    full = -(-size // parts) if parts else size
    if full == 0:
        return {0}
    whole = min(size // full, parts)
    out = {full} if whole else set()
    rest = size - whole * full
    if whole < parts:
        out.add(rest)
        if whole + 1 < parts:
            out.add(0)
    return out


def cpu_kernel_check(a: Any, b: Any, offs: Any, bias: Any, out_dtype: torch.dtype | None, strides: bool = True) -> str | None:
    """None if the CPU kernel accepts these operands (shapes/strides/dtypes only), else its message.

    ``strides=False`` skips the 16-byte stride check (a rank's shard may be laid out differently).
    """
    if a.dtype not in CPU_DTYPES or b.dtype != a.dtype:
        return f"grouped mm needs matching fp32/fp16/bf16 operands, got {a.dtype} and {b.dtype}"
    if len(a.shape) not in (2, 3) or len(b.shape) not in (2, 3):
        return f"Multiplicands must be 2D or 3D but got mat_a.dim()={len(a.shape)} and mat_b.dim()={len(b.shape)}"
    if (len(a.shape) == 3 or len(b.shape) == 3) and not guard_or_false(a.shape[-1] == b.shape[-2]):
        return f"contraction dimension of mat_a and mat_b must match (got {a.shape[-1]} and {b.shape[-2]})"
    if strides:
        for name, m in (("mat_a", a), ("mat_b", b)):
            if not kernel_accepts_layout(m.shape, m.stride, m.dtype.itemsize):
                return f"{name}: strides should be multiple of 16 bytes (got strides {tuple(m.stride)})"
    if len(a.shape) == 2 or len(b.shape) == 2:
        if offs is None or len(offs.shape) != 1 or offs.dtype != torch.int32:
            got = "none" if offs is None else f"{len(offs.shape)}-D {offs.dtype}"
            return f"Offsets tensor must be a 1-D int32 tensor for 2D multiplicand layouts, got {got}"
    elif offs is not None:
        return "Offsets tensor provided, but is not needed for 3D/3D multiplicand layouts"
    if bias is not None:
        return "Bias not supported yet"
    if out_dtype is not None and out_dtype != a.dtype:
        return f"Grouped gemm output dtype must match `mat_a` dtype ({a.dtype}), got {out_dtype}"
    return None


class _Meta:
    """shape / stride / dtype of a tensor, the fields :func:`cpu_kernel_check` reads."""

    def __init__(self, t: torch.Tensor) -> None:
        self.shape, self.stride, self.dtype = tuple(t.shape), tuple(t.stride()), t.dtype


def check_call(a: torch.Tensor, b: torch.Tensor, offs: Any, bias: Any, out_dtype: Any, strides: bool = True) -> None:
    """Raise the ``RuntimeError`` the op raises for these tensors (nothing if it accepts them)."""
    metas = [None if t is None else _Meta(t) for t in (a, b, offs, bias)]
    reason = cpu_kernel_check(*metas, out_dtype, strides=strides)
    if reason is not None:
        raise RuntimeError(f"aten._grouped_mm: {reason}")


def local_size_sets(shape: Sequence[Any], shard_dims: Sequence[int | None], mesh_shape: Sequence[int]) -> list[list[Any]] | None:
    """Per tensor dim, the distinct local sizes over all ranks (``shard_dims[i]``: the tensor dim
    mesh dim ``i`` shards, or None). At most 3 per mesh dim (full chunk, remainder, empty), so this
    is per (mesh dim, local size) work, never per rank. None if a symbolic size would need a guard.
    (Lists, not sets: symbolic sizes are not hashable.)"""
    sizes: list[list[Any]] = [[s] for s in shape]
    for mesh_dim, d in enumerate(shard_dims):
        if d is None:
            continue
        k, new = mesh_shape[mesh_dim], []
        for s in sizes[d]:
            if isinstance(s, int):
                new += [c for c in sorted(chunk_sizes(s, k)) if c not in new]
            elif guard_or_false(s % k == 0):  # symbolic: only an even split has one known size
                new.append(s // k)
            else:
                return None
        sizes[d] = new
    return sizes


def _dense_stride(shape: Sequence[Any], order: Sequence[int]) -> tuple[Any, ...]:
    """Dense strides for ``shape`` laying dims out in ``order`` (outermost first)."""
    stride: list[Any] = [0] * len(shape)
    step: Any = 1
    for d in reversed(order):
        stride[d] = step
        step = step * max(shape[d], 1) if isinstance(shape[d], int) else step * shape[d]
    return tuple(stride)


def shards_accepted(
    shape: Sequence[Any], stride: Sequence[Any], itemsize: int, shard_dims: Sequence[int | None], mesh_shape: Sequence[int]
) -> bool:
    """True if every local shard, laid out the way DTensor usually holds it (dense in the global
    dim order, as ``compute_local_stride`` says, or contiguous after a redistribution), passes
    the kernel's stride check. Layouts nobody can predict (an un-padded all-gather) are the
    handler's job (:func:`aligned_copy`); this only keeps strategies that need no copy."""
    if not any(d is not None and d >= len(shape) - 2 for d in shard_dims):
        return True  # last two dims whole on every rank: the global layout, already checked
    sizes = local_size_sets(shape, shard_dims, mesh_shape)
    if sizes is None:
        return False
    n = len(shape)
    if all(isinstance(s, int) for s in stride):
        # the global layout order (outermost first); ties only on size-1 dims, where it does not matter
        order = sorted(range(n), key=lambda d: stride[d], reverse=True)
    else:  # symbolic strides: batch dims outer, the last two row- or column-major
        col_major = guard_or_false(stride[-2] == 1) and not guard_or_false(stride[-1] == 1)
        order = list(range(n - 2)) + ([n - 1, n - 2] if col_major else [n - 2, n - 1])
    for local in itertools.product(*sizes):  # at most 3 sizes per dim: <= 27 shapes
        for o in (order, list(range(n))):
            if not kernel_accepts_layout(local, _dense_stride(local, o), itemsize):
                return False
    return True


@functools.lru_cache(maxsize=4096)
def _shards_accepted_cached(*key: Any) -> bool:
    return shards_accepted(*key)


def shards_accepted_cached(
    shape: Sequence[Any], stride: Sequence[Any], itemsize: int, shard_dims: Sequence[int | None], mesh_shape: Sequence[int]
) -> bool:
    """:func:`shards_accepted`, memoized on its (hashable, concrete) arguments: it depends only on
    the operand's meta, which dims are sharded, and the mesh shape."""
    key = (tuple(shape), tuple(stride), itemsize, tuple(shard_dims), tuple(mesh_shape))
    try:
        return _shards_accepted_cached(*key)
    except TypeError:  # SymInts are unhashable: compute without the cache
        return shards_accepted(*key)
