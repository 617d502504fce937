"""Ground-truth validation of sharding rules, ours and upstream's side by side.

``check_rule(op, args)`` runs the op on one device for the truth, then for every
combination of input placements (1-D mesh: exhaustive; N-D mesh: every strategy
either rule emits plus products of per-mesh-dim valid combos) simulates each rank's
shards (uneven chunks, asymmetric Partial splits, a negated second variant), runs
the op locally and checks every claimed output placement. A combo counts as valid
only if it reproduces the truth on every variant.
"""

from __future__ import annotations

import itertools
import math
import random
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch._ops import OpOverload
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.placement_types import Partial, Placement, Replicate, Shard

from dtensor_rules import registry
from dtensor_rules.testing.aliasing import Aliasing, aliasing, with_sized_outs
from dtensor_rules.testing.masks import as_layout, is_mask
from dtensor_rules.testing.mesh import fake_world
from dtensor_rules.testing.query import PARTIAL_OPS, Combo, candidate_placements, emitted_combos
from dtensor_rules.testing.simulate import NDPlacement, Sample, as_outputs, check_output, run_ranks

__all__ = ["check_rule", "check_samples", "RuleReport", "RuleCheckError", "SideReport", "format_combo", "missing_reason"]


@dataclass
class SideReport:
    """How one side's rule fares against ground truth."""

    has_rule: bool
    correct: int = 0
    incorrect: int = 0
    missing: int = 0
    incorrect_combos: list[str] = field(default_factory=list)
    missing_combos: list[str] = field(default_factory=list)
    # why each of ``missing_combos`` is missing (same order): what the rule offers instead
    missing_reasons: list[str] = field(default_factory=list)
    error: str | None = None

    def merge(self, other: SideReport) -> None:
        self.has_rule = self.has_rule or other.has_rule
        self.correct += other.correct
        self.incorrect += other.incorrect
        self.missing += other.missing
        self.incorrect_combos += other.incorrect_combos
        self.missing_combos += other.missing_combos
        self.missing_reasons += other.missing_reasons
        self.error = self.error or other.error

    def counts(self) -> dict[str, int]:
        return {"correct": self.correct, "incorrect": self.incorrect, "missing": self.missing}


@dataclass
class RuleReport:
    op: str
    mesh_shape: tuple[int, ...]
    samples: int
    valid: int
    ours: SideReport
    upstream: SideReport
    sampled: bool = False
    # sharded input layouts run against ground truth (N-D mesh: the 1-D ones per mesh dim size, then the
    # N-D candidates); 0: the sample proves nothing
    tried: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "op": self.op,
            "mesh": list(self.mesh_shape),
            "samples": self.samples,
            "ground_truth_valid": self.valid,
            "layouts_tried": self.tried,
            "ours": self.ours.counts(),
            "upstream": self.upstream.counts(),
        }

    def summary(self) -> str:
        def side(name: str, s: SideReport) -> str:
            if not s.has_rule:
                return f"  {name:9s} no rule          missing {s.missing}"
            extra = f"  error: {s.error}" if s.error else ""
            return f"  {name:9s} correct {s.correct:4d}  incorrect {s.incorrect:3d}  missing {s.missing:4d}{extra}"

        mesh = "x".join(map(str, self.mesh_shape))
        lines = [f"{self.op} on mesh {mesh}: {self.valid} valid combos over {self.samples} sample(s), "
                 f"{self.tried} sharded input layouts tried"]
        lines += [side("ours", self.ours), side("upstream", self.upstream)]
        for label, combos in (("ours INCORRECT", self.ours.incorrect_combos), ("upstream INCORRECT", self.upstream.incorrect_combos)):
            for c in combos[:5]:
                lines.append(f"    {label}: {c}")
        return "\n".join(lines)


    def check(self, *, complete: bool = True, replicate_only: bool = False) -> None:
        """Raise :class:`RuleCheckError` unless this report proves our rule right.

        Fails when our rule offers an incorrect layout, misses a valid one (``complete``), or the
        report is vacuous: 0 valid combos means "incorrect 0, missing 0" holds for ANY rule that
        offers nothing. A rule that is Replicate-only by design states it with
        ``replicate_only=True``: then the check is that sharded layouts were tried, none is
        valid, and ours offers none.
        """
        mesh = "x".join(map(str, self.mesh_shape))
        where = f"{self.op} on mesh {mesh} ({self.samples} sample(s))"
        problems = []
        if self.tried == 0:
            problems.append("no sharded input layout could be tried (every tensor too small to shard on this "
                            "mesh?): the check proves nothing; use larger samples")
        if self.ours.error:
            problems.append(f"our rule raised: {self.ours.error}")
        if self.ours.incorrect:
            problems.append(f"our rule offers {self.ours.incorrect} incorrect layout(s): " + "; ".join(self.ours.incorrect_combos[:5]))
        offered = self.ours.correct + self.ours.incorrect
        if replicate_only:
            if self.valid:
                problems.append(f"declared Replicate-only, but ground truth accepts {self.valid} sharded layout(s): "
                                + "; ".join(self.ours.missing_combos[:5] or ["(offered by our rule)"]))
            if offered:
                problems.append(f"declared Replicate-only, but our rule offers {offered} sharded layout(s)")
        elif self.valid == 0 and self.tried:
            problems.append(
                f"0 valid combos of {self.tried} layouts tried: 'incorrect 0, missing 0' would hold for any rule "
                "that offers nothing. Use samples on which some sharded layout is valid, or, if the op is "
                "Replicate-only by design, check that claim: report.check(replicate_only=True)")
        elif complete and self.ours.missing:
            shown = [f"{c} ({why})" for c, why in zip(self.ours.missing_combos[:5], self.ours.missing_reasons)]
            problems.append(f"our rule misses {self.ours.missing} valid layout(s): " + "; ".join(shown))
        if problems:
            raise RuleCheckError(f"{where}: " + "\n  ".join(problems))


class RuleCheckError(AssertionError):
    """A :class:`RuleReport` that does not prove the rule right (see :meth:`RuleReport.check`)."""


def _pstr(p: Placement) -> str:
    if isinstance(p, Replicate):
        return "R"
    if isinstance(p, Shard):
        return f"S({p.dim})"
    if is_mask(p):
        return f"M({p.offset_dim})"
    if isinstance(p, Partial):
        return f"P({p.reduce_op})"
    return str(p)


def format_combo(combo: Combo) -> str:
    ins, outs = combo
    f = lambda pls: ", ".join("".join(_pstr(p) for p in pl) for pl in pls)  # noqa: E731
    return f"({f(ins)}) -> ({f(outs)})"


class _Progress:
    """A dependency-free progress bar on stderr for long validations."""

    def __init__(self, total: int, label: str, enabled: bool) -> None:
        self.total, self.label, self.enabled, self.n = max(total, 1), label, enabled and total > 200, 0

    def step(self) -> None:
        self.n += 1
        if self.enabled and (self.n % 50 == 0 or self.n == self.total):
            filled = int(30 * self.n / self.total)
            sys.stderr.write(f"\r{self.label} [{'#' * filled}{'.' * (30 - filled)}] {self.n}/{self.total}")
            if self.n >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


class _Oracle:
    """Caches per-rank runs per input layout, and answers 'is this combo valid?'.

    ``alias`` names the inputs that are outputs (``out=``, in-place self): a combo is valid
    only if each is laid out like the output it is.
    """

    def __init__(
        self, op: OpOverload, sample: Sample, mesh_shape: tuple[int, ...], tol_scale: float, alias: Aliasing | None = None
    ) -> None:
        self.op, self.mesh_shape, self.tol_scale = op, mesh_shape, tol_scale
        self.alias = alias or Aliasing()
        self.variants: list[tuple[Sample, list[torch.Tensor]]] = []
        for k in (0, 1, 2):
            v = sample.variant(k)
            try:
                # on copies: an in-place / out= op must not overwrite the sample the ranks are cut from
                args, kwargs = v.replace_tensors([t.clone() for t in v.tensors()])
                truth = as_outputs(op(*args, **kwargs))
            except Exception:
                if k == 0:
                    raise
                continue
            if truth is None:
                raise ValueError(f"{op} returned no tensors for this sample")
            self.variants.append((v, truth))
        self.n_out = len(self.variants[0][1])
        self._runs: dict[tuple[NDPlacement, ...], list[Any]] = {}

    def runs(self, inputs: tuple[NDPlacement | None, ...]) -> list[Any]:
        if inputs not in self._runs:
            self._runs[inputs] = [
                run_ranks(self.op, v, inputs, self.mesh_shape, salt=1 + k) for k, (v, _) in enumerate(self.variants)
            ]
        return self._runs[inputs]

    def output_ok(self, inputs: tuple[NDPlacement | None, ...], out_idx: int, placement: NDPlacement) -> bool:
        for (_, truth), per_rank in zip(self.variants, self.runs(inputs)):
            if isinstance(per_rank, str) or len(per_rank[0].outputs) != self.n_out:
                return False
            locals_ = [run.outputs[out_idx] for run in per_rank]
            masks = [run.masks for run in per_rank]
            if check_output(locals_, truth[out_idx], placement, self.mesh_shape, self.tol_scale, masks) is not None:
                return False
        return True

    def aliasing_ok(self, combo: Combo) -> bool:
        ins, outs = combo
        return all(ins[i] == outs[o] for i, o in self.alias.all.items())

    def valid(self, combo: Combo) -> bool:
        ins, outs = combo
        return self.aliasing_ok(combo) and all(self.output_ok(ins, i, pl) for i, pl in enumerate(outs))

    def valid_outputs(self, inputs: tuple[NDPlacement | None, ...], candidates: list[list[NDPlacement]]) -> list[list[NDPlacement]]:
        return [[pl for pl in cands if self.output_ok(inputs, i, pl)] for i, cands in enumerate(candidates)]


def _shardable(t: torch.Tensor, pl: NDPlacement, mesh_shape: Sequence[int]) -> bool:
    shards = [1] * t.ndim
    for size, p in zip(mesh_shape, pl):
        if isinstance(p, Shard):
            if not 0 <= p.dim < t.ndim:
                return False  # a Shard dim past the tensor's ndim cannot be laid out
            shards[p.dim] *= size
    # an unsharded dim is fine at any size, 0 included (empty tensors are legal inputs)
    return all(shards[d] == 1 or t.shape[d] >= shards[d] for d in range(t.ndim))


def _normalize(combo: Combo, in_shapes: Sequence[torch.Size], out_shapes: Sequence[torch.Size]) -> Combo:
    """Shard on a size-1 dim behaves like Replicate, upstream's masked partial like ours: count them once."""

    def norm(pl: NDPlacement, shape: torch.Size) -> NDPlacement:
        # a Shard dim past the tensor's ndim (a rule bug) stays as is and is judged invalid
        return tuple(
            Replicate() if isinstance(p, Shard) and p.dim < len(shape) and shape[p.dim] == 1 else as_layout(p) for p in pl
        )

    ins, outs = combo
    return (
        tuple(norm(p, s) for p, s in zip(ins, in_shapes)),
        tuple(norm(p, s) for p, s in zip(outs, out_shapes)),
    )


def _representable(combo: Combo) -> bool:
    """DTensor cannot hold a tensor Partial with different reduce ops on different mesh dims (sum+avg aside)."""
    for pl in combo[0] + combo[1]:
        ops = {p.reduce_op for p in pl if isinstance(p, Partial)}
        if len(ops) > 1 and ops != {"sum", "avg"}:
            return False
    return True


def _trivial(combo: Combo, skip: Iterable[int] = ()) -> bool:
    """All inputs Replicate (``skip``: out= tensors, which follow the output and are not inputs)."""
    skip = set(skip)
    return all(isinstance(p, Replicate) for i, pl in enumerate(combo[0]) if i not in skip for p in pl)


def _ground_truth_1d(oracle: _Oracle, tensors: list[torch.Tensor], size: int, partial_ops: Sequence[str], progress: bool,
                     tried: list[int] | None = None) -> set[Combo]:
    """Every valid combo on a 1-D mesh: all input layouts x all output placements.

    An ``out=`` tensor is not enumerated as an input: each layout runs once with an empty
    out tensor, and every output placement that passes is confirmed with the out tensor
    laid out as that output (its placement IS the output's). An in-place self is enumerated
    as an input; only outputs laid out like it count.
    """
    outs_of = oracle.alias.out
    in_cands: list[list[NDPlacement | None]] = [
        [None] if i in outs_of else [(p,) for p in candidate_placements(t, partial_ops)] for i, t in enumerate(tensors)
    ]
    out_cands = [[(p,) for p in candidate_placements(t, partial_ops)] for t in oracle.variants[0][1]]
    layouts = [c for c in itertools.product(*in_cands) if not all(pl is None or isinstance(pl[0], Replicate) for pl in c)]
    layouts = [c for c in layouts if all(pl is None or _shardable(t, pl, (size,)) for t, pl in zip(tensors, c))]
    if tried is not None:
        tried.append(len(layouts))
    bar = _Progress(len(layouts), f"{oracle.op} ground truth", progress)
    valid: set[Combo] = set()
    for ins in layouts:
        ok = oracle.valid_outputs(ins, out_cands)
        for outs in itertools.product(*ok):
            full = tuple(outs[outs_of[i]] if i in outs_of else pl for i, pl in enumerate(ins))
            combo = (full, outs)
            if not oracle.aliasing_ok(combo):
                continue
            if outs_of and not oracle.valid(combo):
                continue
            valid.add(combo)
        bar.step()
    return valid


def _side(
    kind_fn: tuple[str, Any] | None,
    op: OpOverload,
    sample: Sample,
    mesh: Any,
) -> tuple[set[Combo] | None, str | None]:
    if kind_fn is None:
        return None, None
    kind, fn = kind_fn
    if kind == "prop_rule":
        return set(), "rule is an output-sharding rule; it offers no strategy list to validate"
    try:
        return emitted_combos(kind, fn, op, sample, mesh), None
    except Exception as e:  # a rule that crashes on a legal input is reported, not hidden
        return set(), f"{type(e).__name__}: {e}"


def check_rule(
    op: OpOverload,
    args: Sequence[Any],
    kwargs: dict[str, Any] | None = None,
    mesh_shape: Sequence[int] | int = (2,),
    *,
    partial_ops: Sequence[str] = PARTIAL_OPS,
    tol_scale: float = 1.0,
    max_nd_combos: int = 3000,
    progress: bool = False,
    seed: int = 0,
) -> RuleReport:
    """Validate our rule and upstream's for ``op(*args, **kwargs)`` on a mesh.

    Returns counts of correct (emitted and valid), incorrect (emitted, wrong result)
    and missing (valid by ground truth, not emitted) combos for each side.
    """
    mesh_shape = (mesh_shape,) if isinstance(mesh_shape, int) else tuple(mesh_shape)
    sample = Sample(tuple(args), dict(kwargs or {}))
    if not sample.tensors():
        raise ValueError(f"{op}: the sample has no tensor arguments to shard")
    sample = with_sized_outs(op, sample)
    tensors = sample.tensors()
    alias = aliasing(op, sample)
    oracle = _Oracle(op, sample, mesh_shape, tol_scale, alias)
    in_shapes = [t.shape for t in tensors]
    out_shapes = [t.shape for t in oracle.variants[0][1]]

    ours_rule = registry.rules().get(op)
    ours_kind_fn = (ours_rule.kind, _ours_info(ours_rule)) if ours_rule else None
    upstream_kind_fn = registry.upstream_strategy(op)

    with fake_world(math.prod(mesh_shape)):
        mesh = init_device_mesh("cpu", mesh_shape)
        emitted = {name: _side(kf, op, sample, mesh) for name, kf in (("ours", ours_kind_fn), ("upstream", upstream_kind_fn))}

    def admitted(c: Combo) -> bool:
        return not _trivial(c, alias.out) and all(_shardable(t, pl, mesh_shape) for t, pl in zip(tensors, c[0])) and oracle.valid(c)

    emitted_any = [c for combos, _ in emitted.values() for c in combos or ()]
    sampled = False
    counted: list[int] = []  # sharded 1-D input layouts each ground truth ran
    if len(mesh_shape) == 1:
        truth = _ground_truth_1d(oracle, tensors, mesh_shape[0], partial_ops, progress, counted)
        tried = counted[0]
        # layouts no enumeration holds (a masked index): an emitted one that reproduces the truth is valid
        truth |= {c for c in emitted_any if c not in truth and admitted(c)}
    else:
        by_size: dict[int, list[Combo]] = {}  # mesh dims of equal size share one 1-D ground truth
        for size in sorted(set(mesh_shape)):
            sub = _Oracle(op, sample, (size,), tol_scale, alias)
            by_size[size] = sorted(_ground_truth_1d(sub, tensors, size, partial_ops, False, counted), key=format_combo)
        per_dim = [by_size[size] for size in mesh_shape]
        products = itertools.product(*per_dim)
        n_products = math.prod(len(d) + 0 for d in per_dim)
        candidates: list[Combo] = [
            c for c in map(_stack, itertools.islice(products, max_nd_combos * 4)) if _representable(c)
        ]
        if n_products > max_nd_combos:
            sampled = True
            candidates = random.Random(seed).sample(candidates, min(max_nd_combos, len(candidates)))
        candidates.extend(emitted_any)
        tried = sum(counted) + sum(1 for c in candidates if not _trivial(c, alias.out))  # 1-D per mesh dim size, then N-D
        bar = _Progress(len(candidates), f"{op} on {mesh_shape}", progress)
        truth = set()
        for c in candidates:
            if admitted(c):
                truth.add(c)
            bar.step()

    norm = lambda c: _normalize(c, in_shapes, out_shapes)  # noqa: E731
    truth_n = {norm(c) for c in truth if not _trivial(norm(c), alias.out)}
    reports = {}
    offered = {name: {norm(c) for c in combos or ()} for name, (combos, _) in emitted.items()}
    described = f"{_describe(tensors)} -> {_describe(oracle.variants[0][1])}"
    for name, (combos, error) in emitted.items():
        if combos is None:
            reports[name] = SideReport(has_rule=False, missing=len(truth_n))
            continue
        good, bad = set(), set()
        for c in combos:
            n = norm(c)
            if _trivial(n, alias.out):
                continue
            (good if (c in truth or oracle.valid(c)) else bad).add(n)
        good -= bad
        missing = sorted(truth_n - good - bad, key=format_combo)
        other = "upstream" if name == "ours" else "ours"
        reports[name] = SideReport(
            has_rule=True,
            correct=len(good),
            incorrect=len(bad),
            missing=len(missing),
            incorrect_combos=sorted(map(format_combo, bad)),
            missing_combos=[format_combo(c) for c in missing],
            missing_reasons=[f"sample {described}: " + missing_reason(c, offered[name], error, other, offered[other]
                                                                    if emitted[other][0] is not None else None)
                             for c in missing],
            error=error,
        )
    return RuleReport(str(op), mesh_shape, 1, len(truth_n), reports["ours"], reports["upstream"], sampled, tried)


def _describe(tensors: Sequence[torch.Tensor]) -> str:
    """``int32[4, 6], int64[4]``: what a sample's tensors are (a reason often depends on the dtypes)."""
    return ", ".join(f"{str(t.dtype).removeprefix('torch.')}{list(t.shape)}" for t in tensors)


def missing_reason(combo: Combo, offered: set[Combo], error: str | None, other: str, other_offered: set[Combo] | None) -> str:
    """Why a rule lacks a layout that ground truth accepts: what it offers for those inputs
    instead (or that it takes no strategy with them), and whether the other side offers it."""
    if error:
        why = f"not offered: the rule raised {error}"
    else:
        instead = sorted(format_combo(((), outs)).removeprefix("() -> ") for ins, outs in offered if ins == combo[0])
        if instead:
            shown = ", ".join(instead[:3]) + (f" and {len(instead) - 3} more" if len(instead) > 3 else "")
            why = f"not offered: for these inputs the rule outputs {shown}"
        else:
            why = "not offered: the rule has no strategy taking these inputs (DTensor redistributes them first)"
    if other_offered is None:
        return f"{why}; {other} has no rule"
    return f"{why}; {other} {'offers it' if combo in other_offered else 'does not offer it either'}"


def _stack(parts: Sequence[Combo]) -> Combo:
    """Per-mesh-dim 1-D combos -> one N-D combo."""
    n_in, n_out = len(parts[0][0]), len(parts[0][1])
    ins = tuple(tuple(part[0][i][0] for part in parts) for i in range(n_in))
    outs = tuple(tuple(part[1][i][0] for part in parts) for i in range(n_out))
    return ins, outs


def _ours_info(rule: registry.Rule) -> Any:
    if rule.kind == "single_dim":
        from dtensor_rules._upstream import SingleDimStrategyInfo

        return SingleDimStrategyInfo(
            func=registry._checked_single_dim(rule), allow_uneven_sharding=rule.allow_uneven_sharding
        )
    return registry._checked_op_strategy(rule)


def check_samples(
    op: OpOverload,
    samples: Iterable[tuple[Sequence[Any], dict[str, Any]]],
    mesh_shape: Sequence[int] | int = (2,),
    **options: Any,
) -> RuleReport:
    """``check_rule`` over several samples, counts summed."""
    total: RuleReport | None = None
    for args, kwargs in samples:
        r = check_rule(op, args, kwargs, mesh_shape, **options)
        if total is None:
            total = r
            continue
        total.samples += 1
        total.valid += r.valid
        total.sampled = total.sampled or r.sampled
        total.tried += r.tried
        total.ours.merge(r.ours)
        total.upstream.merge(r.upstream)
    if total is None:
        raise ValueError(f"no samples given for {op}")
    return total


def report_dict(report: RuleReport) -> dict[str, Any]:
    return asdict(report)
