"""Plan caches (cache.py): the identity fast path and the layout cache return the right plan, never a stale one."""

from __future__ import annotations

import pytest
import torch
from torch.distributed.tensor import Partial, Replicate, Shard

from dtensor_rules.redistribute import NoPlanError, cache, clear_plan_cache, plan

MESH, SHAPE = (2, 2), (8, 6)
SRC, DST = (Shard(0), Shard(1)), (Replicate(), Shard(0))


@pytest.fixture(autouse=True)
def _fresh():
    clear_plan_cache()
    yield
    clear_plan_cache()


def test_same_immutable_arguments_hit_the_identity_path():
    p = plan(MESH, SHAPE, torch.float32, SRC, DST, src_device_order=(1, 0))
    assert (id(SRC), id(DST)) in cache.BY_ARGS
    assert plan(MESH, SHAPE, torch.float32, SRC, DST, src_device_order=(1, 0)) is not None
    order = (1, 0)
    p2 = plan(MESH, SHAPE, torch.float32, SRC, DST, src_device_order=order)
    assert p2 == p  # equal order, other object: the layout cache answers
    assert plan(MESH, SHAPE, torch.float32, SRC, DST, src_device_order=order) is p2


def _uncached(*args, **kwargs):
    clear_plan_cache()
    try:
        return plan(*args, **kwargs)
    finally:
        clear_plan_cache()


def test_one_src_against_several_dsts_in_turn_stays_on_the_identity_paths():
    dsts = [(Replicate(), Shard(0)), (Shard(1), Shard(0)), (Replicate(), Replicate())]
    want = [_uncached(MESH, SHAPE, torch.float32, SRC, d) for d in dsts]
    first = [plan(MESH, SHAPE, torch.float32, SRC, d) for d in dsts]
    assert first == want
    layouts = len(cache.BY_LAYOUT)
    for _ in range(2):
        for d, p in zip(dsts, first):
            assert plan(MESH, SHAPE, torch.float32, SRC, d) is p  # BY_SRC holds only the last dst: BY_ARGS answers
            assert cache.BY_SRC[id(SRC)][0] is d  # ... and refreshes BY_SRC for the next identical call
    assert len(cache.BY_LAYOUT) == layouts


@pytest.mark.parametrize("changed", ["dst", "mesh", "shape", "dtype", "src_order", "dst_order", "topology", "cap"])
def test_the_inline_path_checks_every_argument(changed: str):
    """Same src object, one other argument replaced: the plan is the uncached one for the new arguments."""
    from dtensor_rules.redistribute import Topology

    src = (Shard(0), Shard(0))  # one tensor dim on both mesh dims: both device orders matter
    args = dict(mesh=MESH, shape=SHAPE, dtype=torch.float32, dst=(Shard(0), Shard(0)), src_order=(1, 0),
                dst_order=None, topology=None, cap=None)
    other = dict(mesh=(4, 1), shape=(6, 8), dtype=torch.float64, dst=(Shard(1), Shard(0)), src_order=(0, 1),
                 dst_order=(1, 0), topology=Topology.node_aware(MESH, 2), cap=188)  # the plan peaks at 192 bytes

    def call(a):
        return plan(a["mesh"], a["shape"], a["dtype"], src, a["dst"], src_device_order=a["src_order"],
                    dst_device_order=a["dst_order"], topology=a["topology"], max_peak_bytes=a["cap"])

    def outcome(a):
        try:
            return call(a)
        except NoPlanError as e:
            return str(e)

    new = dict(args, **{changed: other[changed]})
    want = outcome(new)  # the uncached answer (the fixture cleared the caches)
    clear_plan_cache()
    before = call(args)
    assert want != before  # the changed argument changes the answer (else this test could not catch a stale hit)
    assert cache.BY_SRC[id(src)][-2] is before  # the inline entry is there to be (wrongly) reused
    assert outcome(new) == want


def test_equal_fresh_arguments_share_the_layout_cache():
    p = plan(MESH, SHAPE, torch.float32, SRC, DST)
    q = plan(list(MESH), list(SHAPE), torch.float32, list(SRC), list(DST), src_device_order={0: (0,), 1: (1,)})
    assert q is p


def test_mutable_arguments_are_never_keyed_by_identity():
    shape = [8, 6]
    src, dst = [Shard(0), Shard(1)], [Replicate(), Shard(0)]
    a = plan(MESH, shape, torch.float32, src, dst)
    assert (id(src), id(dst)) not in cache.BY_ARGS and id(src) not in cache.BY_SRC
    shape[0] = 16  # same list object, new contents: a new plan, not the stale one
    src[1] = Partial()
    b = plan(MESH, shape, torch.float32, src, dst)
    assert b.shape == (16, 6) and b.src[1] == 0b10 and a.shape == (8, 6)
    assert b == plan((2, 2), (16, 6), torch.float32, (Shard(0), Partial()), (Replicate(), Shard(0)))


def test_different_dtype_topology_or_cap_is_a_different_entry():
    from dtensor_rules.redistribute import Topology

    p = plan(MESH, SHAPE, torch.float32, SRC, DST)
    assert plan(MESH, SHAPE, torch.float64, SRC, DST).cost_us > p.cost_us
    assert plan(MESH, SHAPE, torch.float32, SRC, DST, topology=Topology.node_aware(MESH, 2)) != p
    assert plan(MESH, SHAPE, torch.float32, SRC, DST, max_peak_bytes=10**9) == p


def test_bad_input_still_raises_after_an_equal_valid_call():
    """A float mesh dim or order entry compares equal to an int: the caches must not let it through."""
    plan(MESH, SHAPE, torch.float32, SRC, DST, src_device_order=(1, 0))
    with pytest.raises(ValueError, match="positive ints"):
        plan((2.0, 2), SHAPE, torch.float32, SRC, DST, src_device_order=(1, 0))
    with pytest.raises(ValueError, match="permutation"):
        plan(MESH, SHAPE, torch.float32, SRC, DST, src_device_order=(1.0, 0))
    with pytest.raises(ValueError, match="entries"):
        plan(MESH, SHAPE, torch.float32, SRC[:1], DST)


def test_clear_plan_cache_forgets_both_levels():
    plan(MESH, SHAPE, torch.float32, SRC, DST)
    assert cache.BY_SRC and cache.BY_ARGS and cache.BY_LAYOUT
    clear_plan_cache()
    assert not cache.BY_SRC and not cache.BY_ARGS and not cache.BY_LAYOUT


def test_unhashable_junk_gets_the_validation_error_not_a_hash_error():
    with pytest.raises(ValueError, match="not supported"):
        plan(MESH, SHAPE, torch.float32, [[0], Shard(1)], DST)
