"""``CommBytesMode``: ``CommDebugMode`` that also adds up the bytes each collective moves on this rank.

``CommDebugMode`` counts collectives; comparing a gather path with an all-to-all
path needs their volume too. For every collective call this rank makes, the mode
adds the bytes of the larger of its tensor input and its tensor output (an
all_gather counts the gathered result, a reduce_scatter its full input, an
all_reduce its tensor, an all_to_all the larger of what it sends and receives), and
splits forward from backward with ``CommDebugMode``'s own module tracker. On a simulated
mesh (``LocalTensorMode``) it counts rank 0's pieces. The EP token moves
(``dtensor_rules::ep_dispatch`` / ``ep_combine``: an all_to_all each) are counted as the collective
they run inside (``CommDebugMode`` does not see into a custom op), by the rows their split sizes move.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch.distributed.tensor.debug import CommDebugMode
from torch.utils._pytree import tree_leaves

__all__ = ["CommBytesMode", "collective_name"]

# the package's custom ops that are one collective each (their inner funcol calls are not seen)
_CUSTOM_COLLECTIVES = {"dtensor_rules.ep_dispatch": "all_to_all", "dtensor_rules.ep_combine": "all_to_all"}
# ... of which only the first argument moves (the others are host split sizes, never sent)
_ROWS_ONLY = {"dtensor_rules.ep_dispatch", "dtensor_rules.ep_combine"}


def collective_name(func: Any) -> str:
    """``c10d_functional.all_gather_into_tensor`` -> ``all_gather``; ``c10d.broadcast_`` -> ``broadcast``."""
    name = str(func._overloadpacket).split(".")[-1].rstrip("_")
    for short in ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "broadcast", "scatter", "alltoall"):
        if name.startswith(short) or name.startswith(short.replace("_", "")):
            return "all_to_all" if short == "alltoall" else short
    return name


def _bytes(tree: Any) -> int:
    """Bytes of the tensors in ``tree``; of rank 0's piece for a simulated (``LocalTensor``) tensor."""
    total = 0
    for t in tree_leaves(tree):
        if not isinstance(t, torch.Tensor):
            continue
        local = getattr(t, "_local_tensors", None)  # simulated mesh: one piece per rank, sizes may differ
        t = local[min(local)] if local else t
        total += _rank0(t.numel()) * t.element_size()
    return total


def _rank0(n: Any) -> int:
    """An element count; rank 0's for a simulated size that differs per rank (a ``LocalIntNode``)."""
    if isinstance(n, int):
        return n
    ints = getattr(getattr(n, "node", None), "_local_ints", None)
    return int(ints[min(ints)]) if ints else int(n)


def _ep_bytes(args: Any) -> int:
    """An EP token move: its row bytes times the larger of the rows sent and received, read from its
    (2, ep) split sizes (rank 0's when simulated). Not the tensors' sizes: with ``padded`` the input
    (dispatch) or the output (combine) is a static buffer of which only the live rows move."""
    x, splits = args[0], args[1]
    local = getattr(splits, "_local_tensors", None)
    splits = local[min(local)] if local else splits
    row = x.element_size() * int(torch.Size(x.shape[1:]).numel())
    return row * int(splits.sum(1).max())


def _ep_sent_all_ranks(packet: str, args: Any) -> int:
    """Bytes an EP token move sends, summed over the ranks this process holds (every simulated rank;
    this rank on a real group): ``ep_dispatch`` sends ``splits[0]`` rows, ``ep_combine`` ``splits[1]``."""
    x, splits = args[0], args[1]
    local = getattr(splits, "_local_tensors", None)
    row = x.element_size() * int(torch.Size(x.shape[1:]).numel())
    side = 0 if packet.endswith("dispatch") else 1
    return row * sum(int(t[side].sum()) for t in (local.values() if local else [splits]))


class CommBytesMode(CommDebugMode):
    """``CommDebugMode`` plus ``bytes[phase][collective]`` (phase ``"forward"``/``"backward"``), and
    ``ep_sent[phase][(op, row shape)]``: the bytes the EP token moves (``"ep_dispatch"``,
    ``"ep_combine"``) send, summed over every rank this process holds (all ranks of a simulated mesh)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: dict[str, dict[str, int]] = {"forward": defaultdict(int), "backward": defaultdict(int)}
        self.calls: dict[str, dict[str, int]] = {"forward": defaultdict(int), "backward": defaultdict(int)}
        self.largest: dict[str, int] = defaultdict(int)  # collective -> largest single call's bytes
        self.ep_sent: dict[str, dict[tuple[str, tuple[int, ...]], int]] = {"forward": defaultdict(int),
                                                                          "backward": defaultdict(int)}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        before = sum(self.comm_counts.values())
        out = super().__torch_dispatch__(func, types, args, kwargs)
        packet = str(getattr(func, "_overloadpacket", ""))
        custom = _CUSTOM_COLLECTIVES.get(packet)
        if out is not NotImplemented and (custom or sum(self.comm_counts.values()) > before):
            phase = "backward" if self.advanced_module_tracker.is_bw else "forward"
            name = custom or collective_name(func)
            size = _ep_bytes(args) if packet in _ROWS_ONLY else max(_bytes((args, kwargs)), _bytes(out))
            self.bytes[phase][name] += size
            self.calls[phase][name] += 1
            self.largest[name] = max(self.largest[name], size)
            if packet in _ROWS_ONLY:
                key = (packet.split(".")[-1], tuple(int(n) for n in args[0].shape[1:]))
                self.ep_sent[phase][key] += _ep_sent_all_ranks(packet, args)
        return out

    def total_bytes(self, collective: str | None = None) -> int:
        """Bytes over both phases, of one collective or of all."""
        return sum(v for phase in self.bytes.values() for k, v in phase.items() if collective in (None, k))
