"""Integer / bool operands whose chosen strategy needs Replicate -> Partial(sum).

Upstream partitions a replicated value as ``v / n`` (a float); our ``exact_int_partition`` patch
keeps the value on mesh coordinate 0 and zeros elsewhere. Every call runs through real DTensor
dispatch with the index / src sharded on the token dim (the MoE count pattern) and must equal
plain torch on the full tensors, for int32 / int64 (near-wraparound values) and bool where
torch takes bool.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

import dtensor_rules
from dtensor_rules.testing import simulated_mesh
from dtensor_rules.testing.dispatch import full_value, to_dtensor

MESHES = [(2,), (4,), (2, 2), (2, 2, 2)]
INT_DTYPES = [torch.int32, torch.int64, torch.int16, torch.uint8]


def _values(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    info = torch.iinfo(dtype)
    near = torch.tensor([info.max, info.max - 3, info.min, 0, 1, 7], dtype=torch.int64)
    return near[torch.randint(0, len(near), shape, generator=g)].to(dtype)


def _calls(dtype: torch.dtype) -> list[tuple[str, object]]:
    tokens, experts = 11, 5  # uneven over every mesh size
    idx = torch.randint(0, experts, (tokens,), generator=torch.Generator().manual_seed(1))
    src = _values(dtype, (tokens,), 2)
    base = _values(dtype, (experts,), 3)
    return [
        ("scatter_add", lambda s, i, v: s.scatter_add(0, i, v), base, idx, src),
        ("scatter", lambda s, i, v: s.scatter(0, i, v), base, idx, src),
        ("scatter_reduce_sum", lambda s, i, v: s.scatter_reduce(0, i, v, "sum"), base, idx, src),
        ("scatter_reduce_sum_excl", lambda s, i, v: s.scatter_reduce(0, i, v, "sum", include_self=False), base, idx, src),
        ("index_put_acc", lambda s, i, v: s.index_put((i,), v, accumulate=True), base, idx, src),
        ("index_put", lambda s, i, v: s.index_put((i,), v), base, idx, src),
    ]


@pytest.mark.parametrize("mesh_shape", MESHES, ids=str)
@pytest.mark.parametrize("dtype", INT_DTYPES + [torch.bool], ids=str)
def test_int_and_bool_scatter_family_matches_single_device(dtype, mesh_shape) -> None:
    for name, fn, base, idx, src in _calls(dtype):
        try:
            expected = fn(base, idx, src)
        except RuntimeError:
            continue  # torch itself refuses this dtype for the op: nothing to match
        if name == "scatter" or name == "index_put":
            # overwrite with duplicate indices is nondeterministic on one device; keep it defined
            idx_u = torch.arange(len(idx)) % base.numel()
            uniq = torch.unique(idx_u, return_inverse=False)
            idx, src = uniq, src[: len(uniq)]
            expected = fn(base, idx, src)
        with simulated_mesh(mesh_shape) as mesh:
            rest = [Replicate()] * (mesh.ndim - 1)
            got = fn(
                to_dtensor(base, mesh, [Replicate()] + rest),
                to_dtensor(idx, mesh, [Shard(0)] + rest),
                to_dtensor(src, mesh, [Shard(0)] + rest),
            )
            got = full_value(got)
        assert got.dtype == expected.dtype, name
        assert torch.equal(got, expected), f"{name} {dtype} on {mesh_shape}: {got} != {expected}"


def test_moe_token_count_pattern() -> None:
    """torch.zeros(E, dtype=long).scatter_add(0, idx, ones) with idx sharded on the token dim."""
    idx = torch.tensor([0, 2, 2, 1, 3, 0, 3, 3, 1])
    with simulated_mesh((2, 2)) as mesh:
        counts = torch.zeros(4, dtype=torch.long)
        d = to_dtensor(counts, mesh, [Replicate(), Replicate()]).scatter_add(
            0, to_dtensor(idx, mesh, [Shard(0), Replicate()]), to_dtensor(torch.ones(9, dtype=torch.long), mesh, [Shard(0), Replicate()])
        )
        assert isinstance(d.placements[0], Partial)  # no gather of the tokens: each rank counts its own
        got = full_value(d)
    assert torch.equal(got, torch.bincount(idx, minlength=4))


def test_replicate_to_partial_of_int_is_exact_and_float_is_upstreams() -> None:
    from dtensor_rules._upstream import partial_partition

    with simulated_mesh((4,)) as mesh:
        v = torch.tensor([2**31 - 1, -5, 3], dtype=torch.int32)
        parts = partial_partition(Partial("sum"), to_dtensor(v, mesh, [Replicate()]).to_local(), mesh, 0)._local_tensors
        assert all(p.dtype == torch.int32 for p in parts.values())
        assert torch.equal(parts[0], v) and all(not p.any() for r, p in parts.items() if r)
        f = partial_partition(Partial("sum"), to_dtensor(torch.tensor([4.0, 8.0]), mesh, [Replicate()]).to_local(), mesh, 0)
        assert torch.equal(f._local_tensors[3], torch.tensor([1.0, 2.0]))  # floats: upstream's v / n, unchanged


def test_patch_is_undone_by_uninstall() -> None:
    from torch.distributed.tensor.placement_types import Partial as P

    patched = P.__dict__["_partition_value"]
    dtensor_rules.uninstall()
    try:
        assert P.__dict__["_partition_value"] is not patched
    finally:
        dtensor_rules.install()
    assert P.__dict__["_partition_value"] is patched


def _gloo_token_count(rank: int, world: int) -> list[int]:
    import dtensor_rules  # noqa: F401  (spawned process: install the rules)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    idx = torch.tensor([0, 2, 2, 1, 3, 0, 3, 3, 1])
    counts = distribute_tensor(torch.zeros(4, dtype=torch.long), mesh, [Replicate()])
    out = counts.scatter_add(0, distribute_tensor(idx, mesh, [Shard(0)]), distribute_tensor(torch.ones(9, dtype=torch.long), mesh, [Shard(0)]))
    assert isinstance(out.placements[0], Partial)
    return out.full_tensor().tolist()


@pytest.mark.slow
def test_moe_token_count_on_real_gloo_ranks() -> None:
    from dtensor_rules.testing import run_gloo

    for counts in run_gloo(_gloo_token_count, 2):
        assert counts == torch.bincount(torch.tensor([0, 2, 2, 1, 3, 0, 3, 3, 1]), minlength=4).tolist()
