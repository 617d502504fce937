"""The ``hinted_strategy_costs`` patch: upstream's strategy pricing on the sizes' hints.

Oracle: upstream's own ``redistribute_cost`` (``torch.distributed.tensor._collective_utils``) on
the same specs with concrete sizes. A backed size is priced at its example value, an unbacked one
at the fallback, a concrete spec exactly as upstream prices it, and pricing records no guard.
That compiled results do not change is proven by the compile tests, which run with the patch on
(tests/test_moe_compile.py, tests/test_compile_simulated.py, tests/test_rules_compile.py).
"""

from __future__ import annotations

import pytest
import torch
from torch._dynamo.source import ConstantSource
from torch.distributed.tensor._collective_utils import redistribute_cost as upstream_cost
from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
from torch.distributed.tensor._ops import utils as ops_utils
from torch.distributed.tensor.placement_types import Partial, Replicate, Shard
from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv

import dtensor_rules
from dtensor_rules import patches
from dtensor_rules._upstream.hinted_costs import UNBACKED_FALLBACK
from dtensor_rules.testing import simulated_mesh

# (source placements, target placements) on a 2x2 mesh: all-gather, reduce-scatter, all-reduce,
# all-to-all, two steps, and a free local split
MOVES = [
    ((Shard(0), Replicate()), (Replicate(), Replicate())),
    ((Partial(), Replicate()), (Shard(0), Replicate())),
    ((Replicate(), Partial()), (Replicate(), Replicate())),
    ((Shard(0), Shard(1)), (Shard(1), Shard(0))),
    ((Shard(0), Partial()), (Replicate(), Shard(1))),
    ((Replicate(), Replicate()), (Shard(1), Shard(0))),
]


def _spec(mesh, placements, rows, cols=48) -> DTensorSpec:
    return DTensorSpec(mesh, placements, TensorMeta(torch.Size([rows, cols]), (cols, 1), torch.float32))


def _env_sizes() -> tuple[ShapeEnv, torch.SymInt, torch.SymInt]:
    env = ShapeEnv()
    backed = env.create_symintnode(env.create_symbol(37, ConstantSource("tokens"), dynamic_dim=DimDynamic.DYNAMIC),
                                   hint=37)
    return env, backed, env.create_unbacked_symint()


def test_the_patch_is_on_by_default_and_replaces_only_the_expansions_name() -> None:
    assert "hinted_strategy_costs" in patches.defaults() and "hinted_strategy_costs" in patches.applied()
    assert ops_utils.redistribute_cost is not upstream_cost
    with dtensor_rules.installed(patches=[n for n in patches.defaults() if n != "hinted_strategy_costs"]):
        assert ops_utils.redistribute_cost is upstream_cost
    assert ops_utils.redistribute_cost is not upstream_cost


@pytest.mark.parametrize("move", MOVES, ids=str)
def test_symbolic_specs_are_priced_at_their_hints_without_guards(move) -> None:
    src, dst = move
    env, backed, unbacked = _env_sizes()
    with simulated_mesh((2, 2)) as mesh:
        for rows in (37, 6):  # concrete: upstream's own price
            assert ops_utils.redistribute_cost(_spec(mesh, src, rows), _spec(mesh, dst, rows)) == \
                upstream_cost(_spec(mesh, src, rows), _spec(mesh, dst, rows))
        for size, hint in ((backed, 37), (unbacked, UNBACKED_FALLBACK), (backed * 2 + 1, 75)):
            guards = len(env.guards)
            got = ops_utils.redistribute_cost(_spec(mesh, src, size), _spec(mesh, dst, size))
            assert isinstance(got, float)
            assert got == upstream_cost(_spec(mesh, src, hint), _spec(mesh, dst, hint)), (size, hint)
            assert len(env.guards) == guards, env.guards[guards:]


def test_a_spec_with_a_symbolic_stride_only_is_hinted_too() -> None:
    env, backed, _ = _env_sizes()
    with simulated_mesh((2, 2)) as mesh:
        src, dst = MOVES[0]
        meta = TensorMeta(torch.Size([8, 48]), (backed, 1), torch.float32)
        got = ops_utils.redistribute_cost(DTensorSpec(mesh, src, meta), _spec(mesh, dst, 8))
        assert got == upstream_cost(_spec(mesh, src, 8), _spec(mesh, dst, 8))
