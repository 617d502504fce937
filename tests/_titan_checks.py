"""One torchrun launch of torchtitan's trainer on one mesh layout, several runs: torchtitan's EP and ours.

``torchrun --nproc-per-node 4 -m tests._titan_checks OUT.json LAYOUT``: rank 0 writes, per run, the
logged (loss, grad norm) of every step; tests/test_torchtitan_trainer_ep.py asserts on them. One layout
per launch: torchtitan's FSDP refuses a second mesh layout in the same process (its storage meshes are
cached by the process's first layout).

Runs (``dsv3_cpu_small``, torchtitan's EP the oracle); two trainers per launch: torchtitan's FSDP setup
refuses a third trainer built in the same process ("Expected param's DTensor mesh to be the same mesh
passed to fully_shard"; seen once for a second trainer too, after a first one that ran a step under
``CommBytesMode``, which these runs do not use):

- ``ep4``: torchtitan's EP and ours, 3 steps each, EP over all 4 ranks (efsdp 1), FSDP over 4 on the
  other parameters;
- ``ep4_resume``: torchtitan's EP for 4 steps saving DCP checkpoints at steps 2 and 4, then ours loading
  step 2 (``checkpoint.load_step``) and training steps 3 and 4;
- ``ep2``: EP over 2 ranks with expert FSDP over the other 2 (efsdp 2), 3 steps each;
- ``ep2tp2``: tensor parallel 2 (the shared expert laid out by torchtitan) x EP 2, 3 steps each.
"""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from tests._titan_trainer import train

OURS = ["--override.imports", "dtensor_rules.integrations.torchtitan.expert_parallel"]
EP4 = ["--parallelism.expert_parallel_degree", "4"]
EP2 = ["--parallelism.expert_parallel_degree", "2"]
EP2TP2 = [*EP2, "--parallelism.tensor_parallel_degree", "2"]


def main(out: str, layout: str) -> None:
    from torchtitan.tools.logging import init_logger

    init_logger()
    results: dict[str, list[list[float]]] = {}

    def run(name: str, args: list[str]) -> None:
        results[name] = [[r["step"], r["loss"], r["grad_norm"]] for r in train(args)]

    if layout in ("ep4", "ep2", "ep2tp2"):
        mesh = {"ep4": EP4, "ep2": EP2, "ep2tp2": EP2TP2}[layout]
        dump = ["--dump_folder", f"{out}.dump"]  # torchtitan's logs go beside OUT, not into the checkout
        run("titan", [*mesh, *dump, "--training.steps", "3"])
        run("ours", [*mesh, *dump, *OURS, "--training.steps", "3"])
    elif layout == "ep4_resume":
        # next to OUT (the test's temporary folder): every rank writes into the same checkpoint
        ckpt = [*EP4, "--training.steps", "4", "--dump_folder", f"{out}.dump", "--checkpoint.enable",
                "--checkpoint.interval", "2", "--checkpoint.no-last_save_model_only"]
        run("titan", ckpt)
        run("ours_resumed", [*ckpt, *OURS, "--checkpoint.load_step", "2"])
    else:
        raise ValueError(f"unknown layout {layout!r}: ep4, ep2, ep2tp2, ep4_resume")
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
