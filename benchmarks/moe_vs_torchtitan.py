"""Our expert parallelism vs torchtitan 0.3.0's own EP path, same weights and tokens, real gloo ranks.

Configs (torchtitan's sense; the token mesh is ("dp_shard", "tp") = (world/2, 2), tokens (B, L, D)
batch on dp_shard and sequence on tp): ep2 (world 2, ep over both dims), ep4 (world 4, ep over
both dims), ep2xtp2 (world 4, ep borrowed from tp, efsdp = dp_shard). Paths: torchtitan's
``MoE.forward`` + ``AllToAllTokenDispatcher`` + ``GroupedExperts`` on each rank's expert slice
(what its ``local_map`` region runs); ours, ``expert_parallel(..., ep_dims=...)`` on the same
module; and, at ep2xtp2, our expert TP (``expert_parallel`` on an (ep, tp) mesh, tokens
replicated on tp). One forward+backward (token gradient included) is measured with
``CommBytesMode`` on rank 0 (calls and bytes per collective type), then ``--rounds`` interleaved
ABBA rounds of timed steps; the table gives each path's median step time over torchtitan's.

    python benchmarks/moe_vs_torchtitan.py              # the three configs, 6 rounds
    python benchmarks/moe_vs_torchtitan.py --quick      # ep2 only, small sizes, 1 round (smoke)

Timings on a shared CPU are noisy; bytes and calls are deterministic. Needs the [torchtitan] extra.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)  # tests/_ttmesh_workers.py, tests/_torchtitan.py

from dtensor_rules.testing import run_gloo  # noqa: E402
from tests._ttmesh_workers import Sizes, compare_rank  # noqa: E402

CONFIGS = {"ep2": 2, "ep4": 4, "ep2xtp2": 4}
COLLECTIVES = ("all_to_all", "all_reduce", "all_gather", "reduce_scatter")


def _kib(n: int) -> str:
    return f"{n / 1024:.1f}"


def table(rows: list[tuple[str, str, object, object]]) -> str:
    head = ("| config | path | step time / torchtitan's | " + " | ".join(f"{c} calls / KiB" for c in COLLECTIVES)
            + " | expert params KiB per rank |")
    lines = [head, "|" + "---|" * (4 + len(COLLECTIVES))]
    for config, path, res, tt in rows:
        ratio = res.times[0] / tt.times[0] if res.times and tt.times else float("nan")
        cells = [f"{res.calls.get(c, 0)} / {_kib(res.bytes.get(c, 0))}" for c in COLLECTIVES]
        lines.append(f"| {config} | {path} | {ratio:.2f} | " + " | ".join(cells) + f" | {_kib(res.expert_bytes)} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="ep2 only, small sizes, 1 round")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--only", choices=sorted(CONFIGS))
    args = ap.parse_args()
    sizes = Sizes(seq=8) if args.quick else Sizes()
    rounds = 1 if args.quick else args.rounds
    configs = ["ep2"] if args.quick else [args.only] if args.only else list(CONFIGS)
    rows = []
    for config in configs:
        print(f"moe_vs_torchtitan: {config} on {CONFIGS[config]} gloo ranks, {rounds} ABBA rounds", file=sys.stderr)
        res = run_gloo(compare_rank, CONFIGS[config], config, rounds, sizes)[0]
        tt = res["torchtitan"]
        rows += [(config, name, r, tt) for name, r in res.items()]
    import torch

    print(f"{datetime.date.today()}, torch {torch.__version__}, sizes {dict(sizes._asdict())}, rank 0, "
          f"{rounds} rounds, median step; bytes: fp32 tokens, one forward+backward")
    print(table(rows))


if __name__ == "__main__":
    main()
