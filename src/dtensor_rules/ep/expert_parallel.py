"""Expert parallelism under DTensor: tokens travel by all-to-all, experts are never gathered.

``shard_moe`` places the experts on "ep", but DTensor runs ``_grouped_mm`` with ``offs``
only on whole experts (a split of the expert dim would move the group boundaries), so
it all-gathers the experts and the tokens: every rank computes every expert.
:func:`expert_parallel` places the parameters the same way and runs the routed-expert
region as a local region instead (``local_map``'s contract, see
:func:`routed_experts_ep`): each rank sends its tokens to the experts' owners
(``dtensor_rules.ep.local``), multiplies by its LOCAL experts only and sends the
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
from dtensor_rules.ep.adapters import EPAdapter, adapter_for, resolve_adapter
from dtensor_rules.ep.checks import check_block, check_tokens_before_forward, mesh_name_error
from dtensor_rules.ep.local import check_dispatch, ep_routed_experts

__all__ = ["EPMesh", "BorrowedEPMesh", "borrowed_ep_mesh", "routed_experts_borrowed", "expert_parallel", "distribute_named", "routed_experts_ep", "token_placements", "expert_param_bytes"]


class EPMesh(NamedTuple):
    """A mesh and the indices of its expert-parallel dim and (optional) tensor-parallel dim.

    Any other dim of ``mesh`` (only with ``expert_parallel(..., placements=...)``) replicates the
    tokens inside the region; the experts are gathered there from the layout they are stored in
    (expert FSDP: their gradients come back in that layout)."""

    mesh: DeviceMesh
    ep_dim: int
    tp_dim: int | None


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
    """``on_ep`` on the ep dim, ``on_tp`` on the tp dim, ``Replicate`` on any other."""
    return tuple(on_ep if i == ep.ep_dim else on_tp if i == ep.tp_dim else Replicate() for i in range(ep.mesh.ndim))


def token_placements(mesh: DeviceMesh, ep_dim: str | int = "ep", tp_dim: str | int | None = "tp", *,
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


def _dim_index(mesh: DeviceMesh, dim: str | int) -> int | None:
    """The index of mesh dim ``dim`` (a name, or an index counted from the front or the back); None if none."""
    if isinstance(dim, int) and not isinstance(dim, bool):
        return dim % mesh.ndim if -mesh.ndim <= dim < mesh.ndim else None
    names = tuple(mesh.mesh_dim_names or ())
    return names.index(dim) if dim in names else None


def _check_mesh(mesh: DeviceMesh, ep_dim: str | int, tp_dim: str | int | None, other_dims: bool = False) -> EPMesh:
    """``ep_dim``/``tp_dim`` as indices; a ``tp_dim`` name the mesh lacks means no tp. Without
    ``other_dims`` the mesh must have no dim besides them (a dp dim belongs to ``fully_shard``)."""
    names = tuple(mesh.mesh_dim_names or ())
    ep = _dim_index(mesh, ep_dim)
    tp = None if tp_dim is None or (isinstance(tp_dim, str) and tp_dim not in names) else _dim_index(mesh, tp_dim)
    bad_tp = tp_dim is not None and not isinstance(tp_dim, str) and tp is None
    if ep is None or bad_tp or tp == ep or (not other_dims and mesh.ndim != 1 + (tp is not None)):
        if isinstance(ep_dim, str) and (tp_dim is None or isinstance(tp_dim, str)):
            raise mesh_name_error(mesh, ep_dim, tp_dim)
        wanted = (ep_dim,) if tp is None else (ep_dim, tp_dim)
        raise ValueError(
            f"expert_parallel needs a mesh whose dims are {wanted} (ep_dim={ep_dim!r}, tp_dim={tp_dim!r}; names or "
            f"indices), got a {mesh.ndim}-D mesh with dim names {names}; for FSDP2 pass the (ep, tp) submesh here "
            "and the dp dim to fully_shard"
        )
    return EPMesh(mesh, ep, tp)


def routed_experts_ep(moe: nn.Module | EPAdapter, ep: EPMesh, x: DTensor, idx: DTensor, weights: DTensor, *,
                      dispatch: str = "per_expert") -> DTensor:
    """The routed experts of ``moe`` (a block or its :class:`EPAdapter`) on DTensor tokens by expert parallelism.

    ``x`` (..., dim), ``idx`` (..., k) and ``weights`` (..., k) are ``Shard(0)`` on ep and
    ``Replicate`` on tp and any other dim (redistributed to that if not); the leading dims are
    flattened per rank. The result (same shape as ``x``) is ``Shard(0)`` on ep, ``Partial`` on
    tp and ``Replicate`` on any other dim.

    The same contract as ``local_map(ep_routed_experts, out_placements, in_placements,
    in_grad_placements)``, written out with ``to_local``/``from_local`` because
    ``local_map`` infers the output's global shape as ``local rows * ep`` (even shards):
    with T not divisible by ep that shape is wrong (and differs between ranks).
    ``dispatch``: see :func:`expert_parallel`.
    """
    a = moe if isinstance(moe, EPAdapter) else adapter_for(moe)
    tokens = _placements(ep, Shard(0), Replicate())
    token_grads = _placements(ep, Shard(0), Partial())  # each tp rank's gradient is its hidden slice's part
    guard_global_sizes(x)  # compiled with 0 or 1 rows on a rank: see _upstream/static_shards.py
    x_l, w_l = (t.redistribute(ep.mesh, tokens).to_local(grad_placements=token_grads) for t in (x, weights))
    idx_l = idx.redistribute(ep.mesh, tokens).to_local()
    dim, k = x_l.shape[-1], idx_l.shape[-1]
    experts = a.experts()
    w_local = [_local_expert(w, ep, role, experts.layout)
               for w, role in zip(experts[:3], ("expert_in", "expert_in", "expert_out"))]
    gdt = a.gmm_dtype or x.dtype
    out = ep_routed_experts(
        x_l.reshape(-1, dim), idx_l.reshape(-1, k), w_l.reshape(-1, k), *w_local,
        n_experts=a.n_experts,
        alignment=a.alignment(gdt),
        group=ep.mesh.get_group(ep.ep_dim),
        gmm_dtype=a.gmm_dtype,
        sum_dtype=x.dtype if a.sum_dtype_is_input else None,
        experts_fn=a.local_experts,
        dispatch=dispatch,
    )
    return DTensor.from_local(out.view(x_l.shape), ep.mesh, token_grads, run_check=False, shape=x.shape,
                              stride=x.stride())


def routed_experts_borrowed(moe: nn.Module | EPAdapter, ep: BorrowedEPMesh, x: DTensor, idx: DTensor,
                            weights: DTensor, *, dispatch: str = "per_expert") -> DTensor:
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
        sum_dtype=x.dtype if a.sum_dtype_is_input else None, experts_fn=a.local_experts, dispatch=dispatch,
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


def _local_expert(w: DTensor, ep: EPMesh, role: str, layout: str) -> torch.Tensor:
    """This rank's part of an expert weight in the layout the region computes with (``Shard(0)`` on
    ep, the hidden split on tp, ``Replicate`` elsewhere); stored otherwise (a solver's choice), it
    is gathered to that layout here and its gradient returns in the stored layout (expert FSDP)."""
    want = _role_placements(ep, role, layout)
    w = w if tuple(w.placements) == want else w.redistribute(ep.mesh, want)
    return w.to_local(grad_placements=want)


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


def expert_parallel(module: nn.Module, mesh: DeviceMesh, ep_dim: str | int = "ep", tp_dim: str | int | None = "tp",
                    adapter: EPAdapter | None = None, *, ep_dims: tuple[str, ...] | None = None,
                    placements: dict[str, tuple[Placement, ...]] | None = None,
                    dispatch: str = "per_expert") -> nn.Module:
    """Distribute ``module`` in place for expert (x tensor) parallelism and route its experts by all-to-all.

    ``module``: this package's ``MoE``, torchtitan 0.3.0's ``MoE``, or any block described
    by ``adapter`` (:class:`~dtensor_rules.ep.adapters.EPAdapter`, docs/expert_parallel.md
    "Any MoE module"). ``mesh`` has the dim ``ep_dim`` and optionally ``tp_dim`` (each a name or
    an index, at any position; a ``tp_dim`` name the mesh lacks means no tp; see the module
    docstring for every layout). Feed it tokens placed with :func:`token_placements`. Raises
    ``ValueError`` if ep does not divide the experts or tp does not divide the hidden dims.

    ``placements``: a layout per qualified parameter/buffer name (e.g. a placement solver's
    choice, ``dtensor_rules.solver.apply_choice``) used instead of the role layouts; names not in
    it keep their role layout. The router and shared expert run as placed under DTensor's rules;
    the experts are stored as placed and the region computes with them ``Shard(0)`` on ep, split
    on hidden on tp and ``Replicate`` elsewhere (gathered inside the region where stored
    otherwise: expert FSDP; gradients return in the stored layout). With it the mesh may have
    dims besides ep and tp: the region replicates the tokens on them.

    ``ep_dims`` (torchtitan's mesh model, docs/expert_parallel.md): ``mesh`` is the
    data/sequence-parallel mesh (e.g. ``("dp_shard", "tp")``), EP borrows ``ep_dims`` of it
    (e.g. ``("tp",)`` for ep = tp, or ``("dp_shard", "tp")``), the other dims are the
    "efsdp" dims (experts ``Replicate`` there, for ``fully_shard``); tokens are split on
    every dim, so no rank sends a token another rank also sends. ``ep_dim``/``tp_dim`` are
    ignored; there is no expert TP in this mode.

    ``dispatch``: ``"per_expert"`` sends a token row per chosen expert (torchtitan's
    ``AllToAllTokenDispatcher`` bytes); ``"per_rank"`` sends it once per destination rank, the
    receiving rank sums its experts' weighted outputs and sends one row back (DeepEP's scheme:
    dispatch and combine bytes times ``E[distinct ranks per token] / k``; the same result up to
    the summation order; docs/expert_parallel.md "Per-rank dispatch").
    """
    check_dispatch(dispatch)
    a = resolve_adapter(module, adapter)
    check_block(module, a)
    if ep_dims is not None:
        bep = borrowed_ep_mesh(mesh, ep_dims)
        n_ep = bep.group.size()
        if a.n_experts % n_ep:
            raise ValueError(f"n_experts={a.n_experts} is not divisible by the ep size {n_ep} (ep_dims={bep.ep_dims})")
        distribute_named(module, mesh, {name: _borrowed_role_placements(bep, role) for name, role in a.roles().items()})
        a.install(functools.partial(routed_experts_borrowed, a, bep, dispatch=dispatch))
        check_tokens_before_forward(module, a, f"token_placements(mesh, ep_dims={bep.ep_dims})")
        return module
    ep = _check_mesh(mesh, ep_dim, tp_dim, other_dims=placements is not None)
    n_ep = mesh.size(ep.ep_dim)
    if a.n_experts % n_ep:
        raise ValueError(
            f"n_experts={a.n_experts} is not divisible by the '{ep_dim}' mesh size {n_ep}: every ep rank must own "
            f"the same number of experts; use an ep size that divides {a.n_experts}"
        )
    if ep.tp_dim is not None:
        n_tp = mesh.size(ep.tp_dim)
        if a.hidden % n_tp:
            raise ValueError(f"hidden={a.hidden} is not divisible by the '{tp_dim}' mesh size {n_tp}")
    layout = a.experts().layout
    plan = {name: _role_placements(ep, role, layout) for name, role in a.roles().items()}
    if placements is not None:
        plan.update(_checked_placements(placements, plan, mesh))
    distribute_named(module, mesh, plan)
    a.install(functools.partial(routed_experts_ep, a, ep, dispatch=dispatch))
    check_tokens_before_forward(module, a, "token_placements(mesh" + (f", ep_dim={ep_dim!r})" if ep_dim != "ep" else ")"))
    return module


def _checked_placements(placements: dict[str, tuple[Placement, ...]], plan: dict[str, tuple[Placement, ...]],
                        mesh: DeviceMesh) -> dict[str, tuple[Placement, ...]]:
    """``placements`` as tuples, refused (ValueError naming the entry) where a name is not one of the
    block's parameters or buffers or a layout does not have one placement per mesh dim."""
    out = {}
    for name, lay in placements.items():
        lay = tuple(lay)
        if name not in plan:
            raise ValueError(f"placements names {name!r}, which is not one of the block's parameters or buffers "
                             f"{sorted(plan)}")
        if len(lay) != mesh.ndim or not all(isinstance(p, Placement) for p in lay):
            raise ValueError(f"placements[{name!r}] = {lay} must hold one Placement per mesh dim ({mesh.ndim})")
        out[name] = lay
    return out


def distribute_named(module: nn.Module, mesh: DeviceMesh, plan: dict[str, tuple[Placement, ...]]) -> None:
    """Replace each parameter or buffer named in ``plan`` (qualified name; None skipped) by a DTensor so placed.

    On a simulated mesh every rank gets its own copy first (``per_rank_copies``), as
    :func:`~dtensor_rules.models.moe.distribute_params` explains. A ``Partial`` placement
    (a counter) starts from zeros on every rank: a counter holding counts raises (reset it first).

    Meta tensors (a model built under ``torch.device("meta")``) become meta DTensors and are
    never read: the values arrive with ``module.to_empty(device=...)`` and the model's own
    init, which must also zero the counters (an uninitialized counter holds garbage).
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
            if not t.is_meta and bool(t.detach().ne(0).any()):
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
