"""Ops torch's ``FlopCounterMode`` already prices: flops from torch's own registered formula.

``torch.utils.flop_counter.flop_registry`` maps op packets (``mm``, ``addmm``, ``bmm``,
``baddbmm``, ``_scaled_mm``, ``convolution`` and its backward, the SDPA / flash /
efficient / cuDNN attention kernels and their backwards, ...) to formula functions.
We call that function exactly as ``FlopCounterMode`` does (the op's arguments plus
``out_val``, the output computed by the meta kernel), so our count equals torch's by
construction; formulas are never re-derived here.

Bytes: every tensor operand's distinct memory read once, every output written once
(a roofline lower bound: tiled kernels re-read operands from cache, not DRAM).
These are matrix-engine kernels: ``unit="tensor"``, ``family="matmul"``.
Packets whose registry entry is one of ours (:mod:`dtensor_rules.costs.flop_counter`)
are skipped: those ops are priced by our table.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._ops import OpOverload

from dtensor_rules.costs._util import CostError, first_float_dtype, nbytes, numel
from dtensor_rules.costs.op_cost import OpCost, _tensors, meta_call

__all__ = ["torch_flop_cost", "torch_flop_formula"]


def torch_flop_formula(op: OpOverload) -> Any:
    """torch's registered flop formula for ``op``'s packet, or None (also None when the entry is ours)."""
    from torch.utils import flop_counter as fc

    from dtensor_rules.costs.flop_counter import _ours

    packet = op.overloadpacket
    fn = fc.flop_registry.get(packet)
    if fn is None or _ours.get(packet) is fn:
        return None
    return fn


def torch_flop_cost(op: OpOverload, args: tuple[Any, ...], kwargs: dict[str, Any]) -> OpCost | None:
    """Cost of an op torch's flop counter prices, or None if it prices no such op."""
    fn = torch_flop_formula(op)
    if fn is None:
        return None
    out = meta_call(op, args, kwargs)
    try:
        flops = int(fn(*args, out_val=out, **kwargs))
    except Exception as e:  # a formula that rejects these arguments: say which
        raise CostError(f"torch's flop formula for {op} failed on these arguments ({type(e).__name__}: {e})") from e
    ins = _tensors(args, kwargs)
    outs = [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
    written = sum(numel(t) * t.dtype.itemsize for t in outs)
    return OpCost(
        flops,
        sum(nbytes(t) for t in ins),
        written,
        dtype=first_float_dtype(ins),
        unit="tensor",
        source="torch_flop_counter",
        family="matmul",
    )
