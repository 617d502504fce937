"""Per-rank expert parallelism on plain tensors: dispatch, local experts, combine.

What one ep rank does with its own tokens (``T`` tokens, top-``k``, ``E`` experts in
all, ``E_l = E / ep`` of them on this rank, rank ``r`` owning experts
``[r * E_l, (r + 1) * E_l)``):

1. sort the ``T * k`` assignments by expert id (stable): the rows for each destination
   rank are then contiguous, and inside them grouped by the destination's local expert;
2. count the assignments per expert and exchange the counts with ONE small all-to-all
   (``E`` ints out, ``ep * E_l`` ints in): entry ``s * E_l + e`` of the result is what rank
   ``s`` sends to local expert ``e`` -- the input layout of ``moe_permute_indices``;
3. copy the ``2 * ep`` per-rank row counts to the host ONCE (``host_splits``: the one
   device-to-host sync per step) and move the token rows with the custom op
   ``dtensor_rules::ep_dispatch`` (``dtensor_rules.ep.all_to_all``), which reads them
   there: compiled, it is one opaque node whose received row count is an unbacked size
   (docs/compile.md "Compiled expert parallelism");
4. ``moe_permute_indices`` groups the received rows per local expert and pads every
   group to the ``_grouped_mm`` alignment; the padded rows read a zero row;
5. SwiGLU with ``_grouped_mm`` on the LOCAL experts only, back to the received order;
6. the reverse all-to-all (``dtensor_rules::ep_combine``, the transposed split sizes) and
   the weighted combine.

Autograd: every step is differentiable (gathers, ``_grouped_mm``, and the two moves, each the
other's backward with the same host splits: no second sync), so the backward sends the
output gradients forward along the same routes and back.

``dispatch="per_rank"`` (:func:`ep_dispatch_per_rank`): each token crosses the wire ONCE per
destination rank, not once per chosen expert (what DeepEP does): the receiving rank runs the row
through each of its chosen local experts, sums their weighted outputs, and sends ONE row back per
(token, rank); the home rank adds the per-rank partial sums. Dispatch and combine bytes drop from
``T * k * D`` to ``T * D * (distinct destination ranks per token)`` elements; the routing weights
travel with a small per-assignment record (row index and weight, two fp32 per assignment). Same
count exchange (one more int per destination rank), same ONE device-to-host copy. The result
differs from ``"per_expert"`` only in the summation order (per-rank partial sums first).

``custom_ops=False`` moves the rows with funcol's ``all_to_all_single_autograd`` and host split
lists instead (the path before the custom ops; compiled it needs ``capture_scalar_outputs``):
kept as the eager oracle of the custom ops (``tests/test_ep_compile.py``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from dtensor_rules._upstream import funcol

from dtensor_rules.kernels import moe_permute_indices, permuted_length_bound
from dtensor_rules.ep.all_to_all import count_under_comm_debug_mode, ep_combine_op, ep_dispatch_op
from dtensor_rules.models.moe import check_compiled_gmm_dtype

# (x_grouped (L, dim), offs (E_l,) int32 group ends, w1, w3, w2 local) -> (L, dim)
ExpertsFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

__all__ = ["ExpertsFn", "Dispatched", "RankDispatched", "DISPATCH_MODES", "ep_dispatch", "ep_dispatch_per_rank",
           "host_splits", "local_experts", "ep_combine", "ep_combine_per_rank", "ep_routed_experts", "check_dispatch"]

DISPATCH_MODES = ("per_expert", "per_rank")


class Dispatched(NamedTuple):
    """The state a dispatch leaves for its combine (all on this rank)."""

    x_grouped: torch.Tensor  # (max_len, dim): received rows grouped per local expert, padded
    offs: torch.Tensor  # (E_l,) int32 group ends for _grouped_mm
    dest: torch.Tensor  # (n_recv,) int64: padded row of each received row
    order: torch.Tensor  # (T*k,) int64: the assignments sorted by expert
    splits: torch.Tensor  # (2, ep) int64 on the host: rows sent to / received from each ep rank
    group: dist.ProcessGroup
    custom_ops: bool  # False: funcol's autograd all-to-all with the host lists below
    send_splits: list[int] | None = None  # rows sent to each ep rank (custom_ops=False only)
    recv_splits: list[int] | None = None  # rows received from each ep rank (custom_ops=False only)


def _all_to_all(t: torch.Tensor, out_splits: list[int], in_splits: list[int], group: dist.ProcessGroup) -> torch.Tensor:
    """Autograd all-to-all (backward: the transposed all-to-all), waited on."""
    return funcol.wait_tensor(funcol.all_to_all_single_autograd(t, out_splits, in_splits, group))


def exchange_counts(counts: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """(E,) per-expert counts of this rank -> (ep * E_l,) counts this rank's experts receive, per sender."""
    ep = dist.get_world_size(group)
    block = [counts.numel() // ep] * ep
    return funcol.wait_tensor(funcol.all_to_all_single(counts, block, block, group))


def host_splits(counts: torch.Tensor, recv_counts: torch.Tensor, ep: int) -> torch.Tensor:
    """(2, ep): rows sent to / received from each ep rank, on the host: the one device-to-host sync.

    ONE copy of the ``2 * ep`` sums (``.cpu()``; a no-op on CPU). The custom ops and their
    backwards read this host tensor, so nothing else in the step syncs.
    """
    return torch.stack([counts.view(ep, -1).sum(1), recv_counts.view(ep, -1).sum(1)]).cpu()


def _host_lists(splits: torch.Tensor) -> tuple[list[int], list[int]]:
    """The funcol path's split lists; compiled (``capture_scalar_outputs``) they are unbacked SymInts."""
    send, recv = splits.tolist()
    for s in send + recv:
        torch._check(s >= 0)
    return send, recv


def _expert_order(idx: torch.Tensor, n_experts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, counts)``: the flat assignments of ``idx`` sorted by expert (stable) and the count per expert."""
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    # not bincount: on CUDA it reads max(flat) on the host to size its output (a sync)
    counts = flat.new_zeros(n_experts).scatter_add_(0, flat, torch.ones_like(flat))
    return order, counts


def _padded_slots(perm: torch.Tensor, max_len: Any, n_rows: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """``(target, dest)`` of a grouped layout ``perm`` of ``max_len`` slots (padding slots hold -1): ``target`` reads row
    ``n_rows`` (an appended zero row) at padding, ``dest[perm[i]] = i`` for the ``n_rows`` real rows."""
    target = torch.where(perm < 0, torch.full_like(perm, n_rows), perm)
    slots = torch.arange(max_len, dtype=torch.int64, device=perm.device)
    dest = perm.new_zeros(n_rows + 1).index_put((target,), slots)[:n_rows]
    return target, dest


def ep_dispatch(x: torch.Tensor, idx: torch.Tensor, n_experts: int, alignment: int,
                group: dist.ProcessGroup, custom_ops: bool = True) -> Dispatched:
    """Send each (token, expert) assignment of ``x`` (T, dim) to the rank owning the expert.

    ``idx`` (T, k) holds global expert ids. Returns the received rows already grouped
    per local expert and padded (``Dispatched.x_grouped``) plus what ``ep_combine`` needs.
    """
    ep = dist.get_world_size(group)
    E_l = n_experts // ep
    k = idx.shape[-1]
    order, counts = _expert_order(idx, n_experts)
    recv_counts = exchange_counts(counts, group)
    splits = host_splits(counts, recv_counts, ep)
    rows = x[torch.div(order, k, rounding_mode="floor")]
    send_splits = recv_splits = None
    if custom_ops:
        count_under_comm_debug_mode()
        received = ep_dispatch_op(rows, splits, group.group_name)
    else:
        send_splits, recv_splits = _host_lists(splits)
        received = _all_to_all(rows, recv_splits, send_splits, group)
    n_recv = received.shape[0]
    max_len = permuted_length_bound(n_recv, E_l, alignment)
    perm, _sizes, offs = moe_permute_indices(recv_counts, E_l, ep, max_len, alignment)
    perm = perm.to(torch.int64)
    # padding slots hold -1, which picks the appended zero row
    x_grouped = torch.cat([received, received.new_zeros(1, received.shape[1])])[perm]
    _target, dest = _padded_slots(perm, max_len, n_recv)
    return Dispatched(x_grouped, offs, dest, order, splits, group, custom_ops, send_splits, recv_splits)


class RankDispatched(NamedTuple):
    """The state a per-rank dispatch leaves for its combine (all on this rank)."""

    x_grouped: torch.Tensor  # (max_len, dim): received assignments grouped per local expert, padded
    offs: torch.Tensor  # (E_l,) int32 group ends for _grouped_mm
    dest: torch.Tensor  # (A,) int64: padded row of each received assignment
    row: torch.Tensor  # (A,) int64: the received token row of each received assignment
    weight: torch.Tensor  # (A,) the routing weight of each received assignment (the weights' dtype)
    n_recv: torch.Tensor | int  # received token rows (an unbacked size when compiled)
    token: torch.Tensor  # (cap,) int64: the home token of each slot of the send buffer
    splits: torch.Tensor  # (2, ep) int64 on the host: token rows sent to / received from each ep rank
    group: dist.ProcessGroup


def _rank_rows(idx: torch.Tensor, ep: int, E_l: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Which tokens go to which rank, once each.

    Returns ``(rows_per_rank (ep,), pos (ep, T): row of token t among those sent to rank r,
    token (cap,): the token of each slot of the send buffer, rank-major, cap)``; ``cap = T * min(k, ep)``
    bounds the rows sent (a static size), the slots past the live rows hold token 0 and are never sent.
    """
    T, k = idx.shape
    to_rank = torch.zeros(T, ep, dtype=torch.bool, device=idx.device)
    to_rank.scatter_(1, torch.div(idx, E_l, rounding_mode="floor"), True)
    mask = to_rank.t().contiguous()  # (ep, T)
    rows_per_rank = mask.sum(1)
    pos = mask.cumsum(1) - 1
    cap = T * min(k, ep)
    base = rows_per_rank.cumsum(0) - rows_per_rank
    slot = torch.where(mask, base.unsqueeze(1) + pos, cap)  # unsent (rank, token) pairs write the dropped slot
    tokens = (mask.new_ones(mask.shape, dtype=torch.int64).cumsum(1) - 1).view(-1)  # t at (r, t)
    token = idx.new_zeros(cap + 1).scatter_(0, slot.view(-1), tokens)[:cap]
    return rows_per_rank, pos, token, cap


def _record_dtype(weights: torch.Tensor, n_tokens: int) -> torch.dtype:
    """The dtype of the per-assignment record (row index, weight): fp32 holds both exactly while
    the row index stays below 2**24 and the weights are at most fp32 wide; else fp64."""
    wide = weights.dtype == torch.float64 or n_tokens > 2**24
    return torch.float64 if wide else torch.float32


def ep_dispatch_per_rank(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, n_experts: int, alignment: int,
                         group: dist.ProcessGroup) -> RankDispatched:
    """Send each token of ``x`` (T, dim) ONCE to every rank owning one of its ``idx`` (T, k) experts.

    Three all-to-alls: the counts (per expert, plus the token rows per rank), the per-assignment
    records (the row index among the tokens this rank sends the receiver, and the routing weight;
    sorted by expert, so they arrive in ``moe_permute_indices``' sender-major, expert-minor order),
    and the token rows themselves (``padded``: a ``T * min(k, ep)`` row buffer whose live prefix
    moves). The receiver groups its assignments per local expert reading the received token rows.
    """
    ep = dist.get_world_size(group)
    E_l = n_experts // ep
    T, k = idx.shape
    flat = idx.reshape(-1)
    order, counts = _expert_order(idx, n_experts)
    rows_per_rank, pos, token, cap = _rank_rows(idx, ep, E_l)
    sent = torch.cat([counts.view(ep, E_l), rows_per_rank.view(ep, 1)], 1).reshape(-1)
    got = exchange_counts(sent, group).view(ep, E_l + 1)
    recv_counts, recv_rows = got[:, :E_l].reshape(-1), got[:, E_l]
    assignments = counts.view(ep, E_l).sum(1)
    recv_assignments = recv_counts.view(ep, E_l).sum(1)
    # the one device-to-host copy: token rows and assignment records, sent and received, per rank
    host = torch.stack([rows_per_rank, recv_rows, assignments, recv_assignments]).cpu()
    row_splits, record_splits = host[:2], host[2:]
    t_of = torch.div(order, k, rounding_mode="floor")
    r_of = torch.div(flat[order], E_l, rounding_mode="floor")
    rdt = _record_dtype(weights, T)
    record = torch.stack([pos[r_of, t_of].to(rdt), weights.reshape(-1)[order].to(rdt)], -1)
    count_under_comm_debug_mode()
    received_record = ep_dispatch_op(record, record_splits, group.group_name)
    received = ep_dispatch_op(x[token], row_splits, group.group_name, None, True)
    n_recv, n_assign = received.shape[0], received_record.shape[0]
    base = recv_rows.cumsum(0) - recv_rows  # first received row of each sender
    local_row, received_weight = (c.squeeze(1) for c in received_record.split(1, dim=1))
    local_row = local_row.to(torch.int64)
    nth = torch.ones_like(local_row).cumsum(0) - 1  # arange(n_assign), whose length is data
    sender = torch.searchsorted(recv_assignments.cumsum(0), nth, right=True)
    row = local_row + base[sender]
    weight = received_weight.to(weights.dtype)
    max_len = permuted_length_bound(n_assign, E_l, alignment)
    perm, _sizes, offs = moe_permute_indices(recv_counts, E_l, ep, max_len, alignment)
    perm = perm.to(torch.int64)
    target, dest = _padded_slots(perm, max_len, n_assign)
    # padding slots (-1) read the appended zero row (received row n_recv)
    src = torch.cat([row, row.new_full((1,), n_recv)])[target]
    x_grouped = torch.cat([received, received.new_zeros(1, received.shape[1])])[src]
    return RankDispatched(x_grouped, offs, dest, row, weight, n_recv, token, row_splits, group)


def ep_combine_per_rank(y_grouped: torch.Tensor, d: RankDispatched, n_tokens: int,
                        sum_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Weight and sum each received token's local expert outputs, send ONE row back per (token, rank),
    add the ranks' partial sums per token -> (T, dim).

    ``sum_dtype``: as :func:`ep_combine` (each product rounds where it does there); the partial
    sums travel in the dtype they are summed in, so no rounding is added, only the order changes.
    """
    y = y_grouped[d.dest]  # received assignment order; never reads an uncomputed row
    w = d.weight.unsqueeze(-1)
    if sum_dtype is None:
        contrib = y.to(d.weight.dtype) * w
    else:
        contrib = (y.to(sum_dtype).float() * w.float()).to(sum_dtype)
    partial = contrib.new_zeros(d.n_recv, contrib.shape[-1]).index_add(0, d.row, contrib)
    back = ep_combine_op(partial, d.splits, d.group.group_name, d.token.shape[0], True)
    return back.new_zeros(n_tokens, back.shape[-1]).index_add(0, d.token, back)


def local_experts(x_grouped: torch.Tensor, offs: torch.Tensor, w1: torch.Tensor, w3: torch.Tensor,
                  w2: torch.Tensor, gmm_dtype: torch.dtype | None = None) -> torch.Tensor:
    """SwiGLU of this rank's experts on their padded groups (rows past ``offs[-1]`` are not computed)."""
    if gmm_dtype is not None:
        x_grouped, w1, w3, w2 = (t.to(gmm_dtype) for t in (x_grouped, w1, w3, w2))
    check_compiled_gmm_dtype(x_grouped.dtype)
    h = F.silu(torch._grouped_mm(x_grouped, w1, offs=offs)) * torch._grouped_mm(x_grouped, w3, offs=offs)
    return torch._grouped_mm(h, w2, offs=offs)


def ep_combine(y_grouped: torch.Tensor, d: Dispatched, weights: torch.Tensor, n_tokens: int,
               sum_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Send the expert outputs back and sum them per token with the routing weights -> (T, dim).

    ``sum_dtype`` None: weight and sum in the weights' dtype. A dtype (torchtitan's combine,
    ``sum_dtype`` = the tokens' dtype): each row is cast to it, weighted in float32, cast back
    and summed in it, so a bf16 model rounds where torchtitan's does.
    """
    y = y_grouped[d.dest]  # received order; never reads an uncomputed row
    if d.custom_ops:
        back = ep_combine_op(y, d.splits, d.group.group_name, d.order.shape[0])
    else:
        assert d.send_splits is not None and d.recv_splits is not None
        back = _all_to_all(y, d.send_splits, d.recv_splits, d.group)
    k = weights.shape[-1]
    w = weights.reshape(-1)[d.order].unsqueeze(-1)
    if sum_dtype is None:
        contrib = back.to(weights.dtype) * w
    else:
        contrib = (back.to(sum_dtype).float() * w.float()).to(sum_dtype)
    token = torch.div(d.order, k, rounding_mode="floor")
    return contrib.new_zeros(n_tokens, contrib.shape[-1]).index_add(0, token, contrib)


def ep_routed_experts(x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor, w1: torch.Tensor,
                      w3: torch.Tensor, w2: torch.Tensor, *, n_experts: int, alignment: int,
                      group: dist.ProcessGroup, gmm_dtype: torch.dtype | None = None,
                      sum_dtype: torch.dtype | None = None, experts_fn: ExpertsFn | None = None,
                      custom_ops: bool = True, dispatch: str = "per_expert") -> torch.Tensor:
    """The routed-expert output of this rank's tokens, (T, dim), computed by expert parallelism.

    ``w1/w3`` (E_l, dim, H_l) and ``w2`` (E_l, H_l, dim) are this rank's experts; with a
    tensor-parallel hidden dim (H_l < H) the result is this rank's partial sum.
    ``experts_fn(x_grouped, offs, w1, w3, w2)`` replaces :func:`local_experts` (another
    block's own expert math and layout, e.g. torchtitan's ``GroupedExperts``).
    ``sum_dtype``: see :func:`ep_combine`. ``custom_ops``: see the module docstring.
    ``dispatch``: ``"per_expert"`` (a row per (token, expert)) or ``"per_rank"`` (a row per
    (token, destination rank); custom ops only): see the module docstring.
    """
    check_dispatch(dispatch, custom_ops)
    experts = functools.partial(local_experts, gmm_dtype=gmm_dtype) if experts_fn is None else experts_fn
    if dispatch == "per_rank":
        r = ep_dispatch_per_rank(x, idx, weights, n_experts, alignment, group)
        return ep_combine_per_rank(experts(r.x_grouped, r.offs, w1, w3, w2), r, x.shape[0], sum_dtype).to(x.dtype)
    d = ep_dispatch(x, idx, n_experts, alignment, group, custom_ops)
    return ep_combine(experts(d.x_grouped, d.offs, w1, w3, w2), d, weights, x.shape[0], sum_dtype).to(x.dtype)


def check_dispatch(dispatch: str, custom_ops: bool = True) -> None:
    """A ValueError naming the choices for an unknown ``dispatch``; per-rank needs the custom ops."""
    if dispatch not in DISPATCH_MODES:
        raise ValueError(f"dispatch={dispatch!r}: use one of {DISPATCH_MODES}")
    if dispatch == "per_rank" and not custom_ops:
        raise ValueError("dispatch='per_rank' moves its rows with the custom ops: pass custom_ops=True")
