"""``expert_parallel``'s ep and tp dims at any mesh position (by name or index) and its ``placements``.

Oracle: the block on one device (fp32), output and every parameter gradient.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

from dtensor_rules._upstream import per_rank_copies
from dtensor_rules.models import MoE, MoEConfig
from dtensor_rules.ep.expert_parallel import expert_parallel, token_placements
from dtensor_rules.testing import simulated_mesh

CONFIG = MoEConfig(dim=8, hidden=16, n_experts=4, top_k=2)
R = Replicate()


def _check(model: MoE, mesh, x_placements: tuple, ep_model: MoE) -> dict[str, tuple]:
    x = torch.randn(10, CONFIG.dim, generator=torch.Generator().manual_seed(1))
    cot = torch.randn(10, CONFIG.dim, generator=torch.Generator().manual_seed(2))
    want = model(x)
    want_grads = torch.autograd.grad((want * cot).sum(), list(model.parameters()))
    out = ep_model(distribute_tensor(per_rank_copies(x), mesh, x_placements))
    loss = (out * distribute_tensor(per_rank_copies(cot), mesh, (R,) * mesh.ndim)).sum()
    grads = torch.autograd.grad(loss, list(ep_model.parameters()))
    torch.testing.assert_close(out.full_tensor(), want, rtol=1e-5, atol=1e-5)
    names = [n for n, _ in model.named_parameters()]
    for name, g, w in zip(names, grads, want_grads):
        torch.testing.assert_close(g.full_tensor(), w, rtol=1e-5, atol=1e-5, msg=name)
    return {n: tuple(g.placements) for n, g in zip(names, grads)}


@pytest.mark.parametrize("ep_dim, tp_dim, names", [
    ("ep", "tp", ("tp", "ep")),  # names, ep second
    (1, 0, None),  # indices on an unnamed mesh
    (-1, -2, None),  # indices from the back
], ids=["names, ep second", "indices", "negative indices"])
def test_ep_and_tp_dims_by_name_or_index_at_any_position(ep_dim, tp_dim, names) -> None:
    model = MoE(CONFIG)
    with simulated_mesh((2, 2), names=names) as mesh:
        ep_model = expert_parallel(copy.deepcopy(model), mesh, ep_dim=ep_dim, tp_dim=tp_dim)
        grads = _check(model, mesh, token_placements(mesh, ep_dim, tp_dim), ep_model)
    assert grads["w1"] == (Shard(2), Shard(0)) and grads["w2"] == (Shard(1), Shard(0))  # ep is mesh dim 1


def test_placements_store_the_experts_as_given_and_replicate_tokens_on_other_dims() -> None:
    """A (2, 2, 2) mesh: ep on dim 2, tp on dim 0, dim 1 neither (tokens replicated there); w1 stored
    split along D on dim 1 (gathered in the region: expert FSDP), the shared expert as given."""
    model = MoE(CONFIG)
    given = {"w1": (Shard(2), Shard(1), Shard(0)), "shared_w1": (R, Shard(1), R), "gate": (R, R, R)}
    with simulated_mesh((2, 2, 2)) as mesh:
        ep_model = expert_parallel(copy.deepcopy(model), mesh, ep_dim=2, tp_dim=0, placements=given)
        grads = _check(model, mesh, (Shard(0),) * 3, ep_model)
    assert grads["w1"] == given["w1"]  # the region hands the gradient back in the stored layout
    assert ep_model.shared_w1.placements == given["shared_w1"]  # plain DTensor code: stored as given
    assert grads["w3"] == (Shard(2), R, Shard(0))  # not given: its role layout, Replicate on the other dim


def test_bad_dims_and_placements_name_the_fix() -> None:
    model = MoE(CONFIG)
    with simulated_mesh((2, 2)) as mesh:
        with pytest.raises(ValueError, match="fully_shard"):  # a third dim needs placements
            expert_parallel(copy.deepcopy(model), mesh, ep_dim=0, tp_dim=None)
        with pytest.raises(ValueError, match="tp_dim=5"):
            expert_parallel(copy.deepcopy(model), mesh, ep_dim=0, tp_dim=5)
        with pytest.raises(ValueError, match="ep_dim=1, tp_dim=1"):
            expert_parallel(copy.deepcopy(model), mesh, ep_dim=1, tp_dim=1)
        with pytest.raises(ValueError, match="'w9', which is not one of the block's"):
            expert_parallel(copy.deepcopy(model), mesh, ep_dim=0, tp_dim=1, placements={"w9": (R, R)})
        with pytest.raises(ValueError, match="one Placement per mesh dim"):
            expert_parallel(copy.deepcopy(model), mesh, ep_dim=0, tp_dim=1, placements={"w1": (Shard(0),)})
