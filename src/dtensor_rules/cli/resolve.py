"""Which op and which samples ``validate --op NAME`` checks: every shipped rule resolves.

- an op with its own sample suite: that suite (``testing.suites.find_op`` spellings: ``cumsum``,
  ``aten.cumsum``, ``aten.cumsum.default``);
- a rule torch defines later (``fma``: ``prims.fma`` exists once inductor is imported): the op is
  defined first (``registry.deferred``), then as above;
- an out= / in-place overload: its functional counterpart's suite turned into calls of it
  (``testing.measure.op_samples``, what the measured data uses);
- a sibling overload without either (``index.Tensor_hacked_twin``, ``_index_put_impl_``): the
  calls of the suite of the overload it copies that it accepts.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch._ops import OpOverload

from dtensor_rules.cli.op_names import spellings

__all__ = ["Resolved", "resolve"]

Samples = list[tuple[tuple[Any, ...], dict[str, Any]]]


class Resolved(NamedTuple):
    op: OpOverload
    samples: Samples
    how: str  # "own suite", "functional counterpart's suite", "<op>'s suite"


def _define_deferred(name: str) -> None:
    from dtensor_rules import registry

    for full, rule in registry.deferred().items():
        if name.replace("::", ".", 1) in spellings(full) or name in spellings(full):
            rule.define()


def _by_name(name: str) -> OpOverload | None:
    from dtensor_rules import registry

    wanted = name.replace("::", ".", 1)
    return next((op for op in registry.rules() if wanted in (str(op), op.name().replace("::", ".", 1))), None)


def _accepted(op: OpOverload, calls: Samples) -> Samples:
    """The calls ``op`` runs without error (on clones: an in-place op must not touch the suite)."""
    from torch.utils._pytree import tree_map

    from dtensor_rules.testing.aliasing import _written_args, aliased_sample

    out: Samples = []
    for args, kwargs in calls:
        try:
            call = aliased_sample(op, tuple(args), dict(kwargs)) if _written_args(op) else (tuple(args), dict(kwargs))
            trial = tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, call)
            op(*trial[0], **trial[1])
        except (RuntimeError, ValueError, TypeError, IndexError):
            continue
        out.append(call)
    return out


def _sibling(op: OpOverload) -> OpOverload | None:
    """The suite-owning overload ``op`` copies: same packet (hacked_twin) or the same name without
    leading/trailing ``_`` and ``_impl`` (``_index_put_impl_`` -> ``index_put``)."""
    from dtensor_rules.testing.suites import suites

    def base(o: OpOverload) -> str:
        return o._schema.name.split("::")[-1].strip("_").removesuffix("_impl")

    candidates = [s for s in suites() if s.overloadpacket is op.overloadpacket] or [s for s in suites() if base(s) == base(op)]
    return min(candidates, key=lambda s: (not str(s).endswith(".default"), str(s)), default=None)


def resolve(name: str) -> Resolved:
    """The op ``name`` spells and the samples ``validate`` checks it on; KeyError says why not."""
    from dtensor_rules.testing.measure import op_samples
    from dtensor_rules.testing.suites import find_op, suites

    _define_deferred(name)
    try:
        op = find_op(name)
        return Resolved(op, list(suites()[op]()), "own suite")
    except KeyError as missing:
        op = _by_name(name)
        if op is None:
            raise missing from None
    try:
        return Resolved(op, op_samples(op), "functional counterpart's suite")
    except KeyError:
        pass
    donor = _sibling(op)
    calls = _accepted(op, list(suites()[donor]())) if donor is not None else []
    if not calls:
        raise KeyError(f"{op} has our rule (see `status`) but no suite it accepts calls from, so `validate` cannot run it")
    return Resolved(op, calls, f"{donor}'s suite")
