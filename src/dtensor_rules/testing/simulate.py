"""Pure-torch simulation of sharded execution: no process group, no DTensor dispatch.

Each rank's local inputs are cut from the full tensors exactly as DTensor would
(``compute_local_shape_and_global_offset``: chunk semantics, uneven and empty
shards included); Partial inputs are split into per-rank contributions that
reduce back to the full value but are individually far from it (asymmetric,
sign-varying splits; for max/min alternating owners, the other ranks below by
offsets that vary along every dim, so no part, nor their mean, is a shifted
copy), so an op that is not really linear or selective fails. The op runs on each rank's plain tensors and
the claimed output placements are checked by reducing Partial mesh dims and
comparing each rank's shard with the ground truth.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from dtensor_rules._upstream import compute_local_shape_and_global_offset
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard
from torch.utils import _pytree as pytree

from dtensor_rules.testing.masks import Masks, is_mask, mask_inputs, mask_outputs

NDPlacement = tuple[Placement, ...]  # one placement per mesh dim

# relative tolerance per dtype; absolute tolerance is this times the magnitude of the
# values that were combined (Partial contributions are large by construction)
_TOL = {
    torch.float64: 1e-9,
    torch.float32: 2e-5,
    torch.float16: 4e-3,
    torch.bfloat16: 3e-2,
}


def tolerance(dtype: torch.dtype) -> float:
    if not dtype.is_floating_point and not dtype.is_complex:
        return 0.0
    return _TOL.get(dtype, 0.15)  # fp8 and friends


def coords(mesh_shape: Sequence[int]) -> list[tuple[int, ...]]:
    """Rank -> mesh coordinate, row-major like DeviceMesh."""
    return list(itertools.product(*(range(s) for s in mesh_shape)))


def _checkerboard(shape: Sequence[int], shift: int) -> torch.Tensor:
    if len(shape) == 0:
        return torch.tensor(shift % 2 == 0)
    grids = torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij")
    return sum(grids, torch.tensor(shift)) % 2 == 0  # type: ignore[return-value]


def _owner(shape: Sequence[int], n: int, shift: int) -> torch.Tensor:
    """Which of n ranks holds the true value of each element (alternates on every axis)."""
    if len(shape) == 0:
        return torch.tensor(shift % n)
    grids = torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij")
    return (sum(grids, torch.tensor(shift))) % n


def split_partial(x: torch.Tensor, reduce_op: str, n: int, idx: int, salt: int) -> torch.Tensor:
    """Rank ``idx``'s contribution of ``x`` under ``Partial(reduce_op)`` over ``n`` ranks."""
    if n == 1:
        return x.clone()
    if x.dtype == torch.bool:
        raise ValueError("bool tensors cannot be Partial")
    floating = x.dtype.is_floating_point
    if reduce_op in ("sum", "avg"):
        if reduce_op == "avg":
            if not floating:
                raise ValueError("Partial(avg) needs a floating dtype")
            x = x * n
        sign = torch.where(_checkerboard(x.shape, salt), 1, -1).to(x.dtype if floating else torch.int64)
        if floating:
            work = x.double()
            off = (work.abs() + 1.0) * sign.double()
            ratio = 0.6 + 0.1 * (salt % 3)
            part = work * ratio + off if idx == 0 else work * ((1 - ratio) / (n - 1)) - off / (n - 1)
            return part.to(x.dtype)
        off = (x.abs() + 1) * sign
        return ((x - (n - 1) * off) if idx == 0 else off).to(x.dtype)
    if reduce_op in ("max", "min"):
        if x.numel() == 0:
            return x.clone()
        span = (x.max() - x.min()).double().item() if floating else int(x.max() - x.min())
        big = span * 2 + 1
        holds = _owner(x.shape, n, salt) == idx
        # a non-owner's offset varies along every dim (big, 2 big or 3 big), so the parts are not
        # x shifted by a constant: their average then is not either, and a shift-invariant op
        # (x - x.mean(-1)) cannot pass a P(max) -> P(avg) claim
        offset = big * (1 + _owner(x.shape, 3, salt + 1 + idx))
        shifted = x - offset if reduce_op == "max" else x + offset
        return torch.where(holds, x, shifted.to(x.dtype))
    raise ValueError(f"unknown Partial reduce op {reduce_op!r}")


# (id of full, its version, placements, mesh shape, coord, salt) -> (full, the rank's piece before
# the final copy). A ground-truth sweep lays out the same input the same way for every combination
# of the other inputs' layouts (thousands of times for a 4-input op). The entry holds ``full``
# itself, so its id cannot be reused while cached, and the version counter makes an in-place write
# a new key.
_LOCAL_MEMO: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]] = {}
_LOCAL_MEMO_LIMIT = 4096


def local_input(
    full: torch.Tensor, placements: NDPlacement, mesh_shape: Sequence[int], coord: Sequence[int], salt: int
) -> torch.Tensor:
    """The tensor rank ``coord`` holds for ``full`` laid out as ``placements`` (a fresh copy)."""
    try:
        key: tuple[Any, ...] | None = (id(full), full._version, tuple(placements), tuple(mesh_shape), tuple(coord), salt)
        hash(key)
    except TypeError:  # an unhashable placement: no memo
        key = None
    entry = _LOCAL_MEMO.get(key) if key is not None else None
    if entry is not None and entry[0] is full:
        piece = entry[1]
    else:
        value = full
        for mesh_dim, p in enumerate(placements):
            if isinstance(p, Partial) and not is_mask(p):  # a masked index: moved into the rank's chunk (masks.py)
                value = split_partial(value, p.reduce_op, mesh_shape[mesh_dim], coord[mesh_dim], salt + 7 * mesh_dim)
        piece = _slice(value, placements, mesh_shape, coord)
        if key is not None:
            if len(_LOCAL_MEMO) >= _LOCAL_MEMO_LIMIT:
                _LOCAL_MEMO.clear()
            _LOCAL_MEMO[key] = (full, piece)
    # keep the memory layout (a column-major weight stays column-major), as DTensor does without redistribution
    return piece.clone(memory_format=torch.preserve_format)


def _slice(t: torch.Tensor, placements: NDPlacement, mesh_shape: Sequence[int], coord: Sequence[int]) -> torch.Tensor:
    shard_placements = [p if isinstance(p, Shard) else Replicate() for p in placements]
    if not any(isinstance(p, Shard) for p in shard_placements):
        return t
    shape, offset = compute_local_shape_and_global_offset(t.shape, tuple(mesh_shape), list(coord), shard_placements)
    out = t
    for d, (size, off) in enumerate(zip(shape, offset)):
        if size != t.shape[d]:
            out = out.narrow(d, min(off, t.shape[d]), size)
    return out


def _reduce(tensors: list[torch.Tensor], op: str) -> torch.Tensor:
    stacked = torch.stack(tensors)
    if op == "sum":
        return stacked.sum(0).to(tensors[0].dtype)
    if op == "avg":
        return stacked.double().mean(0).to(tensors[0].dtype) if stacked.is_floating_point() else stacked.sum(0) // len(tensors)
    if op == "max":
        return stacked.amax(0)
    if op == "min":
        return stacked.amin(0)
    raise ValueError(op)


def check_output(
    locals_: list[torch.Tensor],
    truth: torch.Tensor,
    placements: NDPlacement,
    mesh_shape: Sequence[int],
    tol_scale: float = 1.0,
    masks: Sequence[Masks] = (),
) -> str | None:
    """None if the per-rank ``locals_`` form ``truth`` laid out as ``placements``, else why not.

    ``masks``: per rank, the masks its inputs' masked-partial layouts made (``run_ranks``)."""
    cs = coords(mesh_shape)
    if any(not isinstance(t, torch.Tensor) for t in locals_):
        return "a rank produced a non-tensor output"
    if any(isinstance(p, Partial) for p in placements) and truth.dtype == torch.bool:
        return "bool output cannot be Partial"
    values = list(locals_)
    # Per element, the magnitude of what was combined: a reduction's rounding error grows with
    # the sum of |terms| (Partial contributions are large by construction), not with the result.
    mags = [t.detach().double().abs() if t.is_floating_point() else None for t in values]
    masked: set[Placement] = set()
    for mesh_dim, p in enumerate(placements):
        if not isinstance(p, Partial):
            continue
        if is_mask(p) and (why := mask_outputs(values, mags, p, masks, masked)) is not None:
            return why
        groups: dict[tuple[int, ...], list[int]] = {}
        for r, c in enumerate(cs):
            groups.setdefault(c[:mesh_dim] + c[mesh_dim + 1 :], []).append(r)
        for ranks in groups.values():
            members = [values[r] for r in ranks]
            if any(m.shape != members[0].shape or m.dtype != members[0].dtype for m in members):
                return f"Partial({p.reduce_op}) on mesh dim {mesh_dim}: ranks hold different shapes"
            if p.reduce_op == "avg" and not truth.is_floating_point():
                return "Partial(avg) of a non-floating output"
            reduced = _reduce(members, p.reduce_op)
            mag = None
            if mags[ranks[0]] is not None:  # max/min select exactly: no rounding to account for
                summed = p.reduce_op in ("sum", "avg")
                mag = sum(mags[r] for r in ranks) if summed else reduced.detach().double().abs()
            for r in ranks:
                values[r], mags[r] = reduced, mag
    tol = tolerance(truth.dtype) * tol_scale
    for r, c in enumerate(cs):
        expected = _slice(truth, placements, mesh_shape, c)
        got = values[r]
        if got.shape != expected.shape:
            return f"rank {r}: shape {tuple(got.shape)}, expected {tuple(expected.shape)}"
        if got.dtype != expected.dtype:
            return f"rank {r}: dtype {got.dtype}, expected {expected.dtype}"
        if tol == 0.0:
            if not torch.equal(got, expected):
                return f"rank {r}: values differ"
        elif got.numel():
            g, e = got.double(), expected.double()
            both_nan = torch.isnan(g) & torch.isnan(e)
            diff = torch.where(both_nan, 0.0, (g - e).abs())
            mag = mags[r] if mags[r] is not None else g.abs()
            # elementwise |expected| + |combined terms|, plus their mean as a floor for values near 0
            bound = tol * (e.abs() + mag + float(mag.mean()) + 1e-3)
            if bool((diff > bound).any()) or bool((torch.isnan(diff)).any()):
                return f"rank {r}: max abs diff {float(torch.nan_to_num(diff, nan=math.inf).max()):.3g}"
    return None


@dataclass
class Sample:
    """One call of an op: ``op(*args, **kwargs)`` with real tensors (lists allowed)."""

    args: tuple[Any, ...]
    kwargs: dict[str, Any]

    def tensors(self) -> list[torch.Tensor]:
        return [x for x in pytree.tree_leaves((self.args, self.kwargs)) if isinstance(x, torch.Tensor)]

    def replace_tensors(self, new: Sequence[torch.Tensor]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        it = iter(new)
        return pytree.tree_map(lambda x: next(it) if isinstance(x, torch.Tensor) else x, (self.args, self.kwargs))

    def variant(self, k: int) -> Sample:
        """Variant 0 is the sample; 1 negates every floating input; 2 rescales and shifts each element.

        A combo must reproduce the truth on every variant, so a layout that only works for
        the particular values drawn (equal operands, one-element tensors) does not pass.
        """
        if k == 0:
            return self
        g = torch.Generator().manual_seed(1234 + k)

        def change(t: torch.Tensor) -> torch.Tensor:
            if not t.is_floating_point():
                return t
            if k == 1:
                return -t
            scale = torch.rand(t.shape, generator=g) * 1.5 + 0.5
            shift = torch.randn(t.shape, generator=g)
            return (t.double() * scale + shift).to(t.dtype)

        args, kwargs = self.replace_tensors([change(t) for t in self.tensors()])
        return Sample(args, kwargs)


def as_outputs(result: Any) -> list[torch.Tensor] | None:
    if isinstance(result, torch.Tensor):
        return [result]
    if isinstance(result, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in result):
        return list(result)
    return None


def tensor_salt(salt: int, index: int) -> int:
    """Decorrelated per-tensor salt: which rank owns each element differs between tensors and variants."""
    return random.Random(salt * 1_000_003 + index).randrange(1 << 16)


class RankRun(NamedTuple):
    """One rank's outputs, and the masks its masked-partial inputs made (for ``check_output``)."""

    outputs: list[torch.Tensor]
    masks: Masks


def run_ranks(
    op: Callable[..., Any],
    sample: Sample,
    input_placements: Sequence[NDPlacement | None],
    mesh_shape: Sequence[int],
    salt: int,
) -> list[RankRun] | str:
    """Run ``op`` on every rank's local inputs; per-rank outputs, or the error text."""
    tensors = sample.tensors()
    per_rank: list[RankRun] = []
    for c in coords(mesh_shape):
        try:
            local = [  # cloned: a shard can be a view of the sample, which an in-place op would overwrite
                # None: an out= tensor whose layout is not chosen yet; empty, the op resizes it
                t.new_empty(0) if pl is None else local_input(t, pl, mesh_shape, c, tensor_salt(salt, i)).clone()
                for i, (t, pl) in enumerate(zip(tensors, input_placements))
            ]
            masks = mask_inputs(tensors, local, input_placements, mesh_shape, c)
        except (ValueError, IndexError) as e:  # IndexError: a Shard dim past the tensor's ndim
            return f"cannot lay out inputs: {e}"
        args, kwargs = sample.replace_tensors(local)
        try:
            outs = as_outputs(op(*args, **kwargs))
        except Exception as e:  # the local op rejecting its shard means the layout is invalid
            return f"local op failed: {type(e).__name__}: {e}"
        if outs is None:
            return "op returned no tensors"
        per_rank.append(RankRun(outs, masks))
    return per_rank
