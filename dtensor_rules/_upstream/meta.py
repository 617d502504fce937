"""Fake tensors and meta kernels: shapes without data."""

from __future__ import annotations

from typing import Any

from torch._subclasses.fake_tensor import DynamicOutputShapeException, FakeTensor, FakeTensorMode

__all__ = [
    "DynamicOutputShapeException",
    "FAKE_TENSOR_LOGGER",
    "META_FAILURE_MESSAGE",
    "FakeTensor",
    "FakeTensorMode",
    "create_grouped_mm_output_tensor",
    "ensure_prims_fma",
]


def create_grouped_mm_output_tensor(mat_a: Any, mat_b: Any, offs: Any, out_dtype: Any) -> Any:
    """``_grouped_mm``'s output (shape, strides, dtype) as its meta kernel builds it."""
    from torch._meta_registrations import _create_grouped_mm_output_tensor

    return _create_grouped_mm_output_tensor(mat_a, mat_b, offs, out_dtype)


def ensure_prims_fma() -> None:
    """Define ``torch.ops.prims.fma`` (inductor defines it; importing inductor costs ~2 s)."""
    import torch._inductor.inductor_prims  # noqa: F401


# the logger FakeTensorMode reports a failing meta kernel on (at ERROR, with a traceback)
FAKE_TENSOR_LOGGER = "torch._subclasses.fake_tensor"
META_FAILURE_MESSAGE = "failed while attempting to run meta for %s"
