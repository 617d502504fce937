"""Device orders, layout text form and the errors for bad orders."""

from __future__ import annotations

import pytest
from torch.distributed.tensor import Partial, Replicate, Shard

from dtensor_rules.redistribute import Layout, parse_layout


def test_rank_form_sorts_mesh_dims_by_rank():
    lay = Layout.from_placements((Shard(0), Shard(0), Replicate()), 2, (1, 0, 2))
    assert lay.orders == ((1, 0), ())
    assert str(lay) == "S(0)[1,0]R"


def test_dict_form_equals_rank_form():
    a = Layout.from_placements((Shard(0), Shard(1), Shard(0)), 2, {0: (2, 0)})
    b = Layout.from_placements((Shard(0), Shard(1), Shard(0)), 2, (2, 1, 0))
    assert a == b and a.orders == ((2, 0), (1,))


def test_default_is_left_to_right():
    assert Layout.from_placements((Shard(1), Shard(1)), 2).orders == ((), (0, 1))


@pytest.mark.parametrize("text,mesh_ndim,ndim", [("S(0)[1,0]R", 3, 2), ("PS(1)[2,1]", 3, 2), ("RS(0)[1,2]", 3, 1), ("S(1)S(0)", 2, 2)])
def test_parse_format_roundtrip(text, mesh_ndim, ndim):
    assert str(parse_layout(text, mesh_ndim, ndim)) == text


@pytest.mark.parametrize(
    "order,match",
    [((0, 0, 1), "permutation"), ((0, 1, 3), "permutation"), ((0, 1), "permutation"), ({0: (0, 2)}, "contradicts"),
     ({0: (1,)}, "contradicts"), ({5: ()}, "not a tensor dim")],
)
def test_bad_orders_raise(order, match):
    with pytest.raises(ValueError, match=match):
        Layout.from_placements((Shard(0), Shard(0), Replicate()), 2, order)


def test_bad_text_and_placements_raise():
    with pytest.raises(ValueError, match="cannot parse"):
        parse_layout("S(0)X", 2, 1)
    with pytest.raises(ValueError, match="covers 1 of 2"):
        parse_layout("R", 2, 1)
    with pytest.raises(ValueError, match="mixed Partial"):
        Layout.from_placements((Partial("sum"), Partial("max")), 1)
    with pytest.raises(ValueError, match="shards dim 3"):
        Layout.from_placements((Shard(3), Replicate()), 2)
