"""Bool masks of ``x[mask]`` on DTensors: validated like torch, and ordinary long
indices never go through a per-call Python handler."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.placement_types import Replicate, Shard

import dtensor_rules
from dtensor_rules._upstream import custom_op_handlers
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor

aten = torch.ops.aten


def _torch_error(x: torch.Tensor, indices: list) -> str:
    with pytest.raises(IndexError) as err:
        aten.index.Tensor(x, indices)
    return str(err.value)


@pytest.mark.parametrize(
    "mask_shape, lead",
    [((3,), 0), ((5,), 0), ((4, 4), 0), ((4,), 1), ((4, 5, 2), 0), ((2, 5), 0), ((0,), 0)],
    ids=str,
)
@pytest.mark.parametrize("mesh_shape", [(2,), (2, 2)], ids=str)
def test_mask_shape_mismatch_raises_torchs_index_error(mask_shape, lead, mesh_shape) -> None:
    x = torch.randn(4, 5)
    mask = torch.ones(mask_shape, dtype=torch.bool)
    indices = [None] * lead + [mask]
    expected = _torch_error(x, indices)
    with simulated_mesh(mesh_shape) as mesh:
        rest = [Replicate()] * (mesh.ndim - 1)
        dx = to_dtensor(x, mesh, [Shard(1)] + rest)
        dind = [None] * lead + [to_dtensor(mask, mesh, [Replicate()] + rest)]
        with pytest.raises(IndexError) as err:
            aten.index.Tensor(dx, dind)
    assert str(err.value) == expected


@pytest.mark.parametrize("placement", [Replicate(), Shard(0)], ids=str)
def test_matching_masks_still_work(placement) -> None:
    x = torch.randn(4, 5)
    for indices in ([torch.tensor([True, False, True, True])], [None, torch.tensor([0, 1, 1, 0, 1], dtype=torch.uint8).bool()],
                    [torch.rand(4, 5) > 0.5]):
        with simulated_mesh((2,)) as mesh:
            dind = [None if i is None else to_dtensor(i, mesh, [Replicate()]) for i in indices]
            got = full_value(aten.index.Tensor(to_dtensor(x, mesh, [placement]), dind))
        torch.testing.assert_close(got, aten.index.Tensor(x, indices))


def test_index_tensor_has_no_custom_handler() -> None:
    """A handler would put every index call on the Python path; masks go via the cache-miss hook."""
    assert aten.index.Tensor not in custom_op_handlers()
    assert aten.bincount.default in custom_op_handlers()  # data-dependent output: still a handler


def test_mask_patch_is_undone_by_uninstall() -> None:
    from dtensor_rules._upstream import dispatcher
    from dtensor_rules._upstream.registries import SLOW_PATH_ATTR  # the hook is an instance attribute

    assert SLOW_PATH_ATTR in vars(dispatcher())
    dtensor_rules.uninstall()
    try:
        assert SLOW_PATH_ATTR not in vars(dispatcher())
    finally:
        dtensor_rules.install()


def test_bincount_handler_caches_its_choice(monkeypatch) -> None:
    """The second identical call does not expand the rule again."""
    from dtensor_rules.dispatch import custom_handler as _rule_dispatch

    calls = []
    real = _rule_dispatch.expand_to_mesh
    monkeypatch.setattr(_rule_dispatch, "expand_to_mesh", lambda *a, **k: calls.append(1) or real(*a, **k))
    _rule_dispatch._CHOICES.clear()
    x = torch.tensor([0, 3, 3, 1])
    w = torch.tensor([0.5, 1.0, 2.0, 4.0])
    with simulated_mesh((2,)) as mesh:
        dx, dw = to_dtensor(x, mesh, [Replicate()]), to_dtensor(w, mesh, [Shard(0)])
        outs = [full_value(torch.bincount(dx, dw)) for _ in range(3)]
        assert len(calls) == 1
        torch.bincount(dx, to_dtensor(w, mesh, [Replicate()]))  # another layout: a new choice
        assert len(calls) == 2
    for o in outs:
        torch.testing.assert_close(o, torch.bincount(x, w))


def _count_cache_misses(rank: int, world: int) -> tuple[int, int]:
    import dtensor_rules  # noqa: F401  (spawned process: install the rules)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from dtensor_rules._upstream import dispatcher
    from dtensor_rules._upstream.registries import SLOW_PATH_ATTR

    mesh = init_device_mesh("cpu", (world,))
    x = distribute_tensor(torch.randn(16, 4), mesh, [Shard(1)])
    i = distribute_tensor(torch.randint(0, 16, (6,)), mesh, [Replicate()])
    m = distribute_tensor(torch.rand(16) > 0.5, mesh, [Replicate()])
    d = dispatcher()
    hook = getattr(d, SLOW_PATH_ATTR)
    calls = []
    setattr(d, SLOW_PATH_ATTR, lambda *a, **k: calls.append(a[0]) or hook(*a, **k))
    x[i]  # first call fills the cache
    calls.clear()
    for _ in range(50):
        x[i]
    long_misses = len(calls)
    for _ in range(3):
        x[m]
    return long_misses, len(calls) - long_misses


@pytest.mark.slow
def test_long_index_calls_stay_on_the_fast_path_on_gloo() -> None:
    """Structurally, not by timing: after the first call, x[i] with
    long indices never calls back into Python propagation; each x[mask] does (by design)."""
    from dtensor_rules.testing import run_gloo

    for long_misses, mask_misses in run_gloo(_count_cache_misses, 2):
        assert long_misses == 0
        assert mask_misses >= 3
