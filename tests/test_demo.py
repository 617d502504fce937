"""``python -m dtensor_rules demo``: runs clean end to end, and its checks can fail."""

from __future__ import annotations

import io

import pytest
import torch
from expecttest import TestCase

import dtensor_rules  # noqa: F401
from dtensor_rules.cli import demo
from dtensor_rules.cli.ui import Steps, table
from tests._fresh import run_python


@pytest.mark.slow
def test_demo_command_exits_zero_and_every_check_holds() -> None:
    run = run_python(module="dtensor_rules", args=["demo"])  # a fresh process (tests/_fresh.py)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    for title in ("1. the MoE block", "2. op coverage", "3. sharded = single device", "4. redistribute", "5. per-op cost",
                  "6. expert parallel"):
        assert f"== {title}" in out
    assert "every op has a rule: yes" in out
    assert "sharded = single device: yes" in out
    assert "full_tensor() == input: True" in out
    assert "no all_gather in forward or backward: yes" in out
    assert "FAIL" not in out
    assert "Traceback" not in run.stderr and "[rank" not in run.stderr  # torch's log chatter is silenced


def test_demo_rejects_a_mesh_it_cannot_use(capsys) -> None:
    assert demo.run_demo((4,)) == 2
    assert "2-D ('ep', 'tp') mesh" in capsys.readouterr().err
    assert demo.run_demo((3, 1)) == 2
    assert "must divide n_experts=4" in capsys.readouterr().err


def test_tolerance_check_rejects_a_wrong_result() -> None:
    """The demo's 'ok' is not a formality: one wrong element fails it, in both dtypes."""
    want = torch.randn(8, 4, generator=torch.Generator().manual_seed(0))
    for dtype, bump in ((torch.float32, 1e-3), (torch.bfloat16, 0.1)):
        w = want.to(dtype)
        bad = w.clone()
        bad[3, 2] += bump * w.abs().max()
        assert demo.within_tolerance(w.clone(), w, dtype)
        assert not demo.within_tolerance(bad, w, dtype)
    rows = demo.compare(["t"], [[want, want + 1]], [want], torch.float32)  # one rank's copy is off
    assert rows[0][0] == "t" and abs(rows[0][1] - 1.0) < 1e-6 and rows[0][2] is False


def test_flop_rows_counts_what_torch_prices_at_zero_and_restores_registrations() -> None:
    from torch.utils import flop_counter as fc

    from dtensor_rules.costs.flop_counter import registered_flop_formulas

    before, ours_before = set(fc.flop_registry), set(registered_flop_formulas())
    assert ours_before == {torch.ops.aten._grouped_mm}  # torch's convention: matmul-like work only
    model = demo.demo_model(torch.float32, permute_impl="torch")
    x, cot = demo.demo_inputs(torch.float32, (10, demo.DEMO_CONFIG.dim))
    rows = {r["op"]: r for r in demo.flop_rows(model, x, cot)}
    # ours unregistered for the torch-only count, then registered again
    assert (set(fc.flop_registry), set(registered_flop_formulas())) == (before, ours_before)
    mm = rows["aten.mm.default"]
    assert mm["torch_flops"] == mm["our_flops"] > 0  # torch's own formula is never replaced
    histc = rows["aten.histc.default"]  # integer-valued counting: 0 in FlopCounterMode with or without us
    assert (histc["calls"], histc["torch_flops"], histc["our_flops"]) == (1, 0, 0)
    assert rows["aten._grouped_mm.default"]["torch_flops"] == 0 < rows["aten._grouped_mm.default"]["our_flops"]


def test_steps_bar_draws_only_on_a_terminal() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    for stream, drawn in ((io.StringIO(), False), (Tty(), True)):
        out = io.StringIO()
        with Steps("work", 2, out, stream=stream) as s:
            s.step("first")
            s.step("second")
        assert ("work [############............] 1/2" in stream.getvalue()) == drawn
        assert out.getvalue().startswith("(work: 2 steps in ")


class TestDemoGolden(TestCase):
    def test_table_layout(self) -> None:
        self.assertExpectedInline(table([("a", 1, "x"), ("long name", 22, "")], ("op", "n", "note"), right=(1,)), """\
op          n  note
---------  --  ----
a           1  x
long name  22""")

    def test_plan_section(self) -> None:
        """Section 4's prose, and its two plans with bytes and costs derived by hand: a 4096x7168 bf16
        tensor (half of it a rank on the 2-rank tp dim), ring collectives on the default uniform
        topology (87.7 GB/s, 0.6 us a hop, 6.6 us base, bytes counted in GiB)."""
        from torch.distributed.tensor import Partial, Shard

        from dtensor_rules.redistribute import plan

        def ring_us(ranks: int, nbytes: int) -> float:
            return 6.6 + (ranks - 1) * 0.6 + (ranks - 1) / ranks * nbytes / 2**30 / 87.7 * 1e6

        src, dst, shape = (Partial(), Shard(0)), (Shard(0), Shard(0)), (4096, 7168)
        half = 4096 * 7168 * 2 // 2  # bytes a rank holds of the tp-sharded bf16 tensor
        ordered = plan((2, 2), shape, torch.bfloat16, src, dst, dst_device_order=(1, 0))
        default = plan((2, 2), shape, torch.bfloat16, src, dst)
        # in tp-major order the data is already where it goes: one reduce-scatter over ep
        assert [(s.collective, s.mesh_dims, s.bytes) for s in ordered.steps] == [("reduce_scatter", (0,), half)]
        # in DTensor's order it must then be re-dealt: two all_to_alls of the quarter each rank holds
        assert [(s.collective, s.mesh_dims, s.bytes) for s in default.steps] == [
            ("reduce_scatter", (0,), half), ("all_to_all", (1,), half // 2), ("all_to_all", (0, 1), half // 2)]
        assert [s.cost_us for s in ordered.steps + default.steps] == pytest.approx(
            [ring_us(2, half), ring_us(2, half), ring_us(2, half // 2), ring_us(4, half // 2)], rel=1e-9)

        out = io.StringIO()
        self.assertTrue(demo.section_plan((2, 2), out))
        self.assertEqual(out.getvalue(), f"""
== 4. redistribute to a non-default device order (dtensor_rules.plan) ==========
routed-expert output, Partial over ep and token-sharded over tp, to token-sharded over both.
device_order=(1, 0): tp splits the tokens first, ep second -- the layout the data already has:
{ordered.explain()}

the same move to DTensor's default order (0, 1):
{default.explain()}

the device order saves {default.cost_us / ordered.cost_us:.1f}x (1 vs 3 collectives)

executed on the simulated mesh, tensor 10x3 (uneven): full_tensor() == input: True
rank (ep, tp)  rows held
-------------  ---------
(0, 0)         0, 1, 2
(0, 1)         5, 6, 7
(1, 0)         3, 4
(1, 1)         8, 9
""")

    @pytest.mark.slow  # ~11 s: runs the demo's expert-parallel section
    def test_expert_parallel_section(self) -> None:
        """Where EP parameters and gradients live and what one step communicates (section 6)."""
        from dtensor_rules.cli.demo_ep import section_expert_parallel

        out = io.StringIO()
        with demo.quiet():
            self.assertTrue(section_expert_parallel((2, 2), out))
        self.assertExpectedInline(out.getvalue(), """\

== 6. expert parallel: tokens by all-to-all, experts never gathered ============
expert_parallel(model, mesh): mesh 2x2 ('ep', 'tp'), 66 tokens Shard(0) on ep, Replicate on tp
parameter  shape    placements  rank 0 holds  grad placements  grad rank 0 holds
---------  -------  ----------  ------------  ---------------  -----------------
gate       4x32     R, R        4x32          P, R             4x32
w1         4x32x64  S(0), S(2)  2x32x32       S(0), S(2)       2x32x32
w3         4x32x64  S(0), S(2)  2x32x32       S(0), S(2)       2x32x32
w2         4x64x32  S(0), S(1)  2x32x32       S(0), S(1)       2x32x32
shared_w1  64x32    R, S(0)     32x32         P, S(0)          32x32
shared_w3  64x32    R, S(0)     32x32         P, S(0)          32x32
shared_w2  32x64    R, S(1)     32x32         P, S(1)          32x32

collectives of one forward+backward (rank 0; bytes = larger of input and output per call):
path                   phase     collective      calls   bytes
---------------------  --------  --------------  -----  ------
expert parallel        forward   all_to_all          3   17184
expert parallel        backward  all_reduce          2    4488
expert parallel        backward  all_to_all          2   17152
shard_moe gather path  forward   all_gather         11  105392
shard_moe gather path  backward  all_gather         10  138400
shard_moe gather path  backward  reduce_scatter      3   13344

expert parallel = single device (output and 8 gradients, float32 1e-5): yes
no all_gather in forward or backward: yes
expert gradients stay sharded like their weights: yes
""")
