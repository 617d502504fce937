"""The ragged token all-to-all compiles as one opaque node with an unbacked row count.

Fake process group of 2 ranks (rank 0): this checks what traces (the fake implementation), not
values. Two routings with different local row counts must reuse one compiled frame
(``dynamic=True``, ``fullgraph``), i.e. the data-dependent size is an unbacked SymInt inside the
op, not a guard on the routing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounter

import dtensor_rules  # noqa: F401
from dtensor_rules.ragged.ops import ragged_exchange
from dtensor_rules.testing.mesh import fake_world


def _recording_backend() -> tuple[list[torch.fx.GraphModule], CompileCounter, Callable[..., object]]:
    """A fresh Dynamo state and a backend that keeps every graph and counts frames."""
    torch._dynamo.reset()
    graphs: list[torch.fx.GraphModule] = []
    counter = CompileCounter()

    def backend(gm: torch.fx.GraphModule, inputs: list) -> object:
        graphs.append(gm)
        return counter(gm, inputs)

    return graphs, counter, backend


def test_exchange_compiles_once_for_two_routings_as_one_node() -> None:
    graphs, counter, backend = _recording_backend()
    with fake_world(2), torch._dynamo.config.patch(capture_scalar_outputs=True):
        group = dist.group.WORLD.group_name

        def block(x: torch.Tensor, counts: torch.Tensor, recv: torch.Tensor) -> torch.Tensor:
            return ragged_exchange(x, counts, recv, 2, True, group) * 2

        f = torch.compile(block, backend=backend, fullgraph=True, dynamic=True)
        f(torch.randn(6, 8), torch.tensor([3, 0, 2, 1]), torch.tensor([3, 0, 1, 4]))
        f(torch.randn(5, 8), torch.tensor([1, 4, 0, 0]), torch.tensor([3, 0, 1, 4]))
    assert counter.frame_count == 1
    calls = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert calls.count(torch.ops.dtensor_rules.ragged_exchange.default) == 1, calls


def test_dtensor_dispatch_compiles_once_for_two_routings() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    from dtensor_rules import ragged
    from dtensor_rules.ragged import RaggedShard

    graphs, counter, backend = _recording_backend()
    with fake_world(2), torch._dynamo.config.patch(capture_scalar_outputs=True):
        mesh = init_device_mesh("cpu", (2,))

        def make(rows: int, counts: list[int]) -> tuple[DTensor, DTensor]:
            x = DTensor.from_local(torch.randn(rows, 8), mesh, (RaggedShard(0, 4, False),), run_check=False,
                                   shape=(11, 8), stride=(8, 1))
            return x, ragged.counts_from_local(torch.tensor(counts), mesh, 0)

        def block(x: DTensor, counts: DTensor) -> torch.Tensor:
            return ragged.dispatch(x, counts).to_local() * 2

        f = torch.compile(block, backend=backend, fullgraph=True, dynamic=True)
        f(*make(6, [3, 0, 2, 1]))
        f(*make(5, [1, 4, 0, 0]))
    assert counter.frame_count == 1
    calls = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert calls.count(torch.ops.dtensor_rules.ragged_exchange.default) == 1, calls


def _ragged_rows(mesh, rows: int, counts: list[int]):
    from torch.distributed.tensor import DTensor

    from dtensor_rules import ragged
    from dtensor_rules.ragged import RaggedShard

    x = DTensor.from_local(torch.randn(rows, 8), mesh, (RaggedShard(0, 4, False),), run_check=False, shape=(11, 8),
                           stride=(8, 1))
    return x, ragged.counts_from_local(torch.tensor(counts), mesh, 0)


def test_row_ops_between_moves_compile_once_with_explicit_counts() -> None:
    # regression: the lift rule asked DTensor's lru-cached propagator about a schema with SymInt shapes
    # ("unhashable type: non-nested SymInt"): every op on a ragged DTensor failed under dynamic=True
    from torch.distributed.device_mesh import init_device_mesh

    from dtensor_rules import ragged

    graphs, counter, backend = _recording_backend()
    with fake_world(2), torch._dynamo.config.patch(capture_scalar_outputs=True):
        mesh = init_device_mesh("cpu", (2,))

        def block(x, counts):
            y = ragged.dispatch(x, counts)
            return ragged.combine(torch.nn.functional.silu(y) * 2 + 1, counts).to_local()

        f = torch.compile(block, backend=backend, fullgraph=True, dynamic=True)
        f(*_ragged_rows(mesh, 6, [3, 0, 2, 1]))
        f(*_ragged_rows(mesh, 5, [1, 4, 0, 0]))
    assert counter.frame_count == 1
    calls = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert calls.count(torch.ops.dtensor_rules.ragged_exchange.default) == 2, calls


def test_sizes_do_not_cross_a_compiled_op() -> None:
    # why shard_moe(ragged=True) does not compile (docs/expert_parallel.md): the sizes ride on the DTensor as a
    # Python attribute set inside __torch_dispatch__; Dynamo's variable for an op's result never carries it, so a
    # move after an op needs counts= (above) and a clear error names that, never a wrong result
    from torch.distributed.device_mesh import init_device_mesh

    from dtensor_rules import ragged

    torch._dynamo.reset()
    with fake_world(2), torch._dynamo.config.patch(capture_scalar_outputs=True):
        mesh = init_device_mesh("cpu", (2,))
        x, counts = _ragged_rows(mesh, 6, [3, 0, 2, 1])
        assert ragged.context_of(ragged.combine(ragged.dispatch(x, counts) * 2)) is not None  # eager: it does
        f = torch.compile(lambda x, c: ragged.combine(ragged.dispatch(x, c) * 2), backend="aot_eager", fullgraph=True,
                          dynamic=True)
        with pytest.raises(Exception, match="carries no ragged context"):
            f(x, counts)
