"""Train the MoE block with expert parallelism, and check it against one device.

Each run trains the package's MoE block for ``--steps`` steps with AdamW (weight decay on the
expert and router weights, none on the shared expert), grad-norm clipping across the whole
mesh (``torch.nn.utils.clip_grad_norm_`` on DTensor gradients) and a fresh batch per step,
printing each step's loss as it goes (rank 0 only); it saves a DCP checkpoint after step
``--save-at``, keeps training, then builds a NEW model and optimizer, loads the checkpoint and
trains the same steps again. It ends with the loss of every step next to one device's, the
largest parameter difference from one device, and whether the resumed run ended bit for bit
where the uninterrupted one did.

    python examples/train_moe.py                          # 4 gloo ranks: ep=2 x tp=2
    python examples/train_moe.py --mesh dp=2,ep=2,tp=2    # 8 gloo ranks: FSDP2 over dp
    python examples/train_moe.py --mesh ep=2              # 2 gloo ranks: ep=2 x tp=1
    python examples/train_moe.py --simulated              # all ranks in this process (ep x tp, no checkpoint)
    python examples/train_moe.py --balance-loss sequence  # plus the auxiliary load-balancing loss (alpha 0.01)
    python examples/train_moe.py --checkpoint-dir ckpt --steps 4           # keeps ckpt/step-3, ckpt/step-4
    python examples/train_moe.py --checkpoint-dir ckpt --steps 8 --resume  # goes on from ckpt/step-4
    torchrun --standalone --nproc-per-node 4 examples/train_moe.py        # one process per rank, rank 0 reports

Checkpoints go to ``--checkpoint-dir`` (``step-N`` after step N: at ``--save-at`` and at the end),
or to a temporary folder deleted at exit. ``--resume`` loads the newest ``step-N`` there and
trains steps N to ``--steps``; the one-device oracle trains from step 0, so the table compares
the resumed steps too. Every argument is checked before any work starts. Under ``torchrun``
(one process per rank, ``--nproc-per-node`` = the mesh's rank count) each process trains its
own rank once and rank 0 alone prints; without it the script starts the gloo ranks itself.

With ``--balance-loss sequence|batch`` (weight ``--balance-alpha``) the block is built with
``MoEConfig(balance_loss=..., balance_alpha=...)`` and every step adds its ``aux_loss`` (the
router's load-balancing loss, ``dtensor_rules.models.routing.balance_loss``) to the task loss;
``sequence`` feeds the batch as (sequences, SEQ_LEN, dim), one sequence per row. With a dp dim
each dp rank's loss is that of its own slice of the batch (for ``batch``: its own batch, as a
data-parallel trainer computes it); the one-device oracle computes the same per-slice losses
and averages them, which is what FSDP2's gradient averaging over dp trains.

Layouts (``dtensor_rules.ep.expert_parallel``): experts ``Shard(0)`` on ep (each rank owns
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
import math
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Callable
from typing import Any, NamedTuple


def load_torch() -> None:
    """Import torch and the package. A script run imports them after its arguments are checked
    (``main``), so a bad argument is answered at once; an import of this file (a test, or a rank
    process of ``run_gloo``) imports them at the bottom of the file."""
    global torch, MoE, MoEConfig, expert_parallel, token_placements
    import torch

    import dtensor_rules  # noqa: F401  (installs the rules)
    from dtensor_rules.ep import expert_parallel
    from dtensor_rules.models import MoE, MoEConfig
    from dtensor_rules.ep.expert_parallel import token_placements


DIM, HIDDEN, N_EXPERTS, TOKENS, LR, WEIGHT_DECAY, MAX_NORM = 16, 32, 4, 24, 1e-2, 0.1, 0.5
MAX_GLOO_RANKS = 8  # dtensor_rules.testing.run_gloo's limit on one machine
SEQ_LEN = 6  # tokens per sequence for --balance-loss sequence (TOKENS / dp must divide by it)
NO_DECAY = ("shared_w1", "shared_w2", "shared_w3")  # a parameter group without weight decay


class Balance(NamedTuple):
    """The auxiliary load-balancing loss of a run (``MoEConfig.balance_loss``/``balance_alpha``)."""

    mode: str  # "sequence" or "batch"
    alpha: float


class Run(NamedTuple):
    """What one training run reports (plain values: they cross process boundaries)."""

    losses: list[float]  # one per step from first_step on, before its update
    params: dict[str, list]  # every parameter's full value at the end
    resumed_losses: list[float]  # the steps after the checkpoint, trained again from it
    resumed_equal: bool | None  # the resumed run ended bit for bit where the first did (None: no checkpoint)
    placements: dict[str, str]  # every parameter's placements (and mesh dims) while training
    first_step: int = 0  # the step training started at (--resume: the checkpoint's)


def make_model(balance: Balance | None = None) -> MoE:
    extra = {} if balance is None else {"balance_loss": balance.mode, "balance_alpha": balance.alpha}
    model = MoE(MoEConfig(dim=DIM, hidden=HIDDEN, n_experts=N_EXPERTS, top_k=2, **extra))
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


def say(text: str) -> None:
    """Print on the reporting rank only, at once: rank 0 of real ranks, or the one process that
    simulates every rank (the fake backend; its rank may be a per-rank value there)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_backend() == "fake" or dist.get_rank() == 0:
        print(text, flush=True)


def checkpoint_path(checkpoint_dir: str, step: int) -> str:
    return os.path.join(checkpoint_dir, f"step-{step}")


def newest_checkpoint(checkpoint_dir: str) -> int | None:
    """The largest N of the ``step-N`` checkpoints in ``checkpoint_dir`` (None if there is none)."""
    if not os.path.isdir(checkpoint_dir):
        return None
    steps = [int(m.group(1)) for name in os.listdir(checkpoint_dir) if (m := re.fullmatch(r"step-(\d+)", name))]
    return max(steps, default=None)


def save_checkpoint(run: "Distributed", checkpoint_dir: str, step: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(run.model, run.optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=checkpoint_path(checkpoint_dir, step))


def load_checkpoint(run: "Distributed", checkpoint_dir: str, step: int) -> None:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(run.model, run.optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=checkpoint_path(checkpoint_dir, step))
    set_state_dict(run.model, run.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def train(world: Any, steps: int, save_at: int | None, checkpoint_dir: str | None,
          balance: Balance | None = None, resume_at: int | None = None, keep_final: bool = False) -> Run:
    """Train on ``world``, printing each step's loss (rank 0).

    ``resume_at``: start from ``checkpoint_dir``'s ``step-N`` checkpoint of that step. ``save_at``:
    checkpoint after that step and check the resume (a new model and optimizer loaded from it train
    the remaining steps again). ``keep_final``: also checkpoint the state after the last step.
    """
    run = distributed(world, balance)
    placements = _placements(run.model)
    for name, where in placements.items():
        say(f"  {name:10s} {where}")
    first = 0
    if resume_at is not None:
        load_checkpoint(run, checkpoint_dir, resume_at)
        first = resume_at
        say(f"resumed from {checkpoint_path(checkpoint_dir, resume_at)}")
    losses = []
    for s in range(first, steps):
        losses.append(train_step(run.model, run.optimizer, run.loss_of, s))
        say(f"step {s}: loss {losses[-1]:.7f}")
        if save_at is not None and s + 1 == save_at:
            save_checkpoint(run, checkpoint_dir, save_at)
            say(f"saved the step-{save_at} checkpoint")
    if keep_final and save_at != steps:
        save_checkpoint(run, checkpoint_dir, steps)
        say(f"saved the step-{steps} checkpoint")
    final = full_params(run.model)
    if save_at is None:
        return Run(losses, _as_lists(final), [], None, placements, first)
    again = distributed(world, balance)  # a new model and optimizer, as after a restart
    load_checkpoint(again, checkpoint_dir, save_at)
    say(f"a new model and optimizer, loaded from the step-{save_at} checkpoint:")
    resumed = []
    for s in range(save_at, steps):
        resumed.append(train_step(again.model, again.optimizer, again.loss_of, s))
        say(f"step {s}: loss {resumed[-1]:.7f} (resumed)")
    again_params = full_params(again.model)
    equal = all(torch.equal(final[n], again_params[n]) for n in final)
    return Run(losses, _as_lists(final), resumed, equal, placements, first)


def _as_lists(params: dict[str, torch.Tensor]) -> dict[str, list]:
    return {n: v.tolist() for n, v in params.items()}


def _placements(model: torch.nn.Module) -> dict[str, str]:
    return {n: f"{tuple(p.placements)} on {p.device_mesh.mesh_dim_names}" for n, p in model.named_parameters()}


def parse_mesh(text: str) -> dict[str, int]:
    """``"dp=2,ep=2,tp=2"`` -> ``{"dp": 2, "ep": 2, "tp": 2}``; ep required, dp and tp optional (tp
    defaults to 1), in the order dp, ep, tp."""
    dims: dict[str, int] = {}
    for part in text.split(","):
        name, _, size = part.partition("=")
        if name not in ("dp", "ep", "tp") or not size.isdigit() or int(size) < 1 or name in dims:
            raise ValueError(f"--mesh takes dp=N,ep=N,tp=N (dp and tp optional, N >= 1), got {text!r}")
        dims[name] = int(size)
    if "ep" not in dims:
        raise ValueError(f"--mesh needs an ep size (e.g. ep=2 or ep=2,tp=2), got {text!r}")
    if list(dims) != [n for n in ("dp", "ep", "tp") if n in dims]:
        raise ValueError(f"--mesh lists its dims in the order dp, ep, tp, got {text!r}")
    dims.setdefault("tp", 1)
    return {n: dims[n] for n in ("dp", "ep", "tp") if n in dims}


def mesh_text(dims: dict[str, int]) -> str:
    return ",".join(f"{n}={v}" for n, v in dims.items())


def quiet() -> None:
    """Drop DTensor's note that the clipping's 2-D norm reduces one mesh dim at a time (it does, correctly)."""
    import logging

    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)


def gloo_rank(rank: int, world_size: int, dims: dict[str, int], steps: int, save_at: int | None,
              checkpoint_dir: str | None, balance: Balance | None = None, resume_at: int | None = None,
              keep_final: bool = False) -> Run:
    """One real rank (``run_gloo`` starts one process per rank; under torchrun this process is one)."""
    from torch.distributed.device_mesh import init_device_mesh

    quiet()
    world = init_device_mesh("cpu", tuple(dims.values()), mesh_dim_names=tuple(dims))
    return train(world, steps, save_at, checkpoint_dir, balance, resume_at, keep_final)


def simulated(dims: dict[str, int], steps: int, balance: Balance | None = None) -> Run:
    """Every rank in this process (``LocalTensorMode``); rank 0's view (all ranks agree)."""
    from dtensor_rules.testing import simulated_mesh

    with simulated_mesh(tuple(dims.values()), tuple(dims)) as world:
        return train(world, steps, None, None, balance)


def launched_by_torchrun() -> bool:
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def check_args(args: argparse.Namespace, dims: dict[str, int]) -> tuple[str | None, int | None]:
    """(the first problem with the arguments, or None; the step ``--resume`` starts at). Reads only
    the arguments, the environment and the checkpoint folder: no training before it."""
    world = math.prod(dims.values())
    dp = dims.get("dp", 1)
    if N_EXPERTS % dims["ep"]:
        ok = ", ".join(f"ep={n}" for n in range(1, N_EXPERTS + 1) if N_EXPERTS % n == 0)
        return (f"--mesh {args.mesh}: the block has {N_EXPERTS} experts and every ep rank owns the same number; "
                f"use {ok}"), None
    if HIDDEN % dims["tp"]:
        return f"--mesh {args.mesh}: tp={dims['tp']} does not divide the experts' hidden size {HIDDEN}", None
    if args.steps < 1:
        return f"--steps must be at least 1, got {args.steps}", None
    if args.balance_loss == "sequence" and (TOKENS % dp or (TOKENS // dp) % SEQ_LEN):
        return (f"--balance-loss sequence: each dp rank's {TOKENS} / {dp} tokens must split into sequences "
                f"of {SEQ_LEN}; use a dp that divides {TOKENS // SEQ_LEN}"), None
    if args.simulated:
        if "dp" in dims:
            return ("FSDP2 (a dp dim) needs real ranks: fully_shard frees parameter storage (storage.resize_), "
                    "which a simulated rank's tensor does not support; drop --simulated or the dp dim"), None
        if args.checkpoint_dir is not None or args.resume:
            return ("--simulated cannot checkpoint (DCP gathers to rank 0, which LocalTensorMode refuses); "
                    "drop --checkpoint-dir/--resume or --simulated"), None
        if launched_by_torchrun():
            return "--simulated runs every rank in one process: launch it with python, not torchrun", None
    elif launched_by_torchrun():
        if int(os.environ.get("WORLD_SIZE", "0")) != world:
            return (f"--mesh {mesh_text(dims)} has {world} ranks but torchrun started {os.environ.get('WORLD_SIZE')}: "
                    f"use torchrun --nproc-per-node {world}"), None
    elif world > MAX_GLOO_RANKS:
        return (f"--mesh {mesh_text(dims)} has {world} ranks; this script starts at most {MAX_GLOO_RANKS} gloo "
                "processes on one machine (use torchrun for more, or --simulated)"), None
    if args.resume:
        if args.checkpoint_dir is None:
            return "--resume loads from --checkpoint-dir DIR: name the folder the earlier run saved into", None
        found = newest_checkpoint(args.checkpoint_dir)
        if found is None:
            return f"--resume: no step-N checkpoint in {args.checkpoint_dir!r} (a run with --checkpoint-dir saves them)", None
        if found >= args.steps:
            return f"--resume: the newest checkpoint is after step {found}; pass --steps above {found}", None
        return None, found
    if not args.simulated and not 0 < args.save_at < args.steps:
        return f"--save-at must be between 1 and --steps - 1 ({args.steps - 1}), got {args.save_at}", None
    return None, None


def report(run: Run, oracle: Run, save_at: int | None) -> str:
    lines = [f"{'step':>4}  {'loss':>12}  {'one device':>12}  {'resumed':>12}"]
    for s, got in enumerate(run.losses, start=run.first_step):
        want = oracle.losses[s]
        resumed = run.resumed_losses[s - save_at] if save_at is not None and s >= save_at and run.resumed_losses else None
        lines.append(f"{s:>4}  {got:>12.7f}  {want:>12.7f}  {'' if resumed is None else f'{resumed:.7f}':>12}")
    diff = max(float((torch.tensor(run.params[n]) - torch.tensor(oracle.params[n])).abs().max()) for n in oracle.params)
    lines.append(f"largest parameter difference from one device after {len(oracle.losses)} steps: {diff:.2e}")
    if run.resumed_equal is not None:
        lines.append(f"resumed from the step-{save_at} checkpoint: "
                     f"{'bit for bit equal' if run.resumed_equal else 'DIFFERENT'} to the uninterrupted run")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mesh", default="ep=2,tp=2",
                        help="mesh dims: ep=N, ep=N,tp=N or dp=N,ep=N,tp=N (tp defaults to 1; default ep=2,tp=2)")
    parser.add_argument("--steps", type=int, default=6, help="train steps 0 to STEPS - 1 (default 6)")
    parser.add_argument("--save-at", type=int, default=3,
                        help="checkpoint after this many steps and check the resume from it (gloo only; default 3)")
    parser.add_argument("--checkpoint-dir", default=None,
                        help="keep the checkpoints in DIR (step-N after step N: --save-at and the last); "
                             "default: a temporary folder deleted at exit")
    parser.add_argument("--resume", action="store_true",
                        help="go on from the newest step-N checkpoint in --checkpoint-dir up to --steps")
    parser.add_argument("--simulated", action="store_true", help="simulate the ranks in this process (no checkpoint)")
    parser.add_argument("--balance-loss", choices=("sequence", "batch"), default=None,
                        help="add the router's auxiliary load-balancing loss to the training loss (default: off)")
    parser.add_argument("--balance-alpha", type=float, default=0.01, help="its weight (default 0.01)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    torchrun = launched_by_torchrun()
    try:
        dims = parse_mesh(args.mesh)
        problem, resume_at = check_args(args, dims)
    except ValueError as e:
        problem, resume_at = str(e), None
    if problem is not None:
        if torchrun and os.environ.get("RANK", "0") != "0":
            return 2  # rank 0 says why
        parser.error(problem)
    load_torch()
    balance = None if args.balance_loss is None else Balance(args.balance_loss, args.balance_alpha)
    world_size = math.prod(dims.values())
    save_at = None if args.simulated or args.resume else args.save_at
    how = "simulated" if args.simulated else f"{world_size} gloo ranks" + (", torchrun" if torchrun else "")
    quiet()
    header = (f"mesh {mesh_text(dims)} ({how}), {args.steps} steps of AdamW "
              f"(weight decay {WEIGHT_DECAY}, clip {MAX_NORM}), {TOKENS} tokens per step"
              + ("" if balance is None else f", {balance.mode} balance loss (alpha {balance.alpha})"))
    if args.simulated:
        print(header, flush=True)
        run = simulated(dims, args.steps, balance)
    elif torchrun:
        run = torchrun_rank(dims, args, header, save_at, balance, resume_at)
        if run is None:  # not rank 0: its part is done
            return 0
    else:
        from dtensor_rules.testing import run_gloo

        print(header, flush=True)
        checkpoint_dir = args.checkpoint_dir or tempfile.mkdtemp(prefix="train_moe_")
        try:
            run = run_gloo(gloo_rank, world_size, dims, args.steps, save_at, checkpoint_dir, balance, resume_at,
                           args.checkpoint_dir is not None, timeout=600)[0]
        finally:
            if args.checkpoint_dir is None:
                shutil.rmtree(checkpoint_dir, ignore_errors=True)
    print("next to the same steps in plain torch on one device:", flush=True)
    print(report(run, one_device(args.steps, balance, dims.get("dp", 1)), save_at))
    return 0


def torchrun_rank(dims: dict[str, int], args: argparse.Namespace, header: str, save_at: int | None,
                  balance: Balance | None, resume_at: int | None) -> Run | None:
    """This process's rank under torchrun; rank 0 gets the run (the others None). Without
    --checkpoint-dir, rank 0 makes the temporary folder and tells the others its path."""
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        say(header)
        shared = [args.checkpoint_dir or (tempfile.mkdtemp(prefix="train_moe_") if dist.get_rank() == 0 else None)]
        dist.broadcast_object_list(shared, src=0)
        run = gloo_rank(dist.get_rank(), dist.get_world_size(), dims, args.steps, save_at, shared[0], balance,
                        resume_at, args.checkpoint_dir is not None)
        dist.barrier()  # every rank is done with the folder
        if args.checkpoint_dir is None and dist.get_rank() == 0:
            shutil.rmtree(shared[0], ignore_errors=True)
        return run if dist.get_rank() == 0 else None
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
else:
    load_torch()
