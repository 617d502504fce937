"""Feasibility probe: the dispatch as a custom op + DTensor handler, sizes as tensors, compiled.

Design spike for issue 19 / issue 20 item 4 (docs/design/ragged_expert_placement.md, option D
of section 3). The placement is structure only (``RaggedShard(0, E, aligned)``, no sizes);
the per-expert counts are a tensor. A package-style handler for ``epd_c::dispatch`` (in
DTensor's custom-op handlers) exchanges the counts, runs the local all-to-all op, which reads the split
sizes itself (``.tolist()`` in its eager impl: the one host sync; its fake impl allocates one
unbacked row count) and wraps the result with the ragged placement and the *input's*
global shape (the global row count never depends on the routing). Fake process group of 2
ranks (rank 0; collectives return placeholders): this checks what traces, not values.

    PYTHONPATH=src python benchmarks/experiments/ragged_compile_dispatch_probe.py
"""

from __future__ import annotations

import traceback

import torch
import torch.distributed as dist
from torch._dynamo.testing import CompileCounter
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Shard


class RaggedShard(Shard):
    """Structure-only ragged placement: stable eq/hash, a compile constant."""

    def __init__(self, dim: int, num_partitions: int, aligned: bool) -> None:
        super().__init__(dim)
        self.num_partitions, self.aligned = num_partitions, aligned

    def __eq__(self, other: object) -> bool:
        return type(other) is RaggedShard and (self.dim, self.num_partitions, self.aligned) == (
            other.dim, other.num_partitions, other.aligned)

    def __ne__(self, other: object) -> bool:  # _dtensor_spec.py:392 workaround
        return False if (type(other) is Shard and other.dim == self.dim) else not self.__eq__(other)

    def __hash__(self) -> int:
        return hash((RaggedShard, self.dim, self.num_partitions, self.aligned))

    def __reduce__(self):
        return (RaggedShard, (self.dim, self.num_partitions, self.aligned))

    def __repr__(self) -> str:
        return f"RaggedShard({self.dim}, E={self.num_partitions}, {'aligned' if self.aligned else 'unaligned'})"


lib = torch.library.Library("epd_c", "DEF")
# DTensor-level ops (handlers below); autograd is registered on these, above DTensor's dispatch
lib.define("dispatch(Tensor x, Tensor counts) -> (Tensor, Tensor)")  # -> (x aligned, counts received)
lib.define("combine(Tensor y, Tensor counts, Tensor recv_counts, SymInt rows) -> Tensor")
lib.define("local_a2a(Tensor x, Tensor counts, Tensor recv_counts, int ep) -> Tensor")


@torch.library.impl(lib, "local_a2a", "CompositeExplicitAutograd")
def _local_a2a(x, counts, recv_counts, ep):
    """The token all-to-all; the split sizes are read here (the one host sync), not by the caller."""
    splits = torch.cat([counts.view(ep, -1).sum(1), recv_counts.view(ep, -1).sum(1)]).tolist()
    send, recv = splits[:ep], splits[ep:]
    return funcol.wait_tensor(funcol.all_to_all_single(x, recv, send, dist.group.WORLD))


@torch.library.register_fake("epd_c::local_a2a")
def _local_a2a_fake(x, counts, recv_counts, ep):
    rows = torch.library.get_ctx().new_dynamic_size()  # the received row count: one unbacked SymInt
    return x.new_empty(rows, x.shape[1])


lib.define("local_a2a_back(Tensor g, Tensor counts, Tensor recv_counts, int ep, SymInt rows) -> Tensor")


@torch.library.impl(lib, "local_a2a_back", "CompositeExplicitAutograd")
def _local_a2a_back(g, counts, recv_counts, ep, rows):
    """The combine direction: the transposed splits (no count exchange; the sizes are the forward's)."""
    splits = torch.cat([counts.view(ep, -1).sum(1), recv_counts.view(ep, -1).sum(1)]).tolist()
    send, recv = splits[:ep], splits[ep:]
    return funcol.wait_tensor(funcol.all_to_all_single(g, send, recv, dist.group.WORLD))


@torch.library.register_fake("epd_c::local_a2a_back")
def _local_a2a_back_fake(g, counts, recv_counts, ep, rows):
    return g.new_empty(rows, g.shape[1])  # back to the forward input's rows: a known size


@torch.library.impl(lib, "dispatch", "CompositeExplicitAutograd")
def _dispatch_plain(x, counts):  # plain tensors: one rank, nothing moves
    return x.clone(), counts.clone()


@torch.library.register_fake("epd_c::dispatch")
def _dispatch_fake(x, counts):
    return x.new_empty(x.shape), counts.new_empty(counts.shape)  # global semantics: same rows, regrouped


@torch.library.impl(lib, "combine", "CompositeExplicitAutograd")
def _combine_plain(y, counts, recv_counts, rows):
    return y.clone()


@torch.library.register_fake("epd_c::combine")
def _combine_fake(y, counts, recv_counts, rows):
    return y.new_empty(y.shape)


def _dispatch_setup(ctx, inputs, output):
    x, counts = inputs
    ctx.save_for_backward(counts, output[1])
    ctx.rows = x.to_local().shape[0] if isinstance(x, DTensor) else x.shape[0]


def _dispatch_backward(ctx, grad_y, _grad_recv):
    counts, recv = ctx.saved_tensors
    return torch.ops.epd_c.combine(grad_y, counts, recv, ctx.rows), None


torch.library.register_autograd("epd_c::dispatch", _dispatch_backward, setup_context=_dispatch_setup)


def dispatch_handler(op_call, args, kwargs):
    """What the package's handler would do: the dispatch with sizes taken from the counts tensor."""
    x, counts = args
    mesh = x.device_mesh
    ep = mesh.size(0)
    E = NUM_EXPERTS  # static, from the model config (counts.shape[0] is symbolic under dynamic=True)
    c = counts.to_local()  # this rank's per-expert counts: the partition sizes of x's unaligned layout
    recv = funcol.wait_tensor(funcol.all_to_all_single(c, [E // ep] * ep, [E // ep] * ep, dist.group.WORLD))
    local = torch.ops.epd_c.local_a2a(x.to_local(), c, recv, ep)
    y = DTensor.from_local(local, mesh, (RaggedShard(0, E, True),), run_check=False, shape=x.shape, stride=x.stride())
    # received counts: rank r holds column block r of the (ep, E) routing matrix = Shard(1) of it
    r = DTensor.from_local(recv.view(ep, E // ep), mesh, (Shard(1),), run_check=False, shape=(ep, E),
                           stride=(E, 1))
    return y, r


def combine_handler(op_call, args, kwargs):
    y, counts, recv, rows = args
    mesh = y.device_mesh
    local = torch.ops.epd_c.local_a2a_back(y.to_local(), counts.to_local(), recv.to_local().reshape(-1),
                                           mesh.size(0), rows)
    return DTensor.from_local(local, mesh, (RaggedShard(0, NUM_EXPERTS, False),), run_check=False,
                              shape=y.shape, stride=y.stride())


NUM_EXPERTS = 4


def probe(name, fn):
    torch._dynamo.reset()
    try:
        print(f"OK    {name}: {fn() or ''}")
    except Exception as e:  # noqa: BLE001
        msg = " ".join(str(e).split())
        where = traceback.extract_tb(e.__traceback__)[-1]
        print(f"FAIL  {name}: {type(e).__name__}: {msg[:300]} [at {where.filename.split('site-packages/')[-1]}:{where.lineno}]")


def main() -> None:
    dist.init_process_group("fake", rank=0, world_size=2)
    mesh = init_device_mesh("cpu", (2,))
    handlers = DTensor._op_dispatcher._custom_op_handlers
    handlers[torch.ops.epd_c.dispatch.default] = dispatch_handler
    handlers[torch.ops.epd_c.combine.default] = combine_handler
    E, N, D = 4, 11, 8
    x = DTensor.from_local(torch.randn(6, D), mesh, (RaggedShard(0, E, False),), run_check=False,
                           shape=(N, D), stride=(D, 1))
    counts = DTensor.from_local(torch.tensor([3, 0, 2, 1]), mesh, (Partial(),), run_check=False)

    def block(x, counts):
        y, _ = torch.ops.epd_c.dispatch(x, counts)
        return y.to_local() * 2, y.placements[0].aligned

    probe("eager: handler runs, output RaggedShard(aligned) with the input's global shape",
          lambda: f"placements={torch.ops.epd_c.dispatch(x, counts)[0].placements}, "
                  f"global shape={tuple(torch.ops.epd_c.dispatch(x, counts)[0].shape)}")

    def compiled(dynamic):
        torch._dynamo.config.capture_scalar_outputs = True
        cnt = CompileCounter()
        f = torch.compile(block, backend=cnt, fullgraph=True, dynamic=dynamic)
        out, aligned = f(x, counts)
        x2 = DTensor.from_local(torch.randn(5, D), mesh, (RaggedShard(0, E, False),), run_check=False,
                                shape=(N, D), stride=(D, 1))  # another routing: 5 local rows
        c2 = DTensor.from_local(torch.tensor([1, 4, 0, 0]), mesh, (Partial(),), run_check=False)
        f(x2, c2)
        return f"frames compiled for 2 routings={cnt.frame_count}, ops in graph={cnt.op_count}"
    probe("torch.compile(fullgraph, dynamic=True): handler traced, split sizes unbacked", lambda: compiled(True))
    probe("torch.compile(fullgraph, dynamic=None)", lambda: compiled(None))

    def aot_eager():
        torch._dynamo.config.capture_scalar_outputs = True
        f = torch.compile(block, backend="aot_eager", fullgraph=True, dynamic=True)
        out, _ = f(x, counts)
        return f"local out shape {tuple(out.shape)}"
    probe("aot_eager (AOTAutograd traces the DTensor subclass)", aot_eager)

    def graph_ops():
        torch._dynamo.config.capture_scalar_outputs = True
        graphs = []

        def backend(gm, example_inputs):
            from torch._functorch.aot_autograd import aot_module_simplified

            def fw(g, _):
                graphs.append(g)
                return g.forward
            return aot_module_simplified(gm, example_inputs, fw_compiler=fw)
        torch.compile(block, backend=backend, fullgraph=True, dynamic=True)(x, counts)
        ops = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
        return f"{len(graphs)} forward graph; calls: {', '.join(ops)}"
    probe("the traced forward graph (after DTensor desugaring)", graph_ops)

    def joint():
        torch._dynamo.config.capture_scalar_outputs = True
        graphs = []

        def backend(gm, example_inputs):
            from torch._functorch.aot_autograd import aot_module_simplified

            def keep(g, _):
                graphs.append(g)
                return g.forward
            return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

        def step(x, counts):
            y, _ = torch.ops.epd_c.dispatch(x, counts)
            return (y.to_local() * 2).sum()
        leaf = torch.randn(6, D, requires_grad=True)
        xg = DTensor.from_local(leaf, mesh, (RaggedShard(0, E, False),), run_check=False, shape=(N, D), stride=(D, 1))
        torch.compile(step, backend=backend, fullgraph=True, dynamic=True)(xg, counts).backward()
        bw = [str(n.target) for n in graphs[-1].graph.nodes if n.op == "call_function"]
        return (f"{len(graphs)} graphs (fw + bw); backward calls: {', '.join(bw)}; "
                f"grad of the local leaf: {None if leaf.grad is None else tuple(leaf.grad.shape)}")
    probe("forward + backward compiled (backward = the combine direction, no sync of its own)", joint)
    dist.destroy_process_group()


if __name__ == "__main__":
    print("torch", torch.__version__)
    main()
