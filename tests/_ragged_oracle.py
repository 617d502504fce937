"""Plain-Python oracle of the two ragged layouts (tests only): which global rows each rank holds.

Written with loops over the routing matrix, independently of ``dtensor_rules.ragged.segments``.
"""

from __future__ import annotations

import itertools

Counts = list[list[int]]  # counts[rank][expert]


def partition_starts(counts: Counts) -> list[int]:
    """Global start row of each expert's partition (partition-major, sender-minor)."""
    ep, E = len(counts), len(counts[0])
    return list(itertools.accumulate((sum(counts[s][e] for s in range(ep)) for e in range(E)), initial=0))


def rows_of(counts: Counts, rank: int, aligned: bool) -> list[int]:
    """Global rows rank ``rank`` holds, in its local order."""
    ep, E = len(counts), len(counts[0])
    E_l = E // ep
    starts = partition_starts(counts)
    rows: list[int] = []
    if aligned:
        for e in range(rank * E_l, (rank + 1) * E_l):
            rows += range(starts[e], starts[e + 1])
    else:
        for e in range(E):
            before = starts[e] + sum(counts[s][e] for s in range(rank))
            rows += range(before, before + counts[rank][e])
    return rows


# uneven partitions, an empty partition (expert 2 of ep=2 gets nothing from rank 1 and expert 3 nothing at all
# on rank 1), a rank that sends nothing (rank 3 of ep=4), a rank whose experts receive nothing (rank 1 of ep=4)
CASES: dict[int, Counts] = {
    2: [[3, 0, 2, 1], [1, 4, 0, 0]],
    4: [[2, 0, 0, 0, 1, 3, 0, 1], [0, 1, 0, 0, 2, 0, 1, 0], [1, 0, 0, 0, 0, 2, 4, 1], [0, 0, 0, 0, 0, 0, 0, 0]],
}
