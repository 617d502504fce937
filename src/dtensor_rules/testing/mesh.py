"""Meshes for tests: every rank simulated in one process, or real gloo processes.

``simulated_mesh`` gives a real :class:`DeviceMesh` over a fake process group inside
``LocalTensorMode``: DTensor ops run for all ranks in this process with real data,
uneven shards included. ``run_gloo`` runs a function on a real multi-process gloo group.

Rank processes are forked from a fork server that has imported torch once
(:func:`process_context`), so a gloo run does not pay ``import torch`` per rank; each rank
still starts from that clean state (no module of this package, the caller's environment).
"""

from __future__ import annotations

import contextlib
import math
import os
import queue as queue_module
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from dtensor_rules._upstream import LocalTensorMode
from dtensor_rules.testing.simulated_rng import per_rank_generators
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

MAX_WORLD = 8  # real gloo processes on one machine (and the default for generated mesh shapes)
# ranks one simulated mesh may hold: every rank's shard lives in this process, so memory and time
# grow with the world (a 4x8 solver layout of the small MoE block runs in seconds)
MAX_SIMULATED = 64
# what the fork server imports once, before it forks rank processes: torch, not this package
# (a rank imports dtensor_rules itself, under the environment the caller had at run_gloo)
FORKSERVER_PRELOAD = ("torch", "torch.distributed", "torch.distributed.tensor")

__all__ = ["simulated_mesh", "fake_world", "run_gloo", "MAX_WORLD", "MAX_SIMULATED", "process_context"]


def _check_shape(shape: Sequence[int] | int) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not 1 <= len(shape) <= 3 or any(not isinstance(s, int) or s < 1 for s in shape):
        raise ValueError(f"mesh shape must be 1 to 3 positive ints, got {shape}")
    if math.prod(shape) > MAX_SIMULATED:
        raise ValueError(f"mesh {shape} has {math.prod(shape)} ranks; simulated meshes allow at most {MAX_SIMULATED}")
    return shape


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[None]:
    """A default process group of the ``fake`` backend with ``world_size`` ranks.

    Reuses an existing fake group of the same size; replaces a fake group of another
    size for the duration; refuses to touch a real (gloo/nccl) group.
    """
    previous: int | None = None
    if dist.is_initialized():
        backend = dist.get_backend()
        if backend != "fake":
            raise RuntimeError(
                f"a real '{backend}' process group is active; simulated meshes need the fake backend "
                "(run them in a separate process or destroy the group first)"
            )
        if dist.get_world_size() == world_size:
            yield
            return
        previous = dist.get_world_size()
        dist.destroy_process_group()
    _init_fake(world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        if previous is not None:
            _init_fake(previous)


def _init_fake(world_size: int) -> None:
    """``init_process_group("fake")`` without its ``sys.excepthook`` wrapper: every init wraps the
    hook once more to prefix ``[rank0]:`` (a prefix per mesh a script ever opened), and in a
    simulated world rank 0 is not the rank that raised."""
    hook = sys.excepthook
    try:
        dist.init_process_group("fake", rank=0, world_size=world_size)
    finally:
        sys.excepthook = hook


# world sizes of the simulated meshes open now, outermost first (their LocalTensorModes nest)
_OPEN_WORLDS: list[int] = []
# what inductor raises when it reaches a LocalTensor's storage
_NO_DATA_POINTER = "Cannot access data pointer of Tensor"
COMPILE_UNSUPPORTED = (
    "torch.compile with the inductor backend cannot compile DTensor code on a simulated mesh (every rank's "
    "tensor lives in one LocalTensor, which has no storage to hand to a kernel): compile on real ranks with "
    "dtensor_rules.testing.run_gloo (docs/compile.md, 'Real ranks: run_gloo'), or run eagerly here"
)


@contextlib.contextmanager
def simulated_mesh(shape: Sequence[int] | int, names: Sequence[str] | None = None) -> Iterator[DeviceMesh]:
    """A ``DeviceMesh`` of ``shape`` (1-D to 3-D, at most ``MAX_SIMULATED`` = 64 ranks) with every rank simulated.

    Inside the block DTensor ops run for all ranks at once (``LocalTensorMode``);
    ``dtensor.to_local()`` is a ``LocalTensor`` holding every rank's shard.

    Tensors made before the block are plain, one for all ranks: upstream's ``distribute_tensor``
    keeps a replicated one shared (an in-place update, e.g. an optimizer step, then lands once
    per rank). ``dtensor_rules.distribute_tensor``, ``shard_moe`` and ``expert_parallel`` give
    every rank its own copy. An explicit ``torch.Generator`` draws on every rank what one process
    draws from it, as on real ranks (:mod:`dtensor_rules.testing.simulated_rng`; only inside the
    block). ``torch.compile`` does not run here (upstream limits, docs/compile.md):
    inductor's failure on a LocalTensor leaves the block as a RuntimeError saying so; compile on
    real ranks with :func:`run_gloo`. Meshes nest only with the same number of ranks (one
    simulated world at a time); a nested one of another size raises RuntimeError at once.
    """
    shape = _check_shape(shape)
    if names is not None and len(names) != len(shape):
        raise ValueError(f"{len(names)} mesh dim names given for a {len(shape)}-D mesh")
    world = math.prod(shape)
    if _OPEN_WORLDS and _OPEN_WORLDS[-1] != world:
        raise RuntimeError(
            f"simulated_mesh({shape}) ({world} ranks) cannot open inside a simulated mesh of {_OPEN_WORLDS[-1]} ranks: "
            "one simulated world at a time; close the outer block first, or give both meshes the same number of ranks"
        )
    _OPEN_WORLDS.append(world)
    try:
        with fake_world(world), per_rank_generators(), LocalTensorMode(frozenset(range(world))):
            try:
                yield init_device_mesh("cpu", shape, mesh_dim_names=tuple(names) if names else None)
            except RuntimeError as e:
                if _NO_DATA_POINTER in str(e):
                    raise RuntimeError(COMPILE_UNSUPPORTED) from e
                raise
    finally:
        _OPEN_WORLDS.pop()


def process_context() -> Any:
    """The multiprocessing context for rank processes: a fork server preloading torch where the
    platform has one (Linux, macOS), else spawn (each process then imports torch itself)."""
    import multiprocessing

    if "forkserver" not in multiprocessing.get_all_start_methods():
        return torch.multiprocessing.get_context("spawn")
    ctx = torch.multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))  # takes effect when the server first starts
    return ctx


def _gloo_worker(rank: int, world: int, init_file: str, fn: Callable[..., Any], args: tuple, queue: Any,
                 environ: dict[str, str]) -> None:
    os.environ.clear()  # the caller's environment now, not the fork server's from its start
    os.environ.update(environ)
    try:
        # a file rendezvous unique to this run: no TCP port that a concurrent run could also pick
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
        # gloo's init can return on one rank before a peer has finished connecting to it; a rank whose
        # ``fn`` returns (or raises) at once would then close the group under that peer, which fails in
        # init ("connectFullMesh failed ... Connection closed by peer") instead of reporting its own result
        dist.barrier()
        torch.manual_seed(0)
        result = fn(rank, world, *args)
        queue.put((rank, True, result))
    except BaseException:  # report every failure to the parent, which raises it
        queue.put((rank, False, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_gloo(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 300) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` (1 to 8) real gloo processes on this machine.

    For what the simulated mesh cannot do: ``torch.compile``, real collectives, FSDP, DCP.
    Each rank is a fresh process with the default process group initialized (gloo, file
    rendezvous in a private temporary folder, so concurrent runs never collide) and
    ``torch.manual_seed(0)``; build the ``DeviceMesh`` inside ``fn``. Ranks are forked from a
    server that imported only torch (:func:`process_context`; spawn where the platform has no
    fork server) and run ``fn`` under the caller's current environment; modules imported to
    unpickle ``fn`` (this package among them) see the environment the server started with.
    ``fn`` and ``args`` are pickled: ``fn`` must be a module-level function of an importable
    module, or of a script run as ``python script.py`` with the launch under
    ``if __name__ == "__main__":``. Return plain Python values (``tensor.tolist()``, floats),
    not tensors.

    Returns the results in rank order. Raises ``RuntimeError`` with the failing rank's
    traceback if a rank raises, or naming the ranks that died without a result, and
    ``TimeoutError`` after ``timeout`` seconds. Usage: docs/compile.md ("Real ranks").
    """
    if not 1 <= world_size <= MAX_WORLD:
        raise ValueError(f"world_size must be in 1..{MAX_WORLD}, got {world_size}")
    ctx = process_context()
    queue = ctx.Queue()
    environ = dict(os.environ)
    with tempfile.TemporaryDirectory(prefix="dtensor_rules_gloo_") as tmp:
        init_file = os.path.join(tmp, "rendezvous")
        procs = [
            ctx.Process(target=_gloo_worker, args=(r, world_size, init_file, fn, args, queue, environ))
            for r in range(world_size)
        ]
        for p in procs:
            p.start()
        results: dict[int, Any] = {}
        deadline = time.monotonic() + timeout
        try:
            while len(results) < world_size:
                try:
                    rank, ok, value = queue.get(timeout=1.0)
                except queue_module.Empty:
                    dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in results]
                    if dead:
                        raise RuntimeError(f"gloo rank(s) {dead} died without a result (exit codes "
                                           f"{[procs[r].exitcode for r in dead]})") from None
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"gloo run did not finish in {timeout:.0f}s; "
                                           f"ranks still running: {sorted(set(range(world_size)) - set(results))}") from None
                    continue
                if not ok:
                    raise RuntimeError(f"rank {rank} failed:\n{value}")
                results[rank] = value
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
    return [results[r] for r in range(world_size)]
