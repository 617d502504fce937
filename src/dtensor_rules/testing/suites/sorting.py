"""Sample suites for sort / argsort / topk: uneven shapes, ties, int64, bf16, dim by keyword."""

from __future__ import annotations

import torch

from dtensor_rules.testing.suites import Samples, generator


def _inputs(seed: int) -> dict[str, torch.Tensor]:
    g = generator(seed)
    return {
        "f32": torch.randn(5, 4, 3, generator=g),
        "ties": torch.randint(0, 3, (6, 5), generator=g).float(),  # many equal values per row
        "i64": torch.randint(-4, 5, (3, 7), generator=g),
        "bf16": torch.randn(4, 6, generator=g).to(torch.bfloat16),
        "router": torch.randn(7, 8, generator=g).softmax(-1),  # tokens x experts scores
    }


def sort_samples() -> Samples:
    x = _inputs(0)
    return [
        ((x["f32"], 1), {}),
        ((x["f32"],), {}),  # default dim=-1
        ((x["ties"], 0, True), {}),
        ((x["i64"], -1), {}),
        ((x["bf16"],), {"dim": 0}),  # dim by keyword
    ]


def sort_stable_samples() -> Samples:
    x = _inputs(1)
    return [
        ((x["ties"],), {"stable": True, "dim": 1}),
        ((x["ties"],), {"stable": True, "dim": 0, "descending": True}),
        ((x["f32"],), {"stable": True}),
        ((x["i64"],), {"stable": True, "dim": 0}),
    ]


def argsort_samples() -> Samples:
    x = _inputs(2)
    return [((x["router"], 0), {}), ((x["i64"],), {"descending": True}), ((x["f32"], 1), {})]


def argsort_stable_samples() -> Samples:
    x = _inputs(3)
    return [
        ((x["ties"],), {"stable": True, "dim": 0}),  # MoE token permutation: argsort of expert ids
        ((x["i64"].flatten(),), {"stable": True}),
        ((x["bf16"],), {"stable": True, "dim": 1, "descending": True}),
    ]


def topk_samples() -> Samples:
    x = _inputs(4)
    return [
        ((x["router"], 2), {}),  # top-2 experts per token
        ((x["router"], 3, 0), {}),
        ((x["f32"], 2), {"dim": 0}),  # dim by keyword: upstream reads dim=-1 here
        ((x["i64"], 2, 1, False), {}),  # smallest
        ((x["bf16"], 1, -1, True, False), {}),  # sorted=False
    ]
