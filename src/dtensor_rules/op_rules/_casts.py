"""Which Partial reduce ops survive an op's dtype cast of one input.

An op that casts a Partial input (``cat``'s type promotion, ``slice_scatter`` casting ``src``
to ``self``'s dtype) computes ``cast(x_r)`` per rank, and the reduction then combines those;
the single-device result is ``cast(reduce_r(x_r))``, the reduction done in the INPUT's dtype.
The two agree for every input only when:

=============  ====================================================================================
reduce op      the cast ``c`` must satisfy
=============  ====================================================================================
sum / avg      ``sum(c(x_r)) == c(sum(x_r))``: only the identity (same dtype). Narrowing floats
               round or overflow each part (70000 + -70000 in fp16 is inf - inf = NaN); widening
               floats lose the rounding/overflow the narrow sum has (fp16 parts 60000 + 60000 are
               inf single-device, 120000 in fp32); int -> float rounds each part; int widening
               loses the wraparound (int32 parts 2**31-1 + 1 wrap single-device, not in int64);
               float -> int truncates each part.
max / min      monotone (non-decreasing) ``c``: ``max(c(x_r)) == c(max(x_r))``. Float -> float
               (rounding and overflow to +-inf are monotone), int -> float, int -> an int type
               holding the whole source range. Not: int narrowing or signed <-> unsigned (wraps),
               float -> int (out-of-range values are undefined), complex (unordered).
=============  ====================================================================================

bool carries no Partial at all; avg needs a floating dtype (see :func:`partial_ops`).
"""

from __future__ import annotations

import functools

import torch

from dtensor_rules.op_rules._partial import ALL_REDUCE_OPS, monotone_cast, partial_ops, partial_survives_cast

__all__ = ["cast_partial_ops", "monotone_cast"]


@functools.lru_cache(maxsize=None)  # dtype pairs x op tuples: a small finite set, asked at every dispatch
def cast_partial_ops(src: torch.dtype, dst: torch.dtype, ops: tuple[str, ...] = ALL_REDUCE_OPS) -> tuple[str, ...]:
    """The reduce ops in ``ops`` for which a Partial ``src`` input gives a Partial ``dst`` result."""
    return tuple(o for o in partial_ops([src, dst], ops) if partial_survives_cast(o, src, dst))
