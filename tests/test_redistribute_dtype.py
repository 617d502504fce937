"""``plan(dtype=...)`` takes a torch dtype or its name; a name of no dtype is refused in one line."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from dtensor_rules.redistribute import plan

ARGS = ((2, 2), (4096, 7168))
SRC, DST = (Partial(), Shard(0)), (Shard(0), Shard(0))


@pytest.mark.parametrize("name, dtype", [("bf16", torch.bfloat16), ("bfloat16", torch.bfloat16),
                                         ("torch.bfloat16", torch.bfloat16), ("fp32", torch.float32),
                                         ("float16", torch.float16), ("int64", torch.int64)])
def test_a_dtype_name_plans_like_the_dtype(name, dtype):
    by_name, by_dtype = plan(*ARGS, name, SRC, DST), plan(*ARGS, dtype, SRC, DST)
    assert by_name.explain() == by_dtype.explain()  # bytes per step come from the dtype's itemsize
    assert plan(*ARGS, "bf16", SRC, DST).cost_us < plan(*ARGS, "fp32", SRC, DST).cost_us  # half the bytes


@pytest.mark.parametrize("bad, error, match", [
    ("bf61", ValueError, r"^dtype 'bf61' names no torch dtype; pass e.g. torch.bfloat16, 'bf16' or 'float32'$"),
    ("Tensor", ValueError, "names no torch dtype"),  # a torch attribute that is not a dtype
    (2, TypeError, r"^dtype must be a torch.dtype or its name \(e.g. torch.bfloat16 or 'bf16'\), got int$"),
])
def test_a_dtype_that_is_none_is_refused_naming_the_fix(bad, error, match):
    with pytest.raises(error, match=match):
        plan((2,), (8,), bad, (Shard(0),), (Replicate(),))
