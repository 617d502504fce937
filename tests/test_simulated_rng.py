"""Inside ``simulated_mesh()`` an explicit generator behaves as on real ranks; outside it torch's own loop runs.

The oracle is plain torch outside any mesh: a real rank holding its own
``torch.Generator().manual_seed(s)`` draws exactly what one process draws from a fresh generator
with that seed, so every simulated rank must see those values, draw after draw.
"""

from __future__ import annotations

import torch

from dtensor_rules.testing import fake_world, local_shards, simulated_mesh


def _draws(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(5, generator=g), torch.randint(0, 100, (4,), generator=g), torch.rand(3, generator=g)


def _ranks_equal(t: torch.Tensor, want: torch.Tensor) -> None:
    shards = local_shards(t)
    assert len(shards) == 4
    for rank, shard in enumerate(shards):
        torch.testing.assert_close(shard, want, rtol=0, atol=0, msg=lambda m: f"rank {rank}: {m}")


def test_every_simulated_rank_draws_what_one_process_draws_from_the_same_seed() -> None:
    want = _draws(7)
    with simulated_mesh((2, 2)):
        g = torch.Generator().manual_seed(7)
        got = (torch.randn(5, generator=g), torch.randint(0, 100, (4,), generator=g), torch.rand(3, generator=g))
    for t, w in zip(got, want):
        _ranks_equal(t, w)


def test_in_place_draws_into_a_simulated_tensor_and_a_reseed_restart_every_rank() -> None:
    g1 = torch.Generator().manual_seed(3)
    first = torch.empty(6).normal_(generator=g1)
    with simulated_mesh((4,)):
        g = torch.Generator().manual_seed(3)
        x = torch.zeros(6)  # a simulated tensor: one per rank
        x.normal_(generator=g)
        _ranks_equal(x, first)
        g.manual_seed(3)  # reseeded between two draws: every rank starts over
        _ranks_equal(torch.empty(6).normal_(generator=g), first)


def test_outside_the_mesh_the_generator_continues_rank_zeros_stream() -> None:
    want = torch.randn(8, generator=torch.Generator().manual_seed(5))
    g = torch.Generator().manual_seed(5)
    with simulated_mesh((2,)):
        shards = local_shards(torch.randn(4, generator=g))
    assert len(shards) == 2 and all(torch.equal(s, want[:4]) for s in shards)
    torch.testing.assert_close(torch.randn(4, generator=g), want[4:], rtol=0, atol=0)


def test_the_fix_is_scoped_to_simulated_mesh_and_torchs_loop_runs_elsewhere() -> None:
    import torch.distributed._local_tensor as lt
    from torch.distributed._local_tensor import LocalTensorMode

    import dtensor_rules  # noqa: F401  (the import installs rules and patches, never this fix)

    run, map_ = lt._for_each_rank_run_func, lt._map_to_rank_local_val
    assert run.__module__ == lt.__name__ and map_.__module__ == lt.__name__  # torch's own functions
    with simulated_mesh((2,)):
        assert lt._for_each_rank_run_func is not run and lt._map_to_rank_local_val is not map_
        with simulated_mesh((2,)):  # a nested block leaves the outer one's wrap in place
            pass
        assert lt._for_each_rank_run_func is not run
    assert lt._for_each_rank_run_func is run and lt._map_to_rank_local_val is map_
    # a bare LocalTensorMode is torch's simulator, unchanged: rank 1 continues rank 0's stream
    with fake_world(2), LocalTensorMode(frozenset(range(2))):
        shards = local_shards(torch.randn(4, generator=torch.Generator().manual_seed(1)))
    assert not torch.equal(shards[0], shards[1])


def test_data_drawn_inside_the_mesh_trains_like_one_device() -> None:
    """A loop that draws each batch inside the simulated mesh from a seeded generator."""
    from torch.distributed.tensor import Shard, distribute_tensor

    from dtensor_rules.ep import expert_parallel
    from dtensor_rules.models import MoE, MoEConfig

    def model() -> MoE:
        m = MoE(MoEConfig(dim=8, hidden=16, n_experts=4, top_k=2))
        m.init_weights(1)
        return m

    def step_loss(m: torch.nn.Module, s: int, shard: object = None) -> torch.Tensor:
        g = torch.Generator().manual_seed(s)
        x, target = torch.randn(12, 8, generator=g), torch.randn(12, 8, generator=g)
        out = m(x) if shard is None else m(distribute_tensor(x, shard, (Shard(0),))).full_tensor()
        return ((out - target) ** 2).mean()

    ref = model()
    opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    want = []
    for s in range(3):
        loss = step_loss(ref, s)
        want.append(loss.item())
        opt.zero_grad()
        loss.backward()
        opt.step()
    with simulated_mesh((2,), ("ep",)) as mesh:
        m = expert_parallel(model(), mesh, tp_dim=None)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for s in range(3):
            loss = step_loss(m, s, mesh)
            for rank, v in enumerate(local_shards(loss)):
                torch.testing.assert_close(v.item(), want[s], rtol=1e-5, atol=1e-6, msg=lambda m: f"step {s} rank {rank}: {m}")
            opt.zero_grad()
            loss.backward()
            opt.step()
