"""One torchrun launch of torchtitan's trainer on one mesh layout, several runs: torchtitan's EP and ours.

``torchrun --nproc-per-node 4 -m tests._titan_checks OUT.json LAYOUT [EP4_DUMP]``: rank 0 writes, per run, the
logged (loss, grad norm) of every step; tests/test_torchtitan_trainer_ep.py asserts on them. One layout
per launch: torchtitan's FSDP refuses a second mesh layout in the same process (its storage meshes are
cached by the process's first layout).

Runs (``dsv3_cpu_small``, torchtitan's EP the oracle); two trainers per launch: torchtitan's FSDP setup
refuses a third trainer built in the same process ("Expected param's DTensor mesh to be the same mesh
passed to fully_shard"; seen once for a second trainer too, after a first one that ran a step under
``CommBytesMode``, which these runs do not use):

- ``ep4``: torchtitan's EP and ours, 3 steps each, EP over all 4 ranks (efsdp 1), FSDP over 4 on the
  other parameters;
- ``ep4_resume``: torchtitan's EP for 6 steps saving DCP checkpoints at steps 2, 4 and 6, then ours
  loading its step 2 and training steps 3 to 6, saving its own at steps 4 and 6;
- ``ep2_from_ep4 EP4_DUMP``: ``ep4_resume``'s step-4 checkpoints resumed at EP 2 x efsdp 2 for steps
  5 and 6: torchtitan's EP from ours' checkpoint, ours from torchtitan's;
- ``ep4_compile``: torchtitan's ``--compile`` (backend ``aot_eager``), its EP and ours, 3 steps each;
  ``ep4_compile_inductor`` the same with inductor (needs a C++ compiler; minutes of compiling on CPU),
  ``ep2tp2_compile`` with aot_eager at tp2 x ep2;
- ``ep2``: EP over 2 ranks with expert FSDP over the other 2 (efsdp 2), 3 steps each;
- ``ep2tp2``: tensor parallel 2 (the shared expert laid out by torchtitan) x EP 2, 3 steps each;
- ``ep4_spmd_types``, ``ep2tp2_spmd_types`` (and ``..._compile``, backend aot_eager): ours alone under torchtitan's
  ``spmd_types`` backend (plain tensors with SPMD type annotations instead of DTensors; needs torch >=
  2.14, whose ``fully_shard`` takes such parameters), 3 steps; the oracle is torchtitan's EP under
  ``full_dtensor`` from another launch. torchtitan's own EP cannot run under ``spmd_types`` on gloo:
  its uneven token all_to_all is the list form (``dist.all_to_all``), which gloo refuses for chunks of
  different sizes.
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


def _resume_from(dump: str, step: int) -> list[str]:
    """Start from another run's DCP checkpoint (full state, not the model only), as torchtitan resumes."""
    return ["--checkpoint.initial_load_path", f"{dump}/checkpoint/step-{step}",
            "--checkpoint.no-initial_load_model_only"]


def main(out: str, layout: str, ep4_dump: str = "") -> None:
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
        # each run writes its own checkpoints beside OUT (the test's temporary folder); ours starts
        # from torchtitan's step-2 checkpoint as torchtitan resumes from another run's: the full
        # state (model, optimizer, schedule, data position, step) through `initial_load_path`
        save = [*EP4, "--training.steps", "6", "--checkpoint.enable", "--checkpoint.interval", "2",
                "--checkpoint.no-last_save_model_only"]
        run("titan", [*save, "--dump_folder", f"{out}.dump/titan"])
        run("ours_resumed", [*save, *OURS, "--dump_folder", f"{out}.dump/ours",
                             *_resume_from(f"{out}.dump/titan", 2)])
    elif layout == "ep2_from_ep4":
        # ``ep4_resume``'s step-4 checkpoints (its dump folder is argv[3]) resumed at EP 2 x efsdp 2,
        # crossed: torchtitan's EP from the one ours saved, ours from the one torchtitan's saved
        load = [*EP2, "--training.steps", "6", "--dump_folder", f"{out}.dump", "--checkpoint.enable",
                "--checkpoint.load_only"]
        run("titan_from_ours", [*load, *_resume_from(f"{ep4_dump}/ours", 4)])
        run("ours_from_titan", [*load, *OURS, *_resume_from(f"{ep4_dump}/titan", 4)])
    elif layout in ("ep4_compile", "ep4_compile_inductor", "ep2tp2_compile"):
        # torchtitan's --compile (each transformer block one fullgraph torch.compile); aot_eager (the
        # test's): runs without a C++ toolchain and keeps eager's kernels; inductor: torchtitan's default
        backend = "inductor" if layout == "ep4_compile_inductor" else "aot_eager"
        mesh = [*(EP2TP2 if layout == "ep2tp2_compile" else EP4), "--dump_folder", f"{out}.dump",
                "--training.steps", "3", "--compile.enable", "--compile.backend", backend]
        run("titan", mesh)
        run("ours", [*mesh, *OURS])
    elif layout in ("ep4_spmd_types", "ep2tp2_spmd_types", "ep4_spmd_types_compile", "ep2tp2_spmd_types_compile"):
        mesh = EP2TP2 if layout.startswith("ep2tp2") else EP4
        compile_ = ["--compile.enable", "--compile.backend", "aot_eager"] if layout.endswith("compile") else []
        run("ours", [*mesh, "--parallelism.spmd_backend", "spmd_types", *compile_, "--dump_folder", f"{out}.dump",
                     "--training.steps", "3", *OURS])
    else:
        raise ValueError(f"unknown layout {layout!r}: ep4, ep2, ep2tp2, ep4_resume, ep2_from_ep4, ep4_compile, "
                         "ep4_compile_inductor, ep2tp2_compile, ep4_spmd_types, ep2tp2_spmd_types, "
                         "ep4_spmd_types_compile, ep2tp2_spmd_types_compile")
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
