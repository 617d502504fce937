"""``dtensor_rules::ep_dispatch`` / ``ep_combine`` (the EP token moves, ``ep/all_to_all.py``).

Both ops move whole ROWS of ``x`` between the ranks of the process group named in their
arguments (the ep group), by the per-rank split sizes ``splits``. Under DTensor the group's own
mesh dim must be local (the ops ARE that dim's communication: call them on ``to_local()``
tensors, as ``expert_parallel`` does, or inside ``local_map``); the DTensor's mesh holds the
OTHER dims (e.g. tp), where every rank of a dim runs the same move on its piece.

Strategies, per mesh dim of the DTensor ([out, x, splits]):

=====================  =======  =======  ==================================================
out                    x        splits   why it is valid
=====================  =======  =======  ==================================================
R                      R        R        implied: every rank moves the same rows the same way
S(d), d >= 1           S(d)     R        the move picks whole rows: a column slice of every
                                         row moves with its row (same splits on every rank)
P(sum), P(avg)         P        R        the move is linear: moving the pieces and summing
                                         (averaging) them is moving the sum (average)
=====================  =======  =======  ==================================================

Not offered: ``x`` ``S(0)`` (each rank of the dim would hold other rows, but ``splits`` counts
ONE set of rows); ``splits`` sharded or Partial (each rank needs the whole (2, ep) counts); any
layout on the group's own mesh dim (every rank there receives different rows: the result is
no placement of one global tensor of DTensor's kind; the handler refuses it naming the fix).

``ep_dispatch`` without ``rows``: the output's row count is data (the received rows), which
DTensor's fake-tensor step cannot know; the handler reads it from the (replicated, host)
``splits`` first and passes it as ``rows``.

Costs: data movement only (``flops = 0``); ``bytes`` reads and writes the rows once each
(the output's rows are ``rows``, or estimated as ``x``'s where data decides them).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from dtensor_rules._upstream import dispatch_slow_path
from dtensor_rules.ep.all_to_all import count_under_comm_debug_mode, ep_combine_op, ep_dispatch_op
from dtensor_rules.op_rules._common import PlacementOrHole, metas, nbytes
from dtensor_rules.op_rules._gaps import COLLECTIVE
from dtensor_rules.op_rules._partial import partial_ops
from dtensor_rules.registry import register

__all__ = ["EP_DISPATCH", "EP_COMBINE", "ep_exchange_strategy", "ep_exchange_handler"]

EP_DISPATCH = ep_dispatch_op._opoverload
EP_COMBINE = ep_combine_op._opoverload
R = Replicate()


def _args(args: Any, kwargs: Any) -> tuple[Any, Any, str, Any, bool]:
    names = ("x", "splits", "group", "rows", "padded")
    vals = list(args) + [kwargs.get(n) for n in names[len(args):]]
    return vals[0], vals[1], vals[2], vals[3] if len(vals) > 3 else None, bool(vals[4]) if len(vals) > 4 else False


def ep_exchange_bytes(x: torch.Tensor, splits: torch.Tensor, group: str, rows: Any = None, padded: bool = False) -> int:
    """Read ``x``'s rows and the splits, write ``rows`` rows (``x``'s count where data decides it)."""
    row = nbytes(x) // max(int(x.shape[0]), 1)
    out_rows = int(x.shape[0]) if rows is None else int(rows)
    return nbytes(x) + nbytes(splits) + out_rows * row


def ep_exchange_flops(x: torch.Tensor, splits: torch.Tensor, group: str, rows: Any = None, padded: bool = False) -> int:
    """A move: no floating-point operations."""
    return 0


def ep_exchange_handler(op: Any, args: Any, kwargs: Any) -> Any:
    """DTensor dispatch: refuse the group's own mesh dim, replicate ``splits``, fill in ``rows``."""
    count_under_comm_debug_mode()
    x, splits, group, rows, padded = _args(args, kwargs)
    if not isinstance(x, DTensor):
        raise ValueError(f"{op}: x must be the DTensor (splits and group describe its rows), got {type(x).__name__}")
    mesh = x.device_mesh
    for i in range(mesh.ndim):
        if mesh.get_group(i).group_name == group:
            raise ValueError(
                f"{op} communicates over mesh dim {i} ({(mesh.mesh_dim_names or ['?'] * mesh.ndim)[i]}) itself: "
                "that dim must be local; call the op on to_local() tensors of that dim (or inside local_map)"
            )
    replicate = (R,) * mesh.ndim
    if isinstance(splits, DTensor):
        splits = splits.redistribute(mesh, replicate)
    else:  # a plain (host) splits tensor: the same on every rank of the mesh by contract
        splits = DTensor.from_local(splits, mesh, replicate, run_check=False)
    if op is EP_DISPATCH and rows is None:
        rows = int(splits.to_local()[1].sum())  # the row count DTensor's fake-tensor step cannot know
    return dispatch_slow_path(op, (x, splits, group, rows, padded), {})


@register([EP_DISPATCH, EP_COMBINE], flops=ep_exchange_flops, bytes=ep_exchange_bytes, gaps=COLLECTIVE,
          handler=ep_exchange_handler)
def ep_exchange_strategy(op: Any, args: Any, kwargs: Any) -> list[list[PlacementOrHole]]:
    """Whole rows move: column shards and Partial (linear) ride along; splits Replicate."""
    x = metas(args)[0]
    rows: list[list[PlacementOrHole]] = [[Shard(d), Shard(d), R] for d in range(1, len(x.shape))]
    rows += [[Partial(r), Partial(r), R] for r in ("sum", "avg") if r in partial_ops([x.dtype])]
    return rows
