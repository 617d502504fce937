"""Rank function for the ragged gloo test (module level, so ``run_gloo`` can start it).

Every rank knows the whole routing matrix (the test's input) and the full tensor, builds its own
counts row and local rows, runs the moves on a real 4-rank gloo group and returns plain Python
booleans / lists for the parent to assert.
"""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, distribute_tensor

import dtensor_rules  # noqa: F401  (installs the rules and the ragged patches)
from dtensor_rules import ragged

from tests._ragged_oracle import CASES, rows_of


def ragged_worker(rank: int, world_size: int) -> dict[str, object]:
    C = CASES[world_size]
    n = sum(map(sum, C))
    full = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    w = torch.linspace(-1, 1, n * 3).reshape(n, 3)
    mesh = init_device_mesh("cpu", (world_size,))
    counts = ragged.counts_from_local(torch.tensor(C[rank]), mesh, 0)
    rep = distribute_tensor(full, mesh, [Replicate()]).requires_grad_()
    x = ragged.distribute(rep, mesh, counts, 0)
    y = x.redistribute(mesh, (ragged.RaggedShard(0, len(C[0]), True),))  # the dispatch, through the patch
    back = ragged.combine(y)
    out = y.full_tensor()
    (out.sin() * w).sum().backward()

    def rows(aligned: bool) -> torch.Tensor:
        return full[torch.tensor(rows_of(C, rank, aligned), dtype=torch.long)]

    return {
        "unaligned": torch.equal(x.to_local(), rows(False)),
        "aligned": torch.equal(y.to_local(), rows(True)),
        "combined": torch.equal(back.to_local(), rows(False)),
        "full": torch.equal(out, full),
        "grad": torch.allclose(rep.grad.to_local(), full.cos() * w),
        "local_rows": [x.to_local().shape[0], y.to_local().shape[0]],
    }


def ragged_checkpoint_worker(rank: int, world_size: int, folder: str) -> dict[str, object]:
    """Save an aligned ragged DTensor with DCP, load it into a Replicate one; an unaligned save is refused."""
    import torch.distributed.checkpoint as dcp

    from dtensor_rules._upstream.ragged import RaggedPlacementError

    C = CASES[world_size]
    n = sum(map(sum, C))
    full = torch.arange(n * 3, dtype=torch.float32).reshape(n, 3)
    mesh = init_device_mesh("cpu", (world_size,))
    counts = ragged.counts_from_local(torch.tensor(C[rank]), mesh, 0)
    x = ragged.distribute(full, mesh, counts, 0)
    y = ragged.dispatch(x)
    dcp.save({"rows": y}, checkpoint_id=folder)
    target = distribute_tensor(torch.zeros(n, 3), mesh, [Replicate()])
    dcp.load({"rows": target}, checkpoint_id=folder)
    try:
        dcp.save({"rows": x}, checkpoint_id=folder + "_unaligned")
        refused = ""
    except BaseException as err:  # DCP wraps a rank's exception in CheckpointException (a BaseException)
        refused = "DCP" if ("not a box" in str(err) or isinstance(err, RaggedPlacementError)) else repr(err)[:300]
    return {"loaded": torch.equal(target.to_local(), full), "unaligned_refused": refused}
