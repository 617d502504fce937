"""Expert-parallel rows for the solver: the routed rows between permute and combine, as solver labels.

Why here and not from DTensor's propagator: no DTensor placement can describe the routed rows
(their split over ranks is data: the routing counts; docs/design/ep_runtime_decision.md), so no
rule answers a solver's query with such a row. These rows describe what ``expert_parallel``'s
region does (``ep/local.py``), per node of the traced block, on one expert-parallel mesh
dim ``m`` (any mesh dim whose size divides the number of experts ``E``), with the label
:class:`RoutedRows` on ``m``: ``TokenRows`` (unaligned: each rank its own tokens' assignment rows, sorted
by expert, before the dispatch) and ``ExpertRows`` (aligned: each rank the rows of its own experts, after
it). Every other mesh dim keeps what the row says there:

- ``index(data, [idx])`` (the token permute ``x[token]``, and ``out_pad[dest]`` after the
  combine): data ``Shard(0)`` or unaligned -> unaligned rows ``TokenRows(0)``, the index replicated;
- ``index_put`` into the padded buffer: unaligned in, unaligned out (each rank places its rows);
- ``scatter_add`` / ``gather`` on dim 0 (combine into tokens, its backward): tokens ``Shard(0)``
  <-> unaligned rows;
- ``_grouped_mm``: aligned rows (``ExpertRows``) x experts ``Shard(0)`` -> aligned rows (forward and
  grad-input), and aligned x aligned -> expert-sharded ``Shard(0)`` (grad-weight); ``offs``
  replicated (each rank reads its own experts' ends); TP-style combos on the other mesh dims;
- ``new_zeros`` & co. (they read only their input's dtype): a routed input, a replicated output;
- pointwise / cast / (un)squeeze / sum / transpose: every plain row that shards the routed rows
  dim on ``m`` gets a copy with that ``Shard`` read as ``TokenRows`` and one read as ``ExpertRows``.

The dispatch (``TokenRows -> ExpertRows``) and combine (``ExpertRows -> TokenRows``) are then edges priced by
``solver/ep_moves.py`` (counts all-to-all, host sync, token all-to-all). Routing tensors (ints)
never get these rows: they stay as the rules place them. Sizes are priced as an even split
(expected-uniform routing): the solver works on fake tensors, so no routing is known. A choice
made of these rows runs through ``expert_parallel`` (``solver.apply_choice(..., ep=True)``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import fx
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from dtensor_rules.solver.query import Layout, NodeRows, Row, Strategies, out_layouts

__all__ = ["RoutedRows", "add_ep_rows", "ep_info", "is_routed"]


@dataclass(frozen=True)
class RoutedRows:
    """Solver label (never a DTensor placement) for tensor dim ``dim`` made of the routed assignment
    rows, split over the ep mesh dim by expert (``num_experts`` partitions): unaligned (each rank a
    slice of every expert's rows: its own tokens') or aligned (each rank whole experts: its own)."""

    dim: int
    num_experts: int
    aligned: bool

    def is_shard(self, dim: int | None = None) -> bool:  # not a DTensor Shard: its chunks are data-sized
        return False

    def is_replicate(self) -> bool:
        return False

    def is_partial(self, reduce_op: str | None = None) -> bool:
        return False

    def __str__(self) -> str:
        return f"{'ExpertRows' if self.aligned else 'TokenRows'}({self.dim})"


def is_routed(placement: object) -> bool:
    """True for a :class:`RoutedRows` label."""
    return isinstance(placement, RoutedRows)


aten = torch.ops.aten
R, P = Replicate(), Partial("sum")
_PASS = {aten._to_copy.default, aten.unsqueeze.default, aten.squeeze.dim, aten.sum.dim_IntList,
         aten.transpose.int, aten.t.default, aten.clone.default}
_SHAPE_ONLY = {aten.new_zeros.default, aten.new_empty.default, aten.new_full.default}
_HAND = {aten._grouped_mm.default, aten.index.Tensor, aten.index_put.default, aten.scatter_add.default,
         aten.gather.default}
# _grouped_mm on the mesh dims other than ep: (x, w, out) for 2-D x 3-D, (a, b, out) for 2-D x 2-D
_GMM_3D = ((R, R, R), (R, Shard(2), Shard(1)), (Shard(1), Shard(1), P), (P, R, P))
_GMM_2D = ((R, R, R), (R, Shard(1), Shard(2)), (Shard(0), R, Shard(1)), (P, R, P), (R, P, P))


def ep_info(gm: fx.GraphModule) -> tuple[int, frozenset[int]] | None:
    """``(E, lengths)``: the number of experts (a ``_grouped_mm``'s 3-D operand) and the row counts
    a routed rows dim may have (the grouped rows, the permuted assignment rows); None without experts."""
    E, lens = None, set()
    for n in gm.graph.nodes:
        if n.target is aten._grouped_mm.default and _val(n.args[1]).ndim == 3 and _val(n.args[0]).ndim == 2:
            E = E or _val(n.args[1]).shape[0]
            lens.add(_val(n.args[0]).shape[0])
        elif n.target is aten.index.Tensor and _val(n).ndim == 2 and _val(n.args[0]).ndim == 2:
            lens.add(_val(n).shape[0])
    return None if E is None else (E, frozenset(lens))


def add_ep_rows(gm: fx.GraphModule, strategies: Strategies, mesh: DeviceMesh, *,
                ep_dims: tuple[int, ...] | None = None, force: bool = False) -> Strategies:
    """``strategies`` with the expert-parallel rows added (module docstring); unchanged without experts.

    ``ep_dims``: the mesh dims that may be ep (default: every one whose size divides ``E``).
    ``force``: the nodes with hand-made rows (permute, index_put, combine, grouped matmuls) keep
    only those, so the layout is expert parallel by construction (a hand EP priced like the rest).
    """
    info = ep_info(gm)
    if info is None:
        return strategies
    E, lens = info
    if ep_dims is None:
        ep_dims = tuple(m for m in range(mesh.ndim) if mesh.size(m) > 1 and E % mesh.size(m) == 0)
    nodes = {n.name: n for n in gm.graph.nodes}
    out = dict(strategies.nodes)
    for name, nr in strategies.nodes.items():
        node = nodes[name]
        if node.op != "call_function":
            continue
        extra = [r for m in ep_dims for r in _rows(node, nr, m, mesh.ndim, E, lens)]
        if node.target in _SHAPE_ONLY and nr.sources:  # reads its input's dtype only: any routed layout, free
            extra += [Row((tuple(R for _ in lay),), (lay,) + nr.rows[0].ins[1:])
                      for lay in out_layouts(out[nr.sources[0].node], nr.sources[0].index)
                      if any(is_routed(p) for p in lay)]
        if force and extra and node.target in _HAND:
            out[name] = nr._replace(rows=list(dict.fromkeys(extra)))
            continue
        seen = dict.fromkeys(nr.rows)
        seen.update(dict.fromkeys(extra))
        if len(seen) > len(nr.rows):
            out[name] = nr._replace(rows=list(seen))
    return strategies._replace(nodes=out)


def _val(a: object) -> torch.Tensor:
    return a.meta["val"] if isinstance(a, fx.Node) else a


def _lay(ndim: int, m: int, at_m: Placement, others: tuple[Placement, ...]) -> Layout:
    rest = iter(others)
    return tuple(at_m if i == m else next(rest) for i in range(ndim))


def _others(ndim: int, choices: tuple) -> Iterator[tuple]:
    """Every assignment of ``choices`` (one tuple per row kind) to the ndim - 1 other mesh dims,
    transposed: one tuple per operand, each holding that operand's placement per other mesh dim."""
    for combo in itertools.product(choices, repeat=ndim - 1):
        yield tuple(zip(*combo)) if combo else tuple(() for _ in choices[0])


def _rows(node: fx.Node, nr: NodeRows, m: int, ndim: int, E: int, lens: frozenset[int]) -> list[Row]:
    t = node.target
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.is_floating_point():
        return []
    token_rows, expert_rows = RoutedRows(0, E, False), RoutedRows(0, E, True)
    metas = nr.metas
    rows: list[Row] = []
    if t is aten._grouped_mm.default and len(metas) == 3:
        a, b = metas[0], metas[1]
        if len(a.shape) == 2 and len(b.shape) == 3 and a.shape[0] in lens:  # rows x experts -> rows
            for x, w, o in _others(ndim, _GMM_3D):
                rows.append(Row((_lay(ndim, m, expert_rows, o),),
                                (_lay(ndim, m, expert_rows, x), _lay(ndim, m, Shard(0), w), _lay(ndim, m, R, (R,) * (ndim - 1)))))
        elif len(a.shape) == 2 and len(b.shape) == 2 and a.shape[1] in lens and b.shape[0] in lens:  # grad weight
            for x, g, o in _others(ndim, _GMM_2D):
                rows.append(Row((_lay(ndim, m, Shard(0), o),),
                                (_lay(ndim, m, RoutedRows(1, E, True), x), _lay(ndim, m, expert_rows, g),
                                 _lay(ndim, m, R, (R,) * (ndim - 1)))))
        return rows
    keep = ((R, R), (P, P))  # (data, out) on another mesh dim: replicated, or a linear op of a partial sum
    rep = (R,) * (ndim - 1)
    if t is aten.index.Tensor and len(metas) == 2 and len(metas[0].shape) == 2 and val.shape[0] in lens:
        for d, o in _others(ndim, keep):
            for src in (Shard(0), token_rows):
                rows.append(Row((_lay(ndim, m, token_rows, o),), (_lay(ndim, m, src, d), _lay(ndim, m, R, rep))))
    elif (t is aten.index_put.default and len(metas) == 3 and len(metas[0].shape) == 2 and val.shape[0] in lens
          and metas[2].shape[0] in lens):
        for d, o in _others(ndim, keep):
            rows.append(Row((_lay(ndim, m, token_rows, o),),
                            (_lay(ndim, m, token_rows, d), _lay(ndim, m, R, rep), _lay(ndim, m, token_rows, d))))
    elif (t is aten.scatter_add.default and node.args[1] == 0 and len(metas) == 3 and len(metas[0].shape) == 2
          and metas[2].shape[0] in lens):
        for d, o in _others(ndim, keep):
            rows.append(Row((_lay(ndim, m, Shard(0), o),),
                            (_lay(ndim, m, Shard(0), d), _lay(ndim, m, R, rep), _lay(ndim, m, token_rows, d))))
    elif (t is aten.gather.default and node.args[1] == 0 and len(metas) == 2 and len(metas[0].shape) == 2
          and val.shape[0] in lens):
        for d, o in _others(ndim, keep):
            rows.append(Row((_lay(ndim, m, token_rows, o),), (_lay(ndim, m, Shard(0), d), _lay(ndim, m, R, rep))))
    elif t in _PASS or (hasattr(t, "tags") and torch.Tag.pointwise in t.tags):
        rows = [r2 for r in nr.rows for r2 in _substituted(r, val, metas, m, E, lens)]
    return rows


def _substituted(row: Row, val: torch.Tensor, metas: tuple, m: int, E: int, lens: frozenset[int]) -> list[Row]:
    """``row`` with its ``Shard`` of the routed rows dim on mesh dim ``m`` read as TokenRows, and as ExpertRows."""
    if len(row.outs) != 1 or row.outs[0] is None:
        return []
    shapes = (tuple(val.shape), *(tuple(mt.shape) for mt in metas))
    lays = (row.outs[0], *row.ins)
    dims = []
    for shape, lay in zip(shapes, lays):
        p = lay[m]
        if type(p) is not Shard or shape[p.dim] not in lens:
            return []
        dims.append(p.dim)
    out = []
    for aligned in (False, True):
        new = [tuple(RoutedRows(d, E, aligned) if i == m else q for i, q in enumerate(lay)) for d, lay in zip(dims, lays)]
        out.append(Row((new[0],), tuple(new[1:])))
    return out
