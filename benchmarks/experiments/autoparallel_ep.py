"""What AutoParallel is offered, and chooses, for the MoE block with its routed experts as one op.

Not part of CI: AutoParallel (https://github.com/meta-pytorch/autoparallel) is not on the
package registry. Pass a checkout of it; nothing of it is copied here.

The block is ``dtensor_rules.models.moe.MoE`` with ``routed_region = routed_experts_as_op`` (the
routed experts as ONE op, ``dtensor_rules::routed_experts``, whose DTensor rule offers experts
``Shard(0)`` among its rows), this package's rules installed in DTensor's propagator, a fake
process group (no rank runs), and AutoParallel as it is at that checkout: its own tracing,
strategy enumeration, cost model (its H100 compute limits standing in for a CUDA device; its
default collective model when no CUDA device is found) and ILP. Printed: AutoParallel's revision, the rows it is
offered for the forward and backward routed-experts nodes (the expert-parallel ones marked),
what it chooses for them and for every parameter, and what happens when it applies the choice
(``apply_placement``) and runs the parallel module's forward: where it stops, with the frames of
its own code and of the op in the traceback.

    python benchmarks/experiments/autoparallel_ep.py /path/to/autoparallel              # LITE layer, (2, 4)
    python benchmarks/experiments/autoparallel_ep.py /path/to/autoparallel --mesh 4x8
    python benchmarks/experiments/autoparallel_ep.py /path/to/autoparallel --small      # small block, fast
    python benchmarks/experiments/autoparallel_ep.py /path/to/autoparallel --probe-handler   # the proposed apply change

``--probe-handler`` patches, in this process only, the apply-step change the design page proposes
and registers a PROBE handler for the routed-experts ops (shape-only stand-in, not the EP
computation) that records whether DTensor dispatch reaches it from AutoParallel's retrace, and with
which placements.

docs/design/autoparallel_ep.md reads the result: which of AutoParallel's lines stops the
expert-parallel choice and the smallest change there.
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import traceback
from pathlib import Path

import torch
from torch.distributed.tensor.placement_types import Replicate, Shard

LITE = dict(dim=2048, hidden=1408, n_experts=64, top_k=6, n_shared=2)
SMALL = dict(dim=16, hidden=32, n_experts=8, top_k=2, n_shared=1)


def _pl(layout: tuple) -> str:
    return "(" + ", ".join("R" if p.is_replicate() else f"S({p.dim})" if p.is_shard() else "P" for p in layout) + ")"


def _report(e: BaseException) -> None:
    """The error and the frames of AutoParallel's code and of the op that raised it."""
    frames = [f for f in traceback.extract_tb(e.__traceback__)
              if "autoparallel" in f.filename or "routed_experts" in f.filename or "fx/interpreter" in f.filename]
    print(f"  FAILED: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    for f in frames[-8:]:
        print(f"    {f.filename.split('site-packages/')[-1]}:{f.lineno} {f.name}: {f.line}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("autoparallel", type=Path, help="path of an AutoParallel checkout (the repository root)")
    ap.add_argument("--mesh", default="2x4", help="mesh shape, e.g. 2x4 (default) or 4x8")
    ap.add_argument("--small", action="store_true", help="the small block (dim 16, 8 experts, 64 tokens)")
    ap.add_argument("--tokens", type=int, default=None, help="tokens (default 16384, --small 64)")
    ap.add_argument("--probe-handler", action="store_true",
                    help="check the proposal's apply-step change: ops with a DTensor custom handler run on "
                         "DTensors; a PROBE handler (shape-only stand-in, not the EP computation) records "
                         "that it is reached and with which placements")
    ap.add_argument("--ep-forward", action="store_true",
                    help="with --probe-handler: the forward handler runs expert_parallel's local step (the "
                         "tokens' all-to-alls) on an EP row instead of the stand-in")
    ap.add_argument("--dynamic", action="store_true", help="AutoParallel(..., dynamic=True): a ShapeEnv for its "
                                                           "fake mode (the dispatch's received rows are unbacked)")
    args = ap.parse_args(argv)
    root = args.autoparallel.resolve()
    if not (root / "autoparallel" / "api.py").exists():
        ap.error(f"{root} is not an AutoParallel checkout (no autoparallel/api.py)")
    sys.path.insert(0, str(root))
    rev = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%H %cs"], capture_output=True, text=True)
    print(f"AutoParallel {rev.stdout.strip() or '(not a git checkout)'} at {root}; torch {torch.__version__}")

    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from autoparallel.api import AutoParallel
    from autoparallel.cost_models import compute_estimation

    # AutoParallel prices compute from the CUDA device's name (its DEVICE_LIMITS table); on a CPU
    # machine there is none, so its own H100 row stands in (the only change to it in this process)
    h100 = next(limit for limit in compute_estimation.DEVICE_LIMITS if limit.name == "H100")
    compute_estimation._get_device_limit = lambda: h100

    import dtensor_rules
    from dtensor_rules.models.moe import MoE, MoEConfig
    from dtensor_rules.ep.routed_op import routed_experts_as_op
    from dtensor_rules.ep.routed_experts_rule import EXPERT_ARGS

    shape = tuple(int(s) for s in args.mesh.split("x"))
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=math.prod(shape))
    mesh = torch.distributed.device_mesh.init_device_mesh(
        "cpu", shape, mesh_dim_names=tuple(f"d{i}" for i in range(len(shape))))
    dtensor_rules.install()
    sizes = SMALL if args.small else LITE
    tokens = args.tokens or (64 if args.small else 16384)
    config = MoEConfig(**sizes, gmm_dtype=torch.bfloat16)
    with torch.device("meta"):
        model = MoE(config)
    model.routed_region = routed_experts_as_op
    print(f"block: {config}; {tokens} tokens; mesh {shape}")

    def input_fn() -> torch.Tensor:
        return torch.randn(tokens, config.dim)

    reached: list[str] = []
    if args.probe_handler:
        _install_probe(reached, args.ep_forward)
    with AutoParallel(model, input_fn, mesh, dynamic=args.dynamic) as autop:
        autop.add_input_constraints([(Shard(0),) * len(shape)])
        autop.add_output_constraints([(Shard(0),) * len(shape)])
        placement = autop.optimize_placement()
        opt = autop.sharding_optimizer
        by_name = {n.name: spec for n, spec in placement.items()}
        for node, strat in opt.strats.items():
            w = EXPERT_ARGS.get(getattr(node, "target", None))
            if w is None:
                continue
            names = ("grad, " if w == 4 else "") + "x, idx, weights, w1, w3, w2"
            print(f"\n{node.name} ({node.target}): {len(strat.strategies)} rows offered "
                  f"(inputs: {names}; EP = experts Shard(0) on a mesh dim)")
            for s in strat.strategies:
                ins = [_pl(sp.placements) for sp in s.input_specs]
                ep = any(p == Shard(0) for p in s.input_specs[w].placements)
                print(f"  {'EP ' if ep else '   '}ins {' '.join(ins)}")
            chosen = by_name[node.name]
            print(f"  CHOSEN: ins {' '.join(_pl(sp.placements) for sp in chosen.input_specs)}")
        print("\nparameters chosen:")
        for node, spec in placement.items():
            if node.op == "placeholder" and "param" in type(node.meta.get("desc")).__name__.lower():
                print(f"  {node.meta['desc']}: {_pl(spec.output_specs.placements)}")
        print("\napply_placement (AutoParallel retraces the graph on local shards):")
        try:
            parallel = autop.apply_placement(placement)
        except Exception as e:  # noqa: BLE001  the point of the experiment: where it stops
            _report(e)
            parallel = None
    if parallel is not None:
        print("  applied; running the parallel module's forward on this rank's tokens (fake process group):")
        parallel.to_empty(device="cpu")
        with torch.no_grad():
            for p in parallel.parameters():
                p.normal_()
        local_tokens = torch.randn(tokens // math.prod(shape), config.dim)
        try:
            parallel(local_tokens)
            print("  forward ran")
        except Exception as e:  # noqa: BLE001
            _report(e)
    if args.probe_handler:
        print(f"\nprobe handler reached {len(reached)} time(s):")
        for r in reached:
            print(f"  {r}")
    dist.destroy_process_group()


def _ep_forward(args: tuple) -> "torch.Tensor":
    """The EP forward on this rank's shards: ``expert_parallel``'s local step over the ep dims' group."""
    from torch.distributed.tensor import DTensor

    from dtensor_rules.ep.local import ep_routed_experts
    from dtensor_rules.ep.expert_parallel import borrowed_ep_mesh

    x, idx, weights, w1, w3, w2, n_experts, alignment, gmm_dtype = args
    mesh = x.device_mesh
    ep_dims = tuple(mesh.mesh_dim_names[m] for m, p in enumerate(w1.placements) if p == Shard(0))
    group = borrowed_ep_mesh(mesh, ep_dims).group
    out = ep_routed_experts(x.to_local(), idx.to_local(), weights.to_local(), w1.to_local(), w3.to_local(),
                            w2.to_local(), n_experts=n_experts, alignment=alignment, group=group, gmm_dtype=gmm_dtype)
    return DTensor.from_local(out, mesh, x.placements, run_check=False, shape=x.shape, stride=x.stride())


def _install_probe(reached: list[str], ep_forward: bool = False) -> None:
    """The proposal's apply-step change, in this process only, without copying AutoParallel's code:
    when its ``ApplyShardingInterpreter`` calls an op that has a DTensor custom handler, the local
    shards are wrapped as DTensors with the chosen input specs (its line 292 unwraps the outputs);
    and a probe handler for the routed-experts ops that records the placements it gets and returns
    outputs of the right shapes and placements (garbage values: NOT expert parallelism)."""
    from torch.distributed.tensor import DTensor
    from torch.fx import Interpreter
    from torch.utils._pytree import tree_map_only

    from autoparallel.apply_sharding import ApplyShardingInterpreter
    from dtensor_rules.ep.routed_experts_rule import ROUTED_EXPERTS, ROUTED_EXPERTS_BACKWARD

    handlers = DTensor._op_dispatcher._custom_op_handlers
    plain = Interpreter.call_function

    def call_function(self, target, args, kwargs):  # type: ignore[no-untyped-def]
        node = getattr(self, "_curr_node", None)
        if isinstance(self, ApplyShardingInterpreter) and target in handlers and node in self.sharding_placement:
            specs = iter(self.sharding_placement[node].input_specs)

            def wrap(t: torch.Tensor) -> DTensor:
                s = next(specs)
                return DTensor.from_local(t, s.mesh, s.placements, run_check=False, shape=s.tensor_meta.shape,
                                          stride=s.tensor_meta.stride)

            args = tree_map_only(torch.Tensor, wrap, tuple(args))
        return plain(self, target, args, kwargs)

    Interpreter.call_function = call_function

    def probe(op, args, kwargs):  # type: ignore[no-untyped-def]
        tensors = [a for a in args if isinstance(a, DTensor)]
        reached.append(f"{op}: " + " ".join(_pl(t.placements) for t in tensors))
        if op is ROUTED_EXPERTS and ep_forward and any(p == Shard(0) for p in tensors[3].placements):
            return _ep_forward(args)
        if op is ROUTED_EXPERTS:
            x = tensors[0]
            return DTensor.from_local(torch.zeros_like(x.to_local()), x.device_mesh, x.placements, run_check=False,
                                      shape=x.shape, stride=x.stride())
        return tuple(DTensor.from_local(torch.zeros_like(t.to_local()), t.device_mesh, t.placements, run_check=False,
                                        shape=t.shape, stride=t.stride()) for t in tensors[1:3] + tensors[4:7])

    handlers[ROUTED_EXPERTS] = probe
    handlers[ROUTED_EXPERTS_BACKWARD] = probe


if __name__ == "__main__":
    main()
