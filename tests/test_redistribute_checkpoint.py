"""Shard order survives autograd (a.grad) and DCP writes the right offsets for ordered DTensors."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from dtensor_rules.redistribute import Layout, distribute_tensor, layout_of, redistribute
from dtensor_rules.testing import run_gloo, simulated_mesh

from tests._redistribute_helpers import check_locals, int_tensor

ORDERED = ((Shard(0), Shard(0)), (1, 0))  # uneven on 5 rows: (0,0)->0 1, (1,0)->2, (0,1)->3, (1,1)->4


def test_grad_keeps_the_leaf_order_metadata():
    x = int_tensor((5, 4), 1).requires_grad_(True)
    w = int_tensor((5, 4), 2)
    with simulated_mesh((2, 2)) as mesh:
        a = distribute_tensor(x, mesh, *ORDERED)
        b = redistribute(a, (Shard(1), Replicate()))
        (b * distribute_tensor(w, mesh, (Shard(1), Replicate()))).sum().backward()
        assert layout_of(a.grad._spec) == layout_of(a._spec)
        check_locals(a.grad._local_tensor._local_tensors, w, layout_of(a._spec), (2, 2))
        for t in a.grad.full_tensor()._local_tensors.values():  # reads the metadata: wrong rows if it lied
            torch.testing.assert_close(t, w, rtol=0, atol=0)


def test_detach_keeps_order():
    x = int_tensor((5, 3))
    with simulated_mesh((2, 2)) as mesh:
        a = distribute_tensor(x, mesh, *ORDERED).detach()
        assert layout_of(a._spec) == Layout.from_placements(ORDERED[0], 2, ORDERED[1])
        for t in a.full_tensor()._local_tensors.values():
            torch.testing.assert_close(t, x, rtol=0, atol=0)


def _dcp_worker(rank, world, path):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh

    mesh = init_device_mesh("cpu", (2, 2))
    x = int_tensor((5, 6), 0)
    w = int_tensor((5, 6), 1)
    a = distribute_tensor(x.clone().requires_grad_(True), mesh, *ORDERED)
    (redistribute(a, (Shard(1), Replicate())) * distribute_tensor(w, mesh, (Shard(1), Replicate()))).sum().backward()
    dcp.save({"x": a.detach(), "g": a.grad, "y": redistribute(a.detach(), (Shard(1), Shard(1)), (1, 0))}, checkpoint_id=path)
    # load into default-order DTensors with other placements
    from torch.distributed.tensor import distribute_tensor as upstream_distribute

    dst = {k: upstream_distribute(torch.zeros(5, 6), mesh, (Shard(1), Shard(0))) for k in ("x", "g", "y")}
    dcp.load(dst, checkpoint_id=path)
    for k, exp in (("x", x), ("g", w), ("y", x)):
        torch.testing.assert_close(dst[k].full_tensor(), exp, rtol=0, atol=0, msg=lambda m, k=k: f"{k}: {m}")
    return True


@pytest.mark.slow
def test_dcp_save_ordered_load_default_order(tmp_path):
    assert run_gloo(_dcp_worker, 4, str(tmp_path / "ckpt")) == [True] * 4


def test_patches_follow_install_and_uninstall_exactly():
    import torch.distributed.checkpoint.planner_helpers as ph
    from dtensor_rules._upstream import DTensorSpec

    import dtensor_rules
    from dtensor_rules.redistribute import order_patches as op

    def current():
        return (DTensorSpec.__dict__["shallow_copy_with_tensor_meta"], ph._create_write_items_for_dtensor,
                ph._create_chunk_from_dtensor)

    dtensor_rules.install()
    ours = current()
    assert ours == (op._shallow_copy_with_tensor_meta, op._write_items, op._chunk)
    originals = (op._orig["shallow"], op._orig["write"], op._orig["chunk"])
    try:
        dtensor_rules.uninstall()
        assert current() == originals  # the very same function objects
        with dtensor_rules.installed():
            assert current() == ours
        assert current() == originals
    finally:
        dtensor_rules.install()
    assert current() == ours
