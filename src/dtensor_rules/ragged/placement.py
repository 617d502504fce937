"""``RaggedShard``: a tensor dim made of expert partitions of data-dependent sizes (structure only).

The global ragged dim is every EP rank's assignment rows, partition-major and sender-minor
(expert 0's rows from rank 0, then from rank 1, ..., then expert 1's). Its length is fixed by
the batch (``T * k``); only the split is data-dependent. Two layouts over one mesh dim of size
``ep`` (``E`` partitions, ``E_l = E / ep``):

- unaligned (``aligned=False``): every rank holds its own slice of every partition (its tokens
  sorted by expert, before the dispatch); local rows ``sum_e C[s][e]``;
- aligned (``aligned=True``): rank ``r`` holds whole partitions ``[r*E_l, (r+1)*E_l)`` (the
  tokens after the dispatch); a contiguous box of the global dim.

The sizes (the ``ep x E`` routing matrix ``C``) are NOT in the placement: anything in its
eq/hash would be a sharding-cache key (one miss per routing) and a guarded compile constant
(one recompile per routing; SymInts refused). They travel as a tensor in a
:class:`~dtensor_rules.ragged.context.RaggedContext` (docs/design/ragged_expert_placement.md §3).
"""

from __future__ import annotations

from typing import Any

from dtensor_rules._upstream.ragged import ShardSubclass

__all__ = ["RaggedShard", "is_ragged", "ragged_mesh_dims", "other_dims_move"]


class RaggedShard(ShardSubclass):
    """``Shard(dim)`` split into ``num_partitions`` expert partitions, unaligned or aligned."""

    def __init__(self, dim: int, num_partitions: int, aligned: bool, _other: RaggedShard | None = None) -> None:
        if not isinstance(num_partitions, int) or num_partitions < 1:
            raise ValueError(f"RaggedShard needs num_partitions >= 1 (the number of experts), got {num_partitions!r}")
        super().__init__(dim)
        self.num_partitions = num_partitions
        self.aligned = bool(aligned)
        # the other layout, made here so that traced code (a move under torch.compile) never constructs a
        # placement: Dynamo would see the ints read from this one as SymInts and refuse the constructor
        self._other = _other if _other is not None else RaggedShard(dim, num_partitions, not aligned, self)

    def _ctor_args(self) -> tuple[Any, ...]:
        return (self.dim, self.num_partitions, self.aligned)

    def _refusal(self, hook: str) -> str:
        if hook == "_local_shard_size_and_offset" and not self.aligned:
            return (f"{self!r} is not a box of the global tensor (a rank holds a slice of every partition), so it has "
                    "no (offset, size) chunk: a DCP checkpoint or compute_local_shape_and_global_offset of it would be "
                    "wrong. Save it aligned (dtensor_rules.ragged.dispatch) or as Replicate "
                    "(dtensor_rules.ragged.gather)")
        return (f"{self!r} holds no partition sizes (they are data: the routing counts), so upstream's {hook} cannot "
                "run on it; use dtensor_rules.ragged (dispatch / combine / gather / distribute / redistribute), whose "
                "moves read the counts from the tensor's RaggedContext")

    def with_aligned(self, aligned: bool) -> RaggedShard:
        """The same partitions in the given layout."""
        return self if aligned == self.aligned else self._other

    def __eq__(self, other: object) -> bool:
        return type(other) is RaggedShard and self._ctor_args() == other._ctor_args()

    def __hash__(self) -> int:
        return hash((RaggedShard, *self._ctor_args()))

    def __repr__(self) -> str:
        return f"RaggedShard(dim={self.dim}, num_partitions={self.num_partitions}, aligned={self.aligned})"

    def __str__(self) -> str:
        return f"{'RA' if self.aligned else 'RU'}({self.dim})"


def is_ragged(placement: object) -> bool:
    """True for a :class:`RaggedShard`."""
    return isinstance(placement, RaggedShard)


def ragged_mesh_dims(placements: Any) -> list[int]:
    """The mesh dims whose placement is ragged."""
    return [i for i, p in enumerate(placements) if is_ragged(p)]


def other_dims_move(current: Any, target: Any) -> bool:
    """Whether ``current -> target`` keeps every ragged placement and only moves other mesh dims safely.

    A collective over a mesh dim other than the ragged one ``m`` runs among ranks that share their
    coordinate on ``m``, so they hold the same ragged rows: a move there never looks at the partition
    sizes as long as it does not touch a ragged tensor dim. Accepted per other mesh dim ``i``: ``Partial <->
    Replicate``, and ``Shard(j) <-> Replicate`` / ``Partial -> Shard(j)`` / ``Shard(j) -> Partial(sum)`` (local:
    the chunk in place, zeros elsewhere; a gradient's layout hint) for a tensor dim ``j`` that is not ragged,
    that no later mesh dim shards, and that earlier mesh dims shard the same way before and after (nested
    shards, e.g. experts ``Shard(0)`` on ep then on an FSDP dim: the step's logical size is the earlier
    chunk); :func:`dtensor_rules._upstream.ragged.other_dim_step` runs them.
    """
    ragged_dims = {p.dim for p in (*current, *target) if is_ragged(p)}
    for i, (p, q) in enumerate(zip(current, target)):
        if is_ragged(p) or is_ragged(q):
            if type(p) is not type(q) or p != q:
                return False
            continue
        if p == q:
            continue
        for s in (p, q):
            if not s.is_shard():
                continue
            if s.dim in ragged_dims:
                return False
            for k, (a, b) in enumerate(zip(current, target)):
                touches = any(t.is_shard() and not is_ragged(t) and t.dim == s.dim for t in (a, b))
                if touches and (k > i or (k < i and a != b)):
                    return False
        to_partial_ok = q.is_partial() and (p.is_replicate() or (p.is_shard() and q.reduce_op == "sum"))
        if not (p.is_partial() or p.is_replicate() or p.is_shard()) or not (q.is_replicate() or q.is_shard()
                                                                          or to_partial_ok):
            return False
    return True
