"""Every out= and in-place overload we register, validated with the schema's aliasing.

An ``out=`` tensor is an output (its placement is the output's); an in-place ``self`` keeps
its placement. Samples come from the functional op's suite, so no overload goes unchecked.
"""

from __future__ import annotations

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from dtensor_rules._upstream import expand_to_mesh
from torch.distributed.tensor.placement_types import Replicate, Shard

import dtensor_rules  # noqa: F401  (installs the rules)
from dtensor_rules import registry
from dtensor_rules.testing import check_rule, fake_world
from dtensor_rules.testing.aliasing import _written_args, aliased_sample, aliasing, functional_counterpart
from dtensor_rules.testing.masks import is_mask
from dtensor_rules.testing.query import emitted_combos
from dtensor_rules.testing.simulate import Sample
from dtensor_rules.testing.suites import suites
from dtensor_rules.testing.tables import emitted

aten = torch.ops.aten
ALIASED = sorted((op for op in registry.rules() if _written_args(op)), key=str)
# functional overloads without a suite of their own take the samples of an equivalent call
_SUITE_OF = {aten._index_put_impl.default: aten.index_put.default, aten.index_put.hacked_twin: aten.index_put.default}


def _samples(op: torch._ops.OpOverload, limit: int) -> list[tuple[tuple, dict, tuple, dict]]:
    """Up to ``limit`` (aliased args, kwargs, functional args, kwargs) the op accepts.

    In-place calls whose result dtype differs from self's (cumsum_ of int32) are rejected by
    torch and skipped; every op keeps at least one sample.
    """
    func = functional_counterpart(op)
    out = []
    for args, kwargs in suites()[_SUITE_OF.get(func, func)]():
        a, k = aliased_sample(op, args, kwargs)
        try:
            op(*[x.clone() if isinstance(x, torch.Tensor) else x for x in a], **k)
        except RuntimeError:
            continue
        out.append((a, k, args, kwargs))
        if len(out) == limit:
            break
    assert out, f"no suite sample of {func} is accepted by {op}"
    return out


def test_every_aliased_overload_has_a_functional_counterpart() -> None:
    assert len(ALIASED) >= 20
    for op in ALIASED:
        assert functional_counterpart(op) is not None, op


@pytest.mark.parametrize("op", ALIASED, ids=str)
def test_aliased_overload_sound(op: torch._ops.OpOverload) -> None:
    """No emitted strategy is wrong; out= variants offer exactly what the functional op offers
    (but a masked partial, which an out= tensor never holds)."""
    func = functional_counterpart(op)
    for a, k, args, kwargs in _samples(op, limit=1):
        report = check_rule(op, a, k, (2,))
        assert report.ours.error is None, report.ours.error
        assert report.ours.incorrect == 0, report.summary()
        assert report.ours.correct >= report.upstream.correct, report.summary()
        if func in registry.rules():
            functional = check_rule(func, args, kwargs, (2,))
            if aliasing(op, Sample(a, k)).out:
                # less the masked layouts: only a functional gather's dispatch makes the mask (op_rules/gather_mask.py)
                masked = sum(any(is_mask(p) for pl in c[1] for p in pl) for c in emitted(func, args, kwargs))
                assert (report.ours.correct, report.ours.missing) == (functional.ours.correct - masked, functional.ours.missing)
            else:  # in-place: the functional layouts whose output is laid out like self
                assert report.ours.correct <= functional.ours.correct
                assert report.ours.missing <= functional.ours.missing


@pytest.mark.parametrize("op", [aten.cumsum.out, aten.sort.values, aten.cat.out, aten.scatter_add_.default], ids=str)
def test_aliased_overload_sound_on_2d_mesh(op: torch._ops.OpOverload) -> None:
    """N-D ground truth with out= / in-place: per-mesh-dim combos are stacked with the aliasing kept."""
    (a, k, args, kwargs), = _samples(op, limit=1)
    report = check_rule(op, a, k, (2, 2), max_nd_combos=300)
    assert report.ours.error is None and report.ours.incorrect == 0, report.summary()
    assert report.ours.correct > 0
    if aliasing(op, Sample(a, k)).out:
        functional = check_rule(functional_counterpart(op), args, kwargs, (2, 2), max_nd_combos=300)
        assert report.ours.correct == functional.ours.correct


def test_out_tensor_is_laid_out_like_its_output() -> None:
    """cumsum.out offers cumsum's strategies with the out tensor following the result."""
    x = torch.randn(5, 4)
    for mesh in ((2,), (2, 2)):
        base = emitted(aten.cumsum.default, (x, 0), {}, mesh)
        with_out = emitted(aten.cumsum.out, (x, 0), {"out": torch.empty(0)}, mesh)
        assert with_out == {(ins + outs, outs) for ins, outs in base}
        assert len(with_out) > 1  # not only the trivial all-Replicate one


def test_sort_values_two_out_tensors_follow_their_outputs() -> None:
    x = torch.randn(5, 4)
    out = {"values": torch.empty(0), "indices": torch.empty(0, dtype=torch.long)}
    combos = emitted(aten.sort.values, (x, 1), out, (2, 2))
    assert combos == {(ins + outs, outs) for ins, outs in emitted(aten.sort.default, (x, 1), {}, (2, 2))}
    assert any(Shard(0) in outs[0] for _, outs in combos)


def test_inplace_self_keeps_its_placement() -> None:
    """scatter_ offers only scatter's strategies whose output is laid out like self."""
    x, index, src = torch.randn(6, 4), torch.randint(0, 6, (3, 4)), torch.randn(3, 4)
    inplace = emitted(aten.scatter_.src, (x, 0, index, src), {}, (2,))
    functional = emitted(aten.scatter.src, (x, 0, index, src), {}, (2,))
    assert inplace == {(ins, outs) for ins, outs in functional if ins[0] == outs[0]}
    assert inplace != functional  # some functional layouts change self's placement


def test_inplace_ground_truth_is_the_functional_truth_that_keeps_self() -> None:
    """scatter_'s valid layouts are exactly scatter's valid layouts whose output is laid out like self
    (e.g. self P(max) with index/src replicated gives a P(max) result, but R -> P(max) is not in-place)."""
    x, index, src = torch.randn(6, 4), torch.randint(0, 6, (3, 4)), torch.randn(3, 4)
    functional = check_rule(aten.scatter.src, (x, 0, index, src), {}, (2,))
    inplace = check_rule(aten.scatter_.src, (x.clone(), 0, index, src), {}, (2,))
    assert functional.ours.missing == inplace.ours.missing == 0  # so emitted == valid on both sides
    keeps_self = [
        (ins, outs) for ins, outs in emitted(aten.scatter.src, (x, 0, index, src), {}, (2,))
        if ins[0] == outs[0] and not all(p == (Replicate(),) for p in ins)
    ]
    assert inplace.valid == len(keeps_self) < functional.valid


def test_op_strategy_that_redistributes_inplace_self_is_reported() -> None:
    """An op-strategy rule moving self to another placement would write the result into a copy."""
    x, index, src = torch.randn(6, 4), torch.randint(0, 6, (3, 4)), torch.randn(3, 4)
    sample = Sample((x, 0, index, src), {})

    def moves_self(op_schema):  # noqa: ANN001, ANN202 - a deliberately wrong rule
        mesh = op_schema.get_mesh_from_args()
        rows = [[Replicate()] * 4, [Shard(1), Shard(1), Shard(1), Shard(1)]]
        return expand_to_mesh(mesh, op_schema, rows, input_index=1)

    with fake_world(2):
        mesh = init_device_mesh("cpu", (2,))
        with pytest.raises(ValueError, match="redistributes in-place input 0"):
            emitted_combos("op_strategy", moves_self, aten.scatter_.src, sample, mesh)


def test_out_sample_shape_does_not_matter() -> None:
    """An empty out= and a correctly sized one give the same report (the op resizes out)."""
    x = torch.randn(5, 4)
    a = check_rule(aten.cumsum.out, (x, 1), {"out": torch.empty(0)}, (2,))
    b = check_rule(aten.cumsum.out, (x, 1), {"out": torch.empty(5, 4)}, (2,))
    assert (a.valid, a.ours.counts()) == (b.valid, b.ours.counts())
    assert a.ours.correct > 0
