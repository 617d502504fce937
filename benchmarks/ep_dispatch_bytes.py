"""Per-rank vs per-expert EP dispatch: bytes of the token moves and step time, from one run.

``per_expert`` sends a token row per (token, chosen expert): torchtitan's ``AllToAllTokenDispatcher``
bytes. ``per_rank`` (``expert_parallel(..., dispatch="per_rank")``, DeepEP's scheme) sends a row per
(token, destination rank) and returns one row per (token, rank). Expected ratio of the token bytes:
``E[distinct destination ranks per token] / k``; for uniform routing ``E[distinct] = ep * (1 -
C(E - E/ep, k) / C(E, k))``.

Routings (seeded): ``uniform`` (k distinct experts uniformly at random), ``zipf`` (k distinct experts
drawn with probability ~ 1/i^1.2 over a random order of the experts: hot experts scattered over the
ranks, load-imbalanced), ``spread`` (each token's experts on ``min(k, ep)`` distinct ranks: the
unfavourable case, nothing to save, the per-assignment records still travel).

Measured with ``CommBytesMode.ep_sent`` (bytes sent, summed over every rank) on a simulated mesh
(``LocalTensorMode``, one process), one forward + backward of ``ep_routed_experts`` (fp32 tokens and
experts). Step time: forward + backward on the simulated mesh, the two modes interleaved, median of
``--repeats``, as the ratio per_rank / per_expert: it measures the extra index work of the per-rank
path on CPU, not the wire (the simulated all-to-all is a copy).

    python benchmarks/ep_dispatch_bytes.py
    python benchmarks/ep_dispatch_bytes.py --tokens 64 --repeats 3
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from typing import Any, NamedTuple

import torch

CONFIGS = [(256, 8, 8), (64, 6, 8), (8, 2, 4)]  # (experts, top-k, ep ranks)
ROUTINGS = ("uniform", "zipf", "spread")


class Row(NamedTuple):
    config: str
    routing: str
    expected: float  # E[distinct ranks] / k: analytic for uniform, from the routing otherwise
    dispatch: float  # per_rank / per_expert token bytes, forward dispatch
    combine: float  # same, forward combine
    records: float  # per_rank's routing records, as a fraction of per_expert's dispatch bytes
    backward: float  # per_rank / per_expert token bytes, backward (both moves)
    per_expert_mib: float  # per_expert forward dispatch, MiB over all ranks
    time: float  # per_rank / per_expert step time (simulated mesh)


def routing(kind: str, tokens: int, n_experts: int, k: int, ep: int, gen: torch.Generator) -> torch.Tensor:
    """(tokens, k) distinct expert ids per token."""
    if kind == "uniform":
        return torch.rand(tokens, n_experts, generator=gen).topk(k, dim=-1).indices
    if kind == "zipf":
        p = 1.0 / torch.arange(1, n_experts + 1, dtype=torch.float64) ** 1.2
        p = p[torch.randperm(n_experts, generator=gen)]
        return torch.multinomial(p.expand(tokens, n_experts), k, replacement=False, generator=gen)
    e_l = n_experts // ep
    ranks = torch.rand(tokens, ep, generator=gen).argsort(-1)[:, : min(k, ep)]  # distinct ranks
    ranks = ranks.repeat(1, math.ceil(k / ep))[:, :k]  # k > ep: wrap (then each rank twice, k <= E)
    slot = torch.rand(tokens, k, e_l, generator=gen).argsort(-1)[..., 0]
    if k > ep:  # distinct experts inside a rank that is picked twice
        slot = (slot + torch.arange(k) // ep) % e_l
    return ranks * e_l + slot


def uniform_distinct(n_experts: int, k: int, ep: int) -> float:
    return ep * (1 - math.comb(n_experts - n_experts // ep, k) / math.comb(n_experts, k))


def _step(mode: str, mesh: Any, data: dict[str, Any], n_experts: int) -> Any:
    from dtensor_rules.ep.local import ep_routed_experts
    from dtensor_rules.testing.comm import CommBytesMode

    leaves = [t.detach().clone().requires_grad_() for t in (data["x"], data["w"], *data["experts"])]
    with CommBytesMode() as comm:
        out = ep_routed_experts(leaves[0], data["idx"], *leaves[1:], n_experts=n_experts, alignment=8,
                                group=mesh.get_group("ep"), dispatch=mode)
        out.pow(2).sum().backward()
    return comm


def _time(mode: str, mesh: Any, data: dict[str, Any], n_experts: int) -> float:
    from dtensor_rules.ep.local import ep_routed_experts

    leaves = [t.detach().clone().requires_grad_() for t in (data["x"], data["w"], *data["experts"])]
    start = time.perf_counter()
    out = ep_routed_experts(leaves[0], data["idx"], *leaves[1:], n_experts=n_experts, alignment=8,
                            group=mesh.get_group("ep"), dispatch=mode)
    out.pow(2).sum().backward()
    return time.perf_counter() - start


def measure(n_experts: int, k: int, ep: int, kind: str, tokens: int, dim: int, hidden: int, repeats: int) -> Row:
    from dtensor_rules._upstream import LocalTensor
    from dtensor_rules.testing import simulated_mesh

    gen = torch.Generator().manual_seed(0)
    e_l = n_experts // ep
    per_rank = [dict(x=torch.randn(tokens, dim, generator=gen),
                     idx=routing(kind, tokens, n_experts, k, ep, gen),
                     w=torch.rand(tokens, k, generator=gen).softmax(-1),
                     experts=[torch.randn(e_l, dim, hidden, generator=gen) / dim ** 0.5,
                              torch.randn(e_l, dim, hidden, generator=gen) / dim ** 0.5,
                              torch.randn(e_l, hidden, dim, generator=gen) / hidden ** 0.5]) for _ in range(ep)]
    idx = torch.cat([d["idx"] for d in per_rank])
    distinct = torch.zeros(idx.shape[0], ep, dtype=torch.bool).scatter_(1, idx // e_l, True).sum(1).double().mean()
    expected = (uniform_distinct(n_experts, k, ep) if kind == "uniform" else float(distinct)) / k
    with simulated_mesh((ep,), names=("ep",)) as mesh:
        data = {name: LocalTensor({r: d[name] for r, d in enumerate(per_rank)}) for name in ("x", "idx", "w")}
        data["experts"] = [LocalTensor({r: d["experts"][i] for r, d in enumerate(per_rank)}) for i in range(3)]
        sent = {mode: _step(mode, mesh, data, n_experts).ep_sent for mode in ("per_expert", "per_rank")}
        times: dict[str, list[float]] = {"per_expert": [], "per_rank": []}
        for _ in range(repeats):
            for mode in times:
                times[mode].append(_time(mode, mesh, data, n_experts))
    tok = (dim,)

    def fwd(mode: str, op: str, shape: tuple[int, ...] = tok) -> int:
        return sent[mode]["forward"].get((op, shape), 0)

    def bwd(mode: str) -> int:
        return sum(v for (op, shape), v in sent[mode]["backward"].items() if shape == tok)

    base = fwd("per_expert", "ep_dispatch")
    return Row(f"top-{k} of {n_experts}, ep {ep}", kind, expected, fwd("per_rank", "ep_dispatch") / base,
               fwd("per_rank", "ep_combine") / fwd("per_expert", "ep_combine"),
               fwd("per_rank", "ep_dispatch", (2,)) / base, bwd("per_rank") / bwd("per_expert"),
               base / 2**20, statistics.median(times["per_rank"]) / statistics.median(times["per_expert"]))


def table(rows: list[Row]) -> str:
    head = ["config", "routing", "expected E[distinct]/k", "dispatch bytes", "combine bytes", "+ records",
            "backward bytes", "per_expert dispatch MiB", "step time"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        lines.append(f"| {r.config} | {r.routing} | {r.expected:.3f} | {r.dispatch:.3f}x | {r.combine:.3f}x | "
                     f"{r.records:.3f}x | {r.backward:.3f}x | {r.per_expert_mib:.2f} | {r.time:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=256, help="tokens per rank")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    import dtensor_rules  # noqa: F401

    rows = [measure(e, k, ep, kind, args.tokens, args.dim, args.hidden, args.repeats)
            for e, k, ep in CONFIGS for kind in ROUTINGS]
    print(f"{args.tokens} tokens per rank, dim {args.dim}, hidden {args.hidden}, fp32; ratios per_rank / per_expert "
          "(per_expert = torchtitan's AllToAllTokenDispatcher bytes); bytes summed over all ranks; "
          f"step time: simulated mesh, median of {args.repeats}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
