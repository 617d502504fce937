"""Which Partial reduce ops a set of dtypes can carry, shared by the indexing/slicing rules.

How DTensor turns a replicated integer into ``Partial(sum)`` exactly is the ``exact_int_partition``
patch of :mod:`dtensor_rules.dispatch.exact_int_partition`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

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
