"""The expert-parallel token moves as ``torch.library`` custom ops: dispatch and combine.

- ``dtensor_rules::ep_dispatch(x, splits, group, rows=None)``: the all-to-all that sends this
  rank's rows (sorted by destination rank) to the ranks owning their experts. ``splits``
  (2, ep) ints: row 0 the rows sent to each rank, row 1 the rows received from each.
  Returns the received rows (``sum(splits[1])`` of them), sender-major.
- ``dtensor_rules::ep_combine(y, splits, group, rows)``: the same all-to-all transposed (the
  received rows go back to their senders): ``rows = sum(splits[0])`` rows out.
- ``padded=True`` (both ops): the sender's side is a static-size buffer whose live prefix the
  data decides (the per-rank dispatch sends each token once per destination rank, a count only the
  routing knows): ``ep_dispatch`` sends the first ``sum(splits[0])`` rows of ``x`` and leaves the
  rest; ``ep_combine`` returns ``rows >= sum(splits[0])`` rows, the returned ones first, then zeros.
  Only the live rows cross the wire.

Why custom ops: to the compiler each move is ONE opaque node whose row count is an unbacked
SymInt allocated by the fake implementation (``_upstream.unbacked_size``: no Dynamo setting
needed, neither ``capture_scalar_outputs`` nor ``capture_dynamic_output_shape_ops``), so a
compiled EP block never breaks its graph or guards on the routing. Autograd: each op's
backward is the other (the transposed all-to-all), with the same ``splits``, so the backward
neither re-exchanges counts nor re-reads them; the backward's output row count is the
forward input's (``rows``), so no new unbacked size appears in the backward graph.

The one host read: the ops take the split sizes as host ints (``all_to_all_single`` needs
them) and read ``splits.tolist()`` inside. Pass ``splits`` as a CPU tensor made by ONE
device-to-host copy per forward (``ep/local.py`` does); then neither op nor either
backward syncs. A device ``splits`` also works, at one sync per op call.

``group`` is a process group's name (``ProcessGroup.group_name``), as funcol's ops take it.
Under ``LocalTensorMode`` (a simulated mesh) each op runs once on the simulated ranks'
LocalTensors, its all-to-all simulated across them, never once per rank. Under ``CommDebugMode``
the all-to-all inside is counted like funcol's (``c10d_functional.all_to_all_single``), registered once
``torch.distributed.tensor.debug`` is loaded (:func:`count_under_comm_debug_mode`).
The DTensor rule is in ``dtensor_rules/ep/all_to_all_rule.py``.
"""

from __future__ import annotations

import sys

from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from dtensor_rules._upstream import ALL_TO_ALL_SINGLE, FakeTensor, funcol, rank_tensors, unbacked_size
from dtensor_rules._upstream.tensors import on_local_tensor_mode

__all__ = ["ep_dispatch_op", "ep_combine_op", "DISPATCH_NAME", "COMBINE_NAME"]

DISPATCH_NAME = "dtensor_rules::ep_dispatch"
COMBINE_NAME = "dtensor_rules::ep_combine"


def _host_splits(splits: Tensor) -> tuple[list[int], list[int]]:
    """(send, recv) split sizes as host ints; checks the (2, ep) layout and the signs."""
    if splits.dim() != 2 or splits.shape[0] != 2 or splits.dtype.is_floating_point or splits.dtype.is_complex:
        raise ValueError(f"splits must be an integer (2, ep) tensor (row 0 sent, row 1 received), got "
                         f"{tuple(splits.shape)} {splits.dtype}")
    send, recv = splits.tolist()
    if min(send + recv) < 0:
        raise ValueError(f"negative split sizes: sent {send}, received {recv}")
    return send, recv


def _a2a(x: Tensor, out_splits: list[int], in_splits: list[int], group: str, padded: bool = False) -> Tensor:
    sent = sum(in_splits)
    if x.shape[0] != sent and not (padded and x.shape[0] > sent):
        more = " or more (padded)" if padded else ""
        raise ValueError(f"the input has {x.shape[0]} rows but the split sizes send {sent}{more} ({in_splits})")
    return funcol.wait_tensor(funcol.all_to_all_single(_live(x, sent, padded), out_splits, in_splits, group))


def _live(x: Tensor, sent: Any, padded: bool) -> Tensor:
    """The rows that move: all of ``x``, or with ``padded`` its first ``sent`` (per-rank ints when simulated)."""
    return (x[:sent] if padded else x).contiguous()


def _zero_tail(out: Tensor, rows: Any, padded: bool) -> Tensor:
    """``padded``: the returned rows, then zeros up to ``rows`` (the sender's static buffer size)."""
    return torch.cat([out, out.new_zeros((rows - out.shape[0], *out.shape[1:]))]) if padded else out


def _check_rows(rows: int | None, splits: list[int], what: str, padded: bool = False) -> None:
    if rows is not None and rows != sum(splits) and not (padded and rows > sum(splits)):
        more = " or more (padded)" if padded else ""
        raise ValueError(f"{what}: rows={rows} but the split sizes deliver {sum(splits)}{more} ({splits})")


@torch.library.custom_op(DISPATCH_NAME, mutates_args=())
def ep_dispatch_op(x: Tensor, splits: Tensor, group: str, rows: int | None = None, padded: bool = False) -> Tensor:
    """Send ``x``'s rows (sorted by destination) along ``splits[0]``; receive ``splits[1]`` per sender.

    ``padded``: ``x`` may hold more rows than it sends; only the first ``sum(splits[0])`` move."""
    send, recv = _host_splits(splits)
    _check_rows(rows, recv, "ep_dispatch")
    return _a2a(x, recv, send, group, padded)


@torch.library.custom_op(COMBINE_NAME, mutates_args=())
def ep_combine_op(y: Tensor, splits: Tensor, group: str, rows: int, padded: bool = False) -> Tensor:
    """Send the received rows ``y`` back to their senders: the transposed ``ep_dispatch``.

    ``padded``: ``rows`` may exceed the rows returned (``sum(splits[0])``); the rest are zeros."""
    send, recv = _host_splits(splits)
    _check_rows(rows, send, "ep_combine", padded)
    return _zero_tail(_a2a(y, send, recv, group), rows, padded)


@ep_dispatch_op.register_fake
def _dispatch_fake(x: Tensor, splits: Tensor, group: str, rows: int | None = None, padded: bool = False) -> Tensor:
    """Data-dependent row count: a new unbacked size (unless the caller knows it: ``rows``)."""
    n = unbacked_size() if rows is None else rows
    return x.new_empty((n, *x.shape[1:]))


@ep_combine_op.register_fake
def _combine_fake(y: Tensor, splits: Tensor, group: str, rows: int, padded: bool = False) -> Tensor:
    return y.new_empty((rows, *y.shape[1:]))


def _setup(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, splits, ctx.group = inputs[:3]
    ctx.padded = bool(inputs[4]) if len(inputs) > 4 else False
    ctx.rows = x.shape[0]  # the backward returns exactly the input's rows (no new unbacked size)
    ctx.save_for_backward(splits)


def _dispatch_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    (splits,) = ctx.saved_tensors
    # padded: the unsent rows of the buffer get a zero gradient
    return ep_combine_op(grad, splits, ctx.group, ctx.rows, ctx.padded), None, None, None, None


def _combine_backward(ctx: Any, grad: Tensor) -> tuple[Any, ...]:
    (splits,) = ctx.saved_tensors
    # padded: the zero rows' gradient is dropped (only the returned rows' gradient goes back)
    return ep_dispatch_op(grad, splits, ctx.group, ctx.rows, ctx.padded), None, None, None, None


ep_dispatch_op.register_autograd(_dispatch_backward, setup_context=_setup)
ep_combine_op.register_autograd(_combine_backward, setup_context=_setup)


def _directions(splits: Tensor, transpose: bool) -> tuple[list[int], list[int]]:
    """(output, input) split sizes of the all-to-all, unchecked: per-rank ints under LocalTensorMode."""
    send, recv = splits.tolist()
    return (send, recv) if transpose else (recv, send)


def _without_moving(args: tuple[Any, ...], transpose: bool) -> Any:
    """What a mode's rule (the simulated body, the ``CommDebugMode`` count) answers without moving
    rows, or None when it must move them.

    - A DTensor argument: ``NotImplemented`` (as ``LocalTensorMode`` itself answers a tensor subclass
      it does not know). A mode sees the op before the subclass does, so this hands the call to the
      DTensor rule (``ep/all_to_all_rule.py``), whose local call comes back to the mode.
    - Fake tensors, or LocalTensors of them (that rule's shape step): there are no split sizes to
      read, so the fake implementation answers.
    """
    x, splits = args[:2]
    if isinstance(x, DTensor) or isinstance(splits, DTensor):
        return NotImplemented
    if isinstance(x, FakeTensor) or any(isinstance(t, FakeTensor) for t in (rank_tensors(x) or {}).values()):
        return (_combine_fake if transpose else _dispatch_fake)(*args)
    return None


def _simulated(transpose: bool) -> Any:
    """The op's body on LocalTensors: the split sizes are per-rank ints there (no Python checks)."""

    def run(x: Tensor, splits: Tensor, group: str, rows: int | None = None, padded: bool = False) -> Any:
        answer = _without_moving((x, splits, group, rows, padded), transpose)
        if answer is not None:
            return answer
        out_splits, in_splits = _directions(splits, transpose)
        live = _live(x, sum(in_splits), padded and not transpose)
        out = funcol.wait_tensor(funcol.all_to_all_single(live, out_splits, in_splits, group))
        return _zero_tail(out, rows, padded and transpose)

    return run


on_local_tensor_mode(torch.ops.dtensor_rules.ep_dispatch.default, _simulated(transpose=False))
on_local_tensor_mode(torch.ops.dtensor_rules.ep_combine.default, _simulated(transpose=True))


def _counted(mode: Any, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
    """Under ``CommDebugMode`` the op's all-to-all goes through the mode, which counts it as
    ``c10d_functional.all_to_all_single`` (a mode sees a custom op, not the collective inside)."""
    transpose = func is torch.ops.dtensor_rules.ep_combine.default
    args = tuple(args) + tuple((kwargs or {}).values())
    answer = _without_moving(args, transpose)
    if answer is not None:
        return answer
    x, splits, group = args[:3]
    rows = args[3] if len(args) > 3 else None
    padded = bool(args[4]) if len(args) > 4 else False
    # no checks: per-rank ints when LocalTensorMode runs below this mode
    out_splits, in_splits = _directions(splits, transpose)
    live = _live(x, sum(in_splits), padded and not transpose)  # only the live rows are counted: they move
    out = funcol.wait_tensor(mode.__torch_dispatch__(ALL_TO_ALL_SINGLE, types, (live, out_splits, in_splits, group), {}))
    return _zero_tail(out, rows, padded and transpose)


_counted_under: list[type] = []  # the CommDebugMode class the rule is registered for, once it is


def count_under_comm_debug_mode() -> None:
    """Register :func:`_counted` for ``CommDebugMode`` once ``torch.distributed.tensor.debug`` is loaded.

    Not at ``import dtensor_rules``: that module costs ~0.8 s (it imports triton and Dynamo), and a
    user who opens a ``CommDebugMode`` has imported it already. So the callers of the ops
    (``ep_local``, the DTensor handler) call this first: a dict lookup once registered, nothing
    while compiling (the mode does not trace).
    """
    if _counted_under or torch.compiler.is_compiling():
        return
    debug = sys.modules.get("torch.distributed.tensor.debug")
    if debug is None:
        return
    for op in (torch.ops.dtensor_rules.ep_dispatch.default, torch.ops.dtensor_rules.ep_combine.default):
        torch.library.register_torch_dispatch(op, debug.CommDebugMode, _counted)
    _counted_under.append(debug.CommDebugMode)


count_under_comm_debug_mode()
