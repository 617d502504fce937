"""Expert parallelism under DTensor: tokens travel by all-to-all, experts are never gathered.

``shard_moe`` places the experts on "ep", but DTensor runs ``_grouped_mm`` with ``offs``
only on whole experts (a split of the expert dim would move the group boundaries), so
it all-gathers the experts and the tokens: every rank computes every expert.
:func:`expert_parallel` places the parameters the same way and runs the routed-expert
region as a local region instead (``local_map``'s contract, see
:func:`routed_experts_ep`): each rank sends its tokens to the experts' owners
(``dtensor_rules.models.ep_local``), multiplies by its LOCAL experts only and sends the
results back. The router, the shared expert and the combine's inputs stay ordinary
DTensor code under the package's rules.

Layouts (mesh dims by name; "tp" optional):

==================  ===========  ===========  ===========================================
tensor              "ep"         "tp"         why
==================  ===========  ===========  ===========================================
w1, w3 (E, D, H)    Shard(0)     Shard(2)     each rank holds E/ep experts; hidden colwise
w2 (E, H, D)        Shard(0)     Shard(1)     hidden rowwise: the region's output is Partial
gate, expert_bias   Replicate    Replicate    every rank routes its own tokens
shared_w1/w3        Replicate    Shard(0)     colwise Linear
shared_w2           Replicate    Shard(1)     rowwise Linear -> Partial over tp
tokens x (T, D)     Shard(0)     Replicate    data parallel over ep
region output       Shard(0)     Partial      each tp rank sums over its hidden slice
==================  ===========  ===========  ===========================================

Gradients come back in the parameters' own layouts (the region hands each rank's
local gradient back with the parameter's placements): ``w1.grad`` is
``(Shard(0), Shard(2))``, so per-rank expert parameter and gradient bytes are
1/(ep*tp) of the total. The token and routing-weight gradients
are ``Partial`` over tp (each tp rank contributes its hidden slice) and DTensor reduces
them where they meet the replicated router.

torchtitan's mesh model (``expert_parallel(..., ep_dims=...)``, :class:`BorrowedEPMesh`): EP
borrows dims of the data/sequence-parallel mesh, tokens stay split on every dim inside the
region (no token is sent by two ranks, no tp all_reduce), experts are ``Replicate`` on the
remaining "efsdp" dims for ``fully_shard``.

FSDP2 composes on top: build the (ep, tp) mesh as a submesh of a ("dp", "ep", "tp")
mesh, call :func:`expert_parallel` with the submesh, then ``fully_shard(model,
mesh=world["dp"])``; the tokens are a DTensor on the (ep, tp) submesh holding this dp
rank's batch.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Partial, Placement, Replicate, Shard, distribute_tensor

from dtensor_rules._upstream.static_shards import guard_global_sizes
from dtensor_rules.models.ep_adapters import EPAdapter, adapter_for
from dtensor_rules.models.ep_local import ep_routed_experts

__all__ = ["EPMesh", "BorrowedEPMesh", "borrowed_ep_mesh", "routed_experts_borrowed", "expert_parallel", "distribute_named", "routed_experts_ep", "token_placements", "expert_param_bytes"]


class EPMesh(NamedTuple):
    """A mesh and the names of its expert-parallel and (optional) tensor-parallel dims."""

    mesh: DeviceMesh
    ep_dim: str
    tp_dim: str | None


class BorrowedEPMesh(NamedTuple):
    """torchtitan's mesh model: EP borrows ``ep_dims`` of a data/sequence-parallel mesh.

    Every dim of ``mesh`` splits the tokens (each rank routes its own tokens, none is
    sent twice); the experts are ``Shard(0)`` over ``ep_dims`` (in mesh order, so rank
    ``(a, b)`` owns chunk ``a * n_b + b``) and ``Replicate`` on the other ("efsdp") dims,
    where ``fully_shard`` shards them. ``group`` is the ep dims' process group.
    """

    mesh: DeviceMesh
    ep_dims: tuple[str, ...]
    group: dist.ProcessGroup


def _placements(ep: EPMesh, on_ep: Placement, on_tp: Placement) -> tuple[Placement, ...]:
    names = ep.mesh.mesh_dim_names or ()
    return tuple(on_ep if n == ep.ep_dim else on_tp for n in names)


def token_placements(mesh: DeviceMesh, ep_dim: str = "ep", tp_dim: str | None = "tp", *,
                     ep_dims: tuple[str, ...] | None = None) -> tuple[Placement, ...]:
    """Placements of the input tokens for :func:`expert_parallel`: ``Shard(0)`` on ep, ``Replicate`` on tp.

    With ``ep_dims`` (torchtitan's mesh model): ``Shard(0)`` on every mesh dim (each rank its
    own tokens; a (B, L, D) input may instead be ``Shard(1)`` on the sequence-parallel dim)."""
    if ep_dims is not None:
        _check_borrowed(mesh, ep_dims)
        return tuple(Shard(0) for _ in mesh.mesh_dim_names)
    return _placements(_check_mesh(mesh, ep_dim, tp_dim), Shard(0), Replicate())


def _check_borrowed(mesh: DeviceMesh, ep_dims: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(mesh.mesh_dim_names or ())
    ep_dims = tuple(ep_dims)
    if not ep_dims or any(d not in names for d in ep_dims) or len(set(ep_dims)) != len(ep_dims):
        raise ValueError(f"ep_dims={ep_dims} must name distinct dims of the mesh, whose dims are {names}")
    if tuple(d for d in names if d in ep_dims) != ep_dims:
        raise ValueError(f"ep_dims={ep_dims} must be in the mesh's dim order {names} (the experts' Shard(0) nests in it)")
    return ep_dims


def borrowed_ep_mesh(mesh: DeviceMesh, ep_dims: tuple[str, ...]) -> BorrowedEPMesh:
    """The :class:`BorrowedEPMesh` of ``mesh``; several ep dims are flattened into one group."""
    ep_dims = _check_borrowed(mesh, ep_dims)
    if len(ep_dims) == 1:
        group = mesh.get_group(ep_dims[0])
    else:
        from dtensor_rules._upstream import flatten_mesh

        group = flatten_mesh(mesh, ep_dims).get_group()
    return BorrowedEPMesh(mesh, ep_dims, group)


def _check_mesh(mesh: DeviceMesh, ep_dim: str, tp_dim: str | None) -> EPMesh:
    names = tuple(mesh.mesh_dim_names or ())
    wanted = (ep_dim,) if tp_dim is None or tp_dim not in names else (ep_dim, tp_dim)
    if ep_dim not in names or set(names) != set(wanted):
        raise ValueError(
            f"expert_parallel needs a mesh whose dims are named {wanted} (ep_dim={ep_dim!r}, tp_dim={tp_dim!r}), "
            f"got dim names {names}; for FSDP2 pass the (ep, tp) submesh here and the dp dim to fully_shard"
        )
    return EPMesh(mesh, ep_dim, tp_dim if tp_dim in names else None)


def routed_experts_ep(moe: nn.Module | EPAdapter, ep: EPMesh, x: DTensor, idx: DTensor, weights: DTensor) -> DTensor:
    """The routed experts of ``moe`` (a block or its :class:`EPAdapter`) on DTensor tokens by expert parallelism.

    ``x`` (..., dim), ``idx`` (..., k) and ``weights`` (..., k) are ``Shard(0)`` on ep and
    ``Replicate`` on tp (redistributed to that if not); the leading dims are flattened per
    rank. The result (same shape as ``x``) is ``Shard(0)`` on ep and ``Partial`` on tp
    (``Replicate`` without a tp dim).

    The same contract as ``local_map(ep_routed_experts, out_placements, in_placements,
    in_grad_placements)``, written out with ``to_local``/``from_local`` because
    ``local_map`` infers the output's global shape as ``local rows * ep`` (even shards):
    with T not divisible by ep that shape is wrong (and differs between ranks).
    """
    a = moe if isinstance(moe, EPAdapter) else adapter_for(moe)
    tokens = _placements(ep, Shard(0), Replicate())
    token_grads = _placements(ep, Shard(0), Partial())  # each tp rank's gradient is its hidden slice's part
    guard_global_sizes(x)  # compiled with 0 or 1 rows on a rank: see _upstream/static_shards.py
    x_l, w_l = (t.redistribute(ep.mesh, tokens).to_local(grad_placements=token_grads) for t in (x, weights))
    idx_l = idx.redistribute(ep.mesh, tokens).to_local()
    dim, k = x_l.shape[-1], idx_l.shape[-1]
    experts = a.experts()
    w_local = [w.to_local(grad_placements=w.placements) for w in experts[:3]]
    gdt = a.gmm_dtype or x.dtype
    out = ep_routed_experts(
        x_l.reshape(-1, dim), idx_l.reshape(-1, k), w_l.reshape(-1, k), *w_local,
        n_experts=a.n_experts,
        alignment=a.alignment(gdt),
        group=ep.mesh.get_group(ep.ep_dim),
        gmm_dtype=a.gmm_dtype,
        sum_dtype=x.dtype if a.sum_dtype_is_input else None,
        experts_fn=a.local_experts,
    )
    return DTensor.from_local(out.view(x_l.shape), ep.mesh, token_grads, run_check=False, shape=x.shape,
                              stride=x.stride())


def routed_experts_borrowed(moe: nn.Module | EPAdapter, ep: BorrowedEPMesh, x: DTensor, idx: DTensor,
                            weights: DTensor) -> DTensor:
    """The routed experts under torchtitan's mesh model (:class:`BorrowedEPMesh`).

    ``x`` must split its tokens on every mesh dim (a ``Shard`` of a leading dim each, e.g.
    batch on dp_shard and sequence on tp): each rank sends only its own rows, so the output
    and the token gradients keep ``x``'s placements (no ``Partial``, no all_reduce). ``idx``
    and ``weights`` are redistributed to ``x``'s placements. Expert gradients are ``Shard(0)``
    on the ep dims and ``Partial`` on the others (each efsdp rank's part, which FSDP's
    reduce-scatter or ``full_tensor()`` sums).
    """
    a = moe if isinstance(moe, EPAdapter) else adapter_for(moe)
    tokens = tuple(x.placements)
    if any(not isinstance(p, Shard) or p.dim % x.ndim >= x.ndim - 1 for p in tokens):
        raise ValueError(
            f"with ep_dims the tokens must be split on every mesh dim along a leading (token) dim, got {tokens}; "
            "use token_placements(mesh, ep_dims=...)"
        )
    guard_global_sizes(x)  # compiled with 0 or 1 rows on a rank: see _upstream/static_shards.py
    x_l, w_l = (t.redistribute(ep.mesh, tokens).to_local(grad_placements=tokens) for t in (x, weights))
    idx_l = idx.redistribute(ep.mesh, tokens).to_local()
    dim, k = x_l.shape[-1], idx_l.shape[-1]
    names = ep.mesh.mesh_dim_names
    grad_pl = tuple(Shard(0) if n in ep.ep_dims else Partial() for n in names)
    w_local = [w.to_local(grad_placements=grad_pl) for w in a.experts()[:3]]
    gdt = a.gmm_dtype or x.dtype
    out = ep_routed_experts(
        x_l.reshape(-1, dim), idx_l.reshape(-1, k), w_l.reshape(-1, k), *w_local,
        n_experts=a.n_experts, alignment=a.alignment(gdt), group=ep.group, gmm_dtype=a.gmm_dtype,
        sum_dtype=x.dtype if a.sum_dtype_is_input else None, experts_fn=a.local_experts,
    )
    return DTensor.from_local(out.view(x_l.shape), ep.mesh, tokens, run_check=False, shape=x.shape,
                              stride=x.stride())


def _borrowed_role_placements(ep: BorrowedEPMesh, role: str) -> tuple[Placement, ...]:
    """Experts Shard(0) on the ep dims, Replicate on the efsdp dims; everything else Replicate
    (each rank runs the router and shared expert on its own tokens); counters Partial everywhere."""
    names = ep.mesh.mesh_dim_names
    if role in ("expert_in", "expert_out"):
        return tuple(Shard(0) if n in ep.ep_dims else Replicate() for n in names)
    if role == "counter":
        return tuple(Partial() for _ in names)
    if role in ("replicate", "colwise", "rowwise"):
        return tuple(Replicate() for _ in names)
    raise ValueError(f"unknown role {role!r}")


def _role_placements(ep: EPMesh, role: str, layout: str) -> tuple[Placement, ...]:
    R = Replicate()
    hidden_in, hidden_out = (2, 1) if layout == "EDH" else (1, 2)  # where H sits in w1/w3 and in w2
    on_ep_tp = {
        "expert_in": (Shard(0), Shard(hidden_in)),
        "expert_out": (Shard(0), Shard(hidden_out)),
        "replicate": (R, R),
        "colwise": (R, Shard(0)),
        "rowwise": (R, Shard(1)),
        "counter": (Partial(), R),
    }
    if role not in on_ep_tp:
        raise ValueError(f"unknown role {role!r}; use one of {sorted(on_ep_tp)}")
    return _placements(ep, *on_ep_tp[role])


def expert_parallel(module: nn.Module, mesh: DeviceMesh, ep_dim: str = "ep", tp_dim: str | None = "tp",
                    adapter: EPAdapter | None = None, *, ep_dims: tuple[str, ...] | None = None) -> nn.Module:
    """Distribute ``module`` in place for expert (x tensor) parallelism and route its experts by all-to-all.

    ``module``: this package's ``MoE``, torchtitan 0.3.0's ``MoE``, or any block described
    by ``adapter`` (:class:`~dtensor_rules.models.ep_adapters.EPAdapter`, docs/expert_parallel.md
    "Any MoE module"). ``mesh`` has a dim named ``ep_dim`` and optionally one named
    ``tp_dim`` (see the module docstring for every layout). Feed it tokens placed with
    :func:`token_placements`. Raises ``ValueError`` if ep does not divide the experts
    or tp does not divide the hidden dims.

    ``ep_dims`` (torchtitan's mesh model, docs/expert_parallel.md): ``mesh`` is the
    data/sequence-parallel mesh (e.g. ``("dp_shard", "tp")``), EP borrows ``ep_dims`` of it
    (e.g. ``("tp",)`` for ep = tp, or ``("dp_shard", "tp")``), the other dims are the
    "efsdp" dims (experts ``Replicate`` there, for ``fully_shard``); tokens are split on
    every dim, so no rank sends a token another rank also sends. ``ep_dim``/``tp_dim`` are
    ignored; there is no expert TP in this mode.
    """
    a = adapter if adapter is not None else adapter_for(module)
    if ep_dims is not None:
        bep = borrowed_ep_mesh(mesh, ep_dims)
        n_ep = bep.group.size()
        if a.n_experts % n_ep:
            raise ValueError(f"n_experts={a.n_experts} is not divisible by the ep size {n_ep} (ep_dims={bep.ep_dims})")
        distribute_named(module, mesh, {name: _borrowed_role_placements(bep, role) for name, role in a.roles().items()})
        a.install(functools.partial(routed_experts_borrowed, a, bep))
        return module
    ep = _check_mesh(mesh, ep_dim, tp_dim)
    n_ep = mesh.size(mesh.mesh_dim_names.index(ep_dim))
    if a.n_experts % n_ep:
        raise ValueError(
            f"n_experts={a.n_experts} is not divisible by the '{ep_dim}' mesh size {n_ep}: every ep rank must own "
            f"the same number of experts; use an ep size that divides {a.n_experts}"
        )
    if ep.tp_dim is not None:
        n_tp = mesh.size(mesh.mesh_dim_names.index(ep.tp_dim))
        if a.hidden % n_tp:
            raise ValueError(f"hidden={a.hidden} is not divisible by the '{ep.tp_dim}' mesh size {n_tp}")
    layout = a.experts().layout
    distribute_named(module, mesh, {name: _role_placements(ep, role, layout) for name, role in a.roles().items()})
    a.install(functools.partial(routed_experts_ep, a, ep))
    return module


def distribute_named(module: nn.Module, mesh: DeviceMesh, plan: dict[str, tuple[Placement, ...]]) -> None:
    """Replace each parameter or buffer named in ``plan`` (qualified name; None skipped) by a DTensor so placed.

    On a simulated mesh every rank gets its own copy first (``per_rank_copies``), as
    :func:`~dtensor_rules.models.moe.distribute_params` explains. A ``Partial`` placement
    (a counter) starts from zeros on every rank: a counter holding counts raises (reset it first).
    """
    from dtensor_rules._upstream import per_rank_copies

    params = dict(module.named_parameters())
    for name, placements in plan.items():
        owner_name, _, attr = name.rpartition(".")
        owner = module.get_submodule(owner_name)
        t = getattr(owner, attr)
        if t is None:
            continue
        local = per_rank_copies(t.detach())
        if any(isinstance(p, Partial) for p in placements):
            if bool(t.detach().ne(0).any()):
                raise ValueError(f"{name} is a counter (Partial on ep) but holds counts: zero it before expert_parallel")
            d = DTensor.from_local(local, mesh, placements, run_check=False)
        else:
            d = distribute_tensor(local, mesh, placements)
        if name in params:
            setattr(owner, attr, nn.Parameter(d, t.requires_grad))
        else:
            setattr(owner, attr, d)


def expert_param_bytes(module: nn.Module, adapter: EPAdapter | None = None) -> tuple[int, int]:
    """(bytes of w1+w3+w2 held by this rank, bytes of their gradients held by this rank)."""

    def local(t: torch.Tensor | None) -> int:
        if t is None:
            return 0
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    ws = tuple((adapter or adapter_for(module)).experts()[:3])
    return sum(local(w) for w in ws), sum(local(w.grad) for w in ws)
