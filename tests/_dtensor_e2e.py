"""End-to-end helpers: build DTensors with exact per-rank data on a simulated mesh, read them back.

``distribute_tensor(x, mesh, [Partial()])`` on a simulated mesh (torch 2.13 LocalTensorMode)
returns a plain local tensor whose ``full_tensor()`` is NOT reduced, so Partial inputs are
built here from the validator's own asymmetric per-rank splits with ``DTensor.from_local``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.distributed._local_tensor import LocalTensor
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Placement

from dtensor_rules.testing.simulate import coords, local_input


def dtensor(full: torch.Tensor, mesh: DeviceMesh, placements: Sequence[Placement], salt: int = 1) -> DTensor:
    """``full`` laid out as ``placements``: uneven shards, asymmetric Partial contributions."""
    mesh_shape = tuple(mesh.shape)
    per_rank = {
        r: local_input(full, tuple(placements), mesh_shape, c, salt).clone()  # never a view of `full`
        for r, c in enumerate(coords(mesh_shape))
    }
    return DTensor.from_local(
        LocalTensor(per_rank), mesh, tuple(placements), run_check=False, shape=full.shape, stride=full.stride()
    )


def full(t: DTensor) -> torch.Tensor:
    """The global value of a DTensor as one plain tensor (every rank must agree)."""
    f = t.full_tensor()
    return f.reconcile() if isinstance(f, LocalTensor) else f
