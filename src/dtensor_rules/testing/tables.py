"""Readable strategy tables: what a rule offers for one call on a fixed mesh."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from torch._ops import OpOverload
from torch.distributed.device_mesh import init_device_mesh

from dtensor_rules import registry
from dtensor_rules.testing.aliasing import with_sized_outs
from dtensor_rules.testing.mesh import fake_world
from dtensor_rules.testing.query import Combo, emitted_combos
from dtensor_rules.testing.simulate import Sample
from dtensor_rules.testing.validator import _ours_info, format_combo

__all__ = ["strategy_table", "emitted"]


def emitted(op: OpOverload, args: Sequence[Any], kwargs: dict[str, Any] | None = None, mesh_shape: Sequence[int] = (2,), side: str = "ours") -> set[Combo]:
    """The combos ``side`` ("ours" or "upstream") offers for ``op(*args, **kwargs)``."""
    sample = with_sized_outs(op, Sample(tuple(args), dict(kwargs or {})))
    if side == "ours":
        rule = registry.get_rule(op)
        kind_fn = (rule.kind, _ours_info(rule))
    else:
        kind_fn = registry.upstream_strategy(op)
        if kind_fn is None:
            return set()
    with fake_world(math.prod(mesh_shape)):
        mesh = init_device_mesh("cpu", tuple(mesh_shape))
        return emitted_combos(kind_fn[0], kind_fn[1], op, sample, mesh)


def strategy_table(op: OpOverload, args: Sequence[Any], kwargs: dict[str, Any] | None = None, mesh_shape: Sequence[int] = (2,)) -> str:
    """One line per strategy our rule offers, sorted: ``(inputs) -> (outputs)``."""
    lines = sorted(format_combo(c) for c in emitted(op, args, kwargs, mesh_shape))
    return "\n".join(lines)
