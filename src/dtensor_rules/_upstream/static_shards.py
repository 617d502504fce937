"""Compiled DTensor code whose rank holds 0 or 1 rows: two upstream defects, and the guard that avoids both.

``torch.compile(dynamic=True)`` gives a DTensor input a symbolic global size ``s`` but, by its 0/1
specialization, a STATIC local size where this rank holds 0 or 1 rows (torch 2.13 and 2.14, with
or without this package's rules):

1. **A global size that is a constant is never guarded.** Dynamo guards a DTensor input by its
   spec with ``skip_shapes=True`` and its local tensor's sizes; a global size that is static (0 or
   1 tokens in all) or specialized while tracing is left to a tensor-size check DTensor never gets
   (``produce_guards`` skips constant tensor sizes, which ``TENSOR_MATCH`` covers for plain
   tensors). A graph compiled for one global size is reused for another with the same local size:
   on 2 ranks, ``x * 2`` compiled for 0 rows in all returns a (0, d) DTensor on rank 1 for a
   (1, d) input, and an expert-parallel block hangs (the ranks run different collectives).
2. **A size refined to one value in the backward crashes.** The static local size fixes ``s`` (on
   2 ranks, rank 0 holding 1 row means ``ceil(s / 2) == 1``, so ``s == 2``), but often only an op
   of the BACKWARD relates the two, e.g. ``gather``'s (``new_zeros`` of the global shape, Replicate,
   chunked to ``Shard(0)``). AOTAutograd records the forward's output metadata (a DTensor's global
   size is the symbol ``s``) before it traces the joint graph; when the backward then refines ``s``
   to one value, the forward graph returns ``None`` where that size belongs and the first call
   fails in ``DTensor.__tensor_unflatten__``: ``TypeError: 'NoneType' object cannot be interpreted
   as an integer``. A router (``scores.gather``) has exactly that backward: without the guard below,
   an expert-parallel MoE block with one token row per rank (2 tokens on ep = 2) fails so at its
   first training call (``torch.no_grad()`` runs: no backward is traced).

:func:`guard_global_sizes` handles both for one DTensor while Dynamo traces the forward. Where a
sharded dim's local size is static, it fixes the global size to its value (``guard_scalar``), so
AOTAutograd sees a constant from the start (2). Where the global size is then a constant, it fixes
the same size read from the DTensor's spec as well: a plain attribute, whose value Dynamo guards
once it is fixed, which is the missing guard (1). Exact: a static local size already fixes the
graph to that global size on some ranks, and a call with another size fails the guard and
recompiles. A rank holding 2 or more rows keeps a symbolic size (one graph for every count). The
spec guard needs ``dt`` to be an input of the compiled graph; on a DTensor computed inside the
graph, Dynamo breaks the graph at the spec read and the rest becomes a graph whose input it is.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Shard
from torch.fx.experimental.symbolic_shapes import guard_scalar, has_static_value

__all__ = ["guard_global_sizes"]


def guard_global_sizes(dt: DTensor) -> None:
    """Under ``torch.compile``: fix and guard each global size of ``dt``'s sharded dims whose local size
    is static, and guard any that is a constant. A no-op in eager code."""
    if not torch.compiler.is_compiling():
        return
    local = dt.to_local()
    for p in dt.placements:
        if not isinstance(p, Shard):
            continue
        # has_static_value, not isinstance: Dynamo answers isinstance(size, int) True for a SymInt too
        if has_static_value(local.shape[p.dim]):
            guard_scalar(dt.shape[p.dim])  # defect 2: the value it has now, from the forward on
        if has_static_value(dt.shape[p.dim]):
            # defect 1: the spec's size is a plain attribute, equal to the size; fixed, Dynamo guards it
            guard_scalar(dt._spec.tensor_meta.shape[p.dim])
