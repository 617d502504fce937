"""The ragged moves on one rank's local rows, as ``torch.library`` custom ops.

Three ops, each the other's backward so that autograd of a move is the reverse move:

- ``dtensor_rules::ragged_exchange(x, counts, recv_counts, ep, to_aligned, group)``: the token
  all-to-all of the dispatch (``to_aligned``: unaligned -> aligned, then a local regroup
  sender-major -> expert-major) or of the combine (regroup back, all-to-all with the transposed
  splits). Backward: the same op in the other direction, with the same counts (no exchange).
- ``dtensor_rules::ragged_all_gather(x, counts, ep, aligned, rows, rank, group)``: either layout ->
  the global rows (an all-gather padded to the largest shard, unpadded, reordered
  partition-major). Backward: ``ragged_select``.
- ``dtensor_rules::ragged_select(full, counts, ep, aligned, rank, group)``: the global rows -> this
  rank's rows (a local gather). Backward: ``ragged_all_gather`` (DTensor's convention for
  Replicate -> Shard: the gradient of a replicated input is gathered, never summed).

The split sizes are read on the host inside the ops (``tolist()``: the one device-to-host sync
of a move, as in ``models/ep_local.py``); their fake implementations allocate one unbacked row
count instead (``ctx.new_dynamic_size()``), so a compiled caller traces them as single nodes.
Inputs have the ragged dim first (the DTensor-level moves move it there). Under
``LocalTensorMode`` each op runs once on the simulated ranks' LocalTensors (the collectives are
simulated across ranks), never once per rank.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dtensor_rules._upstream import funcol, maybe_run_for_local_tensor
from dtensor_rules._upstream.ragged import on_local_tensor_mode
from dtensor_rules.ragged.segments import global_rows_of_rank, rank_sizes, transpose_index

__all__ = ["ragged_exchange", "ragged_all_gather", "ragged_select"]


@maybe_run_for_local_tensor
def _regroup(x: Tensor, lens: Tensor) -> Tensor:
    """Rows in ``lens``' (a, b)-major segments -> (b, a)-major."""
    return x.index_select(0, transpose_index(lens, x.shape[0]))


@maybe_run_for_local_tensor
def _pad_rows(x: Tensor, rows: int) -> Tensor:
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


@maybe_run_for_local_tensor
def _select_rows(full: Tensor, counts: Tensor, rank: Tensor, aligned: bool) -> Tensor:
    r = int(rank)
    total = int(rank_sizes(counts, aligned)[r])
    return full.index_select(0, global_rows_of_rank(counts, r, aligned, total))


@maybe_run_for_local_tensor
def _reorder_global(x: Tensor, counts: Tensor) -> Tensor:
    """Rank-major concatenation of unaligned shards ((s, e)-major segments) -> partition-major."""
    return x.index_select(0, transpose_index(counts, x.shape[0]))


def _a2a(x: Tensor, out_splits: list[Any], in_splits: list[Any], group: str) -> Tensor:
    return funcol.wait_tensor(funcol.all_to_all_single(x.contiguous(), out_splits, in_splits, group))


def _exchange(x: Tensor, counts: Tensor, recv_counts: Tensor, ep: int, to_aligned: bool, group: str) -> Tensor:
    send = counts.reshape(ep, -1)  # (dest rank, its local expert): rows this rank sends
    recv = recv_counts.reshape(ep, -1)  # (sender, local expert): rows this rank's experts receive
    if to_aligned:
        splits = torch.cat([send.sum(1), recv.sum(1)]).tolist()  # the one D2H sync
        return _regroup(_a2a(x, splits[ep:], splits[:ep], group), recv)
    splits = torch.cat([recv.sum(1), send.sum(1)]).tolist()
    return _a2a(_regroup(x, recv.t()), splits[ep:], splits[:ep], group)


def _all_gather(x: Tensor, counts: Tensor, ep: int, aligned: bool, rows: int, rank: Tensor, group: str) -> Tensor:
    sizes = rank_sizes(counts, aligned).tolist()  # the same on every rank
    top = max(sizes)
    gathered = funcol.wait_tensor(funcol.all_gather_single(_pad_rows(x.contiguous(), top), 0, group))
    rank_major = torch.cat([gathered[r * top: r * top + sizes[r]] for r in range(ep)])
    return rank_major if aligned else _reorder_global(rank_major, counts)


def _select(full: Tensor, counts: Tensor, ep: int, aligned: bool, rank: Tensor, group: str) -> Tensor:
    return _select_rows(full, counts, rank, aligned)


@torch.library.custom_op("dtensor_rules::ragged_exchange", mutates_args=())
def ragged_exchange(x: Tensor, counts: Tensor, recv_counts: Tensor, ep: int, to_aligned: bool, group: str) -> Tensor:
    """Dispatch (``to_aligned``) or combine token all-to-all of this rank's rows (see the module docstring)."""
    return _exchange(x, counts, recv_counts, ep, to_aligned, group)


@torch.library.custom_op("dtensor_rules::ragged_all_gather", mutates_args=())
def ragged_all_gather(x: Tensor, counts: Tensor, ep: int, aligned: bool, rows: int, rank: Tensor, group: str) -> Tensor:
    """Every rank's rows -> the ``rows`` global rows, partition-major."""
    return _all_gather(x, counts, ep, aligned, rows, rank, group)


@torch.library.custom_op("dtensor_rules::ragged_select", mutates_args=())
def ragged_select(full: Tensor, counts: Tensor, ep: int, aligned: bool, rank: Tensor, group: str) -> Tensor:
    """The global rows -> this rank's rows in the layout."""
    return _select(full, counts, ep, aligned, rank, group)


def _unbacked_rows(x: Tensor) -> Tensor:
    rows = torch.library.get_ctx().new_dynamic_size()
    return x.new_empty((rows, *x.shape[1:]))


@ragged_exchange.register_fake
def _exchange_fake(x: Tensor, counts: Tensor, recv_counts: Tensor, ep: int, to_aligned: bool, group: str) -> Tensor:
    return _unbacked_rows(x)


@ragged_all_gather.register_fake
def _all_gather_fake(x: Tensor, counts: Tensor, ep: int, aligned: bool, rows: int, rank: Tensor, group: str) -> Tensor:
    return x.new_empty((rows, *x.shape[1:]))


@ragged_select.register_fake
def _select_fake(full: Tensor, counts: Tensor, ep: int, aligned: bool, rank: Tensor, group: str) -> Tensor:
    return _unbacked_rows(full)


def _exchange_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    _x, counts, recv_counts, ctx.ep, ctx.to_aligned, ctx.group = inputs
    ctx.save_for_backward(counts, recv_counts)


def _exchange_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    counts, recv_counts = ctx.saved_tensors
    return ragged_exchange(grad, counts, recv_counts, ctx.ep, not ctx.to_aligned, ctx.group), None, None, None, None, None


def _gather_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    _x, counts, ctx.ep, ctx.aligned, _rows, rank, ctx.group = inputs
    ctx.save_for_backward(counts, rank)


def _gather_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    counts, rank = ctx.saved_tensors
    return (ragged_select(grad, counts, ctx.ep, ctx.aligned, rank, ctx.group),) + (None,) * 6


def _select_setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    full, counts, ctx.ep, ctx.aligned, rank, ctx.group = inputs
    ctx.rows = full.shape[0]
    ctx.save_for_backward(counts, rank)


def _select_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    counts, rank = ctx.saved_tensors
    return (ragged_all_gather(grad, counts, ctx.ep, ctx.aligned, ctx.rows, rank, ctx.group),) + (None,) * 5


ragged_exchange.register_autograd(_exchange_backward, setup_context=_exchange_setup)
ragged_all_gather.register_autograd(_gather_backward, setup_context=_gather_setup)
ragged_select.register_autograd(_select_backward, setup_context=_select_setup)

on_local_tensor_mode(torch.ops.dtensor_rules.ragged_exchange.default, _exchange)
on_local_tensor_mode(torch.ops.dtensor_rules.ragged_all_gather.default, _all_gather)
on_local_tensor_mode(torch.ops.dtensor_rules.ragged_select.default, _select)
