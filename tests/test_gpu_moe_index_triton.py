"""GPU lane: the Triton ``moe_permute_indices`` kernel COMPILED for a CUDA device against its reference.

``tests/test_moe_index_triton.py`` runs the same kernel body in Triton's interpreter on CPU
tensors; here CUDA tensors launch the ``triton.jit`` kernel (``moe_index_triton._compiled``), and
every result must equal the torch reference computed on the CPU and the spec-level oracle of
``tests/_moe_index_cases.py``: the kernel alone (several block sizes, so skewed groups loop over
chunks), an undersized ``max_len`` (the in-range prefix, nothing written past it), the custom op
on CUDA (which picks the Triton kernel) and that op inside ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._gpu import GPU
from tests._moe_index_cases import Case, cases, oracle

pytestmark = GPU
pytest.importorskip("triton", reason="the Triton MoE index kernel needs the optional extra: pip install '.[triton]'")

from dtensor_rules.kernels import (moe_permute_indices_op, permute_indices_reference,  # noqa: E402
                                   permute_indices_triton)
from dtensor_rules.kernels.moe_index_reference import expert_layout  # noqa: E402
from dtensor_rules.kernels.moe_index_triton import scatter_group_indices  # noqa: E402

CUDA = torch.device("cuda")


def _on_cpu(ts: tuple[torch.Tensor, ...]) -> list[list[int]]:
    return [t.cpu().tolist() for t in ts]


@settings(max_examples=30)  # each example is a few kernel launches (microseconds) after the first compile
@given(cases(), st.sampled_from([16, 32, 128]), st.sampled_from([torch.int32, torch.int64]))
def test_compiled_kernel_equals_reference_and_oracle(case: Case, block: int, dtype: torch.dtype) -> None:
    counts, E, R, max_len, alignment = case.args(dtype)
    got = permute_indices_triton(counts.to(CUDA), E, R, max_len, alignment, block=block)
    assert all(t.device.type == CUDA.type and t.dtype == torch.int32 for t in got)
    want = permute_indices_reference(counts, E, R, max_len, alignment)
    assert _on_cpu(got) == _on_cpu(want)
    assert tuple(_on_cpu(got)) == oracle(case.counts, E, R, max_len, alignment)


@settings(max_examples=20)
@given(cases(), st.integers(0, 64))
def test_compiled_kernel_never_writes_past_max_len(case: Case, short: int) -> None:
    max_len = max(case.needed - short, 0)
    counts = case.tensor().to(CUDA)
    src, dst, _, _ = expert_layout(counts, case.experts_per_rank, case.num_ranks, case.alignment)
    got = scatter_group_indices(counts, src, dst, max_len, block=16)
    full = oracle(case.counts, case.experts_per_rank, case.num_ranks, case.max_len, case.alignment)[0]
    assert got.cpu().tolist() == full[:max_len]


def test_the_op_on_cuda_eager_and_compiled_equals_the_reference() -> None:
    """The custom op's CUDA kernel (Triton) and the op in a fullgraph compile, vs the CPU reference."""
    counts = torch.tensor([3, 0, 17, 1, 0, 0, 250, 2], dtype=torch.int32)  # R=2 ranks x E=4 experts, one hot
    args = (4, 2, 320, 16)
    want = _on_cpu(permute_indices_reference(counts, *args))
    assert _on_cpu(moe_permute_indices_op(counts.to(CUDA), *args)) == want
    compiled = torch.compile(lambda c: moe_permute_indices_op(c, *args), fullgraph=True)
    assert _on_cpu(compiled(counts.to(CUDA))) == want
    other = torch.tensor([0, 0, 0, 0, 5, 6, 7, 8], dtype=torch.int32)  # new values, same graph
    assert _on_cpu(compiled(other.to(CUDA))) == _on_cpu(permute_indices_reference(other, *args))
