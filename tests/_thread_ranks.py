"""Run a function on every rank of one world of upstream's threaded process group.

The threaded process group (``torch.testing._internal.distributed.multi_threaded_pg``, what upstream's
``DTensorOpTestBase``-style tests run on) runs each rank as a thread of this process, so a test can
compare every rank's DTensor result with plain torch without starting processes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist
from torch.testing._internal.common_distributed import spawn_threads_and_init_comms
from torch.testing._internal.distributed.multi_threaded_pg import _uninstall_threaded_pg

R = TypeVar("R")


def run_on_thread_ranks(body: Callable[[], R], world_size: int) -> list[R]:
    """``body()`` on each of ``world_size`` thread ranks; the results in rank order.

    The first rank's exception to happen is raised here (an ``AssertionError`` prefixed with its rank),
    after every rank has stopped: the failing rank re-raises in its thread, which is how upstream's
    runner wakes the ranks waiting for it in a collective (their own errors come later and are dropped).
    """
    results: dict[int, R] = {}
    errors: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    class _World:
        @spawn_threads_and_init_comms(world_size=world_size)
        def run(self) -> None:
            rank = dist.get_rank()
            try:
                result = body()
            except BaseException as e:
                with lock:
                    errors.append((rank, e))
                raise
            with lock:
                results[rank] = result

    try:
        _World().run()
    except RuntimeError:  # upstream's summary of the ranks' errors: the first one is raised below instead
        if not errors:
            raise
    finally:  # the decorator leaves its thread-local world installed; later tests in this worker need the real one
        _uninstall_threaded_pg()
    if errors:
        rank, e = errors[0]
        if isinstance(e, AssertionError):
            raise AssertionError(f"rank {rank}: {e}") from e
        raise e
    return [results[r] for r in range(world_size)]
