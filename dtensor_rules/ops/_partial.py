"""Which Partial reduce ops a set of dtypes can carry, shared by the indexing/slicing rules."""

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
