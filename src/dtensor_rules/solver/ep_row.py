"""Run what a solver chose for the routed-experts op (``ep/routed_experts_rule.py``) through ``expert_parallel``.

With the block's routed experts as one op (``ep/routed_op.py``), the solver's choice for
them is that node's row: how the op READS the experts and tokens. The parameters' chosen
layouts say only how they are STORED (a replicated expert weight can be read ``Shard(0)`` for
free, a local chunk). So the expert-parallel configuration comes from the row:

==================================================  ===============================================
the forward routed-experts row                      ``expert_parallel`` call
==================================================  ===============================================
no mesh dim with the experts ``Shard(0)``           none: DTensor's rules run the op (``place_choice``)
tokens ``Shard(0)`` on every mesh dim, experts      torchtitan's model: ``ep_dims`` = those dims
``Shard(0)`` on some dims and ``Replicate`` on      (flattened into one group when several), each
the others                                          rank sends only its own tokens
experts ``Shard(0)`` on one mesh dim, otherwise     ``ep_dim`` = that dim, ``tp_dim`` = the dim
(tokens replicated somewhere)                       splitting them on hidden (if any),
                                                    ``placements`` = the chosen storage
==================================================  ===============================================

Under torchtitan's model the parameters other than the experts are then moved to their chosen
layouts (``expert_parallel`` places them ``Replicate``); the experts must be stored as that
model keeps them (``Shard(0)`` on the ep dims, ``Replicate`` elsewhere), else ``ValueError``.
"""

from __future__ import annotations

from typing import NamedTuple

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard

from dtensor_rules.models.moe import MoE
from dtensor_rules.solver.choose import Choice
from dtensor_rules.solver.query import Layout

__all__ = ["ExpertRow", "expert_row", "place_expert_row"]

_EXPERTS = ("w1", "w3", "w2")


class ExpertRow(NamedTuple):
    """How the chosen forward routed-experts row reads its inputs."""

    tokens: Layout
    experts: tuple[Layout, Layout, Layout]  # w1, w3, w2
    ep_dims: tuple[int, ...]  # the mesh dims where every expert weight is Shard(0)


def expert_row(choice: Choice) -> ExpertRow | None:
    """The chosen row of the traced step's forward routed-experts node; None if the block has none."""
    name = choice.routed_experts_node
    if name is None:
        return None
    row = choice.problem.choices[name].rows[choice.solution.choice[name]]
    experts = tuple(row.ins[3:6])
    ep_dims = tuple(m for m in range(len(row.ins[0]))
                    if all(isinstance(w[m], Shard) and w[m].dim == 0 for w in experts))
    return ExpertRow(row.ins[0], experts, ep_dims)  # type: ignore[arg-type]


def place_expert_row(module: MoE, mesh: DeviceMesh, choice: Choice) -> MoE:
    """``module`` placed as ``choice`` (in place), its routed experts run as the chosen row says
    (module table); call it on tokens laid out as ``choice.input_layout``. Under torchtitan's
    model ``mesh`` needs dim names (``expert_parallel``'s ``ep_dims`` names them)."""
    from dtensor_rules.ep.expert_parallel import expert_parallel
    from dtensor_rules.solver.apply import place_choice

    params = {k: tuple(v) for k, v in choice.params.items()}
    row = expert_row(choice)
    if row is None or not row.ep_dims:
        return place_choice(module, mesh, params)
    others = [m for m in range(mesh.ndim) if m not in row.ep_dims]
    if all(p == Shard(0) for p in row.tokens) and all(w[m] == Replicate() for w in row.experts for m in others):
        names = mesh.mesh_dim_names
        if names is None:
            raise ValueError("this choice runs expert_parallel(..., ep_dims=...), which names mesh dims: "
                             "build the mesh with mesh_dim_names")
        for w in _EXPERTS:
            want = tuple(Shard(0) if m in row.ep_dims else Replicate() for m in range(mesh.ndim))
            if params[w] != want:
                raise ValueError(f"{w} is stored {params[w]} but torchtitan's model (ep_dims) keeps it {want}")
        expert_parallel(module, mesh, ep_dims=tuple(names[m] for m in row.ep_dims))
        for name, lay in params.items():
            p = getattr(module, name)
            if name not in _EXPERTS and isinstance(p, DTensor) and tuple(p.placements) != lay:
                setattr(module, name, nn.Parameter(p.detach().redistribute(mesh, lay), p.requires_grad))
        return module
    if len(row.ep_dims) != 1:
        raise ValueError(f"experts Shard(0) on mesh dims {row.ep_dims} with tokens {row.tokens}: several ep dims "
                         "run only with the tokens Shard(0) on every mesh dim (torchtitan's model)")
    ep = row.ep_dims[0]
    want = {"w1": Shard(2), "w3": Shard(2), "w2": Shard(1)}
    tp = next((m for m in others if all(row.experts[i][m] == want[w] for i, w in enumerate(_EXPERTS))), None)
    return expert_parallel(module, mesh, ep_dim=ep, tp_dim=tp, placements=params)
