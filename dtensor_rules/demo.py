"""``python -m dtensor_rules demo``: our rules at work on a simulated mesh, next to upstream's."""

from __future__ import annotations

import time

import torch
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard

from dtensor_rules.testing import check_samples, simulated_mesh
from dtensor_rules.testing.dispatch import sharded_call
from dtensor_rules.testing.simulate import Sample
from dtensor_rules.testing.suites import samples_for, suites


def _rule(title: str) -> None:
    print(f"\n== {title} " + "=" * max(0, 70 - len(title)))


def coverage_table(mesh_shape: tuple[int, ...]) -> list[str]:
    """Per op with a sample suite: ours vs upstream (correct / incorrect / missing)."""
    rows = [f"{'op':40s} {'ours c/i/m':>16s} {'upstream c/i/m':>16s}"]
    for op in sorted(suites(), key=str):
        r = check_samples(op, samples_for(op), mesh_shape)
        o, u = r.ours, r.upstream
        up = f"{u.correct}/{u.incorrect}/{u.missing}" if u.has_rule else f"none/{u.missing}"
        rows.append(f"{str(op):40s} {f'{o.correct}/{o.incorrect}/{o.missing}':>16s} {up:>16s}")
    return rows


def run_demo(mesh_shape: tuple[int, ...] = (2, 2)) -> int:
    start = time.perf_counter()
    torch.manual_seed(0)
    _rule(f"rules vs ground truth on a simulated {'x'.join(map(str, mesh_shape))} mesh")
    for line in coverage_table(mesh_shape):
        print(line)

    _rule("softmax backward with a Partial(sum) gradient, through DTensor dispatch")
    y = torch.randn(8, 6).softmax(-1)
    g = torch.randn(8, 6)
    op = torch.ops.aten._softmax_backward_data.default
    sample = Sample((g, y, -1, torch.float32), {})
    expected = op(*sample.args)
    placements = [(Partial("sum"),) + (Shard(0),) * (len(mesh_shape) - 1), (Replicate(),) + (Shard(0),) * (len(mesh_shape) - 1)]
    with simulated_mesh(mesh_shape) as mesh:
        got = sharded_call(op, sample, mesh, placements)
    ok = torch.allclose(got, expected, atol=1e-5)
    print(f"inputs {placements} -> sharded result equals single-device: {ok}")
    print(f"\ndone in {time.perf_counter() - start:.1f}s")
    return 0 if ok else 1

