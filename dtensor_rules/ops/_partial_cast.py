"""LOCAL COPY, to fold: ``partial_survives_cast`` is being added to ``ops/_partial.py`` by another
engineer; until it lands, the fma / softmax backward / grouped_mm rules use this one (same name,
same signature). Coordinator: replace imports of this module with ``ops._partial`` and delete it.

Whether a Partial value stays a Partial of the same reduce op through a dtype cast: the parts are
cast (and computed on) one by one, while the Partial's value is their reduction in the source
dtype, so the cast must commute with the reduction for every input.
"""

from __future__ import annotations

import torch

from dtensor_rules.ops._partial import partial_ops


def partial_survives_cast(reduce_op: str, src_dtype: torch.dtype, dst_dtype: torch.dtype) -> bool:
    """True if ``cast(reduce(parts)) == reduce(cast(part) for part in parts)`` for all parts.

    - no cast: whatever the dtype can carry (:func:`partial_ops`);
    - sum / avg: never through a real cast: an integer sum wraps in the narrow type and not in the
      wide one (int8 100 + 100), a float16 sum overflows to inf where float32 does not, and a
      narrowing cast rounds each part (cancelling parts 1e6 and -1e6 + 1 cast to float16 give
      inf - inf);
    - max / min: through monotone casts only (rounding and widening keep the order): float to
      float, integer to float, integer to a wider integer; not to or from bool or complex, not
      float to integer (NaN / out of range), not to a narrower integer (wraps).
    """
    if src_dtype == dst_dtype:
        return reduce_op in partial_ops([src_dtype])
    if reduce_op not in ("max", "min") or reduce_op not in partial_ops([src_dtype, dst_dtype]):
        return False
    if torch.bool in (src_dtype, dst_dtype) or src_dtype.is_complex or dst_dtype.is_complex:
        return False
    if dst_dtype.is_floating_point:
        return True
    if src_dtype.is_floating_point:
        return False
    src, dst = torch.iinfo(src_dtype), torch.iinfo(dst_dtype)
    return dst.min <= src.min and src.max <= dst.max
