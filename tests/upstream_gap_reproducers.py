"""Minimal reproducers of the upstream gaps the package's patches stand in for, on torch alone.

Run by tests/test_upstream_gaps.py in a fresh interpreter (``python -I``, ``--torch-alone``: it
asserts the package was never imported); prints one JSON line: reproducer -> "gap" (torch still
fails), "fixed" (torch behaves) or "error: ..." (the reproducer itself broke on this release).
The names are the patches' (``per_rank_generators``: the fix ``simulated_mesh()`` applies).
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

def fake_mesh(rank):
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", rank=rank, world_size=4)
    return init_device_mesh("cpu", (2, 2))

out: dict[str, str] = {}


def gap(name):
    def deco(fn):
        try:
            out[name] = "gap" if fn() else "fixed"
        except Exception as e:  # the reproducer itself broke: report, never count as fixed
            out[name] = f"error: {type(e).__name__}: {e}"[:300]
        return fn
    return deco

mesh = fake_mesh(0)

@gap("exact_int_partition")
def _():
    from torch.distributed.tensor import Partial
    v = Partial("sum")._partition_value(torch.tensor([3, 5]), mesh, 0)
    return v.dtype.is_floating_point

@gap("meta_fallback")
def _():
    from torch._subclasses.fake_tensor import FakeTensorMode
    a, b, offs = torch.randn(8, 16), torch.randn(2, 16, 8), torch.tensor([4, 8], dtype=torch.int32)
    torch._grouped_mm(a, b, offs=offs)  # the CPU kernel takes fp32
    with FakeTensorMode() as m:
        try:
            torch._grouped_mm(m.from_tensor(a), m.from_tensor(b), offs=m.from_tensor(offs))
        except Exception:
            return True
    return False

@gap("shard_order")
def _():
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta
    order = (ShardOrderEntry(tensor_dim=0, mesh_dims=(1, 0)),)
    spec = DTensorSpec(mesh, (Shard(0), Shard(0)), shard_order=order)
    copy = spec.shallow_copy_with_tensor_meta(TensorMeta(torch.Size([8]), (1,), torch.float32))
    return tuple(copy.shard_order) != order

@gap("flop_registry")
def _():
    from torch.utils.flop_counter import FlopCounterMode, flop_registry
    a, b, offs = torch.randn(8, 16), torch.randn(2, 16, 8), torch.tensor([4, 8], dtype=torch.int32)
    with FlopCounterMode(display=False) as fc:
        torch._grouped_mm(a, b, offs=offs)
    return torch.ops.aten._grouped_mm.default not in flop_registry and fc.get_total_flops() == 0

@gap("first_symbol_record")
def _():
    import torch.fx.experimental.proxy_tensor as pt
    import sympy
    tracer = pt.PythonKeyTracer()
    pt._init_proxy_trackers(tracer)
    s = sympy.Symbol("s0")
    tracer.sympy_expr_tracker[s] = "first"
    tracer.sympy_expr_tracker[s] = "second"
    return tracer.sympy_expr_tracker[s] == "second"  # the last record wins: the cycle's ingredient

@gap("hinted_strategy_costs")
def _():
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta
    from torch.distributed.tensor._ops.utils import redistribute_cost
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv
    from torch._dynamo.source import ConstantSource
    env = ShapeEnv()
    n = env.create_symintnode(env.create_symbol(37, ConstantSource("n"), dynamic_dim=DimDynamic.DYNAMIC), hint=37)
    meta = TensorMeta(torch.Size([n, 48]), (48, 1), torch.float32)
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(shape_env=env):  # what tracing sees: upstream's uncached, symbolic path
        cost = redistribute_cost(DTensorSpec(mesh, (Shard(0), Replicate()), meta), DTensorSpec(mesh, (Replicate(), Replicate()), meta))
    return not isinstance(cost, float) and cost == cost  # a symbolic cost, not a plain number

@gap("cache_miss_hook")
def _():
    from torch.distributed._local_tensor import LocalTensorMode
    from torch.distributed.tensor import Replicate, distribute_tensor
    with LocalTensorMode(frozenset(range(4))):
        x = distribute_tensor(torch.arange(8.0), mesh, [Replicate(), Replicate()])
        try:
            x[x > 3]
        except Exception:
            return True
    return False

@gap("per_rank_generators")
def _():
    from torch.distributed._local_tensor import LocalTensorMode
    with LocalTensorMode(frozenset(range(4))):
        t = torch.randn(4, generator=torch.Generator().manual_seed(1))
    shards = list(t._local_tensors.values())
    return not all(torch.equal(shards[0], s) for s in shards[1:])

@gap("deferred_fma")
def _():
    import torch._inductor.inductor_prims  # noqa: F401  (defines prims.fma; upstream registers its rule)
    from torch.distributed.tensor import DTensor, Partial
    from torch.distributed.tensor._dtensor_spec import TensorMeta
    fma = torch.ops.prims.fma.default
    p = DTensor._op_dispatcher.sharding_propagator
    m = TensorMeta(torch.Size([4]), (1,), torch.float32)
    rows = p.op_single_dim_strategy_funcs[fma](fma, (m, m, m), {})
    return not any(isinstance(x, Partial) for row in rows for x in row)

@gap("torchtitan_rules")
def _():
    import torchtitan.ops.scatter_add  # noqa: F401
    from torch.distributed.tensor import DTensor
    op = torch.ops.torchtitan.deterministic_scatter_add.default
    p = DTensor._op_dispatcher.sharding_propagator
    return not any(op in getattr(p, r) for r in ("op_strategy_funcs", "op_single_dim_strategy_funcs", "op_to_rules"))

@gap("checkpoint_shard_order")
def _():
    mesh = fake_mesh(1)
    from torch.distributed.tensor import DTensor, Shard
    from torch.distributed.tensor._dtensor_spec import DTensorSpec, ShardOrderEntry, TensorMeta
    import torch.distributed.checkpoint.planner_helpers as ph
    # rank 1 is mesh coordinate (0, 1); rows 0..7 split by mesh dim 1 first, then dim 0: rows 4..5
    order = (ShardOrderEntry(tensor_dim=0, mesh_dims=(1, 0)),)
    spec = DTensorSpec(mesh, (Shard(0), Shard(0)), TensorMeta(torch.Size([8]), (1,), torch.float32), shard_order=order)
    dt = DTensor(torch.arange(4.0, 6.0), spec, requires_grad=False)
    return tuple(ph._create_chunk_from_dtensor(dt).offsets) != (4,)

if "--torch-alone" in sys.argv:
    assert not any(m.startswith("dtensor_rules") for m in sys.modules), "the reproducers must run on torch alone"
print(json.dumps({"torch": torch.__version__, "gaps": out}))
