"""The Makefile's reproduce-table* targets compose every run they launch (a dry run, nothing trains).

`make -n <target>` prints the target's commands; every `python -m rapid.train -m <overrides>` line
among them is expanded into its runs by Hydra's own sweeper, and each run's config is composed from
conf/ with those overrides, resolved, and validated as `rapid.train` would at start-up. The paper-scale
targets name Hub models and need GPUs to run, not to compose.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from rapid.config import register_resolvers, validate
from tests.test_train import REPO

PAPER = ("reproduce-table1", "reproduce-table2", "reproduce-table3", "reproduce-table4")
CPU = (
    "reproduce-table1-cpu",
    "reproduce-table2-cpu",
    "reproduce-table3-cpu",
    "reproduce-table4-cpu",
    "reproduce-ablations-cpu",
)

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make to print the targets' commands")


def sweeps(target: str, tmp_path) -> list[list[str]]:
    """The override lists of the target's `rapid.train -m` commands. `make -n` prints the commands (running
    none); each rapid.train line is then run by bash with VENV's python replaced by a stub that prints its
    arguments, so that they arrive exactly as the shell would pass them."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / ".installed").touch()
    stub = venv / "bin" / "python"
    stub.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    stub.chmod(0o755)
    proc = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = []
    for line in proc.stdout.splitlines():
        if line.startswith(f"{stub} -m rapid.train -m "):
            argv = json.loads(subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True).stdout)
            assert argv[:3] == ["-m", "rapid.train", "-m"]
            out.append([w for w in argv[3:] if not w.startswith("hydra.")])
    return out


def expand(overrides: list[str]) -> list[list[str]]:
    """Every run of a multirun, as Hydra's basic sweeper enumerates them."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [run for batch in BasicSweeper.split_arguments(parsed, None) for run in batch]


def compose_all(target: str, tmp_path) -> list:
    register_resolvers()
    configs = []
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        for overrides in sweeps(target, tmp_path):
            for run in expand(overrides):
                cfg = compose("config", overrides=run)
                OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
                if cfg.algorithm.loss != "sft":  # algorithm=sft skips the RL checks
                    validate(cfg, world=1)
                configs.append((run, cfg))
    return configs


def by(configs, **want):
    return [cfg for _, cfg in configs if all(OmegaConf.select(cfg, k) == v for k, v in want.items())]


def test_table1_composes_every_method_benchmark_and_seed(tmp_path):
    configs = compose_all("reproduce-table1", tmp_path)
    assert len(configs) == 3 * (4 + 1) * 3  # benchmarks x (RL methods + SFT) x seeds
    assert {c.task.name for _, c in configs} == {"mbpp_plus", "math", "minif2f"}
    for name, h in (("rapid", 8), ("pg", 1), ("grpo", 1), ("dapo", 1)):  # H stays the algorithm's own
        assert {c.algorithm.H for c in by(configs, **{"algorithm.name": name})} == {h}
    sft = by(configs, **{"algorithm.name": "sft"})
    assert len(sft) == 9 and {c.algorithm.distill.teacher for c in sft} == {"qwen2.5_1.5b"}
    math_runs = by(configs, **{"task.name": "math", "algorithm.name": "rapid"})
    assert {(c.algorithm.n_step, c.algorithm.n_group, c.model.dtype) for c in math_runs} == {(32, 4, "bfloat16")}


def test_table2_composes_the_model_families(tmp_path):
    configs = compose_all("reproduce-table2", tmp_path)
    assert len(configs) == 3 * 4 * 3
    assert {c.model.path for _, c in configs} >= {"meta-llama/Llama-3.2-1B-Instruct", "google/gemma-3-1b-it"}


@pytest.mark.parametrize("target", ["reproduce-table3", "reproduce-table4"])
def test_h_sweep_composes(target, tmp_path):
    configs = compose_all(target, tmp_path)
    assert len(configs) == 3 * 4 * 3
    assert sorted({c.algorithm.H for _, c in configs}) == [2, 4, 8, 16]
    assert all(c.algorithm.n_inference == c.algorithm.H * c.algorithm.n_step for _, c in configs)


@pytest.mark.parametrize("target", CPU)
def test_cpu_targets_compose_on_the_offline_model(target, tmp_path):
    configs = compose_all(target, tmp_path)
    assert configs and {c.seed for _, c in configs} == {0, 1, 2}
    for _, c in configs:
        assert c.model.gguf is not None and c.task.name == "multistep" and c.rounds is None  # offline, by epochs
        a = c.algorithm
        # rapid.train sets rounds = ceil(epochs * n_train / prompts per round): 512 samples at every H
        rounds = math.ceil(c.epochs * c.task.n_train / (a.n_inference // a.n_group))
        assert rounds * a.n_inference == 512
        assert (c.eval.every, c.eval.every_samples) == (0, 128)  # an evaluation every 128 samples, at any H


def test_ablations_cpu_covers_each_switch_once(tmp_path):
    configs = compose_all("reproduce-ablations-cpu", tmp_path)
    key = lambda c: (
        c.algorithm.name,
        c.algorithm.eta,
        c.algorithm.leave_one_out,
        c.algorithm.iw_baseline,
        c.algorithm.iw_gradient,
    )
    variants = {key(c) for _, c in configs}
    assert len(variants) == len(configs) // 3 == 10  # no configuration runs twice
    assert ("rapid", 2.0, False, False, False) in variants  # uncorrected off-policy GRPG
    assert ("rapid", None, False, True, True) in variants and ("rapid", 2.0, True, True, True) in variants
    assert ("grpo_multistep", 2.0, False, True, True) in variants
    assert {c.algorithm.H for c in by(configs, **{"algorithm.name": "grpo_multistep"})} == {8}
