"""Teach ``torch.utils.flop_counter.FlopCounterMode`` the ops it counts as free.

:func:`register_flop_formulas` registers our formulas (``OpCost.flops``) with
``register_flop_formula`` for every op packet whose rule has a cost formula (``Rule.cost``),
that has arithmetic and that torch has no formula for; torch's own formulas (mm, bmm,
attention, ...) are never replaced.
It is idempotent and undone by :func:`unregister_flop_formulas`. ``import dtensor_rules``
arranges for it (:func:`register_flop_formulas_on_import`): at once if
``torch.utils.flop_counter`` is already imported, else right after its first import (on CUDA
builds that module imports triton, ~100 ms and ~75 MiB, which ``import dtensor_rules`` should
not pay). Pure data movement (cat, gather, index, scatter, slice_scatter, the MoE index
permutation) is not registered: it has 0 flops and would only add empty rows to
FlopCounterMode tables.
"""

from __future__ import annotations

import contextlib

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._ops import OpOverload, OpOverloadPacket

from dtensor_rules.core.post_import import when_imported
from dtensor_rules.costs._util import fits
from dtensor_rules.costs.op_cost import Formula
from dtensor_rules.costs.rule_source import rule_formulas

__all__ = ["register_flop_formulas", "register_flop_formulas_on_import", "unregister_flop_formulas",
           "registered_flop_formulas", "torch_flop_formulas_only"]

aten = torch.ops.aten
_DATA_MOVEMENT = {aten.cat, aten.gather, aten.index, aten.slice_scatter, aten.scatter, aten.scatter_}
_DATA_MOVEMENT_NAMES = {"dtensor_rules::moe_permute_indices"}  # custom ops: by name, they may load later
_ours: dict[OpOverloadPacket, Callable[..., int]] = {}
FLOP_COUNTER = "torch.utils.flop_counter"


def _counter(packet: OpOverloadPacket, overloads: dict[OpOverload, Formula]) -> Callable[..., int]:
    def flops(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
        for op, formula in overloads.items():
            if fits(op, args, kwargs):
                return formula(op, args, kwargs).flops
        return 0  # an overload we have no formula for (e.g. an out= variant): torch's old answer

    flops.__name__ = f"dtensor_rules_{packet.__name__}_flops"
    return flops


def _packets() -> dict[OpOverloadPacket, dict[OpOverload, Formula]]:
    out: dict[OpOverloadPacket, dict[OpOverload, Formula]] = {}
    for op, formula in rule_formulas().items():
        packet = op.overloadpacket
        if packet not in _DATA_MOVEMENT and packet._qualified_op_name not in _DATA_MOVEMENT_NAMES:
            out.setdefault(packet, {})[op] = formula
    return out


def register_flop_formulas() -> list[OpOverloadPacket]:
    """Register our flop formulas where torch has none; returns the packets now counted by ours."""
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
    """:func:`register_flop_formulas` once ``torch.utils.flop_counter`` is imported (now if it is)."""
    when_imported(FLOP_COUNTER, lambda _module: register_flop_formulas())


def registered_flop_formulas() -> list[OpOverloadPacket]:
    from torch.utils import flop_counter as fc

    return [p for p, fn in _ours.items() if fc.flop_registry.get(p) is fn]


def unregister_flop_formulas() -> None:
    """Remove exactly the entries :func:`register_flop_formulas` added (torch's are untouched)."""
    from torch.utils import flop_counter as fc

    for packet, fn in list(_ours.items()):
        if fc.flop_registry.get(packet) is fn:
            del fc.flop_registry[packet]
        del _ours[packet]


@contextlib.contextmanager
def torch_flop_formulas_only() -> Iterator[None]:
    """Inside: FlopCounterMode counts with torch's formulas alone; on exit exactly the entries of
    ours that were registered before come back (the same function objects, a user rule's too)."""
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
