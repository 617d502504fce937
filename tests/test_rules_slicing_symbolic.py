"""cat / slice_scatter under torch.compile with backed dynamic and unbacked sizes.

The rules must not guard on a data-dependent size (a cat rule evaluating
``shape[cat_dim] != 0``, slice_scatter ``slice(...).indices(size)``): an unknown emptiness or
"full slice" drops the rows that need it. DTensor inputs on a fake process group; layouts that
need no communication, so rank 0's local result is real and compared with plain torch.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules.op_rules.slicing import slice_facts
from dtensor_rules.testing import fake_world

pytestmark = pytest.mark.slow  # see pyproject.toml

aten = torch.ops.aten


@pytest.fixture()
def mesh():  # noqa: ANN201
    with fake_world(2):
        torch._dynamo.reset()
        yield init_device_mesh("cpu", (2,))
        torch._dynamo.reset()


def _compiled(fn):  # noqa: ANN001, ANN202
    return torch.compile(fn, backend="aot_eager", dynamic=True, fullgraph=True)


def _inputs(mesh, tensors, placement, unbacked: bool) -> list[DTensor]:  # noqa: ANN001
    """Rank 0's piece of each tensor as a DTensor; every dim of size >= 2 unbacked if asked."""
    out = []
    for t in tensors:
        local = t.tensor_split(2, placement.dim)[0] if isinstance(placement, Shard) else t
        d = DTensor.from_local(local, mesh, [placement], run_check=False, shape=t.shape, stride=t.stride())
        if unbacked:
            for i in range(d.ndim):
                if t.shape[i] >= 2:
                    torch._dynamo.decorators.mark_unbacked(d, i)
        out.append(d)
    return out


def _rank0(t: torch.Tensor, placement) -> torch.Tensor:  # noqa: ANN001
    return t.tensor_split(2, placement.dim)[0] if isinstance(placement, Shard) else t


@pytest.mark.parametrize("unbacked", [False, True], ids=["backed", "unbacked"])
@pytest.mark.parametrize("placement", [Replicate(), Shard(0)], ids=str)
def test_cat_compiled(mesh, unbacked: bool, placement) -> None:  # noqa: ANN001
    a, b, c = torch.randn(6, 4), torch.randn(6, 3), torch.randn(6, 2)
    xs = _inputs(mesh, (a, b, c), placement, unbacked)
    out = _compiled(lambda x, y, z: torch.cat([x, y, z], 1))(*xs)
    assert tuple(out.placements) == (placement,)
    torch.testing.assert_close(out.to_local(), _rank0(torch.cat([a, b, c], 1), placement))


@pytest.mark.parametrize("unbacked", [False, True], ids=["backed", "unbacked"])
@pytest.mark.parametrize("placement", [Replicate(), Shard(0)], ids=str)
def test_cat_on_the_cat_dim_compiled(mesh, unbacked: bool, placement) -> None:  # noqa: ANN001
    """Cat dim 0 with inputs whose emptiness is unknown: S(0) must not be offered unless known."""
    a, b = torch.randn(4, 3), torch.randn(2, 3)
    xs = _inputs(mesh, (a, b), Replicate(), unbacked)
    out = _compiled(lambda x, y: torch.cat([x, y], 0))(*xs)
    torch.testing.assert_close(out.full_tensor() if out.placements[0] != Replicate() else out.to_local(),
                               torch.cat([a, b], 0))


@pytest.mark.parametrize("unbacked", [False, True], ids=["backed", "unbacked"])
@pytest.mark.parametrize("placement", [Replicate(), Shard(0)], ids=str)
@pytest.mark.parametrize("bounds", [(1, 4, 1), (0, None, 1), (0, 6, 2), (-3, None, 1)], ids=str)
def test_slice_scatter_compiled(mesh, unbacked: bool, placement, bounds) -> None:  # noqa: ANN001
    start, end, step = bounds
    x = torch.randn(6, 6)
    src = torch.randn(6, len(range(*slice(start, end, step).indices(6))))
    dx, dsrc = _inputs(mesh, (x, src), placement, unbacked)
    out = _compiled(lambda a, b: aten.slice_scatter.default(a, b, 1, start, end, step))(dx, dsrc)
    assert tuple(out.placements) == (placement,)
    torch.testing.assert_close(out.to_local(), _rank0(aten.slice_scatter.default(x, src, 1, start, end, step), placement))


def test_slice_scatter_bounds_from_item_compiled(mesh) -> None:  # noqa: ANN001
    """start/end computed from data inside the compiled function (unbacked SymInts)."""
    x, src = torch.randn(6, 6), torch.randn(6, 2)
    dx, dsrc = _inputs(mesh, (x, src), Replicate(), unbacked=False)
    k = torch.tensor(3)
    with torch._dynamo.config.patch(capture_scalar_outputs=True):
        def fn(a, b, k):  # noqa: ANN001, ANN202
            s = k.item()
            torch._check(s >= 0)
            torch._check(s + 2 <= a.shape[1])
            return aten.slice_scatter.default(a, b, 1, s, s + 2)

        out = _compiled(fn)(dx, dsrc, k)
    torch.testing.assert_close(out.to_local(), aten.slice_scatter.default(x, src, 1, 3, 5))


def test_slice_facts_symbolic_fall_back_safely() -> None:
    """Unknown answers are False (fewer rows), exact ones where statically known."""
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    env = ShapeEnv()
    u = env.create_unbacked_symint()
    assert slice_facts(u, 0, None, 1).full  # x[:, 0:] covers the dim whatever its size
    assert not slice_facts(u, 1, None, 1).full and not slice_facts(u, 1, None, 1).empty
    assert slice_facts(u, None, 0, 1).empty
    assert not slice_facts(u, 0, 3, 1).full and not slice_facts(u, 0, 3, 1).empty
    assert slice_facts(6, -2, 3, 1).empty and not slice_facts(6, -2, 3, 1).shard_empty
