"""Partial DTensors built from chosen per-rank parts, for dtype-cast property tests.

``adversarial_parts`` picks parts on which a non-additive cast shows: fp32 parts that cancel
(70000 and -70000 overflow fp16 on their own), bf16 parts whose sum rounds (256 + 1 -> 256),
halves that truncate to 0 in an int cast, int parts whose sum wraps (2**31 - 1 + 1 in int32).
Only ranks 0 and 1 of the Partial mesh dim hold non-trivial parts, so the reduction is the
same in every order and the oracle (reduce the parts, then plain torch) is exact.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import torch
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.placement_types import Partial, Replicate

from dtensor_rules._upstream import LocalTensor
from dtensor_rules.testing.simulate import coords

_FLOAT_PAIRS = [(70000.0, -70000.0), (70000.0, -69999.0), (16777217.0, -16777216.0), (256.0, 1.0), (0.5, 0.5), (65504.0, 65504.0), (1e-8, 3.0), (-2.5, 1.25)]


def _pair_table(dtype: torch.dtype) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.tensor(_FLOAT_PAIRS, dtype=torch.float64)
    info = torch.iinfo(dtype)
    hi, lo = info.max, info.min
    return torch.tensor([(hi, 1), (hi, hi), (lo, -1 if lo < 0 else 0), (hi // 2 + 1, hi // 2 + 1), (3, 4), (0, 1)], dtype=torch.int64)


def adversarial_parts(dtype: torch.dtype, shape: Sequence[int], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two parts of ``shape``: elementwise pairs from the adversarial table."""
    g = torch.Generator().manual_seed(seed)
    n = math.prod(shape)
    table = _pair_table(dtype)
    # every pair at least once when there is room, so each adversary is in every such sample
    pick = torch.cat([torch.randperm(len(table), generator=g), torch.randint(0, len(table), (max(n - len(table), 0),), generator=g)])[:n]
    a, b = table[pick, 0].reshape(shape), table[pick, 1].reshape(shape)
    return a.to(dtype), b.to(dtype)


def pair_rows(dtype: torch.dtype, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two parts of shape (pairs, width), row i repeating pair i: an op along dim 1 mixes no two
    pairs, so each adversary's error is compared with its own magnitude only."""
    table = _pair_table(dtype)
    return table[:, :1].expand(-1, width).to(dtype).contiguous(), table[:, 1:].expand(-1, width).to(dtype).contiguous()


def reduce_parts(parts: Sequence[torch.Tensor], reduce_op: str, n: int) -> torch.Tensor:
    """The value a Partial over ``n`` ranks holding ``parts`` (then fillers) stands for, in the parts' dtype."""
    if reduce_op in ("sum", "avg"):
        total = functools.reduce(torch.add, parts)  # keeps the dtype (torch.sum widens ints)
        return total / n if reduce_op == "avg" else total
    return functools.reduce(torch.maximum if reduce_op == "max" else torch.minimum, parts)


def filler(parts: Sequence[torch.Tensor], reduce_op: str) -> torch.Tensor:
    """What ranks 2.. of the Partial dim hold: 0 for sum/avg, a copy of part 1 for max/min."""
    return torch.zeros_like(parts[0]) if reduce_op in ("sum", "avg") else parts[1].clone()


def partial_dtensor(parts: Sequence[torch.Tensor], mesh: DeviceMesh, mesh_dim: int, reduce_op: str) -> DTensor:
    """Partial(reduce_op) on ``mesh_dim``, Replicate elsewhere; coordinate k on mesh_dim holds parts[k] (or the filler)."""
    fill = filler(parts, reduce_op)
    locals_ = {}
    for r, c in enumerate(coords(tuple(mesh.shape))):
        k = c[mesh_dim]
        p = parts[k] if k < len(parts) else fill
        locals_[r] = p.clone()
    placements = [Replicate()] * mesh.ndim
    placements[mesh_dim] = Partial(reduce_op)
    t = parts[0]
    return DTensor.from_local(LocalTensor(locals_), mesh, placements, run_check=False, shape=t.shape, stride=t.stride())


def assert_matches(got: torch.Tensor, expected: torch.Tensor, magnitude: torch.Tensor, src: torch.dtype) -> None:
    """Exact for integer results; floats within a few ulps of ``magnitude`` (the size of the parts that
    were combined: reordering a float sum rounds relative to them, not to the result) in the MORE
    precise of the source and result dtypes, plus one result-dtype rounding of the value. A cast that
    is not additive errs by more: NaN / inf, a coarser rounding of the parts, a truncation."""
    assert got.dtype == expected.dtype and got.shape == expected.shape, (got, expected)
    if not expected.is_floating_point():
        assert torch.equal(got, expected), (got, expected)
        return
    g, e = got.double(), expected.double()
    same_nonfinite = (torch.isnan(g) & torch.isnan(e)) | (torch.isinf(e) & (g == e))
    eps_out = torch.finfo(expected.dtype).eps
    eps_parts = min(eps_out, torch.finfo(src).eps) if src.is_floating_point else eps_out
    bound = 4 * eps_parts * magnitude + 2 * eps_out * e.abs() + 1e-6
    bad = ~same_nonfinite & ~((g - e).abs() <= bound)
    assert not bool(bad.any()), f"got {got}, expected {expected}"
