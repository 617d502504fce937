"""Sample suites for gather / scatter_add / scatter / scatter_reduce: index smaller than self and
src on non-indexed dims, duplicate indices, negative dims, bf16 and int64."""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples, generator


def _index(g: torch.Generator, high: int, *shape: int) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=g)


def _r(g: torch.Generator, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(*shape, generator=g).to(dtype)
    return torch.randint(-5, 6, shape, generator=g, dtype=dtype)


def gather_samples() -> Samples:
    g = generator(20)
    return [
        ((_r(g, 4, 6), 1, _index(g, 6, 4, 3)), {}),  # same size on the other dim
        ((_r(g, 5, 6), 1, _index(g, 6, 3, 3)), {}),  # index smaller on dim 0
        ((_r(g, 5, 4), -2, _index(g, 5, 7, 4)), {}),  # index longer on the gathered dim (duplicates)
        ((_r(g, 3, 5, dtype=torch.bfloat16), 1, _index(g, 5, 3, 5)), {}),
        ((_r(g, 4, 5, dtype=torch.int64), 0, _index(g, 4, 2, 5)), {}),
    ]


def scatter_add_samples() -> Samples:
    g = generator(21)
    return [
        ((_r(g, 4, 6), 0, _index(g, 4, 5, 6), _r(g, 5, 6)), {}),  # duplicates along dim 0
        ((_r(g, 4, 6), 1, _index(g, 6, 4, 3), _r(g, 6, 5)), {}),  # src larger than index
        ((_r(g, 5, 3), -2, _index(g, 5, 6, 2), _r(g, 6, 3)), {}),  # index narrower than self on dim 1
        ((_r(g, 6, 4, dtype=torch.bfloat16), 0, _index(g, 6, 3, 4), _r(g, 3, 4, dtype=torch.bfloat16)), {}),
        ((_r(g, 4, 3, dtype=torch.int64), 1, _index(g, 3, 4, 3), _r(g, 4, 3, dtype=torch.int64)), {}),
    ]


def scatter_src_samples() -> Samples:
    g = generator(22)
    # unique indices along dim so the written value is well defined
    idx = torch.stack([torch.randperm(6, generator=g)[:3] for _ in range(4)])
    return [
        ((_r(g, 4, 6), 1, idx, _r(g, 4, 3)), {}),
        ((_r(g, 4, 6), 1, idx[:, :2], _r(g, 5, 4)), {}),  # src larger than index
        ((_r(g, 5, 4, dtype=torch.int64), 0, torch.randperm(5, generator=g)[:3].view(3, 1).expand(3, 4).contiguous(), _r(g, 3, 4, dtype=torch.int64)), {}),
    ]


def scatter_value_samples() -> Samples:
    g = generator(23)
    return [
        ((_r(g, 4, 6), 1, _index(g, 6, 4, 3), 0.0), {}),
        ((_r(g, 5, 3), 0, _index(g, 5, 2, 3), -0.5), {}),
        ((_r(g, 4, 6, dtype=torch.int64), -1, _index(g, 6, 3, 6), 0), {}),
    ]


def scatter_reduce_samples() -> Samples:
    g = generator(24)
    out = []
    for reduce in ("sum", "mean", "amax", "amin", "prod"):
        for include_self in (True, False):
            out.append(((_r(g, 4, 5), 0, _index(g, 4, 6, 5), _r(g, 6, 5), reduce), {"include_self": include_self}))
    out.append(((_r(g, 4, 5, dtype=torch.int64), 1, _index(g, 5, 4, 3), _r(g, 4, 3, dtype=torch.int64), "mean"), {}))
    return out
