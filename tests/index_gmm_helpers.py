"""Shared by the rule tests: our rule's emitted 1-D strategies as sorted text (for golden tables)."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh

from dtensor_rules import registry
from dtensor_rules.testing.mesh import fake_world
from dtensor_rules.testing.query import emitted_combos
from dtensor_rules.testing.simulate import Sample
from dtensor_rules.testing.validator import _ours_info, format_combo


def strategy_table(op: Any, args: tuple, kwargs: dict | None = None, mesh_shape: tuple[int, ...] = (2,)) -> str:
    rule = registry.get_rule(op)
    with fake_world(math.prod(mesh_shape)):
        mesh = init_device_mesh("cpu", mesh_shape)
        combos = emitted_combos(rule.kind, _ours_info(rule), op, Sample(tuple(args), dict(kwargs or {})), mesh)
    return "\n".join(sorted(format_combo(c) for c in combos))


def idx(*vals: int) -> torch.Tensor:
    return torch.tensor(vals)
