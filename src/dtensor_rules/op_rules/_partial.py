"""Which Partial reduce ops a set of dtypes can carry, shared by the indexing/slicing rules.

Also the ``exact_int_partition`` patch (applied by ``dtensor_rules.install()``): upstream turns
a replicated value into ``Partial(sum)`` as ``v / n`` on every rank, a FLOAT for an integer
tensor (``scatter_add`` of an int64 self then fails on the dtype mismatch, other ops silently
promote). For integer and bool dtypes the patch keeps the value on mesh coordinate 0 and zeros
elsewhere: the sum is exactly ``v``, wraparound included. Floating dtypes keep upstream's ``v / n``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from dtensor_rules._upstream import maybe_run_for_local_tensor, mesh_coordinate, swap_partial_partition
from dtensor_rules.dispatch.greedy import ExactIntegerPartial

ALL_REDUCE_OPS = ("sum", "avg", "max", "min")


def partial_ops(dtypes: Iterable[torch.dtype], ops: Iterable[str] = ALL_REDUCE_OPS) -> tuple[str, ...]:
    """The reduce ops in ``ops`` every dtype in ``dtypes`` can be Partial over.

    bool cannot be Partial at all (DTensor has no boolean reduction); ``avg`` needs a
    floating (or complex) dtype because the mean of integers is not an integer.
    """
    dts = list(dtypes)
    if any(d == torch.bool for d in dts):
        return ()
    floating = all(d.is_floating_point or d.is_complex for d in dts)
    complex_ = any(d.is_complex for d in dts)
    out = []
    for op in ops:
        if op == "avg" and not floating:
            continue
        if op in ("max", "min") and complex_:
            continue  # complex numbers are not ordered
        out.append(op)
    return tuple(out)


def _range_contains(dst: torch.dtype, src: torch.dtype) -> bool:
    """Every value of integer ``src`` is a value of integer ``dst`` (the cast is exact)."""
    s, d = torch.iinfo(src), torch.iinfo(dst)
    return d.min <= s.min and d.max >= s.max


def monotone_cast(src: torch.dtype, dst: torch.dtype) -> bool:
    """True if casting ``src`` values to ``dst`` never reverses their order."""
    if src == dst:
        return True
    if src.is_complex or dst.is_complex or torch.bool in (src, dst):
        return False
    if dst.is_floating_point:
        return True  # float or int source: rounding to nearest is monotone, overflow goes to +-inf
    if src.is_floating_point:
        return False  # float -> int: out-of-range values are undefined
    return _range_contains(dst, src)


def partial_survives_cast(reduce_op: str, src_dtype: torch.dtype, dst_dtype: torch.dtype) -> bool:
    """Is ``cast(reduce(parts)) == reduce(cast(parts))`` for EVERY input, i.e. may a
    ``Partial(reduce_op)`` operand of ``src_dtype`` become a ``Partial(reduce_op)`` result in
    ``dst_dtype`` without being reduced first?

    - ``sum`` / ``avg``: only the identity cast. A narrowing float cast overflows or rounds
      each part (fp32 parts 70000 and -70000 become fp16 inf and -inf: NaN instead of 0); a
      widening float cast drops the rounding the src-dtype reduction applies; a widening
      integer cast loses the src-dtype wraparound (int32 parts summing past 2**31); int <->
      float casts are neither additive under wraparound nor under truncation.
    - ``max`` / ``min``: any cast that is non-decreasing on every value commutes with them:
      the identity, int -> int whose range contains the source's, int -> float (rounding is
      monotone), float -> float (rounding and overflow to inf are monotone). Not float -> int
      (NaN / out-of-range is undefined), not narrowing int (wraps), not to/from bool or complex.
    - ``bool`` is never Partial; ``avg`` needs a floating or complex dtype.
    """
    if reduce_op not in partial_ops([src_dtype, dst_dtype], (reduce_op,)):
        return False
    if src_dtype == dst_dtype:
        return True
    if reduce_op in ("sum", "avg"):
        return False
    return monotone_cast(src_dtype, dst_dtype)


@maybe_run_for_local_tensor
def _keep_on_first(tensor: torch.Tensor, coordinate: int) -> torch.Tensor:
    """Rank-local: the value on coordinate 0, zeros elsewhere (per simulated rank under LocalTensorMode)."""
    return tensor if coordinate == 0 else torch.zeros_like(tensor)


_upstream_partition: list[Any] = []


def _exact_partition(self: Any, tensor: torch.Tensor, mesh: Any, mesh_dim: int) -> torch.Tensor:
    if self.reduce_op == "sum" and not (tensor.is_floating_point() or tensor.is_complex()):
        return _keep_on_first(tensor, mesh_coordinate(mesh, mesh_dim))
    return _upstream_partition[0](self, tensor, mesh, mesh_dim)


def _apply_exact_partition() -> None:
    _upstream_partition.append(swap_partial_partition(_exact_partition))
    ExactIntegerPartial.active = True  # dispatch's greedy choice may now move an integer R -> P(sum)


def _restore_exact_partition() -> None:
    swap_partial_partition(_upstream_partition.pop())
    ExactIntegerPartial.active = False


def _register() -> None:
    from dtensor_rules.patches import Patch, register

    register(Patch(
        name="exact_int_partition",
        apply=_apply_exact_partition,
        restore=_restore_exact_partition,
        changes="Partial._partition_value (Replicate -> Partial(sum)): integer and bool tensors keep the "
        "value on mesh coordinate 0 and zeros elsewhere; floating tensors keep upstream's v / n",
        reason="upstream's v / n is a float for an integer tensor: scatter_add of an int64 self fails on "
        "the dtype, other ops silently promote",
        upstream="defect: Partial._partition_value (Replicate -> Partial(sum)) divides by the mesh size, so an "
        "integer or bool tensor comes back floating (checked: torch 2.13.0, 2.14.1)",
        required=True,
    ))


_register()
