"""Train the MoE block with expert parallelism, and check it against one device.

Each run trains the package's MoE block for ``--steps`` steps with AdamW (weight decay on the
expert and router weights, none on the shared expert), grad-norm clipping across the whole
mesh (``torch.nn.utils.clip_grad_norm_`` on DTensor gradients) and a fresh batch per step; it
saves a DCP checkpoint after step ``--save-at``, keeps training, then builds a NEW model and
optimizer, loads the checkpoint and trains the same steps again. It prints the loss of every
step next to one device's, the largest parameter difference from one device at the end, and
whether the resumed run ended bit for bit where the uninterrupted one did.

    python examples/train_moe.py                          # 4 gloo ranks: ep=2 x tp=2
    python examples/train_moe.py --mesh dp=2,ep=2,tp=2    # 8 gloo ranks: FSDP2 over dp
    python examples/train_moe.py --simulated              # all ranks in this process (ep x tp, no checkpoint)
    python examples/train_moe.py --balance-loss sequence  # plus the auxiliary load-balancing loss (alpha 0.01)

With ``--balance-loss sequence|batch`` (weight ``--balance-alpha``) the block is built with
``MoEConfig(balance_loss=..., balance_alpha=...)`` and every step adds its ``aux_loss`` (the
router's load-balancing loss, ``dtensor_rules.models.routing.balance_loss``) to the task loss;
``sequence`` feeds the batch as (sequences, SEQ_LEN, dim), one sequence per row. With a dp dim
each dp rank's loss is that of its own slice of the batch (for ``batch``: its own batch, as a
data-parallel trainer computes it); the one-device oracle computes the same per-slice losses
and averages them, which is what FSDP2's gradient averaging over dp trains.

Layouts (``dtensor_rules.models.expert_parallel``): experts ``Shard(0)`` on ep (each rank owns
E/ep experts, tokens travel by all-to-all), hidden dims ``Shard`` on tp, and with a dp dim
FSDP2 (``fully_shard``) shards every parameter over dp and averages gradients over it. Each dp
rank trains on its own slice of the batch; the loss printed is the mean over dp.

A simulated mesh (``--simulated``: ``LocalTensorMode``, every rank in one process) trains
ep x tp the same way, with two limits of ``LocalTensorMode`` (torch 2.13 and 2.14): no
checkpoint, because DCP coordinates through a gather to rank 0, which it refuses ("does not
support MPMD operations like gather"), and DCP's ``no_dist`` path hashes the per-rank shard
offsets, which are symbolic there; no FSDP2, because ``fully_shard`` frees parameter storage
(``storage.resize_(0)``), which a simulated rank's tensor does not support.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules.models import MoE, MoEConfig, expert_parallel
from dtensor_rules.models.expert_parallel import token_placements

DIM, TOKENS, LR, WEIGHT_DECAY, MAX_NORM = 16, 24, 1e-2, 0.1, 0.5
SEQ_LEN = 6  # tokens per sequence for --balance-loss sequence (TOKENS / dp must divide by it)
NO_DECAY = ("shared_w1", "shared_w2", "shared_w3")  # a parameter group without weight decay


class Balance(NamedTuple):
    """The auxiliary load-balancing loss of a run (``MoEConfig.balance_loss``/``balance_alpha``)."""

    mode: str  # "sequence" or "batch"
    alpha: float


class Run(NamedTuple):
    """What one training run reports (plain values: they cross process boundaries)."""

    losses: list[float]  # one per step, before its update
    params: dict[str, list]  # every parameter's full value at the end
    resumed_losses: list[float]  # the steps after the checkpoint, trained again from it
    resumed_equal: bool | None  # the resumed run ended bit for bit where the first did (None: no checkpoint)
    placements: dict[str, str]  # every parameter's placements (and mesh dims) while training


def make_model(balance: Balance | None = None) -> MoE:
    extra = {} if balance is None else {"balance_loss": balance.mode, "balance_alpha": balance.alpha}
    model = MoE(MoEConfig(dim=DIM, hidden=32, n_experts=4, top_k=2, **extra))
    model.init_weights(3)
    return model


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    named = list(model.named_parameters())
    return torch.optim.AdamW([
        {"params": [p for n, p in named if n not in NO_DECAY], "weight_decay": WEIGHT_DECAY},
        {"params": [p for n, p in named if n in NO_DECAY], "weight_decay": 0.0},
    ], lr=LR)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s tokens and targets: the same on every rank (a seeded private generator)."""
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(TOKENS, DIM, generator=g), torch.randn(TOKENS, DIM, generator=g)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, loss_of: Callable[[int], torch.Tensor],
               step: int) -> float:
    loss = loss_of(step)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    optimizer.step()
    return float(plain(loss.detach()))


def block_input(x: torch.Tensor, balance: Balance | None) -> torch.Tensor:
    """(tokens, dim) as the block takes them: (sequences, SEQ_LEN, dim) for the sequence-wise loss."""
    return x.reshape(-1, SEQ_LEN, DIM) if balance is not None and balance.mode == "sequence" else x


def one_device(steps: int, balance: Balance | None = None, dp: int = 1) -> Run:
    """The oracle: plain torch on one device, the same steps. With a balance loss, the loss of
    each of the ``dp`` slices of the batch (what each dp rank computes), averaged."""
    model = make_model(balance)
    optimizer = make_optimizer(model)

    def loss_of(step: int) -> torch.Tensor:
        x, target = batch(step)
        if balance is None:
            return ((model(x) - target) ** 2).mean()
        losses = []
        for xs, ts in zip(x.chunk(dp), target.chunk(dp)):
            out = model(block_input(xs, balance)).reshape(ts.shape)
            losses.append(((out - ts) ** 2).mean() + model.aux_loss)
        return sum(losses) / dp

    losses = [train_step(model, optimizer, loss_of, s) for s in range(steps)]
    return Run(losses, {n: p.detach().tolist() for n, p in model.named_parameters()}, [], None, {})


class Distributed(NamedTuple):
    """The model laid out on the mesh, and how a step computes its loss there."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    loss_of: Callable[[int], torch.Tensor]


def distributed(world: Any, balance: Balance | None = None) -> Distributed:
    """``make_model(balance)`` laid out on ``world`` (mesh dims ep, tp and optionally dp), its optimizer and loss."""
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    names = world.mesh_dim_names
    sub = world["ep", "tp"] if "dp" in names else world
    model = expert_parallel(make_model(balance), sub)
    dp = world.size(names.index("dp")) if "dp" in names else 1
    if dp > 1:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model, mesh=world["dp"])
    optimizer = make_optimizer(model)

    def this_dp_rank(t: torch.Tensor) -> torch.Tensor:
        """This dp rank's slice of ``t`` (a DTensor move, so a simulated mesh slices per rank too)."""
        if dp == 1:
            return t
        return distribute_tensor(t, world, [Shard(0) if n == "dp" else Replicate() for n in names]).to_local()

    def loss_of(step: int) -> torch.Tensor:
        x, target = (this_dp_rank(t) for t in batch(step))
        x = block_input(x, balance)
        tokens = DTensor.from_local(x, sub, [Replicate(), Replicate()]).redistribute(sub, token_placements(sub))
        out = model(tokens).full_tensor().reshape(target.shape)
        loss = ((out - target) ** 2).mean()  # this dp rank's slice; FSDP2 averages the gradients over dp
        if balance is not None:  # a DTensor over (ep, tp): the loss of this dp rank's whole slice
            loss = loss + model.aux_loss.full_tensor()
        if dp > 1:  # the printed loss: the mean over dp (the backward uses this rank's own)
            mean = loss.detach().clone()
            torch.distributed.all_reduce(mean, group=world.get_group("dp"))
            loss = loss + (mean / dp - loss).detach()
        return loss

    return Distributed(model, optimizer, loss_of)


def plain(t: torch.Tensor) -> torch.Tensor:
    """A (DTensor's full) value as one plain tensor; on a simulated mesh every rank must agree."""
    from dtensor_rules.testing import local_shards

    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    shards = local_shards(t)  # one per simulated rank; [t] on a real rank
    for other in shards[1:]:
        if not torch.equal(other, shards[0]):
            raise AssertionError("simulated ranks disagree on a replicated value")
    return shards[0]


def full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: plain(p.detach()) for n, p in model.named_parameters()}


def train(world: Any, steps: int, save_at: int | None, checkpoint_dir: str | None,
          balance: Balance | None = None) -> Run:
    """Train on ``world``; with ``save_at``, checkpoint after that step and check the resume."""
    run = distributed(world, balance)
    losses = [train_step(run.model, run.optimizer, run.loss_of, s) for s in range(save_at or steps)]
    if save_at is None:
        return Run(losses, _as_lists(full_params(run.model)), [], None, _placements(run.model))
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(run.model, run.optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint_dir)
    losses += [train_step(run.model, run.optimizer, run.loss_of, s) for s in range(save_at, steps)]
    first = full_params(run.model)

    again = distributed(world, balance)  # a new model and optimizer, as after a restart
    model_state, optim_state = get_state_dict(again.model, again.optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=checkpoint_dir)
    set_state_dict(again.model, again.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    resumed = [train_step(again.model, again.optimizer, again.loss_of, s) for s in range(save_at, steps)]
    second = full_params(again.model)
    equal = all(torch.equal(first[n], second[n]) for n in first)
    return Run(losses, _as_lists(first), resumed, equal, _placements(run.model))


def _as_lists(params: dict[str, torch.Tensor]) -> dict[str, list]:
    return {n: v.tolist() for n, v in params.items()}


def _placements(model: torch.nn.Module) -> dict[str, str]:
    return {n: f"{tuple(p.placements)} on {p.device_mesh.mesh_dim_names}" for n, p in model.named_parameters()}


def parse_mesh(text: str) -> dict[str, int]:
    """``"dp=2,ep=2,tp=2"`` -> ``{"dp": 2, "ep": 2, "tp": 2}`` (ep and tp required, dp optional, in that order)."""
    dims = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if name not in ("dp", "ep", "tp") or not size.isdigit():
            raise ValueError(f"--mesh takes dp=N,ep=N,tp=N (dp optional), got {text!r}")
        dims[name] = int(size)
    if set(dims) not in ({"ep", "tp"}, {"dp", "ep", "tp"}):
        raise ValueError(f"--mesh needs ep and tp (and optionally dp), got {text!r}")
    return {n: dims[n] for n in ("dp", "ep", "tp") if n in dims}


def quiet() -> None:
    """Drop DTensor's note that the clipping's 2-D norm reduces one mesh dim at a time (it does, correctly)."""
    import logging

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def gloo_rank(rank: int, world_size: int, dims: dict[str, int], steps: int, save_at: int, checkpoint_dir: str,
              balance: Balance | None = None) -> Run:
    """One real rank (``run_gloo`` spawns one process per rank)."""
    from torch.distributed.device_mesh import init_device_mesh

    quiet()
    world = init_device_mesh("cpu", tuple(dims.values()), mesh_dim_names=tuple(dims))
    return train(world, steps, save_at, checkpoint_dir, balance)


def simulated(dims: dict[str, int], steps: int, balance: Balance | None = None) -> Run:
    """Every rank in this process (``LocalTensorMode``); rank 0's view (all ranks agree)."""
    from dtensor_rules.testing import simulated_mesh

    with simulated_mesh(tuple(dims.values()), tuple(dims)) as world:
        return train(world, steps, None, None, balance)


def report(run: Run, oracle: Run, save_at: int | None) -> str:
    lines = [f"{'step':>4}  {'loss':>12}  {'one device':>12}  {'resumed':>12}"]
    for s, (got, want) in enumerate(zip(run.losses, oracle.losses)):
        resumed = run.resumed_losses[s - save_at] if save_at is not None and s >= save_at and run.resumed_losses else None
        lines.append(f"{s:>4}  {got:>12.7f}  {want:>12.7f}  {'' if resumed is None else f'{resumed:.7f}':>12}")
    diff = max(float((torch.tensor(run.params[n]) - torch.tensor(oracle.params[n])).abs().max()) for n in oracle.params)
    lines.append(f"largest parameter difference from one device after {len(run.losses)} steps: {diff:.2e}")
    if run.resumed_equal is not None:
        lines.append(f"resumed from the step-{save_at} checkpoint: "
                     f"{'bit for bit equal' if run.resumed_equal else 'DIFFERENT'} to the uninterrupted run")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mesh", default="ep=2,tp=2", help="mesh dims: ep=N,tp=N or dp=N,ep=N,tp=N (default ep=2,tp=2)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-at", type=int, default=3, help="checkpoint after this many steps (gloo only)")
    parser.add_argument("--simulated", action="store_true", help="simulate the ranks in this process (no checkpoint)")
    parser.add_argument("--balance-loss", choices=("sequence", "batch"), default=None,
                        help="add the router's auxiliary load-balancing loss to the training loss (default: off)")
    parser.add_argument("--balance-alpha", type=float, default=0.01, help="its weight (default 0.01)")
    args = parser.parse_args(argv)
    dims = parse_mesh(args.mesh)
    balance = None if args.balance_loss is None else Balance(args.balance_loss, args.balance_alpha)
    dp = dims.get("dp", 1)
    if balance is not None and balance.mode == "sequence" and (TOKENS % dp or (TOKENS // dp) % SEQ_LEN):
        parser.error(f"--balance-loss sequence: each dp rank's {TOKENS} / {dp} tokens must split into sequences "
                     f"of {SEQ_LEN}; use a dp that divides {TOKENS // SEQ_LEN}")
    if not 0 < args.save_at < args.steps:
        parser.error(f"--save-at must be between 1 and --steps - 1 ({args.steps - 1}), got {args.save_at}")
    quiet()
    oracle = one_device(args.steps, balance, dp)
    if args.simulated and "dp" in dims:
        parser.error("FSDP2 (a dp dim) needs real ranks: fully_shard frees parameter storage (storage.resize_), "
                     "which a simulated rank's tensor does not support; drop --simulated or the dp dim")
    if args.simulated:
        run, save_at = simulated(dims, args.steps, balance), None
    else:
        from dtensor_rules.testing import run_gloo

        world_size = 1
        for size in dims.values():
            world_size *= size
        with tempfile.TemporaryDirectory(prefix="train_moe_") as checkpoint_dir:
            run = run_gloo(gloo_rank, world_size, dims, args.steps, args.save_at, checkpoint_dir, balance,
                           timeout=600)[0]
        save_at = args.save_at
    print(f"mesh {args.mesh} ({'simulated' if args.simulated else 'gloo'}), {args.steps} steps of AdamW "
          f"(weight decay {WEIGHT_DECAY}, clip {MAX_NORM}), {TOKENS} tokens per step"
          + ("" if balance is None else f", {balance.mode} balance loss (alpha {balance.alpha})"))
    for name, where in run.placements.items():
        print(f"  {name:10s} {where}")
    print(report(run, oracle, save_at))
    return 0


if __name__ == "__main__":
    sys.exit(main())
