"""torchtitan 0.3.0's own trainer: our EP (one setting) vs torchtitan's EP, 4 CPU gloo ranks.

Per configuration (layout x activation dtype) it trains torchtitan's EP and ours
(``--override.imports dtensor_rules.integrations.torchtitan.expert_parallel``, plus ``bf16_dispatch``
for fp32 activations), one torchrun launch per run, the paths interleaved, on ``dsv3_cpu_small``
(tests/_titan_trainer.py: ``deepseek_v3_debugmodel`` cut to 3 layers, CPU shims) and prints:

- loss and grad norm per step (ours must equal torchtitan's bit for bit with fp32 moves);
- step time: median over steps 2..N-1 (step 1 warms up; the last step is counted with
  ``CommBytesMode``, which slows it), as a ratio to torchtitan's; the order of the paths reverses
  between repeats (``--repeats``);
- bytes per collective on rank 0 in the counted step (forward + backward, ``CommBytesMode``);
- peak RSS per rank (the CPU stand-in for peak device memory).

    python benchmarks/torchtitan_trainer.py [--steps 5] [--repeats 1] [--no-save-moves]
        [--free-moves-bound] [--moves-share] [--layout ep4|ep2tp2 ...] [--act fp32|bf16 ...]

``--moves-share`` profiles step N-1 of each run (torch.profiler, CPU) and prints the wall time its
token moves took, as a share of that step: the all_to_alls and their waits (functional collectives
and c10d ``alltoall``), our ``dtensor_rules::ep_*`` ops, nested events counted once. Every functional
``wait_tensor`` counts, so with tensor parallel (whose DTensor collectives wait the same way) the share
is an upper bound. A share measured inside one step is robust to the machine's load, where step-time
ratios between launches are not.

``--free-moves-bound`` adds the path ``titan_free_moves``: torchtitan's EP with every all_to_all of its
token dispatcher replaced by a local gather of the same size (no communication; the losses are
meaningless, the shapes and the expert work are a real step's). Its step time bounds what ANY
implementation of the moves can reach on this machine: a ratio above the goal there means the goal
cannot be met by changing the moves.

Ours runs with ``selective_ac`` too (the debug config's SelectiveAC then saves our two moves as it
saves torchtitan's all_to_all); ``--no-save-moves`` leaves it out (the moves are recomputed in the
backward: 1.5x the all_to_all bytes).

Layouts: ep4 (EP over the 4 ranks, FSDP 4) and ep2tp2 (TP 2 x EP 2). Activations: fp32
(``--training.mixed_precision_param float32``) and bf16 (torchtitan's default FSDP mixed precision).
CPU timings on a shared machine are noisy; bytes are deterministic. Needs the [torchtitan] extra.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the debug config trains with torchtitan's SelectiveAC: with ``selective_ac`` it saves our two moves
# as it saves its own all_to_all (``--no-save-moves``: leave them to be recomputed in the backward)
SAC = "dtensor_rules.integrations.torchtitan.selective_ac"
OURS = ["--override.imports", "dtensor_rules.integrations.torchtitan.expert_parallel"]
OURS_BF16 = ["--override.imports", 'dtensor_rules.integrations.torchtitan.expert_parallel={"bf16_dispatch": true}']
LAYOUTS = {"ep4": ["--parallelism.expert_parallel_degree", "4"],
           "ep2tp2": ["--parallelism.expert_parallel_degree", "2", "--parallelism.tensor_parallel_degree", "2"]}
DTYPES = {"fp32": ["--training.mixed_precision_param", "float32"], "bf16": []}


def _free_moves() -> None:
    """torchtitan's token dispatcher without communication: each all_to_all becomes a local gather of
    the size it would receive (the count exchange returns this rank's own counts), gradients flowing."""
    import torch
    from torchtitan.models.common import token_dispatcher

    def local_all_to_all(x, output_split_sizes, input_split_sizes, group=None):  # noqa: ANN001, ANN202
        if output_split_sizes is None:
            return x.clone()
        n = sum(output_split_sizes)
        if x.shape[0] == 0:
            return x.new_zeros(n, *x.shape[1:])
        return x[torch.arange(n, device=x.device) % x.shape[0]]

    token_dispatcher.all_to_all_single = local_all_to_all


_MOVES = ("all_to_all", "alltoall", "dtensor_rules::ep_")


def _is_move(name: str) -> bool:
    return any(m in name for m in _MOVES)


def _profile_moves_on(step: int) -> None:
    """Wrap ``Trainer.train_step``: step ``step`` runs under the CPU profiler and its row gets ``moves_s``."""
    import torch
    from torchtitan.trainer import Trainer

    from tests._titan_trainer import RECORDED

    train_step = Trainer.train_step

    def profiled(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if self.step != step:
            return train_step(self, *args, **kwargs)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = train_step(self, *args, **kwargs)
        moves_us = 0.0
        for e in prof.events():
            if not (_is_move(e.name) or e.name == "_c10d_functional::wait_tensor"):
                continue
            parent = e.cpu_parent
            while parent is not None and not _is_move(parent.name):
                parent = parent.cpu_parent
            if parent is None:  # outermost: its time once
                moves_us += e.cpu_time_total
        RECORDED[-1]["moves_s"] = moves_us / 1e6
        return out

    Trainer.train_step = profiled


def _worker(out: str, runs: list[list[str]]) -> None:
    """Under torchrun: train each run and write rank-local rows."""
    import torch.distributed as dist

    from tests._titan_trainer import train  # first: its CPU shims must precede torchtitan's imports
    from torchtitan.tools.logging import init_logger

    if os.environ.get("TITAN_FREE_MOVES"):
        _free_moves()
    if os.environ.get("TITAN_PROFILE_STEP"):
        _profile_moves_on(int(os.environ["TITAN_PROFILE_STEP"]))

    init_logger()
    rows = [train([*args, "--dump_folder", f"{out}.dump"]) for args in runs]  # logs in the temporary folder
    with open(f"{out}.{dist.get_rank()}.json", "w") as f:
        json.dump(rows, f)


def _launch(runs: list[list[str]], steps: int, free_moves: bool = False,
            profile_step: int = 0) -> list[list[list[dict]]]:
    """rows[rank][run] for one torchrun launch of ``runs``."""
    with tempfile.TemporaryDirectory() as tmp, socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        out = os.path.join(tmp, "rows")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(ROOT, "src"), ROOT]),
               "TITAN_COUNT_BYTES_STEP": str(steps), "OMP_NUM_THREADS": "1", "TITAN_FREE_MOVES": "1" if free_moves else "",
               "TITAN_PROFILE_STEP": str(profile_step or "")}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "4", "--master-addr", "127.0.0.1",
               "--master-port", str(port), os.path.abspath(__file__), "--worker", out, json.dumps(runs)]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if proc.returncode:
            raise RuntimeError(proc.stdout[-2000:] + proc.stderr[-4000:])
        return [json.load(open(f"{out}.{r}.json")) for r in range(4)]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--no-save-moves", action="store_true")
    p.add_argument("--free-moves-bound", action="store_true")
    p.add_argument("--moves-share", action="store_true")
    p.add_argument("--layout", choices=list(LAYOUTS), action="append", help="default: all")
    p.add_argument("--act", choices=list(DTYPES), action="append", help="default: both")
    p.add_argument("--worker", nargs=2)
    a = p.parse_args()
    if a.worker:
        _worker(a.worker[0], json.loads(a.worker[1]))
        return
    ours, ours_bf16 = OURS, OURS_BF16
    if not a.no_save_moves:
        ours, ours_bf16 = [*OURS, SAC], [*OURS_BF16, SAC]
    steps = ["--training.steps", str(a.steps)]
    table = []
    for layout in a.layout or LAYOUTS:
        mesh = LAYOUTS[layout]
        for dtype in a.act or DTYPES:
            act = DTYPES[dtype]
            paths = {"titan": [], "ours": ours} | ({"ours_bf16": ours_bf16} if dtype == "fp32" else {})
            if a.free_moves_bound:
                paths["titan_free_moves"] = []
            results: dict[str, list[list[dict]]] = {k: [] for k in paths}  # path -> per repeat: rows per rank
            for rep in range(a.repeats):
                order = list(paths) if rep % 2 == 0 else list(paths)[::-1]  # interleaved: ABC, CBA, ...
                for k in order:
                    rows = _launch([[*steps, *mesh, *act, *paths[k]]], a.steps, free_moves=k == "titan_free_moves",
                                   profile_step=a.steps - 1 if a.moves_share else 0)
                    results[k].append([rows[r][0] for r in range(4)])
            table.append((layout, dtype, results))
    _print(table)


def _median_step(per_rank: list[list[dict]]) -> float:
    return statistics.median(row["step_s"] for rows in per_rank for row in rows[1:-1])


def _print(table) -> None:
    print("| layout | act | path | loss per step (rank 0) | grad norm per step | step s (median) | vs titan | "
          "all_to_all MB | all_gather MB | reduce_scatter MB | all_reduce MB | peak RSS GiB (max rank) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for layout, dtype, results in table:
        base = statistics.median(_median_step(rep) for rep in results["titan"])
        for path, reps in results.items():
            rows0 = reps[0][0]
            t = statistics.median(_median_step(rep) for rep in reps)
            b = rows0[-1].get("bytes", {})
            mb = [f"{b.get(k, 0) / 2**20:.2f}" for k in ("all_to_all", "all_gather", "reduce_scatter", "all_reduce")]
            peak = max(r[-1]["peak_rss"] for r in reps[0]) / 2**30
            losses = " ".join(f"{r['loss']:.6f}" for r in rows0)
            norms = " ".join(f"{r['grad_norm']:.6f}" for r in rows0)
            share = [r[-2]["moves_s"] / r[-2]["step_s"] for rep in reps for r in rep if "moves_s" in r[-2]]
            moves = f" moves {min(share):.0%}-{max(share):.0%} of step {len(rows0) - 1} |" if share else ""
            print(f"| {layout} | {dtype} | {path} | {losses} | {norms} | {t:.2f} | {t / base:.2f} | "
                  f"{' | '.join(mb)} | {peak:.2f} |{moves}")


if __name__ == "__main__":
    if ROOT not in sys.path:
        sys.path.insert(0, ROOT)
    main()
