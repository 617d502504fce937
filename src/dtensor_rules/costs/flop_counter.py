"""What ``import dtensor_rules`` adds to ``torch.utils.flop_counter.FlopCounterMode``: the
named patch ``flop_registry`` (docs/patches.md).

torch's convention: ``FlopCounterMode`` counts matrix-engine work in floating point (mm, addmm,
bmm, baddbmm, convolution, attention, ``_scaled_mm``); every other op counts 0. Tools read its
totals as tensor-core FLOPs: AutoParallel's compute estimator divides them by a per-dtype
TFLOP/s table that has float and int8 rows only. So :func:`register_flop_formulas` registers,
with ``register_flop_formula(..., get_raw=True)``, only rules whose cost formula has the
``matmul`` family (today ``aten._grouped_mm``, the one matmul torch has no formula for), and a
call counts only when its formula says it runs on the matrix unit in a floating dtype. torch's
own formulas are never replaced. Sorting, scans, histograms, scatters and the other integer or
data-movement ops keep counting 0 there; their arithmetic and bytes are in our own cost API
(:func:`dtensor_rules.costs.estimate`).

The registration waits for the user's first import of ``torch.utils.flop_counter`` (on CUDA
builds it imports triton, ~100 ms and ~75 MiB, which ``import dtensor_rules`` should not pay):
applying the patch registers at once if the module is imported, else right after its import.
Restoring the patch removes exactly our entries.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

from torch._ops import OpOverload, OpOverloadPacket

from dtensor_rules import patches
from dtensor_rules._upstream.post_import import when_imported
from dtensor_rules.costs._util import fits
from dtensor_rules.costs.op_cost import Formula
from dtensor_rules.costs.rule_source import rule_formulas

__all__ = ["register_flop_formulas", "register_flop_formulas_on_import", "unregister_flop_formulas",
           "registered_flop_formulas", "torch_flop_formulas_only", "TORCH_FLOP_FAMILIES"]

# the cost families torch's FlopCounterMode convention counts (matrix-engine work)
TORCH_FLOP_FAMILIES = frozenset({"matmul"})
_ours: dict[OpOverloadPacket, Callable[..., int]] = {}
FLOP_COUNTER = "torch.utils.flop_counter"


def _counter(packet: OpOverloadPacket, overloads: dict[OpOverload, Formula]) -> Callable[..., int]:
    def flops(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        for op, formula in overloads.items():
            if fits(op, args, kwargs):
                cost = formula(op, args, kwargs)
                floating = cost.dtype is not None and (cost.dtype.is_floating_point or cost.dtype.is_complex)
                return cost.flops if cost.unit == "tensor" and floating else 0
        return 0  # an overload we have no formula for (e.g. an out= variant): torch's old answer

    flops.__name__ = f"dtensor_rules_{packet.__name__}_flops"
    return flops


def _packets() -> dict[OpOverloadPacket, dict[OpOverload, Formula]]:
    out: dict[OpOverloadPacket, dict[OpOverload, Formula]] = {}
    for op, formula in rule_formulas().items():
        if getattr(formula, "family", None) in TORCH_FLOP_FAMILIES:
            out.setdefault(op.overloadpacket, {})[op] = formula
    return out


def register_flop_formulas() -> list[OpOverloadPacket]:
    """Register our matmul-family formulas where torch has none; returns the packets now counted by ours."""
    from torch.utils import flop_counter as fc

    for packet, overloads in _packets().items():
        current = fc.flop_registry.get(packet)
        if current is not None:
            continue  # torch's own formula, or ours from an earlier call
        fn = _counter(packet, overloads)
        fc.register_flop_formula(packet, get_raw=True)(fn)
        _ours[packet] = fc.flop_registry[packet]
    return registered_flop_formulas()


def register_flop_formulas_on_import() -> None:
    """Apply the ``flop_registry`` patch: :func:`register_flop_formulas` once ``torch.utils.flop_counter``
    is imported (now if it is)."""
    patches.apply(["flop_registry"])


def registered_flop_formulas() -> list[OpOverloadPacket]:
    from torch.utils import flop_counter as fc

    return [p for p, fn in _ours.items() if fc.flop_registry.get(p) is fn]


def unregister_flop_formulas() -> None:
    """Remove exactly the entries :func:`register_flop_formulas` added (torch's are untouched)."""
    fc = sys.modules.get(FLOP_COUNTER)
    for packet, fn in list(_ours.items()):
        if fc is not None and fc.flop_registry.get(packet) is fn:
            del fc.flop_registry[packet]
        del _ours[packet]


@contextlib.contextmanager
def torch_flop_formulas_only() -> Iterator[None]:
    """Inside: FlopCounterMode counts with torch's formulas alone; on exit exactly the entries of
    ours that were registered before come back (the same function objects)."""
    from torch.utils import flop_counter as fc

    saved = {p: fn for p, fn in _ours.items() if fc.flop_registry.get(p) is fn}
    unregister_flop_formulas()
    try:
        yield
    finally:
        for packet, fn in saved.items():
            if packet not in fc.flop_registry:
                fc.flop_registry[packet] = fn
                _ours[packet] = fn


_cancel: list[Callable[[], None]] = []


def _apply() -> None:
    _cancel.append(when_imported(FLOP_COUNTER, patches.guarded("flop_registry", lambda _module: register_flop_formulas())))


def _restore() -> None:
    _cancel.pop()()
    unregister_flop_formulas()


patches.register(patches.Patch(
    name="flop_registry",
    changes=f"{FLOP_COUNTER}.flop_registry: adds aten._grouped_mm (2*M*N*K per group, floating dtypes) and "
    "no other op; torch's own entries are untouched",
    reason="FlopCounterMode counts 0 for _grouped_mm, the expert matmuls that are most of an MoE layer's "
    "FLOPs, so MFU and solver cost models built on it are off by that much",
    upstream="missing: torch.utils.flop_counter.flop_registry has no aten._grouped_mm formula: FlopCounterMode counts "
    "0 for it (checked: torch 2.13.0, 2.14.1)",
    required=True,
    apply=_apply,
    restore=_restore,
    waits_for=FLOP_COUNTER,
    pending=lambda: FLOP_COUNTER not in sys.modules,
))
