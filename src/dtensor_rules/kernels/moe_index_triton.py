"""Triton kernel for the MoE permute indices (a scatter; no device-to-host sync).

One program per (rank, expert) group: it reads the group's token count, its first
source row and its first destination slot (prefix sums computed by
:func:`~dtensor_rules.kernels.moe_index_reference.expert_layout` with torch ops on the
device), and writes ``src + k`` to ``dst + k`` for ``k < count`` in chunks of ``BLOCK``
lanes. Slots never written keep ``-1`` (padding). A skewed routing (one hot expert)
still spreads over ``num_ranks`` programs.

``triton`` is optional (``pip install dtensor_rules[triton]``): importing this module
never fails without it, :func:`triton_available` says whether the kernel can run. It is
imported at first use, not with this module: on a CUDA torch it costs ~135 ms and ~75 MiB,
more than the rest of ``import dtensor_rules`` together.
CUDA tensors launch the compiled kernel (not yet run on a GPU: written and guarded, the
tests so far are CPU-only); CPU tensors run the same kernel body through Triton's
interpreter, which is what the tests do.
The kernel uses no ``tl.dot``, so the interpreter's bf16-dot caveat does not apply.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from dtensor_rules.kernels.moe_index_reference import INDEX_DTYPE, check_static_args, expert_layout

# set by _load_triton() on first use; the kernel body and triton.jit read them as module globals
triton: Any = None
tl: Any = None


__all__ = ["triton_available", "permute_indices_triton", "scatter_group_indices"]

DEFAULT_BLOCK = 128


@functools.cache
def _load_triton() -> bool:
    """Import triton once (optional dependency: False without it)."""
    global triton, tl
    try:
        import triton as triton_module
        import triton.language as language
    except ImportError:  # exercised on installs without the [triton] extra
        return False
    triton, tl = triton_module, language
    return True


def triton_available() -> bool:
    return _load_triton()


def _require_triton() -> None:
    if not triton_available():
        raise ImportError(
            "the Triton MoE index kernel needs triton: pip install 'dtensor_rules[triton]' "
            "(or use dtensor_rules.kernels.moe_permute_indices, which falls back to the torch reference)"
        )


def _scatter_group_indices_kernel(
    counts_ptr,  # int64[G]: tokens of group g = r * E + e
    src_start_ptr,  # int64[G]: first source row of group g
    dst_start_ptr,  # int64[G]: first destination slot of group g
    out_ptr,  # int32[max_len], pre-filled with -1
    max_len,
    BLOCK: tl.constexpr,
):
    """The kernel body, wrapped by ``triton.jit`` (CUDA) or the interpreter (CPU) on first use."""
    g = tl.program_id(0)
    n = tl.load(counts_ptr + g)
    src = tl.load(src_start_ptr + g)
    dst = tl.load(dst_start_ptr + g)
    lane = tl.arange(0, BLOCK)
    for chunk in range(0, n, BLOCK):
        k = chunk + lane
        slot = dst + k
        # slot < max_len keeps an undersized max_len from writing out of bounds; the op
        # layer reports that case as an error instead of returning truncated indices
        tl.store(out_ptr + slot, (src + k).to(tl.int32), mask=(k < n) & (slot < max_len))


@functools.cache
def _compiled() -> Any:
    return triton.jit(_scatter_group_indices_kernel)


@functools.cache
def _interpreted() -> Any:
    from triton.runtime.interpreter import InterpretedFunction

    return InterpretedFunction(_scatter_group_indices_kernel)


def scatter_group_indices(
    counts: torch.Tensor,
    src_start: torch.Tensor,
    dst_start: torch.Tensor,
    max_len: int,
    block: int = DEFAULT_BLOCK,
) -> torch.Tensor:
    """Launch the kernel: ``int32[max_len]`` with group g's source rows at its destination slots, else -1."""
    _require_triton()
    if block < 16 or block & (block - 1):
        raise ValueError(f"block must be a power of two >= 16, got {block}")
    out = torch.full((max_len,), -1, dtype=INDEX_DTYPE, device=counts.device)
    groups = counts.numel()
    if max_len == 0 or groups == 0:
        return out
    kernel = _interpreted() if counts.device.type == "cpu" else _compiled()
    args = [t.to(torch.int64).contiguous() for t in (counts, src_start, dst_start)]
    kernel[(groups,)](*args, out, max_len, BLOCK=block)
    return out


def permute_indices_triton(
    tokens_per_expert_group: torch.Tensor,
    experts_per_rank: int,
    num_ranks: int,
    max_len: int,
    alignment: int,
    block: int = DEFAULT_BLOCK,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same contract as ``permute_indices_reference``, computed by the Triton kernel."""
    counts = tokens_per_expert_group
    check_static_args(counts.shape, counts.dtype, experts_per_rank, num_ranks, max_len, alignment)
    src_start, dst_start, m_sizes, m_offsets = expert_layout(counts, experts_per_rank, num_ranks, alignment)
    permuted = scatter_group_indices(counts, src_start, dst_start, max_len, block)
    return permuted, m_sizes.to(INDEX_DTYPE), m_offsets.to(INDEX_DTYPE)
