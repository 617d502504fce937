"""Sample suites for aten.index.Tensor and aten.index_put (uneven shapes, several / broadcasting / separated
index tensors, None entries, negative indices, bool masks, duplicates, bf16 and int64).

``accumulate=False`` samples keep index coordinates unique: with duplicates the written value
is nondeterministic on one device already. ``accumulate=True`` samples include duplicates.
``index.Tensor`` has no bool-mask sample: its output shape is data dependent, which neither
DTensor nor the fake-tensor step of the validator can handle.
"""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples, generator


def _t(*vals: int) -> torch.Tensor:
    return torch.tensor(vals)


def index_samples() -> Samples:
    g = generator(10)
    r = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    return [
        ((r(6, 5), [_t(0, 3, 3, -1)]), {}),  # duplicates, negative index, uneven dim
        ((r(5, 4, 3), [None, _t(2, 0, 1)]), {}),  # index a middle dim
        ((r(5, 4, 3), [_t(4, 0).reshape(2, 1), None, _t(0, 2, 1)]), {}),  # separated: B goes to the front
        ((r(4, 5, 3, dtype=torch.bfloat16), [None, _t(0, 4, 2), _t(1, 1, 0)]), {}),  # adjacent pair
        ((torch.randint(-9, 9, (7, 3), generator=g), [_t(1, 6, 6, 0, 2, 3).reshape(2, 3)]), {}),  # 2-D index, int64
    ]


def index_put_samples() -> Samples:
    g = generator(11)
    r = lambda *s, dtype=torch.float32: torch.randn(*s, generator=g).to(dtype)  # noqa: E731
    mask = torch.tensor([[1, 0, 1], [0, 0, 1], [1, 1, 0], [0, 1, 1]], dtype=torch.bool)
    return [
        ((r(6, 5), [_t(4, 0, 2)], r(3, 5), False), {}),
        ((r(6, 5), [_t(4, 0, 4, 1)], r(4, 5), True), {}),  # duplicates accumulate
        ((r(5, 4, 3), [_t(4, 0).reshape(2, 1), None, _t(0, 2, 1)], r(2, 3, 4), True), {}),  # separated, broadcast
        ((r(4, 5, 3, dtype=torch.bfloat16), [None, _t(0, 4, 2), _t(1, 1, 0)], r(3, dtype=torch.bfloat16), False), {}),
        ((r(4, 3), [mask], r(1), False), {}),  # 2-D mask, broadcast scalar value
        ((r(5, 4), [_t(1, 0, 1, 1, 0).bool()], r(4), True), {}),  # 1-D mask, values broadcast over rows
        ((torch.randint(-9, 9, (7, 3), generator=g), [_t(1, 6, 1, 0)], torch.randint(-9, 9, (4, 3), generator=g), True), {}),
    ]
