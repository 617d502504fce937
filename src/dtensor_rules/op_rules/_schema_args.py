"""Read an op's arguments by schema name, and build strategy rows by argument name.

Arguments reach a rule positionally or as keywords (``topk(x, 2, dim=0)`` and
``topk(x, 2, 0)`` are the same call), and trailing defaults are often dropped; reading
them by position only (as several upstream rules do) silently uses the wrong value.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch._ops import OpOverload
from dtensor_rules._upstream import TensorMeta
from torch.utils._pytree import tree_leaves

from dtensor_rules.op_rules._common import PlacementOrHole


def schema_arg(op: OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any], name: str) -> Any:
    """The value of argument ``name`` as passed, or its schema default."""
    for i, a in enumerate(op._schema.arguments):
        if a.name != name:
            continue
        if not a.kwarg_only and i < len(args):
            return args[i]
        if name in kwargs:
            return kwargs[name]
        return a.default_value if a.has_default_value() else None
    raise KeyError(f"{op} has no argument named {name!r}")


def _is_meta(x: Any) -> bool:
    return isinstance(x, TensorMeta)


# argument values that are never containers (pytree leaves) and never a TensorMeta
_PLAIN_VALUES = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout, torch.memory_format)


def _n_metas(value: Any) -> int:
    """How many TensorMeta leaves ``value`` holds (fast for the usual tensor or scalar argument)."""
    t = type(value)
    if t is TensorMeta:
        return 1
    if t in _PLAIN_VALUES:
        return 0
    return sum(1 for leaf in tree_leaves(value, is_leaf=_is_meta) if _is_meta(leaf))


@functools.lru_cache(maxsize=None)
def _positional_names(op: OpOverload) -> tuple[str, ...]:
    return tuple(a.name for a in op._schema.arguments if not a.kwarg_only)


def tensor_arg_names(op: OpOverload, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[str]:
    """The argument name of every tensor input, in the pytree order DTensor uses (args, then kwargs)."""
    names: list[str] = []
    positional = _positional_names(op)
    for i, value in enumerate(args):
        name = positional[i] if i < len(positional) else f"arg{i}"
        names += [name] * _n_metas(value)
    for name, value in kwargs.items():
        names += [name] * _n_metas(value)
    return names


def row(
    op: OpOverload,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    outputs: Sequence[PlacementOrHole],
    inputs: Mapping[str, PlacementOrHole],
) -> list[PlacementOrHole]:
    """``[*outputs, *inputs]`` with each tensor input's placement looked up by argument name."""
    names = tensor_arg_names(op, args, kwargs)
    missing = [n for n in names if n not in inputs]
    if missing:
        raise KeyError(f"{op}: no placement given for tensor argument(s) {missing}")
    return [*outputs, *(inputs[n] for n in names)]
