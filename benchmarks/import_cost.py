"""What ``import dtensor_rules`` costs on top of ``import torch.distributed.tensor``.

Each run is a fresh interpreter that imports ``torch.distributed.tensor`` first, then
``dtensor_rules``, and reports the wall time and the RSS growth of the second import alone
(the CPU time too: on a shared, loaded machine it is the steadier number), and the wall time of
the baseline import in the same process, for the ratio. Median of ``--runs`` runs.
Target: <= +0.3 s and <= +10 MiB. It also names the heavy modules the import loaded: none is
expected (inductor, DCP, ``torch.utils.flop_counter`` and triton load at the user's first use).

    python benchmarks/import_cost.py            # 7 runs
    python benchmarks/import_cost.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, resource, sys, time
def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
b0 = time.perf_counter()
import torch.distributed.tensor  # the baseline a DTensor user already pays
base = time.perf_counter() - b0
t0, c0, r0 = time.perf_counter(), time.process_time(), rss_kib()
import dtensor_rules
print(json.dumps({"s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0, "mib": (rss_kib() - r0) / 1024,
                  "base_s": base, "heavy": sorted({h for h in HEAVY for m in sys.modules if m == h or m.startswith(h + ".")})}))
"""
# modules `import dtensor_rules` must leave to the user's first use (each costs tens of ms or tens of MiB)
HEAVY = ("torch._inductor.graph", "torch._inductor.compile_fx", "torch._inductor.inductor_prims",
         "torch.distributed.checkpoint", "torch.utils.flop_counter", "triton")


def one_run() -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    code = f"HEAVY = {HEAVY!r}\n" + CHILD
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    runs = [one_run() for _ in range(args.runs)]
    wall = statistics.median(r["s"] for r in runs)
    cpu = statistics.median(r["cpu_s"] for r in runs)
    mib = statistics.median(r["mib"] for r in runs)
    base = statistics.median(r["base_s"] for r in runs)
    ratio = statistics.median(r["s"] / r["base_s"] for r in runs)
    heavy = sorted({h for r in runs for h in r["heavy"]})
    print(f"import dtensor_rules over import torch.distributed.tensor, median of {args.runs} fresh processes:")
    print(f"  wall +{wall:.3f} s   cpu +{cpu:.3f} s   rss +{mib:.1f} MiB   (target <= +0.3 s, <= +10 MiB)")
    print(f"  = {ratio:.2f}x the baseline import's wall time ({base:.3f} s), same processes")
    print(f"  heavy modules imported: {', '.join(heavy) if heavy else 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
