"""Shared test setup: the hypothesis profiles (every property test's example count) and the -n 2 schedule.

HYPOTHESIS_PROFILE=dev (the default): 10 examples, random, so runs explore new inputs;
ci (what .ci/run uses): 10 examples, derandomized, so a CI failure reproduces from the log;
thorough: 100 examples, random, before a release or after changing a rule (about 10x the suite's
property-test time). A test scales its count only with tests/_examples.py's ``scaled`` and a reason
(the validators' examples cost ~0.1-10 s, so 10 is what fits the suite's 10-minute budget).
Health checks: only ``too_slow`` and ``data_too_large`` are off (tensors are slow and big to draw).
"""

import os

import pytest
from hypothesis import HealthCheck, settings

_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("dev", max_examples=10, **_common)
settings.register_profile("ci", max_examples=10, derandomize=True, print_blob=True, **_common)
settings.register_profile("thorough", max_examples=100, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


# The heaviest tests, heaviest first: (node id prefix, seconds in the fresh-clone CI log of 2026-11-26,
# the larger of torch 2.13 / 2.14.1, 2 cores). Under ``-n 2`` a worker that starts a 2-minute test
# last ends the run alone; started first, the short tests fill in around it (longest first is the
# classic greedy schedule). Only the ORDER depends on these numbers; a prefix that no longer matches
# a test is harmless, and tests/test_suite_order.py checks that each still names a test function.
HEAVIEST: tuple[tuple[str, float], ...] = (
    ("tests/test_moe_compile.py::test_moe_block_compiles_once_for_every_token_regime", 165),
    # one xdist_group with the two ep4-checkpoint tests below; 4 gloo ranks, 2 compiled trainers
    ("tests/test_torchtitan_trainer_ep.py::test_ours_compiled_equals_torchtitans_ep_compiled_and_eager_at_ep4", 116),
    ("tests/test_docs_scripts.py::test_script_blocks_run[compile_moe.py]", 108),
    ("tests/test_torchtitan_trainer_ep.py::test_ours_equals_torchtitans_ep_at_tp2_x_ep2", 77),
    ("tests/test_torchtitan_trainer_ep.py::test_ours_resumes_from_torchtitans_checkpoint_and_equals_its_ep_at_ep4", 71),  # the group's ep4 launch
    ("tests/test_torchtitan_trainer_ep.py::test_checkpoints_resume_across_a_change_of_ep_degree_both_ways", 70),
    ("tests/test_expert_parallel.py::", 60),  # one xdist_group: a shared 4-rank world + an 8-rank run
    ("tests/test_moe_training.py::test_gloo_training_equals_one_device", 45),  # one xdist_group
    ("tests/test_benchmark_smoke.py::test_moe_vs_torchtitan_quick_prints_the_table", 40),
    ("tests/test_ep_compile.py::test_ep_block_compiles_to_one_graph_and_equals_one_device", 40),  # 2 gloo ranks, aot_eager + inductor: 40 s near idle, 150 s busy
    # 2 gloo ranks, 3 compiles (aot_eager twice, inductor), 12 calls
    ("tests/test_ep_compile_sweep.py::test_compiled_expert_parallel_equals_one_device_at_every_row_count", 35),
    ("tests/test_train_example.py::test_gloo_fsdp2_ep_tp_trains_like_one_device_and_resumes_bit_for_bit", 34),
    ("tests/test_rules_compile.py::test_families_compile_with_backed_and_unbacked_sizes", 33),
    ("tests/test_train_example.py::test_gloo_ep_tp_trains_like_one_device_and_resumes_bit_for_bit", 32),
    ("tests/test_demo.py::test_demo_command_exits_zero_and_every_check_holds", 32),
    ("tests/test_expert_parallel_ttmesh.py::test_ep2xtp2_bytes_at_most_torchtitans_own_path", 30),
    ("tests/test_docs_scripts.py::test_script_blocks_run[compile_ep.py]", 21),
    ("tests/test_rules_slicing.py::test_slice_scatter_every_emitted_strategy_is_correct", 21),
    ("tests/test_cli.py::test_validate_json_for_every_op_with_a_suite[aten.index_put.default]", 20),
    ("tests/test_rules_slicing.py::test_cat_every_emitted_strategy_is_correct", 18),
    ("tests/test_rules_gather_scatter.py::test_scatter_reduce_every_emitted_strategy_is_correct", 17),
    ("tests/test_rules_grouped_mm.py::test_every_emitted_strategy_is_correct[(2, 2, 2)]", 17),
    ("tests/test_cli_rules.py::test_validate_fma_from_a_fresh_process", 17),
    ("tests/test_torchtitan_ops.py::test_rule_matches_ground_truth", 16),
    ("tests/test_patches.py::test_uninstall_gives_back_torchs_own_objects_and_later_imports_stay_pristine", 15),
    ("tests/test_coverage.py::TestMoEBlockGolden::test_cli_and_demo_trace_the_same_named_model", 15),
    ("tests/test_expert_parallel_ttmesh.py::test_borrowed_ep_torchtitan_moe_equals_its_single_device", 14),
)
_SLOW_DEFAULT = 5.0  # any other slow test: after the listed ones, before the fast ones


def expected_seconds(nodeid: str, slow: bool) -> float:
    """The schedule's estimate for one test: its HEAVIEST entry, else a slow test's default, else 0."""
    return next((s for prefix, s in HEAVIEST if nodeid.startswith(prefix)), _SLOW_DEFAULT if slow else 0.0)


def pytest_collection_modifyitems(items: list) -> None:
    """Longest first (a stable sort): the HEAVIEST tests, then the other slow ones, then the rest, so
    under ``-n 2`` the long gloo/compile runs start early and the many short tests fill in around them
    instead of one long test finishing the run alone. (``--no-loadscope-reorder`` in pyproject.toml
    keeps xdist from re-sorting the work by group size.)"""
    items.sort(key=lambda item: -expected_seconds(item.nodeid, item.get_closest_marker("slow") is not None))


# The suite's ``xdist_group`` marks by node id prefix. pytest-xdist 3.8 groups by appending "@group" to
# a test's node id, which pytest 9.2's structured node ids ignore (pytest-dev/pytest-xdist#1386, open):
# ``--dist loadgroup`` then silently spreads a group over both workers, and each builds the group's
# module fixture (a 4-rank gloo world, 14-20 s). The scheduler below groups by this table instead;
# tests/test_suite_order.py checks it against the marks, so a new mark must be added here.
XDIST_GROUPS: dict[str, str] = {
    "tests/test_expert_parallel.py::": "expert_parallel_gloo",
    "tests/test_moe_training.py::test_gloo_training_equals_one_device": "training_gloo",
    # one ep4 launch (a module fixture): the ep2 resume reads its checkpoints, the compiled runs its eager rows
    "tests/test_torchtitan_trainer_ep.py::test_ours_resumes_from_torchtitans_checkpoint_and_equals_its_ep_at_ep4": "titan_trainer_ep4_checkpoints",
    "tests/test_torchtitan_trainer_ep.py::test_checkpoints_resume_across_a_change_of_ep_degree_both_ways": "titan_trainer_ep4_checkpoints",
    "tests/test_torchtitan_trainer_ep.py::test_ours_compiled_equals_torchtitans_ep_compiled_and_eager_at_ep4": "titan_trainer_ep4_checkpoints",
}


def xdist_group_of(nodeid: str) -> str | None:
    """The group XDIST_GROUPS gives a test, or None."""
    return next((g for prefix, g in XDIST_GROUPS.items() if nodeid.startswith(prefix)), None)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):  # noqa: ANN001, ANN201  (xdist's hook)
    """``--dist loadgroup`` that groups by XDIST_GROUPS whatever pytest does to node ids."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class TableGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid) or super()._split_scope(nodeid)

    return TableGroupScheduling(config, log)
