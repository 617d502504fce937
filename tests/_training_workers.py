"""A few optimizer steps of the MoE block, on one device and distributed (shared by the
simulated-mesh and gloo tests of ``test_moe_training.py``; module level so ``run_gloo`` can
spawn :func:`gloo_train_worker`).

The loss is ``mean((model(x) - target) ** 2)`` over the full batch; the distributed run takes
it on ``out.full_tensor()``, so its gradients are exactly the single-device ones. Results are
plain Python lists (they cross process boundaries): per rank, the loss before each step and
after the last, and every parameter gathered to its full value after the last step.
"""

from __future__ import annotations

import copy
import logging
import warnings
from collections.abc import Callable
from typing import NamedTuple

import torch
from torch.distributed.device_mesh import DeviceMesh

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules.models import MoE, MoEConfig

STEPS = 3
WEIGHT_DECAY = 0.1
# name -> optimizer class, options and the parameters in its weight-decay group. Each run
# has a group with weight decay and one without, and each parameter (the replicated router
# ``gate`` included) meets each optimizer once: with decay under one, without under the other.
# Momentum, so that an update applied twice also shows in the later steps.
class OptimizerSpec(NamedTuple):
    cls: Callable[..., torch.optim.Optimizer]
    options: dict[str, float]
    decayed: frozenset[str]  # the parameters in the weight-decay group


OPTIMIZERS = {
    "sgd": OptimizerSpec(torch.optim.SGD, {"lr": 0.05, "momentum": 0.9}, frozenset({"gate", "w1", "shared_w2"})),
    "adamw": OptimizerSpec(torch.optim.AdamW, {"lr": 1e-2}, frozenset({"w3", "w2", "shared_w1", "shared_w3"})),
}
# tokens per model: the gather path (shard_moe) cannot flatten uneven token shards; EP can
TOKENS = {"shard_moe": 20, "expert_parallel": 21}


class Curve(NamedTuple):
    """One training run as seen by each rank (a single device: one "rank")."""

    losses: list[list[float]]  # [rank][step]: STEPS + 1 losses (the last after the final step)
    params: dict[str, list[list]]  # name -> [rank] full value after the last step, as nested lists


def make_optimizer(opt: str, model: MoE) -> torch.optim.Optimizer:
    """``OPTIMIZERS[opt]`` over ``model``: its weight-decay group and its group without."""
    cls, options, decayed = OPTIMIZERS[opt]
    named = list(model.named_parameters())
    assert decayed < {n for n, _ in named}, "every decayed name must be a parameter"
    return cls([{"params": [p for n, p in named if n in decayed], "weight_decay": WEIGHT_DECAY},
                {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}], **options)


def make_model() -> MoE:
    model = MoE(MoEConfig(dim=16, hidden=32, n_experts=4, top_k=2))
    model.init_weights(3)
    return model


def batch(tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(11)
    return torch.randn(tokens, 16, generator=g), torch.randn(tokens, 16, generator=g)


def train_single(opt: str, tokens: int) -> Curve:
    """The oracle: plain torch on one device."""
    model = make_model()
    x, target = batch(tokens)
    optimizer = make_optimizer(opt, model)
    losses = []
    for step in range(STEPS + 1):
        loss = ((model(x) - target) ** 2).mean()
        losses.append(loss.item())
        if step < STEPS:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return Curve([losses], {n: [p.detach().tolist()] for n, p in model.named_parameters()})


def distribute(model: MoE, kind: str, mesh: DeviceMesh) -> MoE:
    """A copy of ``model`` laid out by ``shard_moe`` (the gather path) or ``expert_parallel`` on ``mesh``."""
    from dtensor_rules.ep import expert_parallel
    from dtensor_rules.models import shard_moe

    model = copy.deepcopy(model)
    if kind == "shard_moe":
        return shard_moe(model, mesh)
    return expert_parallel(model, mesh, tp_dim="tp" if mesh.ndim == 2 else None)


class Setup(NamedTuple):
    """What a run starts from, made outside any simulated mesh (as a user's model and data are)."""

    model: MoE
    x: torch.Tensor
    target: torch.Tensor


def setup(kind: str) -> Setup:
    return Setup(make_model(), *batch(TOKENS[kind]))


class Trained(NamedTuple):
    curve: Curve
    model: MoE  # distributed, after the last step
    optimizer: torch.optim.Optimizer


def train_distributed(start: Setup, kind: str, mesh: DeviceMesh, opt: str) -> Trained:
    """The same steps with a copy of ``start.model`` distributed on ``mesh`` (simulated or real ranks)."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    from dtensor_rules.testing import local_shards

    x, target = start.x, start.target
    model = distribute(start.model, kind, mesh)
    xd = distribute_tensor(x, mesh, (Shard(0),) + (Replicate(),) * (mesh.ndim - 1))
    optimizer = make_optimizer(opt, model)
    losses = []
    for step in range(STEPS + 1):
        loss = ((model(xd).full_tensor() - target) ** 2).mean()
        losses.append([v.item() for v in local_shards(loss)])
        if step < STEPS:
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    params = {n: [t.tolist() for t in local_shards(p.detach().full_tensor())] for n, p in model.named_parameters()}
    return Trained(Curve([list(r) for r in zip(*losses)], params), model, optimizer)


def quiet() -> None:
    """No warnings or 'suboptimal redistribute' notes (full_tensor of 2-D Partials)."""
    warnings.simplefilter("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def gloo_train_worker(rank: int, world: int, runs: list[tuple[str, tuple[int, ...], str]]) -> list[Curve]:
    """Every (model kind, mesh shape, optimizer) of ``runs`` on this real gloo rank, in one world."""
    from torch.distributed.device_mesh import init_device_mesh

    quiet()
    meshes: dict[tuple[int, ...], DeviceMesh] = {}
    curves = []
    for kind, shape, opt in runs:
        if shape not in meshes:
            meshes[shape] = init_device_mesh("cpu", shape, mesh_dim_names=("ep", "tp")[: len(shape)])
        curves.append(train_distributed(setup(kind), kind, meshes[shape], opt).curve)
    return curves
