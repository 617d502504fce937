"""dtensor_rules: complete, proven DTensor sharding rules, costs and an ordered redistribute planner."""
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

setup(
    name="dtensor_rules",
    version="0.1.0",
    description="Proven DTensor sharding rules, cost formulas and an ordered-mesh "
    "redistribute planner for Mixture-of-Experts models",
    long_description=(HERE / "README.md").read_text(),
    long_description_content_type="text/markdown",
    package_dir={"": "src"},  # src/ layout: a checkout's folder can never shadow the installed package
    packages=find_packages("src", include=["dtensor_rules", "dtensor_rules.*"]),
    package_data={"dtensor_rules._upstream": ["measured_*.json"]},  # install()'s measured ours-vs-upstream data
    python_requires=">=3.10",
    install_requires=["torch>=2.13,<2.15", "numpy"],  # tested: 2.13.0, 2.14.1; raise the bound once the next release passes
    extras_require={
        # pulp: tests/test_solver_moe.py runs the solver (the [solver] extra), so the default test run covers it
        "test": ["pytest", "pytest-xdist", "hypothesis", "expecttest", "pulp"],
        "triton": ["triton"],
        "solver": ["pulp"],  # dtensor_rules.solver: the ILP placement solver (PuLP bundles CBC)
        # torchtitan's MoE as an expert_parallel target and its custom ops' DTensor rules;
        # torchtitan imports triton without declaring it
        "torchtitan": ["torchtitan", "triton", "helion"],  # helion: its helion rope ops exist only with it
    },
    entry_points={"console_scripts": ["dtensor-rules=dtensor_rules.cli.main:main"]},
)
