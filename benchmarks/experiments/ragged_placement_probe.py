"""Feasibility probe: can a user-defined ragged placement live in a DTensor (eager)?

Design spike for issue 19 (docs/design/ragged_expert_placement.md). Not product code: it
pokes torch's private DTensor internals directly on purpose (that is what it measures), so
it sits outside ``benchmarks/*.py`` and the ``_upstream`` boundary test. Runs on a
simulated 2-rank mesh (LocalTensorMode, fake process group) in a few seconds:

    PYTHONPATH=src python benchmarks/experiments/ragged_placement_probe.py

Prints one line per probe: ``OK`` / ``WRONG`` (runs, silently wrong) / ``FAIL`` (raises,
with the exact error). Two candidate classes:

* ``RaggedShard(Shard)``: a ``Shard`` subclass carrying the partition sizes, so every code
  path that asks ``is_shard()`` treats it as a shard and calls its overridable methods;
* ``RaggedPlacement(Placement)``: a bare ``Placement`` subclass (no ``is_shard``).

Semantics (EP over one mesh dim of size ``ep``, ``E`` experts, ``E_l = E / ep`` each):
the global tensor is every rank's assignment rows, partition-major (expert 0's rows from
rank 0, then from rank 1, ..., then expert 1's). ``counts[s][e]`` = rows rank ``s`` routes
to expert ``e``. Unaligned: rank ``s`` holds ``counts[s][e]`` rows of every partition ``e``
(its own tokens sorted by expert). Aligned: rank ``r`` holds whole partitions
``[r*E_l, (r+1)*E_l)`` (the tokens after dispatch), expert-major.
"""

from __future__ import annotations

import itertools
import traceback
from collections.abc import Callable

import torch
from torch.distributed._local_tensor import maybe_run_for_local_tensor, rank_map
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard, distribute_tensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
import torch.distributed._functional_collectives as funcol

from dtensor_rules.testing import simulated_mesh

Counts = tuple[tuple[int, ...], ...]  # counts[rank][expert]


def _rows_of(counts: Counts, rank: int, aligned: bool) -> list[int]:
    """Global row indices rank ``rank`` holds, in its local order."""
    ep, E = len(counts), len(counts[0])
    E_l = E // ep
    starts = list(itertools.accumulate((sum(counts[s][e] for s in range(ep)) for e in range(E)), initial=0))
    rows: list[int] = []
    if aligned:
        for e in range(rank * E_l, (rank + 1) * E_l):
            rows += range(starts[e], starts[e + 1])
    else:
        for e in range(E):
            before = starts[e] + sum(counts[s][e] for s in range(rank))
            rows += range(before, before + counts[rank][e])
    return rows


class RaggedShard(Shard):
    """Shard subclass: dim made of ``E`` partitions of data-dependent sizes (``counts``)."""

    def __init__(self, dim: int, counts: Counts, aligned: bool) -> None:
        super().__init__(dim)
        self.counts = counts
        self.aligned = aligned

    def __eq__(self, other: object) -> bool:
        return (type(other) is RaggedShard and self.dim == other.dim and self.counts == other.counts
                and self.aligned == other.aligned)

    def __ne__(self, other: object) -> bool:
        # DTensorSpec._verify_shard_order (torch 2.13 _dtensor_spec.py:392, 2.14 the same) asserts
        # ``placements[mesh_dim] != Shard(tensor_dim)`` is False for every sharded mesh dim: without this
        # asymmetric __ne__ no spec holding a Shard subclass that is unequal to Shard(d) can be built.
        if NE_WORKAROUND and type(other) is Shard and other.dim == self.dim:
            return False
        return not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((RaggedShard, self.dim, self.counts, self.aligned))

    def __reduce__(self):
        # Dynamo guards a placement by == against a deepcopy; pybind's pickling of Shard drops the
        # Python attributes ('RaggedShard' object has no attribute 'counts'), so copy explicitly
        return (RaggedShard, (self.dim, self.counts, self.aligned))

    def __repr__(self) -> str:
        return f"RaggedShard({self.dim}, {'aligned' if self.aligned else 'unaligned'}, counts={self.counts})"

    __str__ = __repr__

    # the one shape hook compute_local_shape_and_global_offset calls on a Shard subclass
    def _local_shard_size_and_offset(self, curr_local_size: int, num_chunks: int, rank: int):
        rows = _rows_of(self.counts, rank, self.aligned)
        return len(rows), (rows[0] if rows else curr_local_size)

    # the -> Replicate hook redistribute_local_tensor calls on current.is_shard()
    def _to_replicate_tensor(self, local_tensor, mesh, mesh_dim, current_logical_shape):
        ep = len(self.counts)
        sizes = [len(_rows_of(self.counts, r, self.aligned)) for r in range(ep)]
        top = max(sizes)
        CALLS.append("RaggedShard._to_replicate_tensor")

        @maybe_run_for_local_tensor
        def pad(t: torch.Tensor) -> torch.Tensor:
            return torch.cat([t, t.new_zeros((top - t.shape[0],) + tuple(t.shape[1:]))])

        gathered = funcol.wait_tensor(funcol.all_gather_single(pad(local_tensor), 0, (mesh, mesh_dim)))
        where = [0] * sum(sizes)  # global row -> row of the padded gather
        for r in range(ep):
            for i, g in enumerate(_rows_of(self.counts, r, self.aligned)):
                where[g] = r * top + i
        return gathered.index_select(0, torch.tensor(where, dtype=torch.long))

    def _replicate_to_shard(self, local_tensor, mesh, mesh_dim, shard_index):
        CALLS.append("RaggedShard._replicate_to_shard")
        return rank_map(lambda r: local_tensor[torch.tensor(_rows_of(self.counts, r, self.aligned), dtype=torch.long)])

    def _to_new_shard_dim(self, *a, **k):
        CALLS.append("RaggedShard._to_new_shard_dim")
        return super()._to_new_shard_dim(*a, **k)


class RaggedPlacement(Placement):
    """A bare Placement subclass (is_shard/is_replicate/is_partial all False)."""

    def __init__(self, dim: int, counts: Counts) -> None:
        super().__init__()
        self.dim, self.counts = dim, counts

    def __eq__(self, other: object) -> bool:
        return type(other) is RaggedPlacement and (self.dim, self.counts) == (other.dim, other.counts)

    def __hash__(self) -> int:
        return hash((RaggedPlacement, self.dim, self.counts))

    def __repr__(self) -> str:
        return f"RaggedPlacement({self.dim})"


CALLS: list[str] = []
NE_WORKAROUND = True  # --strict: off, to show the spec assertion
COUNTS: Counts = ((3, 0, 2, 1), (1, 4, 0, 0))  # rank 1 sends nothing to experts 2, 3: an empty partition slice
D = 3


def probe(name: str, fn: Callable[[], str | None]) -> None:
    CALLS.clear()
    try:
        note = fn()
        verdict = "WRONG" if note and note.startswith("WRONG") else "OK"
        print(f"{verdict:5} {name}: {note or ''}{' | hooks: ' + ', '.join(CALLS) if CALLS else ''}")
    except Exception as e:  # noqa: BLE001 - a probe reports every failure
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"FAIL  {name}: {type(e).__name__}: {str(e).splitlines()[0][:160]} "
              f"[raised at {where.filename.split('site-packages/')[-1]}:{where.lineno}]")


def main() -> None:
    n = sum(map(sum, COUNTS))
    full = torch.arange(n * D, dtype=torch.float32).reshape(n, D)
    un, al = RaggedShard(0, COUNTS, False), RaggedShard(0, COUNTS, True)
    with simulated_mesh(2) as mesh:
        def local_of(p: RaggedShard) -> torch.Tensor:
            return rank_map(lambda r: full[torch.tensor(_rows_of(COUNTS, r, p.aligned), dtype=torch.long)])

        def mk(p) -> DTensor:
            return DTensor.from_local(local_of(p), mesh, (p,), run_check=False, shape=full.shape, stride=full.stride())

        probe("hash/eq: RaggedShard(0) != Shard(0), usable as dict key",
              lambda: f"eq={un == Shard(0)}, Shard(0)==un: {Shard(0) == un}, hash_distinct={hash(un) != hash(Shard(0))}")
        probe("is_shard()/isinstance(Shard) on RaggedShard",
              lambda: f"is_shard={un.is_shard()}, is_shard(0)={un.is_shard(0)}, isinstance Shard={isinstance(un, Shard)}")
        probe("DTensor.from_local(ragged local, shape=global)", lambda: str(mk(un).placements))
        probe("compute_local_shape_and_global_offset (unaligned)",
              lambda: str(compute_local_shape_and_global_offset(full.shape, mesh, (un,))))
        probe("compute_local_shape_and_global_offset (aligned)",
              lambda: str(compute_local_shape_and_global_offset(full.shape, mesh, (al,))))

        def full_tensor(p):
            got = mk(p).full_tensor()
            return None if torch.equal(got.to_local() if hasattr(got, "to_local") else got, full) else "WRONG: values differ"
        probe("full_tensor() from unaligned (custom all_gather with sizes)", lambda: full_tensor(un))
        probe("full_tensor() from aligned", lambda: full_tensor(al))

        def dist_():
            d = distribute_tensor(full, mesh, (al,))
            return None if torch.equal(d.full_tensor(), full) else "WRONG"
        probe("distribute_tensor(full, [aligned]) round trip (values only)", dist_)

        def dispatch():
            d = mk(un).redistribute(mesh, (al,))
            ok = torch.equal(d.to_local(), local_of(al))
            return None if ok else f"WRONG: local data unchanged, labelled {d.placements[0]!r}"
        probe("redistribute unaligned -> aligned (the dispatch, same dim)", dispatch)

        def to_shard():
            d = mk(un).redistribute(mesh, (Shard(0),))
            ok = torch.equal(d.full_tensor(), full)
            return None if ok else "WRONG: ragged local relabelled Shard(0) without moving data"
        probe("redistribute unaligned -> Shard(0)", to_shard)

        def pointwise():
            d = mk(un) * 2 + 1
            ok = d.placements == (un,) and torch.equal(d.full_tensor(), full * 2 + 1)
            return None if ok else f"WRONG: placements {d.placements}"
        probe("pointwise (x * 2 + 1) keeps the ragged placement", pointwise)

        def binary():
            d = mk(un) + mk(un)
            return None if d.placements == (un,) and torch.equal(d.full_tensor(), 2 * full) else f"WRONG {d.placements}"
        probe("binary ragged + ragged (same counts)", binary)

        def mixed():
            d = mk(un) + mk(al)
            return None if torch.equal(d.full_tensor(), 2 * full) else f"WRONG {d.placements}"
        probe("binary unaligned + aligned (needs a redistribute)", mixed)

        def mm():
            w = distribute_tensor(torch.ones(D, 2), mesh, (Replicate(),))
            d = torch.mm(mk(al), w)
            ok = torch.equal(d.full_tensor(), full @ torch.ones(D, 2))
            return None if ok else f"WRONG: output placements {d.placements}"
        probe("mm(ragged, Replicate) (strategy builds fresh Shard(0))", mm)

        def rowsum():
            d = mk(al).sum(1)
            ok = torch.equal(d.full_tensor(), full.sum(1))
            return None if ok else f"WRONG: output placements {d.placements}"
        probe("sum(dim=1) (reduction over a non-ragged dim)", rowsum)

        def grad():
            x = mk(un).requires_grad_()
            y = x.redistribute(mesh, (Replicate(),))
            (y * y).sum().backward()
            want = 2 * full
            ok = x.grad is not None and torch.equal(x.grad.full_tensor(), want)
            return None if ok else f"WRONG: grad placements {x.grad.placements if x.grad is not None else None}"
        probe("autograd through ragged -> Replicate (backward Replicate -> ragged)", grad)

        def dist_placements():
            return f"WRONG: result placements {distribute_tensor(full, mesh, (al,)).placements} (Shard._shard_tensor chunked evenly)"
        probe("distribute_tensor(full, [aligned]): which placement comes back", dist_placements)

        def cache_growth():
            from torch.distributed.tensor import DTensor as _DT
            prop = _DT._op_dispatcher.sharding_propagator
            misses = []
            stats0 = torch._C._get_DTensor_sharding_propagator_cache_stats()
            real = prop.propagate_op_sharding_non_cached
            prop.propagate_op_sharding_non_cached = lambda schema: misses.append(1) or real(schema)
            try:
                for step in range(5):  # five routings of the same global shape (fixed T*k rows)
                    c = ((3 - min(step, 3), min(step, 3), 2, 1), (1, 4 - step // 4, step // 4, 0))
                    loc = rank_map(lambda r: full[torch.tensor(_rows_of(c, r, False), dtype=torch.long)])
                    d = DTensor.from_local(loc, mesh, (RaggedShard(0, c, False),), run_check=False,
                                           shape=full.shape, stride=full.stride())
                    d.neg()
                    d.neg()  # same routing again: should hit
            finally:
                del prop.propagate_op_sharding_non_cached
            stats1 = torch._C._get_DTensor_sharding_propagator_cache_stats()
            return (f"C++ cache stats {stats0} -> {stats1}; {len(misses)} sharding-propagation misses for 5 routings x 2 calls of one op: every new routing "
                    "is a new cache key (the C++ fast-path cache and lru_cache(None) never evict)")
        probe("sizes in the placement: sharding-cache growth per step", cache_growth)

        probe("bare Placement subclass: from_local", lambda: str(DTensor.from_local(
            local_of(un), mesh, (RaggedPlacement(0, COUNTS),), run_check=False, shape=full.shape, stride=full.stride()).placements))

        def bare_full():
            d = DTensor.from_local(local_of(un), mesh, (RaggedPlacement(0, COUNTS),), run_check=False,
                                   shape=full.shape, stride=full.stride())
            d.full_tensor()
        probe("bare Placement subclass: full_tensor()", bare_full)

        def bare_shape():
            return str(compute_local_shape_and_global_offset(full.shape, mesh, (RaggedPlacement(0, COUNTS),)))
        probe("bare Placement subclass: local shape", lambda: "WRONG (treated as Replicate): " + bare_shape())

        def bare_mul():
            d = DTensor.from_local(local_of(un), mesh, (RaggedPlacement(0, COUNTS),), run_check=False,
                                   shape=full.shape, stride=full.stride())
            return str((d * 2).placements)
        probe("bare Placement subclass: pointwise", bare_mul)


if __name__ == "__main__":
    import sys

    NE_WORKAROUND = "--strict" not in sys.argv
    print("torch", torch.__version__, "| __ne__ workaround", "on" if NE_WORKAROUND else "off")
    main()
