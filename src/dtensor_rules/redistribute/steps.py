"""What a search returns: ``Step`` (one collective or local move), ``Plan`` (the steps, cost,
peak memory) and ``NoPlanError``.

Its own module so the plan caches (``cache.py``) and the search (``planner.py``) both use the
type without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dtensor_rules.redistribute.layout import State, format_state

__all__ = ["NoPlanError", "Step", "Plan"]


class NoPlanError(ValueError):
    """No plan exists within the constraints (e.g. the peak-memory cap)."""


@dataclass(frozen=True)
class Step:
    collective: str  # all_gather | reduce_scatter | all_reduce | all_to_all | chunk | partition
    mesh_dims: tuple[int, ...]  # group, major first (its order matters for shard moves)
    src_dim: int | None  # tensor dim gathered / moved from (None for P/R sources)
    dst_dim: int | None  # tensor dim chunked / scattered into (None for R/P targets)
    bytes: int  # bytes moved per rank: output for all_gather, input otherwise
    cost_us: float
    after: State
    after_text: str


@dataclass(frozen=True)
class Plan:
    mesh_shape: tuple[int, ...]
    shape: tuple[int, ...]
    src: State
    dst: State
    steps: tuple[Step, ...]
    cost_us: float
    peak_bytes: int
    reduce_op: str = "sum"
    expanded: int = field(default=0, compare=False)

    def explain(self) -> str:
        """A readable step table: collective, mesh dims, bytes, cost, layout after."""
        rows = [("step", "collective", "mesh dims", "bytes", "cost_us", "layout after")]
        rows.append(("0", "start", "", "", "", format_state(self.src, len(self.mesh_shape))))
        for i, s in enumerate(self.steps, 1):
            dims = ",".join(map(str, s.mesh_dims))
            rows.append((str(i), s.collective, f"({dims})", str(s.bytes), f"{s.cost_us:.1f}", s.after_text))
        widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
        lines = ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in rows]
        lines.append(f"total {self.cost_us:.1f} us, peak {self.peak_bytes} bytes/rank, mesh {self.mesh_shape}, shape {self.shape}")
        return "\n".join(lines)
