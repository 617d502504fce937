"""One collective on a flattened group of mesh dims, exact for uneven nested shards.

A flattened plan step over mesh dims ``g`` (major first, as they sit in the tensor dim's order)
runs as ONE all_gather / all_to_all / reduce_scatter / all_reduce on the process group of all
ranks that differ only in their ``g`` coordinates. Uneven shards follow *nested* chunking
(``torch.chunk`` per mesh dim, major first), not a flat chunk into ``prod(g)`` pieces, so we

1. cut the tensor dim into the nested pieces (sizes from ``Shard.local_shard_size_and_offset``),
2. pad every piece to the largest piece (the iterated ceil of the global size: same on all ranks),
3. order the blocks by the group's own rank order (ascending global rank, i.e. mixed radix over
   the group's mesh dims in *mesh* order, which differs from the nested order when ``g`` is not
   ascending), run the collective,
4. unpad each received block to the sender's / receiver's true nested size.

Upstream's flattened redistribute chunks the flattened group flat (``torch.chunk`` over
``n1*n2``), which disagrees with nested chunking on uneven sizes; this module is the fix.

Groups are made once per (mesh, dims) with ``new_subgroups_by_enumeration`` and cached per
mesh object (weakly). ``supported(mesh)`` says when this path applies (the mesh spans the whole world and
its rank tensor is ``arange(world)`` reshaped, as ``init_device_mesh`` makes it); otherwise the
executor falls back to the equivalent sequence of single-mesh-dim collectives.
``Partial("avg")`` reduces as a sum then divides by the group size (gloo has no AVG).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Sequence

import torch
import torch.distributed as dist
from dtensor_rules._upstream import funcol, maybe_run_for_local_tensor, mesh_coordinate
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.placement_types import Shard

__all__ = ["supported", "flat_group", "all_gather", "all_to_all", "reduce_scatter", "all_reduce"]

# id(mesh) -> (weakref to the mesh, {sorted dims: process group}); not stored on the mesh itself,
# which would break pickling the mesh (ProcessGroups cannot be pickled)
_GROUPS: dict[int, tuple[weakref.ref, dict[tuple[int, ...], dist.ProcessGroup]]] = {}


def supported(mesh: DeviceMesh) -> bool:
    """Mesh = ``arange(world).reshape(shape)``: every flattened group's rank order is the mixed radix
    over its mesh dims in mesh order (what ``_group_to_nested`` assumes)."""
    if not dist.is_initialized() or mesh.mesh.numel() != dist.get_world_size():
        return False
    return bool(torch.equal(mesh.mesh.flatten().long(), torch.arange(mesh.mesh.numel())))


def flat_group(mesh: DeviceMesh, dims: Sequence[int]) -> dist.ProcessGroup:
    """Process group of this rank over the mesh dims ``dims`` (any order; members sorted by rank)."""
    key = tuple(sorted(dims))
    entry = _GROUPS.get(id(mesh))
    if entry is None or entry[0]() is not mesh:
        entry = _GROUPS[id(mesh)] = (weakref.ref(mesh, lambda _, k=id(mesh): _GROUPS.pop(k, None)), {})
    groups = entry[1]
    pg = groups.get(key)
    if pg is None:
        rest = [m for m in range(mesh.ndim) if m not in key]
        n = math.prod(mesh.size(m) for m in key)
        rows = mesh.mesh.permute(*rest, *key).reshape(-1, n).tolist()
        pg, _ = dist.new_subgroups_by_enumeration(rows)
        groups[key] = pg
    return pg


def _coords(mesh: DeviceMesh) -> list:
    return [mesh_coordinate(mesh, m) for m in range(mesh.ndim)]


def _pieces(length: int, sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(size, offset) of every nested piece of ``length`` chunked by ``sizes`` (major first), in nested order."""
    out = [(length, 0)]
    for s in sizes:
        nxt = []
        for size, off in out:
            for c in range(s):
                sz, o = Shard.local_shard_size_and_offset(size, s, c)
                nxt.append((sz, off + o))
        out = nxt
    return out


def _group_to_nested(mesh_shape: Sequence[int], g: Sequence[int]) -> list[int]:
    """For group rank k (mixed radix over sorted(g)), the nested index (mixed radix over g as given)."""
    srt = sorted(g)
    out = []
    for k in range(math.prod(mesh_shape[m] for m in g)):
        c, rem = {}, k
        for m in reversed(srt):
            c[m] = rem % mesh_shape[m]
            rem //= mesh_shape[m]
        j = 0
        for m in g:
            j = j * mesh_shape[m] + c[m]
        out.append(j)
    return out


def _parent_len(shape: Sequence[int], mesh_shape: Sequence[int], order: Sequence[int], d: int, coords: Sequence[int]) -> int:
    """This rank's length of tensor dim ``d`` chunked by the mesh dims ``order`` (major first)."""
    size = shape[d]
    for m in order:
        size, _ = Shard.local_shard_size_and_offset(size, mesh_shape[m], coords[m])
    return size


def _global_max(length: int, mesh_shape: Sequence[int], order: Sequence[int]) -> int:
    for m in order:
        length = -(-length // mesh_shape[m])
    return length


def _pad_to(x: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    if x.shape[dim] == size:
        return x
    pad = list(x.shape)
    pad[dim] = size - x.shape[dim]
    return torch.cat([x, x.new_zeros(pad)], dim)


def _wait(x: torch.Tensor) -> torch.Tensor:
    return x.wait() if hasattr(x, "wait") else x


def _nested_index(coords: Sequence[int], mesh_shape: Sequence[int], g: Sequence[int]) -> int:
    j = 0
    for m in g:
        j = j * mesh_shape[m] + coords[m]
    return j


def all_gather(x: torch.Tensor, mesh: DeviceMesh, shape: Sequence[int], rest: tuple[int, ...], g: tuple[int, ...], d: int) -> torch.Tensor:
    """Gather the suffix ``g`` of tensor dim ``d``'s order ``rest + g`` in one collective."""
    ms = tuple(mesh.shape)
    pmax = _global_max(shape[d], ms, rest + g)
    to_nested = _group_to_nested(ms, g)

    @maybe_run_for_local_tensor
    def pre(t: torch.Tensor) -> torch.Tensor:
        return _pad_to(t.movedim(d, 0), 0, pmax).contiguous()

    @maybe_run_for_local_tensor
    def post(t: torch.Tensor, coords: list) -> torch.Tensor:
        sizes = [s for s, _ in _pieces(_parent_len(shape, ms, rest, d, coords), [ms[m] for m in g])]
        blocks = [None] * len(sizes)
        for k, j in enumerate(to_nested):
            blocks[j] = t[k * pmax: k * pmax + sizes[j]]
        return torch.cat(blocks, 0).movedim(0, d)

    out = _wait(funcol.all_gather_single(pre(x), 0, flat_group(mesh, g)))
    return post(out, _coords(mesh))


def all_to_all(x: torch.Tensor, mesh: DeviceMesh, shape: Sequence[int], orders, g: tuple[int, ...], d: int, e: int) -> torch.Tensor:
    """Move the suffix ``g`` of tensor dim ``d``'s order to the end of tensor dim ``e``'s order, one collective."""
    ms = tuple(mesh.shape)
    rest = orders[d][: len(orders[d]) - len(g)]
    pd = _global_max(shape[d], ms, orders[d])
    pe = _global_max(shape[e], ms, orders[e] + g)
    to_nested = _group_to_nested(ms, g)
    gs = [ms[m] for m in g]

    @maybe_run_for_local_tensor
    def pre(t: torch.Tensor, coords: list) -> torch.Tensor:
        t = t.movedim((d, e), (0, 1))
        t = _pad_to(t, 0, pd)
        pieces = _pieces(t.shape[1], gs)
        blocks = [_pad_to(t.narrow(1, pieces[j][1], pieces[j][0]), 1, pe) for j in to_nested]
        return torch.cat(blocks, 0).contiguous()

    @maybe_run_for_local_tensor
    def post(t: torch.Tensor, coords: list) -> torch.Tensor:
        dsizes = [s for s, _ in _pieces(_parent_len(shape, ms, rest, d, coords), gs)]
        me = _nested_index(coords, ms, g)
        esize = _pieces(_parent_len(shape, ms, orders[e], e, coords), gs)[me][0]
        blocks = [None] * len(dsizes)
        for k, j in enumerate(to_nested):
            blocks[j] = t[k * pd: k * pd + dsizes[j], :esize]
        return torch.cat(blocks, 0).movedim((0, 1), (d, e))

    n = len(to_nested)
    buf = pre(x, _coords(mesh))
    rows = [pd] * n
    out = _wait(funcol.all_to_all_single(buf, rows, rows, flat_group(mesh, g)))
    return post(out, _coords(mesh))


def _op(reduce_op: str) -> str:
    if reduce_op not in ("sum", "avg", "max", "min"):
        raise ValueError(f"Partial({reduce_op!r}) is not supported by the planner; use sum, avg, max or min")
    return "sum" if reduce_op == "avg" else reduce_op


def reduce_scatter(x: torch.Tensor, mesh: DeviceMesh, shape: Sequence[int], orders, g: tuple[int, ...], e: int,
                   reduce_op: str) -> torch.Tensor:
    """Reduce the Partial mesh dims ``g`` and scatter tensor dim ``e`` into their nested pieces (``g`` major first)."""
    ms = tuple(mesh.shape)
    pe = _global_max(shape[e], ms, orders[e] + g)
    to_nested = _group_to_nested(ms, g)
    gs = [ms[m] for m in g]
    n = len(to_nested)

    @maybe_run_for_local_tensor
    def pre(t: torch.Tensor) -> torch.Tensor:
        t = t.movedim(e, 0)
        pieces = _pieces(t.shape[0], gs)
        return torch.cat([_pad_to(t.narrow(0, pieces[j][1], pieces[j][0]), 0, pe) for j in to_nested], 0).contiguous()

    @maybe_run_for_local_tensor
    def post(t: torch.Tensor, coords: list) -> torch.Tensor:
        me = _nested_index(coords, ms, g)
        size = _pieces(_parent_len(shape, ms, orders[e], e, coords), gs)[me][0]
        t = t[:size].movedim(0, e)
        return t / n if reduce_op == "avg" else t

    out = _wait(funcol.reduce_scatter_single(pre(x), _op(reduce_op), 0, flat_group(mesh, g)))
    return post(out, _coords(mesh))


def all_reduce(x: torch.Tensor, mesh: DeviceMesh, g: tuple[int, ...], reduce_op: str) -> torch.Tensor:
    """Reduce the Partial mesh dims ``g`` in one all_reduce."""
    out = _wait(funcol.all_reduce(x.contiguous(), _op(reduce_op), flat_group(mesh, g)))
    if reduce_op == "avg":
        out = out / math.prod(mesh.size(m) for m in g)
    return out
