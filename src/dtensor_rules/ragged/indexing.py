"""Reads from and writes into ``Shard(0)`` tokens by ragged rows of GLOBAL token indices (design §5.3).

Per mesh dim, ``RU``/``RA`` = a ragged placement of the index (its rows are the result's rows).

Reads: ``index_select(src, 0, idx)``, ``src[idx, ...]`` / ``src[idx, j]`` (``aten.index``), ``gather(src, 0, idx)``

=======================  ===========  ==========  ==============================================
src                      index        result      why it is valid
=======================  ===========  ==========  ==============================================
``S(0)`` (EP dim)        ``RU``/``RA``  index's   row ``i`` of the result is ``src[idx[i]]``; every
                                      layout      value a rank holds points into ITS chunk of
                                                  ``src`` (checked: IndexError otherwise), so a
                                                  local read after subtracting the chunk's first
                                                  row is exact (the tokens of a rank's assignments)
``R`` (EP dim)           ``RU``/``RA``  index's   every rank holds all of ``src``: a local read
                                      layout
other mesh dim: ``R``,   ``R``        as src      the index is the same on every rank; the read is
``P(sum)``, or ``S(d)``                           linear in ``src`` and a non-indexed dim rides along
on a non-indexed dim                              (``gather``: the index is cut like ``src`` on
                                                  ``S(j>=1)``, column ``j`` only meets column ``j``)
=======================  ===========  ==========  ==============================================

Writes: ``index_add(self, 0, idx, src)``, ``scatter_add(self, 0, idx, src)``,
``index_put(self, (idx, ...), src, accumulate)`` (and their in-place forms)

=======================  ============  ==========  =============================================
self                     idx, src      result      why it is valid
=======================  ============  ==========  =============================================
``S(0)`` (EP dim)        ``RU``/``RA``  ``S(0)``   every row a rank writes belongs to a token in
                         (one layout)              its chunk (checked), so each chunk receives
                                                   exactly the rows one device would add into it
``P(sum)`` (EP dim)      ``RU``/``RA``  ``P(sum)`` ``out = self + scatter(src)`` is linear: the
                                                   ranks' pieces ``self_s + scatter(src_s)`` sum
                                                   to it, wherever the indices point
``R`` (EP dim), out of   ``RU``/``RA``  ``P(sum)`` ``R -> P(sum)`` is local (self kept on EP
place                                              coordinate 0, zeros elsewhere), then the row above
other mesh dim           idx ``R``,    as self     linear in (self, src) jointly (``P``+``P``),
                         src = self's              the same on every rank (``R``), or a dim the
                                                   index does not touch (``S(d)``)
=======================  ============  ==========  =============================================

A ``Replicate`` ``src`` with the index's row count (the gradient of a loss summed over ragged rows) is
first cut to the index's layout with its sizes (``ragged.distribute``: a local select); ``scatter_add``
cuts its ``Replicate`` index like ``self`` on ``S(j>=1)`` mesh dims (as ``gather``).
``index_put`` without ``accumulate`` is accepted on ``S(0)`` only (a ``P(sum)`` self would keep
every rank's piece at a written row). ``new_zeros`` of a ragged tensor: the same shape keeps its
layout; another shape (the ``(T, D)`` tokens, in the backward of a read) is ``Shard(0)`` on the EP
dim. Zeros are valid in any layout; ``Shard(0)`` is the one whose scatter from ragged rows is
local (the write rule above), which makes the backward of every read here the write rule: the
gradient of the tokens stays ``Shard(0)``, no collective.

Anything else (a ragged ``src`` read by ragged-coordinate indices, a ragged ``self``, an index
dim other than 0, an index that is not Replicate on another mesh dim) raises
:class:`RaggedPlacementError` naming the fix.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard
from torch.distributed.tensor import zeros as dtensor_zeros

from dtensor_rules._upstream import maybe_run_for_local_tensor
from dtensor_rules._upstream.ragged import coordinate_tensor, other_dim_step
from dtensor_rules.ragged.placement import RaggedShard, is_ragged
from dtensor_rules.ragged.rulekit import Ragged, chunk_offset, check_rows, ragged_operand, refuse, wrap
from dtensor_rules.ragged.table import ragged_rule

__all__ = ["ragged_read", "ragged_write", "ragged_new_zeros"]

aten = torch.ops.aten

_READ_FIX = ("Read Shard(0) or Replicate tokens by ragged rows of global token indices (index dim 0), e.g. "
             "x.index_select(0, order // k) after argsort of dtensor_rules.ragged.route's ids; gather a ragged "
             "source first (x.full_tensor() / dtensor_rules.ragged.gather)")
_WRITE_FIX = ("Write ragged rows into Shard(0) (or Partial) tokens at index dim 0, e.g. "
              "tokens.new_zeros(...).index_add(0, order // k, rows); move ragged rows with "
              "dtensor_rules.ragged.redistribute first")


def _is_shard(p: Placement, dim: int) -> bool:
    return type(p) is Shard and p.dim == dim


def _index_local(idx: DTensor, src: DTensor, m: int, what: str) -> torch.Tensor:
    """``idx``'s local values in ``src``'s local rows (translated by ``src``'s chunk start if it is ``S(0)``)."""
    local = idx.to_local()
    if src.placements[m].is_replicate():
        return check_rows(local, src.to_local(), 0, what)
    return check_rows(local - chunk_offset(src.device_mesh, m, src.shape[0]).to(local.device), src.to_local(), 0, what)


def _other_dims(op: Any, src: DTensor, idxs: list[DTensor], m: int, touched: int, out_dim_of: Any,
                also: DTensor | None = None) -> list[Placement | None]:
    """Per mesh dim but ``m``: the result's placement (``src``'s), or refuse."""
    out: list[Placement | None] = []
    for i, p in enumerate(src.placements):
        if i == m:
            out.append(None)
            continue
        if any(not t.placements[i].is_replicate() for t in idxs):
            raise refuse(op, [src, *idxs], f"an index is {idxs[0].placements[i]} on mesh dim {i}, not Replicate", _READ_FIX)
        if also is not None and also.placements[i] != p:
            raise refuse(op, [src, *idxs, also], f"mesh dim {i} has {p} for self but {also.placements[i]} for src",
                         _WRITE_FIX)
        if p.is_replicate() or (isinstance(p, Partial) and p.reduce_op == "sum"):
            out.append(p)
        elif type(p) is Shard and p.dim >= touched and out_dim_of(p.dim) is not None:
            out.append(Shard(out_dim_of(p.dim)))
        else:
            raise refuse(op, [src, *idxs], f"mesh dim {i} has {p}, which the indexed dims cut", _READ_FIX)
    return out


def _narrow(op: Any, local_idx: torch.Tensor, idx: DTensor, like: DTensor, m: int) -> torch.Tensor:
    """``gather`` / ``scatter_add``: a ``Replicate`` index cut like ``like`` (src / self) on its ``Shard(j >= 1)`` mesh dims.

    Column ``j`` of the result depends only on column ``j`` of the index and of the source, so each rank
    takes its own columns of the index (a local chunk, as ``Replicate -> Shard(j)``).
    """
    for i, p in enumerate(like.placements):
        if i != m and type(p) is Shard and p.dim >= 1:
            if idx.shape[p.dim] != like.shape[p.dim]:
                raise refuse(op, [like, idx], f"the index has {idx.shape[p.dim]} entries on dim {p.dim}, which mesh dim "
                             f"{i} shards ({like.shape[p.dim]}): its columns would not line up", _READ_FIX)
            local_idx = other_dim_step(local_idx, like.device_mesh, i, Replicate(), p, idx.shape, like.placements)
    return local_idx


def _read_layout(op: Any, src: DTensor, idxs: list[DTensor]) -> tuple[Ragged, int]:
    r = ragged_operand(op, *idxs)
    m = r.mesh_dim
    if is_ragged(src.placements[m]) or not (src.placements[m].is_replicate() or _is_shard(src.placements[m], 0)):
        raise refuse(op, [src, *idxs], f"the source is {src.placements[m]} on the ragged mesh dim {m}", _READ_FIX)
    if any(not is_ragged(t.placements[m]) or t.placements[m].dim != 0 for t in idxs):
        raise refuse(op, [src, *idxs], "every index must be ragged along its dim 0 (its rows are the result's)", _READ_FIX)
    return r, m


@ragged_rule(aten.index_select.default, aten.gather.default, aten.index.Tensor)
def ragged_read(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DTensor:
    """The reads table: a local read with translated indices; the result takes the index's layout."""
    src = args[0]
    if op is aten.index.Tensor:
        indices = list(args[1] if len(args) > 1 else kwargs["indices"])
        while indices and indices[-1] is None:
            indices.pop()
        if not indices or any(i is None or not isinstance(i, DTensor) for i in indices):
            raise refuse(op, [src], "only leading index tensors (src[idx], src[idx, j]) are supported", _READ_FIX)
        if len({tuple(i.shape) for i in indices}) != 1 or indices[0].dim() != 1:
            raise refuse(op, [src, *indices], "the index tensors must be 1-D and of one shape", _READ_FIX)
        r, m = _read_layout(op, src, indices)
        n = len(indices)
        others = _other_dims(op, src, indices, m, n, lambda d: d - n + 1)
        first = _index_local(indices[0], src, m, str(op))
        rest = [i.to_local() for i in indices[1:]]
        local = src.to_local()[(first, *rest)]
        shape = (indices[0].shape[0], *src.shape[n:])
    else:
        dim = args[1] if len(args) > 1 else kwargs["dim"]
        idx = args[2] if len(args) > 2 else kwargs["index"]
        if dim != 0:
            raise refuse(op, [src, idx], f"index dim {dim} (only dim 0, the tokens, is ragged-indexed)", _READ_FIX)
        if op is aten.gather.default:
            if kwargs.get("sparse_grad") or (len(args) > 3 and args[3]):
                raise refuse(op, [src, idx], "sparse_grad is not supported", _READ_FIX)
            if idx.dim() != src.dim():
                raise refuse(op, [src, idx], "gather needs index and source of the same rank", _READ_FIX)
        r, m = _read_layout(op, src, [idx])
        if op is aten.gather.default:
            others = _other_dims(op, src, [idx], m, 1, lambda d: d)
            local = src.to_local().gather(0, _narrow(op, _index_local(idx, src, m, str(op)), idx, src, m))
            shape = tuple(idx.shape)
        else:
            others = _other_dims(op, src, [idx], m, 1, lambda d: d)
            local = src.to_local().index_select(0, _index_local(idx, src, m, str(op)))
            shape = (idx.shape[0], *src.shape[1:])
    placements = [RaggedShard(0, r.placement.num_partitions, r.placement.aligned) if p is None else p for p in others]
    return wrap(local, src.device_mesh, placements, shape, src.dtype, r.ctx)


def _write_args(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[DTensor, list[DTensor], DTensor, Any]:
    """(self, index tensors, src, how to run it locally) of a write call."""
    self_ = args[0]
    if op in (aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default):
        names = ("self", "indices", "values", "accumulate")
        b = dict(zip(names, args)) | kwargs
        indices = list(b["indices"])
        while indices and indices[-1] is None:
            indices.pop()
        if not indices or any(i is None for i in indices):
            raise refuse(op, [self_], "only leading index tensors are supported", _WRITE_FIX)
        acc = bool(b.get("accumulate", False))
        return self_, indices, b["values"], ("put", acc)
    names = ("self", "dim", "index", "source" if "index_add" in str(op) else "src", "alpha")
    b = dict(zip(names, args)) | kwargs
    if b["dim"] != 0:
        raise refuse(op, [self_], f"index dim {b['dim']} (only dim 0, the tokens, is ragged-indexed)", _WRITE_FIX)
    src = b.get("source", b.get("src"))
    kind = "index_add" if "index_add" in str(op) else "scatter_add"
    return self_, [b["index"]], src, (kind, b.get("alpha", 1))


def _select_rows(op: Any, src: DTensor, r: Ragged, xs: list[Any]) -> DTensor:
    """A ``Replicate`` source of the index's row count -> the index's ragged layout (a local select)."""
    if r.ctx is None or r.ctx.row_offset is not None:
        raise refuse(op, xs, "a Replicate source must be cut to the index's layout, but the index carries no sizes",
                     _WRITE_FIX)
    from dtensor_rules.ragged.moves import distribute

    return distribute(src, src.device_mesh, r.ctx.counts, r.mesh_dim, aligned=r.placement.aligned,
                      placements=src.placements)


@maybe_run_for_local_tensor
def _keep_on_first(local: torch.Tensor, coord: torch.Tensor) -> torch.Tensor:
    return local if int(coord) == 0 else torch.zeros_like(local)


def _partial_from_replicate(x: DTensor, m: int) -> DTensor:
    placements = [Partial() if i == m else p for i, p in enumerate(x.placements)]
    local = _keep_on_first(x.to_local(), coordinate_tensor(x.device_mesh, m))
    return wrap(local, x.device_mesh, placements, x.shape, x.dtype)


@ragged_rule(aten.index_add.default, aten.index_add_.default, aten.scatter_add.default, aten.scatter_add_.default,
             aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default)
def ragged_write(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DTensor:
    """The writes table: a local write with translated indices; the result takes ``self``'s layout."""
    self_, idxs, src, how = _write_args(op, args, kwargs)
    if not isinstance(src, DTensor) or any(not isinstance(i, DTensor) for i in idxs):
        raise refuse(op, [self_], "index and source must be DTensors", _WRITE_FIX)
    r = ragged_operand(op, src, *idxs)
    m = r.mesh_dim
    if src.placements[m].is_replicate() and src.dim() and src.shape[0] == idxs[0].shape[0] > 1:
        src = _select_rows(op, src, r, [self_, *idxs, src])  # e.g. the gradient of a sum over the rows
    if any(not is_ragged(t.placements[m]) or t.placements[m].dim != 0 for t in (src, *idxs)):
        raise refuse(op, [self_, *idxs, src], "index and source must be ragged along dim 0", _WRITE_FIX)
    ps = self_.placements[m]
    partial = isinstance(ps, Partial) and ps.reduce_op == "sum"
    if ps.is_replicate() and how != ("put", False) and not op._schema.name.endswith("_"):
        # Replicate -> Partial(sum) is local (self on coordinate 0, zeros elsewhere): the sum of the pieces
        self_ = _partial_from_replicate(self_, m)
        ps, partial = self_.placements[m], True
    if not (_is_shard(ps, 0) or partial):
        raise refuse(op, [self_, *idxs, src], f"self is {ps} on the ragged mesh dim {m} (Shard(0) or Partial(sum) "
                     "tokens take ragged rows locally)", _WRITE_FIX)
    if how == ("put", False) and partial:
        raise refuse(op, [self_, *idxs, src], "index_put without accumulate on a Partial(sum) self", _WRITE_FIX)
    _other_dims(op, self_, idxs, m, len(idxs) if how[0] == "put" else 1, lambda d: d, also=src)
    local_self = self_.to_local()
    first = idxs[0].to_local()
    if how[0] == "scatter_add":
        first = _narrow(op, first, idxs[0], self_, m)
    if not partial:
        first = first - chunk_offset(self_.device_mesh, m, self_.shape[0]).to(local_self.device)
    first = check_rows(first, local_self, 0, str(op))
    in_place = op._schema.name.endswith("_") or op is aten._index_put_impl_.default
    if how[0] == "put":
        local = (local_self.index_put_ if in_place else local_self.index_put)(
            (first, *[i.to_local() for i in idxs[1:]]), src.to_local(), how[1])
    elif how[0] == "index_add":
        local = (local_self.index_add_ if in_place else local_self.index_add)(0, first, src.to_local(), alpha=how[1])
    else:
        local = (local_self.scatter_add_ if in_place else local_self.scatter_add)(0, first, src.to_local())
    if in_place:
        return self_
    return wrap(local, self_.device_mesh, self_.placements, self_.shape, self_.dtype)


@ragged_rule(aten.new_zeros.default)
def ragged_new_zeros(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> DTensor:
    """Zeros beside a ragged tensor: its layout for its own shape, else ``Shard(0)`` tokens (module docstring)."""
    x, size = args[0], tuple(args[1] if len(args) > 1 else kwargs["size"])
    r = ragged_operand(op, x)
    dtype = kwargs.get("dtype") or x.dtype
    device = kwargs.get("device") or x.device
    if size == tuple(x.shape):
        placements = list(x.placements)
        ctx = r.ctx
    else:
        if not size:
            raise refuse(op, [x], "zeros of a 0-d shape have no token dim", _WRITE_FIX)
        placements = []
        for i, p in enumerate(x.placements):
            if i == r.mesh_dim:
                placements.append(Shard(0))
            elif p.is_replicate() or p.is_partial():
                placements.append(p)
            elif type(p) is Shard and 0 < p.dim < len(size) and p.dim < x.dim() and size[p.dim] == x.shape[p.dim]:
                placements.append(p)
            else:
                placements.append(Replicate())
        ctx = None
    if ctx is not None:
        local = x.to_local().new_zeros(x.to_local().shape, dtype=dtype, device=device)
    else:  # upstream's factory cuts the shape; a zero local is also every Partial's piece
        plain = [Replicate() if p.is_partial() else p for p in placements]
        local = dtensor_zeros(size, dtype=dtype, device_mesh=x.device_mesh, placements=plain).to_local()
    return wrap(local, x.device_mesh, placements, size, dtype, ctx)
