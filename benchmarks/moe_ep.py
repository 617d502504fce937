"""Communication volume and per-rank expert memory: the ``shard_moe`` gather path vs expert parallelism.

Two paths: ``gather`` (``shard_moe``: DTensor's rules gather experts and tokens) and ``ep``
(``expert_parallel``: tokens by all-to-all, experts never gathered).

For ep in {2, 4} (real gloo ranks, mesh (ep, tp=1)), one forward+backward of the same
MoE block, measured on rank 0 with ``dtensor_rules.testing.comm.CommBytesMode``
(``CommDebugMode`` plus bytes): calls and bytes of every collective, the largest single
all_gather (a transient copy of gathered experts/tokens), and the expert parameter and
gradient bytes the rank holds after the step (``w1``, ``w3``, ``w2``: params + grads).

    python benchmarks/moe_ep.py                # ep 2 and 4, the default sizes
    python benchmarks/moe_ep.py --ep 2 --tokens 256
"""

from __future__ import annotations

import argparse
import logging
import warnings
from typing import NamedTuple

import torch

from dtensor_rules.testing import run_gloo

CONFIG = dict(dim=64, hidden=128, n_experts=8, top_k=2)


class Measure(NamedTuple):
    path: str
    ep: int
    calls: dict[str, int]  # collective -> calls (forward + backward)
    bytes: dict[str, int]  # collective -> bytes (forward + backward)
    largest_all_gather: int
    expert_params: int
    expert_grads: int


def _measure(rank: int, world: int, path: str, tokens: int) -> Measure:
    import dtensor_rules  # noqa: F401
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import distribute_tensor

    from dtensor_rules.ep import expert_param_bytes, expert_parallel, token_placements
    from dtensor_rules.models import MoE, MoEConfig, shard_moe
    from dtensor_rules.testing.comm import CommBytesMode

    warnings.simplefilter("ignore")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    # the gather path's fp32 _grouped_mm: the meta kernel refuses fp32, the package's meta_fallback
    # answers, and fake_tensor logs the refusal first; silence that expected note
    logging.getLogger("torch._subclasses.fake_tensor").setLevel(logging.CRITICAL)
    mesh = init_device_mesh("cpu", (world, 1), mesh_dim_names=("ep", "tp"))
    model = MoE(MoEConfig(**CONFIG))
    model = expert_parallel(model, mesh) if path == "ep" else shard_moe(model, mesh)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, CONFIG["dim"], generator=g)
    cot = torch.randn(tokens, CONFIG["dim"], generator=g)
    place = token_placements(mesh)
    xd, cotd = distribute_tensor(x, mesh, place), distribute_tensor(cot, mesh, place)
    with CommBytesMode() as comm:
        (model(xd) * cotd).sum().backward()
    calls: dict[str, int] = {}
    volume: dict[str, int] = {}
    for phase in ("forward", "backward"):
        for name, n in comm.calls[phase].items():
            calls[name] = calls.get(name, 0) + n
            volume[name] = volume.get(name, 0) + comm.bytes[phase][name]
    params, grads = expert_param_bytes(model)
    return Measure(path, world, calls, volume, comm.largest.get("all_gather", 0), params, grads)


def _kib(n: int) -> str:
    return f"{n / 1024:.1f}"


def table(rows: list[Measure]) -> str:
    names = sorted({n for r in rows for n in r.calls})
    head = ["path", "ep", *[f"{n} calls / KiB" for n in names], "total KiB", "largest all_gather KiB",
            "expert params KiB", "expert grads KiB"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = [r.path, str(r.ep)]
        cells += [f"{r.calls.get(n, 0)} / {_kib(r.bytes.get(n, 0))}" for n in names]
        cells += [_kib(sum(r.bytes.values())), _kib(r.largest_all_gather), _kib(r.expert_params), _kib(r.expert_grads)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ep", type=int, action="append", help="repeatable; default 2 and 4")
    parser.add_argument("--tokens", type=int, default=128, help="tokens in the batch (all ranks together)")
    args = parser.parse_args(argv)
    rows = []
    for ep in args.ep or [2, 4]:
        for path in ("gather", "ep"):
            rows.append(run_gloo(_measure, ep, path, args.tokens)[0])
    c = CONFIG
    print(f"MoE dim {c['dim']}, hidden {c['hidden']}, {c['n_experts']} experts, top-{c['top_k']}, "
          f"{args.tokens} tokens, fp32; one forward+backward, rank 0; mesh (ep, tp=1) on gloo\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
