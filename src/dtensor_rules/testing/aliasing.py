"""Which tensor inputs of a call ARE outputs: ``out=`` kwargs and in-place ``self``.

Read from the op schema's alias annotations (``Tensor(a!)``): an argument written by the op
whose alias set a return shares is that return. DTensor treats the two kinds differently,
and so must the validator:

- an ``out=`` kwarg (kwarg-only, written) is not redistributed at dispatch; its placement
  becomes the output's (``expand_to_full_mesh_op_strategy`` only offers strategies whose
  output placement equals the out tensor's), so it is enumerated *jointly* with its output;
- an in-place ``self`` (positional, written) cannot be redistributed and the result is
  ``self``: input and output placement must both equal self's placement.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch._ops import OpOverload
from torch.utils import _pytree as pytree

from dtensor_rules.testing.simulate import Sample

__all__ = ["Aliasing", "aliasing", "is_inplace"]


@dataclass(frozen=True)
class Aliasing:
    """Tensor input index (pytree order of the sample) -> index of the output it is."""

    out: dict[int, int] = field(default_factory=dict)
    inplace: dict[int, int] = field(default_factory=dict)

    @property
    def all(self) -> dict[int, int]:
        return {**self.out, **self.inplace}

    def __bool__(self) -> bool:
        return bool(self.out or self.inplace)


def is_inplace(op: OpOverload) -> bool:
    """DTensor's own test (``single_dim_strategy``): the base op name ends with '_'."""
    return op.name().split("::")[1].split(".")[0].endswith("_")


def _written_args(op: OpOverload) -> dict[str, int]:
    """Argument name -> index of the return sharing its (written) alias set."""
    returns = [r.alias_info.before_set if r.alias_info is not None else set() for r in op._schema.returns]
    out: dict[str, int] = {}
    for a in op._schema.arguments:
        info = a.alias_info
        if info is None or not info.is_write:
            continue
        for i, sets in enumerate(returns):
            if sets and sets & info.before_set:
                out[a.name] = i
                break
    return out


def aliasing(op: OpOverload, sample: Sample) -> Aliasing:
    """Where ``sample``'s tensors alias ``op``'s outputs (empty for functional ops)."""
    written = _written_args(op)
    if not written:
        return Aliasing()
    by_name = {a.name: a for a in op._schema.arguments}
    positional = [a.name for a in op._schema.arguments if not a.kwarg_only]
    out: dict[int, int] = {}
    inplace: dict[int, int] = {}
    index = 0

    def visit(name: str, value: object) -> None:
        nonlocal index
        leaves = [x for x in pytree.tree_leaves(value) if isinstance(x, torch.Tensor)]
        if name in written and len(leaves) == 1:
            (out if by_name[name].kwarg_only else inplace)[index] = written[name]
        index += len(leaves)

    for i, value in enumerate(sample.args):
        visit(positional[i] if i < len(positional) else f"arg{i}", value)
    for name, value in sample.kwargs.items():
        visit(name, value)
    return Aliasing(out, inplace)


def with_sized_outs(op: OpOverload, sample: Sample) -> Sample:
    """``sample`` with each ``out=`` tensor replaced by zeros shaped like the result it receives.

    At dispatch the out DTensor has the output's global shape; a sample may pass ``torch.empty(0)``
    (resized by the op) and that must not change which layouts the out tensor can take.
    """
    from dtensor_rules.testing.simulate import as_outputs

    al = aliasing(op, sample)
    if not al.out:
        return sample
    tensors = sample.tensors()
    args, kwargs = sample.replace_tensors([t.clone() for t in tensors])
    result = as_outputs(op(*args, **kwargs))
    if result is None:
        raise ValueError(f"{op} returned no tensors for this sample")
    new = [torch.zeros_like(result[al.out[i]]) if i in al.out else t for i, t in enumerate(tensors)]
    new_args, new_kwargs = sample.replace_tensors(new)
    return Sample(new_args, new_kwargs)


def _arg_signature(op: OpOverload, skip: set[str] = frozenset()) -> list[tuple[str, str]]:  # type: ignore[assignment]
    return [(a.name, str(a.type)) for a in op._schema.arguments if a.name not in skip]


def functional_counterpart(op: OpOverload) -> OpOverload | None:
    """The functional overload ``op`` writes into ``out=`` / ``self`` for (None if there is none).

    ``cumsum.out`` -> ``cumsum.default``, ``sort.values`` -> ``sort.default``,
    ``scatter_.src`` -> ``scatter.src``: same non-out arguments, same names and types.
    """
    written = _written_args(op)
    if not written:
        return None
    ns, base = op.name().split("::")
    name = base.split(".")[0]
    out_args = {a.name for a in op._schema.arguments if a.name in written and a.kwarg_only}
    packet_name = name[:-1] if is_inplace(op) else name
    packet = getattr(getattr(torch.ops, ns), packet_name, None)
    if packet is None:
        return None
    want = _arg_signature(op, out_args)
    for overload in packet.overloads():
        candidate = getattr(packet, overload)
        if candidate is op or _written_args(candidate):
            continue
        if _arg_signature(candidate) == want:
            return candidate
    return None


def aliased_sample(op: OpOverload, args: tuple, kwargs: dict) -> tuple[tuple, dict]:  # type: ignore[type-arg]
    """A call of ``op`` (an out= or in-place overload) built from a call of its functional counterpart:
    out= tensors are added empty (the op resizes them), an in-place self is cloned."""
    written = _written_args(op)
    out_args = [a for a in op._schema.arguments if a.name in written and a.kwarg_only]
    args = tuple(a.clone() if isinstance(a, torch.Tensor) and i == 0 and not out_args else a for i, a in enumerate(args))
    if not out_args:
        return args, dict(kwargs)
    func = functional_counterpart(op)
    if func is None:
        raise ValueError(f"{op}: no functional overload to take output dtypes from")
    from dtensor_rules.testing.simulate import as_outputs

    result = as_outputs(func(*args, **kwargs))
    if result is None or len(result) != len(out_args):
        raise ValueError(f"{func} returned {result!r}, expected {len(out_args)} tensors for {op}'s out= arguments")
    new_kwargs = dict(kwargs)
    for a, r in zip(out_args, result):
        new_kwargs[a.name] = r.new_empty(0)
    return args, new_kwargs
