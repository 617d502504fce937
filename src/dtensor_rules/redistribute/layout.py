"""Layouts on an ordered mesh: (placements, device order) as compact tuples, text form.

A layout says, for every tensor dim, which mesh dims shard it and in which order
(major -> minor), plus which mesh dims hold a Partial. Sharding is *nested chunking*
(``torch.chunk`` semantics, DTensor's own uneven rule): the major mesh dim chunks the
full dim, the next one chunks that chunk, and so on. With the default order this is
exactly DTensor's left-to-right Shard semantics and upstream's ``shard_order``.

Compact state used by the planner (plain tuples, hashable, no DTensorSpec):
``State = (orders, partial)`` with ``orders[d]`` the tuple of mesh dims sharding tensor
dim ``d`` (major first) and ``partial`` a bitmask of Partial mesh dims.

Text form: one token per mesh dim, except that a tensor dim sharded by several mesh dims is
written once, where its lowest mesh dim is, as ``S(d)[major,...,minor]``; e.g. on a 3-D
mesh ``S(0)[1,0]R`` = tensor dim 0 sharded by mesh dim 1 then mesh dim 0, mesh dim 2 replicated.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

Orders = tuple[tuple[int, ...], ...]
State = tuple[Orders, int]
DeviceOrder = Sequence[int] | Mapping[int, Sequence[int]] | None

__all__ = ["Layout", "State", "normalize_orders", "parse_layout"]


def _check_placements(placements: Sequence[Placement], mesh_ndim: int, tensor_ndim: int) -> tuple[Placement, ...]:
    placements = tuple(placements)
    if len(placements) != mesh_ndim:
        raise ValueError(f"{len(placements)} placements given for a {mesh_ndim}-D mesh; give one per mesh dim")
    ops = set()
    out = []
    for m, p in enumerate(placements):
        if type(p) is Shard:
            d = p.dim + tensor_ndim if p.dim < 0 else p.dim
            if not 0 <= d < tensor_ndim:
                raise ValueError(f"placement {p} on mesh dim {m} shards dim {p.dim} of a {tensor_ndim}-D tensor")
            out.append(Shard(d))
        elif isinstance(p, Partial):
            ops.add(p.reduce_op)
            out.append(p)
        elif isinstance(p, Replicate):
            out.append(p)
        else:
            raise ValueError(f"placement {p!r} on mesh dim {m} is not supported (use Shard, Replicate or Partial)")
    if len(ops) > 1:
        raise ValueError(f"mixed Partial reduce ops {sorted(ops)} in {placements}; reduce to one op first")
    return tuple(out)


def normalize_orders(placements: Sequence[Placement], device_order: DeviceOrder, tensor_ndim: int) -> Orders:
    """Per-tensor-dim shard orders from placements + a device order (either form).

    Both forms list mesh dims major (splits first) to minor, upstream's ``shard_order`` meaning:
    a permutation of all mesh dims, from which each tensor dim takes the mesh dims that shard it
    in that order, or a dict ``{tensor_dim: (major_mesh_dim, ..., minor_mesh_dim)}``;
    ``None`` = left to right. So ``(2, 0, 1)`` and ``{0: (2, 0, 1)}`` are the same layout when
    all three mesh dims shard tensor dim 0.
    """
    mesh_ndim = len(placements)
    by_dim: dict[int, list[int]] = {}
    for m, p in enumerate(placements):
        if type(p) is Shard:
            by_dim.setdefault(p.dim, []).append(m)
    if device_order is None:
        position = list(range(mesh_ndim))
    elif isinstance(device_order, Mapping):
        orders: list[tuple[int, ...]] = [() for _ in range(tensor_ndim)]
        for d, ms in device_order.items():
            if not isinstance(d, int) or not 0 <= d < tensor_ndim:
                raise ValueError(f"device_order key {d!r} is not a tensor dim of a {tensor_ndim}-D tensor")
            ms = tuple(ms)
            if sorted(ms) != sorted(by_dim.get(d, [])):
                raise ValueError(
                    f"device_order[{d}]={ms} contradicts the placements: tensor dim {d} is sharded by mesh dims "
                    f"{tuple(by_dim.get(d, []))}; list exactly those, major first"
                )
            orders[d] = ms
        for d, ms in by_dim.items():
            if len(ms) > 1 and not orders[d]:
                raise ValueError(f"device_order dict has no entry for tensor dim {d}, sharded by mesh dims {tuple(ms)}")
            if not orders[d]:
                orders[d] = tuple(ms)
        return tuple(orders)
    else:
        major_to_minor = list(device_order)
        if sorted(major_to_minor) != list(range(mesh_ndim)) or not all(isinstance(m, int) for m in major_to_minor):
            raise ValueError(
                f"device_order {tuple(device_order)} must be a permutation of 0..{mesh_ndim - 1} "
                "(the mesh dims from major to minor: the first listed splits first)"
            )
        position = [0] * mesh_ndim
        for i, m in enumerate(major_to_minor):
            position[m] = i
    return tuple(tuple(sorted(by_dim.get(d, []), key=lambda m: position[m])) for d in range(tensor_ndim))


@dataclass(frozen=True)
class Layout:
    """Placements per mesh dim plus the shard order of every tensor dim."""

    orders: Orders
    partial: int  # bitmask of Partial mesh dims
    mesh_ndim: int
    reduce_op: str = "sum"

    @staticmethod
    def from_placements(placements: Sequence[Placement], tensor_ndim: int, device_order: DeviceOrder = None) -> "Layout":
        """Validate and normalise; memoised on exact-int inputs (a cached ``plan()`` with fresh lists stays cheap)."""
        key = _memo_key(placements, tensor_ndim, device_order)
        try:
            hit = _FROM_PLACEMENTS.get(key) if key is not None else None
        except TypeError:  # an unhashable entry: let the validation below name it
            key = hit = None
        if hit is None:
            hit = Layout._from_placements(placements, tensor_ndim, device_order)
            if key is not None:
                if len(_FROM_PLACEMENTS) >= 4096:
                    _FROM_PLACEMENTS.clear()
                _FROM_PLACEMENTS[key] = hit
        return hit

    @staticmethod
    def _from_placements(placements: Sequence[Placement], tensor_ndim: int, device_order: DeviceOrder) -> "Layout":
        placements = _check_placements(placements, len(placements), tensor_ndim)
        orders = normalize_orders(placements, device_order, tensor_ndim)
        partial = 0
        op = "sum"
        for m, p in enumerate(placements):
            if isinstance(p, Partial):
                partial |= 1 << m
                op = p.reduce_op
        return Layout(orders, partial, len(placements), op)

    @property
    def state(self) -> State:
        return (self.orders, self.partial)

    @staticmethod
    def from_state(state: State, mesh_ndim: int, reduce_op: str = "sum") -> "Layout":
        return Layout(state[0], state[1], mesh_ndim, reduce_op)

    @property
    def placements(self) -> tuple[Placement, ...]:
        out: list[Placement] = [Replicate()] * self.mesh_ndim
        for d, ms in enumerate(self.orders):
            for m in ms:
                out[m] = Shard(d)
        for m in range(self.mesh_ndim):
            if self.partial >> m & 1:
                out[m] = Partial(self.reduce_op)
        return tuple(out)

    def shard_order(self):
        """Upstream ``ShardOrder`` (tuple of ShardOrderEntry) for DTensorSpec."""
        from dtensor_rules._upstream import ShardOrderEntry

        return tuple(ShardOrderEntry(tensor_dim=d, mesh_dims=ms) for d, ms in enumerate(self.orders) if ms)

    def __str__(self) -> str:
        return format_state(self.state, self.mesh_ndim)


_FROM_PLACEMENTS: dict[tuple, Layout] = {}


def _ints(xs: object) -> tuple[int, ...] | None:
    t = tuple(xs) if isinstance(xs, (tuple, list)) else None
    return t if t is not None and all(type(x) is int for x in t) else None


def _memo_key(placements: Sequence[Placement], tensor_ndim: int, device_order: DeviceOrder) -> tuple | None:
    """Hashable key equal only for inputs that normalise identically; None = do not memoise.

    Only exact ints are accepted in orders, so a float or bool that the validation would reject
    can never hit an entry made by an equal-comparing int.
    """
    if not isinstance(placements, (tuple, list)) or type(tensor_ndim) is not int:
        return None
    if device_order is None:
        order: object = None
    elif isinstance(device_order, Mapping):
        items = []
        for d, ms in device_order.items():
            ms = _ints(ms)
            if type(d) is not int or ms is None:
                return None
            items.append((d, ms))
        order = ("map", tuple(sorted(items)))
    else:
        order = _ints(device_order)
        if order is None:
            return None
    return (tuple(placements), tensor_ndim, order)


def format_state(state: State, mesh_ndim: int) -> str:
    orders, partial = state
    owner: dict[int, int] = {m: d for d, ms in enumerate(orders) for m in ms}
    out = []
    for m in range(mesh_ndim):
        if partial >> m & 1:
            out.append("P")
        elif m not in owner:
            out.append("R")
        else:
            ms = orders[owner[m]]
            if len(ms) == 1:
                out.append(f"S({owner[m]})")
            elif m == min(ms):
                out.append(f"S({owner[m]})[{','.join(map(str, ms))}]")
    return "".join(out)


_TOKEN = re.compile(r"S\((\d+)\)(?:\[([\d,\s]+)\])?|R|P(?:\((\w+)\))?")


def parse_layout(text: str, mesh_ndim: int, tensor_ndim: int) -> Layout:
    """Inverse of ``str(layout)``: e.g. ``parse_layout("S(0)[1,0]R", 3, 2)``."""
    pos, orders = 0, [[] for _ in range(tensor_ndim)]
    assigned: dict[int, str] = {}
    partial, op = 0, "sum"
    while pos < len(text):
        mt = _TOKEN.match(text, pos)
        if not mt:
            raise ValueError(f"cannot parse layout {text!r} at {text[pos:]!r}; tokens are R, P, S(d), S(d)[m,...]")
        pos = mt.end()
        free = [m for m in range(mesh_ndim) if m not in assigned]
        if not free:
            raise ValueError(f"layout {text!r} names more than {mesh_ndim} mesh dims")
        tok = mt.group(0)
        if tok.startswith("S"):
            d = int(mt.group(1))
            if d >= tensor_ndim:
                raise ValueError(f"layout {text!r} shards dim {d} of a {tensor_ndim}-D tensor")
            ms = [int(x) for x in mt.group(2).split(",")] if mt.group(2) else [free[0]]
            if free[0] not in ms or any(m in assigned or not 0 <= m < mesh_ndim for m in ms) or len(set(ms)) != len(ms):
                raise ValueError(f"layout {text!r}: S({d}){ms} must list unused mesh dims including mesh dim {free[0]}")
            for m in ms:
                assigned[m] = tok
            orders[d].extend(ms)
        else:
            assigned[free[0]] = tok
            if tok.startswith("P"):
                partial |= 1 << free[0]
                op = mt.group(3) or "sum"
    if len(assigned) != mesh_ndim:
        raise ValueError(f"layout {text!r} covers {len(assigned)} of {mesh_ndim} mesh dims")
    return Layout(tuple(tuple(o) for o in orders), partial, mesh_ndim, op)
