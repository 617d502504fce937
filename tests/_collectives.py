"""A dispatch mode that lists the collectives and ragged custom ops run inside it (tests only)."""

from __future__ import annotations

from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode


def moves_and_gathers(name: str) -> bool:
    """All-to-alls, all-gathers and the ragged custom ops."""
    return "all_to_all" in name or "all_gather" in name or "ragged" in name


class Collectives(TorchDispatchMode):
    """Short names (``all_to_all_single``, ``ragged_exchange``, ...) of the ops ``keep`` accepts, in order."""

    def __init__(self, keep: Callable[[str], bool] = moves_and_gathers) -> None:
        super().__init__()
        self.keep = keep
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if self.keep(name):
            self.seen.append(name.split(".")[-1])
        return func(*args, **(kwargs or {}))
