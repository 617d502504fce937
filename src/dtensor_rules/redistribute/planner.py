"""Min-cost search over compact ordered-mesh layouts (A* with an admissible bound).

States are ``(orders, partial_mask)`` tuples (see ``layout.py``), never DTensorSpecs: building
specs per expanded state is what makes upstream's ``DTensorRedistributePlanner`` slow.

Move set (``g`` = a group of mesh dims; with ``flatten=True`` any size, else one mesh dim):

==================  ==========================================  ===============================
collective          from -> to                                   why it is valid
==================  ==========================================  ===============================
all_gather          S(d)[..., g] -> S(d)[...]                    ``g`` is a suffix of d's order:
                                                                 the group's pieces are the nested
                                                                 chunks of one parent chunk
all_to_all          S(d)[..., g], S(e)[...] ->                   same suffix rule on d; the group
                    S(d)[...], S(e)[..., g]                      shares e's piece, so chunking it
                                                                 further by ``g`` is local data
reduce_scatter      P on g, S(e)[...] -> S(e)[..., g]            group holds partials of the same
                    (every order of g)                           e-piece; g appended as minor
all_reduce          P on g -> R                                  any subset of Partial dims
chunk (local)       R on m -> S(e)[..., m]                       a chunk of the piece already held
partition (local)   R on m -> P on m  (only if dst has P on m)   v/n each (sum), v each (avg/max/min)
==================  ==========================================  ===============================

Inserting a mesh dim anywhere but last, or gathering a non-suffix, would need data the group
does not hold (a strided, not nested, layout), so those moves are excluded. A flattened move
over a suffix covers every "non-last" mesh dim a single collective can legally touch.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import math
from collections.abc import Sequence

import numpy as np

from dtensor_rules.redistribute.cache import PlanKey, clear_plan_cache, lookup, store
from dtensor_rules.redistribute.layout import State, format_state
from dtensor_rules.redistribute.steps import NoPlanError, Plan, Step
from dtensor_rules.redistribute.topology import _GIB, Topology

__all__ = ["Step", "Plan", "search", "NoPlanError", "PlanContext", "clear_plan_cache"]


class PlanContext:
    """Everything the search needs, precomputed once per (mesh, shape, topology)."""

    def __init__(self, mesh_shape: Sequence[int], shape: Sequence[int], itemsize: int, topology: Topology,
                 flatten: bool = True) -> None:
        self.mesh_shape = tuple(mesh_shape)
        self.shape = tuple(shape)
        self.itemsize = itemsize
        self.topology = topology
        self.flatten = flatten
        self.ndim = len(self.shape)
        self.mesh_ndim = len(self.mesh_shape)
        self.full_bytes = math.prod(self.shape) * itemsize
        self._group: dict[tuple[int, ...], tuple[int, float, float]] = {}
        self._bytes: dict[tuple, int] = {}
        self._side: dict[tuple[int, tuple[int, ...]], int] = {}
        self._cost: dict[tuple, float] = {}
        self._h: dict[State, float] = {}
        self._hc: dict[State, tuple[float, float | None, int]] = {}
        world = math.prod(self.mesh_shape)
        # admissible per-mesh-dim lower bounds for the heuristic (mean shard <= largest shard)
        self.lb_gather = []
        self.lb_reduce = []
        for m in range(self.mesh_ndim):
            n, bw, lat = topology.group(self.mesh_shape, (m,))
            self.lb_gather.append(min(topology.cost("all_to_all", n, bw, lat, self.full_bytes / world),
                                      topology.cost("all_gather", n, bw, lat, self.full_bytes * n / world)))
            self.lb_reduce.append(min(topology.cost("reduce_scatter", n, bw, lat, self.full_bytes * n / world),
                                      topology.cost("all_reduce", n, bw, lat, self.full_bytes * n / world)))
        # data-volume bound (see ``heuristic``/``_need``): per-rank pieces, scaled by ``kappa`` (1 when even)
        self.nontrivial = sum(1 << m for m, s in enumerate(self.mesh_shape) if s > 1)
        self.even = all(s % world == 0 for s in self.shape)
        live = [m for m in range(self.mesh_ndim) if self.mesh_shape[m] > 1]
        self.sec_per_elem = (itemsize / _GIB / max(topology.bandwidth[m] for m in live) * 1e6) if live else 0.0
        self.live = live
        self.hop_lat = [(s - 1) * topology.latency[m] for m, s in enumerate(self.mesh_shape)]
        self.coords: np.ndarray | None = None  # built on first search (a cache hit never needs it)
        self.kappa = 1.0
        self.bound_shape = self.shape  # the shape the data bound is computed on (see _data_bound_geometry)
        self._iv: dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}
        self._ov: dict[tuple[int, tuple[int, ...]], np.ndarray] = {}
        self._dst: State = ((), 0)
        self._dst_vols = np.zeros(1, dtype=np.int64)
        self._dst_vol = 0

    def group(self, dims: tuple[int, ...]) -> tuple[int, float, float]:
        g = self._group.get(dims)
        if g is None:
            g = self._group[dims] = self.topology.group(self.mesh_shape, dims)
        return g

    def side(self, d: int, ms: tuple[int, ...]) -> int:
        """Largest local size of tensor dim d under nested chunking by ``ms`` (first chunk is largest)."""
        key = (d, ms)
        v = self._side.get(key)
        if v is None:
            v = self.shape[d]
            for m in ms:
                v = -(-v // self.mesh_shape[m])
            self._side[key] = v
        return v

    def local_bytes(self, orders: tuple[tuple[int, ...], ...]) -> int:
        v = self._bytes.get(orders)
        if v is None:
            v = self.itemsize
            for d, ms in enumerate(orders):
                v *= self.side(d, ms)
            self._bytes[orders] = v
        return v

    def pieces(self, d: int, ms: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """(start, length) of every rank's piece of tensor dim ``d`` of ``bound_shape`` (ranks in ``self.coords`` order).

        Nested ``torch.chunk`` (DTensor's ``Shard.local_shard_size_and_offset``): chunk ceil(len/n),
        trailing chunks short or empty.
        """
        key = (d, ms)
        v = self._iv.get(key)
        if v is None:
            start = np.zeros(len(self.coords), dtype=np.int64)
            length = np.full(len(self.coords), self.bound_shape[d], dtype=np.int64)
            for m in ms:  # major first
                chunk = -(-length // self.mesh_shape[m])
                first = self.coords[:, m] * chunk
                start = start + np.minimum(first, length)
                length = np.clip(length - first, 0, chunk)
            v = self._iv[key] = (start, length)
        return v

    def set_target(self, dst: State) -> None:
        """Reset the dst-dependent caches of the heuristic."""
        self._h.clear()
        self._hc.clear()
        self._ov.clear()
        if self.coords is None:
            self.coords = np.indices(self.mesh_shape).reshape(self.mesh_ndim, -1).T
            self.bound_shape, self.kappa = _data_bound_geometry(self.mesh_shape, self.shape)
        self._dst = dst
        vols = np.ones(len(self.coords), dtype=np.int64)
        for d, t in enumerate(dst[0]):
            vols = vols * self.pieces(d, t)[1]
        self._dst_vols = vols
        self._dst_vol = int(vols.max())

    def overlap(self, d: int, ms: tuple[int, ...]) -> np.ndarray:
        """Per rank: length of the overlap of its current and target pieces of tensor dim ``d``."""
        key = (d, ms)
        v = self._ov.get(key)
        if v is None:
            (a, la), (b, lb) = self.pieces(d, ms), self.pieces(d, self._dst[0][d])
            v = np.minimum(a + la, b + lb) - np.maximum(a, b)
            v = self._ov[key] = np.maximum(v, 0, out=v)
        return v

    def cost(self, kind: str, dims: tuple[int, ...], nbytes: int) -> float:
        key = (kind, dims, nbytes)
        c = self._cost.get(key)
        if c is None:
            n, bw, lat = self.group(dims)
            c = self._cost[key] = self.topology.cost(kind, n, bw, lat, nbytes)
        return c


def _groups(ctx: PlanContext, dims: Sequence[int]) -> list[tuple[int, ...]]:
    """Non-empty subsets of Partial mesh dims (singletons only without flattening)."""
    if not ctx.flatten:
        return [(m,) for m in dims]
    return [c for r in range(1, len(dims) + 1) for c in itertools.combinations(dims, r)]


def moves(ctx: PlanContext, state: State, target_partial: int) -> list[tuple[State, str, tuple[int, ...], int | None, int | None, int, float]]:
    """Every legal move from ``state``: (next, collective, group, src_dim, dst_dim, bytes, cost)."""
    orders, partial = state
    out = []
    cur_bytes = ctx.local_bytes(orders)
    ndim = ctx.ndim
    used = partial
    for ms in orders:
        for m in ms:
            used |= 1 << m
    for d, o in enumerate(orders):
        k = len(o)
        for j in range(1, (k if ctx.flatten else min(k, 1)) + 1):
            g = o[k - j:]
            rest = o[: k - j]
            gathered = orders[:d] + (rest,) + orders[d + 1:]
            nb = ctx.local_bytes(gathered)
            out.append(((gathered, partial), "all_gather", g, d, None, nb, ctx.cost("all_gather", g, nb)))
            a2a = ctx.cost("all_to_all", g, cur_bytes)
            for e in range(ndim):
                if e == d:
                    continue
                out.append(((gathered[:e] + (gathered[e] + g,) + gathered[e + 1:], partial), "all_to_all", g, d, e, cur_bytes, a2a))
    for m in range(ctx.mesh_ndim):
        if used >> m & 1:
            continue
        mm = (m,)
        for e in range(ndim):
            out.append(((orders[:e] + (orders[e] + mm,) + orders[e + 1:], partial), "chunk", (m,), None, e, 0, 0.0))
        if target_partial >> m & 1:
            out.append(((orders, partial | 1 << m), "partition", (m,), None, None, 0, 0.0))
    if partial:
        pdims = [m for m in range(ctx.mesh_ndim) if partial >> m & 1]
        for g in _groups(ctx, pdims):
            mask = sum(1 << m for m in g)
            rest = partial & ~mask
            out.append(((orders, rest), "all_reduce", g, None, None, cur_bytes, ctx.cost("all_reduce", g, cur_bytes)))
            rs = ctx.cost("reduce_scatter", g, cur_bytes)
            for perm in itertools.permutations(g):
                for e in range(ndim):
                    out.append(((orders[:e] + (orders[e] + perm,) + orders[e + 1:], rest), "reduce_scatter", perm, None, e, cur_bytes, rs))
    return out


def heuristic(ctx: PlanContext, state: State, dst: State) -> float:
    """Admissible lower bound on the cost from ``state`` to ``dst``: the larger of two bounds.

    *Kind bound.* A shard that is not a prefix of the target order must leave (all_gather /
    all_to_all); a Partial absent from the target must be reduced (all_reduce / reduce_scatter).
    No single collective does both, and each is at least the cheapest such collective on that
    mesh dim moving the mean shard (<= the largest shard the model charges).

    *Component bound* (latency + bandwidth charged separately, summed over the remaining steps):
    every non-trivial mesh dim that must leave its place or be reduced is in some collective,
    and a collective over group ``g`` pays ``base + (prod(g)-1)*lat >= base + sum_{m in g}
    (size_m-1)*lat_m``; so latency >= (#kinds needed)*base + sum over those dims. Bandwidth:
    see ``_need``.
    """
    h = ctx._h.get(state)
    if h is not None:
        return h
    hc, lat, reduce_needed = _cheap_bound(ctx, state, dst)
    h = hc
    if lat is not None:
        h = max(h, lat + _need(ctx, state[0], reduce_needed) * ctx.sec_per_elem / ctx.kappa)
    ctx._h[state] = h
    return h


def _cheap_bound(ctx: PlanContext, state: State, dst: State) -> tuple[float, float | None, int]:
    """(kind bound and latency component, latency component or None, reduce-needed mask): no per-rank work."""
    v = ctx._hc.get(state)
    if v is not None:
        return v
    orders, partial = state
    g = 0.0
    touch = 0
    for d, o in enumerate(orders):
        t = dst[0][d]
        if t[: len(o)] != o:
            for i, m in enumerate(o):
                if i >= len(t) or t[i] != m:
                    g = max(g, max(ctx.lb_gather[x] for x in o[i:]))
                    for x in o[i:]:
                        touch |= 1 << x
                    break
    r = 0.0
    extra = partial & ~dst[1]
    if extra:
        r = max(ctx.lb_reduce[m] for m in range(ctx.mesh_ndim) if extra >> m & 1)
    h = g + r
    reduce_needed = extra & ctx.nontrivial
    gather_needed = touch & ctx.nontrivial
    if reduce_needed or gather_needed:
        lat = ((reduce_needed != 0) + (gather_needed != 0)) * ctx.topology.base_latency
        for m in ctx.live:
            if (reduce_needed | gather_needed) >> m & 1:
                lat += ctx.hop_lat[m]
        v = (max(h, lat), lat, reduce_needed)
    else:
        v = (h, None, 0)
    ctx._hc[state] = v
    return v


def _need(ctx: PlanContext, orders, reduce_needed: int) -> int:
    """Largest, over ranks, number of target elements a rank still lacks.

    Potential ``need_r`` = |target piece of r| if a non-trivial Partial absent from the target
    remains, else |target piece \\ current piece| (pieces are boxes, so the overlap is a product of
    interval overlaps), on ``ctx.bound_shape``. Chunk, partition and reductions among target
    Partials never lower it; it is 0 at the target. Every collective charges at least ``1/kappa``
    of how much it lowers any ``need_r`` (see ``_kappa``; ``kappa`` = 1 when every shard is even),
    so remaining bandwidth time >= max_r need_r / kappa / fastest bandwidth. Uneven shapes use a
    shrunk even shape or the real one with kappa > 1, whichever is stronger (``_data_bound_geometry``).
    """
    if reduce_needed:
        return ctx._dst_vol
    prod = None
    for d, o in enumerate(orders):
        ov = ctx.overlap(d, o)
        prod = ov if prod is None else prod * ov
    return 0 if prod is None else int((ctx._dst_vols - prod).max())


@functools.lru_cache(maxsize=256)
def _data_bound_geometry(mesh_shape: tuple[int, ...], shape: tuple[int, ...]) -> tuple[tuple[int, ...], float]:
    """(shape the data bound is computed on, its kappa): the stronger of two valid choices.

    *Shrunk even shape* ``S'' = world * floor(S / world)`` per dim, kappa 1: every layout's largest
    piece is ``ceil(S/P)`` vs ``S''/P <= floor(S/P)``, so every move costs at most as much on S''
    (same move set, cost nondecreasing in bytes) and the cost-to-go on S'' -- bounded by the even
    data bound -- is a lower bound on the real one. Strength ``prod(S'')/prod(S)`` (0 when a dim is
    smaller than the world).
    *The real shape* with ``_kappa``: strength ``1/kappa``.
    """
    world = math.prod(mesh_shape)
    if all(s % world == 0 for s in shape):
        return shape, 1.0
    kappa = _kappa(mesh_shape, shape)
    total = math.prod(shape)
    shrunk = tuple(world * (s // world) for s in shape)
    if total and math.prod(shrunk) / total >= 1 / kappa:
        return shrunk, 1.0
    return shape, kappa


@functools.lru_cache(maxsize=256)
def _kappa(mesh_shape: tuple[int, ...], shape: tuple[int, ...]) -> float:
    """Largest ratio (elements one collective lowers some rank's ``need_r`` by) / (elements it is charged).

    With ``s`` the largest piece of a tensor dim before the move (``ceil(S/P)``, ``P`` the product
    of the mesh dims already splitting it, disjoint from the group ``g`` of size ``n``):

    - all_gather: a rank gains its parent piece minus its own, at most ``min(s, (n-1)*ceil(s/n))``
      elements per unit of the other dims; charged ``(n-1)/n * s``.
    - all_to_all (gather d, scatter e): gains at most ``(n-1)*s_d * ceil(s_e/n)``; charged
      ``(n-1)/n * s_d * s_e`` -> ratio ``n*ceil(s_e/n)/s_e``.
    - reduce_scatter / all_reduce ending the last needed reduction: ratio at most the all_to_all
      one divided by ``n-1`` / at most 1.

    All ratios are 1 when every split is even, so even shapes keep the full-strength bound.
    """
    nm = len(mesh_shape)
    prods = [math.prod(mesh_shape[m] for m in range(nm) if mask >> m & 1) for mask in range(1 << nm)]
    full = (1 << nm) - 1
    k = 1.0
    for g in range(1, 1 << nm):
        n = prods[g]
        if n == 1:
            continue
        rest = full & ~g
        sub = rest
        while True:  # every set of mesh dims disjoint from g already splitting the dim
            for size in shape:
                s = -(-size // prods[sub])
                if s:
                    c = -(-s // n)
                    k = max(k, min(s, (n - 1) * c) * n / ((n - 1) * s), n * c / s)
            if sub == 0:
                break
            sub = (sub - 1) & rest
    return k


def search(ctx: PlanContext, src: State, dst: State, max_peak_bytes: int | None = None) -> tuple[list, int]:
    """A* from src to dst; returns (path of move tuples, states expanded). Exact within the move set."""
    if max_peak_bytes is not None:
        for name, s in (("source", src), ("target", dst)):
            b = ctx.local_bytes(s[0])
            if b > max_peak_bytes:
                raise NoPlanError(f"the {name} layout alone needs {b} bytes/rank > max_peak_bytes={max_peak_bytes}; raise the cap")
    if src == dst:
        return [], 0
    tp = dst[1]
    ctx.set_target(dst)  # the bound depends on dst
    best = {src: 0.0}
    parent: dict[State, tuple] = {}
    counter = 0
    # lazy A*: states are queued under the cheap bound; the per-rank data bound is computed only
    # when a state is popped, and the state re-queued if its key rises (keys stay admissible)
    pq = [(heuristic(ctx, src, dst), 0.0, counter, 0.0, src, True)]
    expanded = 0
    while pq:
        f, _, _, g, s, exact = heapq.heappop(pq)
        if g > best[s]:
            continue  # stale entry (re-opening keeps A* exact even if the bound is inconsistent)
        if not exact:
            fh = g + heuristic(ctx, s, dst)
            if fh > f:
                counter += 1
                heapq.heappush(pq, (fh, -g, counter, g, s, True))
                continue
        if s == dst:
            path = []
            while s != src:
                mv = parent[s]
                path.append(mv)
                s = mv[0]
            path.reverse()
            return [mv[1:] for mv in path], expanded
        expanded += 1
        for mv in moves(ctx, s, tp):
            ns = mv[0]
            if max_peak_bytes is not None and ctx.local_bytes(ns[0]) > max_peak_bytes:
                continue
            ng = g + mv[6]
            if ng < best.get(ns, math.inf):
                best[ns] = ng
                parent[ns] = (s,) + mv
                counter += 1
                heapq.heappush(pq, (ng + _cheap_bound(ctx, ns, dst)[0], -ng, counter, ng, ns, False))  # ties: deepest first
    if max_peak_bytes is not None:
        raise NoPlanError(f"no plan keeps every step within max_peak_bytes={max_peak_bytes}; raise the cap")
    raise NoPlanError("no plan found between these layouts")  # pragma: no cover - the move set is connected


def plan_key(ctx: PlanContext, src: State, dst: State, reduce_op: str, max_peak_bytes: int | None) -> PlanKey:
    return PlanKey(ctx.mesh_shape, ctx.shape, ctx.itemsize, ctx.topology, ctx.flatten, max_peak_bytes, reduce_op, src, dst)


def build_plan(ctx: PlanContext, src: State, dst: State, reduce_op: str, max_peak_bytes: int | None) -> Plan:
    """Search (or fetch from the layout cache, see ``cache.py``) and package a Plan."""
    key = plan_key(ctx, src, dst, reduce_op, max_peak_bytes)
    hit = lookup(key)
    if hit is not None:
        return hit
    path, expanded = search(ctx, src, dst, max_peak_bytes)
    steps = []
    total = 0.0
    peak = ctx.local_bytes(src[0])
    for ns, kind, g, sd, dd, nb, c in path:
        steps.append(Step(kind, g, sd, dd, nb, c, ns, format_state(ns, ctx.mesh_ndim)))
        total += c
        peak = max(peak, ctx.local_bytes(ns[0]))
    plan = Plan(ctx.mesh_shape, ctx.shape, src, dst, tuple(steps), total, peak, reduce_op, expanded)
    store(key, plan)
    return plan
