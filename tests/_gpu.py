"""The GPU lane's marks: ``gpu`` (pyproject.toml) plus a visible skip where no CUDA device is present.

``pytestmark = GPU`` in a module: every test there is marked ``gpu`` and, without a CUDA device,
skipped with a reason that names the missing device (``-ra`` lists it in the summary), so a run
without a GPU shows these tests as not run rather than passing.
"""

from __future__ import annotations

import pytest
import torch

NO_CUDA_REASON = "needs a CUDA device: torch.cuda.is_available() is False here (the GPU lane, marker 'gpu')"

GPU = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA_REASON)]

__all__ = ["GPU", "NO_CUDA_REASON"]
