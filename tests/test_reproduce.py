"""The Makefile's reproduce-table* targets compose every run they launch (a dry run, nothing trains).

`make -n <target>` prints the target's commands; every `python -m rapid.train -m <overrides>` line
among them is expanded into its runs by Hydra's own sweeper, and each run's config is composed from
conf/ with those overrides, resolved, and validated as `rapid.train` would at start-up. The paper-scale
targets name Hub models and need GPUs to run, not to compose.
"""

from __future__ import annotations

import importlib.util
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


def load_gpu_pool():
    spec = importlib.util.spec_from_file_location("gpu_pool", REPO / "experiments" / "gpu_pool.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make to print the targets' commands")


def sweeps(target: str, tmp_path, *make_vars: str) -> list[list[str]]:
    """The override lists of the target's `rapid.train -m` commands (or of experiments/gpu_pool.py, which
    runs the same multirun one run per GPU). `make -n` prints the commands (running none); each such line
    is then run by bash with VENV's python replaced by a stub that prints its arguments, so that they
    arrive exactly as the shell would pass them."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / ".installed").touch()
    stub = venv / "bin" / "python"
    stub.write_text(f"#!/bin/sh\nexec {sys.executable} -c 'import json, sys; print(json.dumps(sys.argv[1:]))' \"$@\"\n")
    stub.chmod(0o755)
    proc = subprocess.run(
        ["make", "-n", "--no-print-directory", target, f"VENV={venv}", *make_vars],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    out = []
    for line in proc.stdout.splitlines():
        if line.startswith((f"{stub} -m rapid.train -m ", f"{stub} experiments/gpu_pool.py ")):
            argv = json.loads(subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True).stdout)
            if argv[0] == "experiments/gpu_pool.py":
                assert argv[1] == "--gpus" and argv[3] == "--", argv[:4]
                out.append(["--gpus", argv[2], *(w for w in argv[4:] if not w.startswith("hydra."))])
                continue
            assert argv[:3] == ["-m", "rapid.train", "-m"]
            out.append([w for w in argv[3:] if not w.startswith("hydra.")])
    return out


def expand(overrides: list[str]) -> list[list[str]]:
    """Every run of a multirun, as Hydra's basic sweeper enumerates them."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [run for batch in BasicSweeper.split_arguments(parsed, None) for run in batch]


def compose_all(target: str, tmp_path, world: int = 1) -> list:
    register_resolvers()
    configs = []
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        for overrides in sweeps(target, tmp_path):
            for run in expand(overrides):
                cfg = compose("config", overrides=run)
                OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
                if cfg.algorithm.loss != "sft":  # algorithm=sft skips the RL checks
                    validate(cfg, world=world)
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


@pytest.mark.slow
@pytest.mark.parametrize("target", ["reproduce-table3", "reproduce-table4"])
def test_h_sweep_composes(target, tmp_path):
    configs = compose_all(target, tmp_path)
    assert len(configs) == 3 * 4 * 3
    assert sorted({c.algorithm.H for _, c in configs}) == [2, 4, 8, 16]
    assert all(c.algorithm.n_inference == c.algorithm.H * c.algorithm.n_step for _, c in configs)


@pytest.mark.slow
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


# ----------------------------------------------------------------------------- N GPUs


@pytest.mark.parametrize("target", PAPER)
def test_gpus_runs_the_same_runs_through_the_gpu_pool(target, tmp_path):
    """GPUS=0,1,2,3: every paper-scale sweep goes through experiments/gpu_pool.py with those GPUs, with
    the same overrides (so the same runs, in the same directories) as the one-process multirun."""
    plain = sweeps(target, tmp_path)
    pooled = sweeps(target, tmp_path, "GPUS=0,1,2,3")
    assert plain and all(p[:2] == ["--gpus", "0,1,2,3"] for p in pooled)
    assert [p[2:] for p in pooled] == plain


@pytest.mark.parametrize("target", CPU)
def test_gpus_leaves_the_cpu_targets_one_run_at_a_time(target, tmp_path):
    """The CPU tables time their runs one after another on the same cores: GPUS does not change them."""
    assert sweeps(target, tmp_path, "GPUS=0,1") == sweeps(target, tmp_path)


def test_gpu_pool_lists_the_multirun_jobs_with_hydra_directories():
    """experiments/gpu_pool.py expands a sweep into the runs Hydra's sweeper would run, each in the
    directory the multirun would give it (conf/base.yaml: sorted overrides, `device` left out)."""
    pool = load_gpu_pool()
    sweep_dir, jobs = pool.jobs(
        ["+experiment=mbpp_h8", "algorithm=rapid,pg", "seed=0,1", "device=cuda", "hydra.sweep.dir=multirun/t/m"],
        pool.excluded_keys(),
    )
    assert str(sweep_dir) == "multirun/t/m"
    assert [run for run, _ in jobs] == [
        ["+experiment=mbpp_h8", f"algorithm={a}", f"seed={s}", "device=cuda"] for a in ("rapid", "pg") for s in (0, 1)
    ]
    assert [str(d) for _, d in jobs] == [
        f"multirun/t/m/+experiment=mbpp_h8,algorithm={a},seed={s}" for a in ("rapid", "pg") for s in (0, 1)
    ]


@pytest.mark.slow
def test_gpu_pool_runs_each_run_on_its_own_device_and_skips_finished_ones(tmp_path):
    """Two tiny runs (CPU here) through the pool with GPUs 0 and 1: both finish in their multirun
    directories (named as Hydra's sweeper renders the overrides: `False`), each was started with its own CUDA_VISIBLE_DEVICES, and a second call runs nothing."""
    from tests.test_train import env_for

    sweep = tmp_path / "sweep"
    argv = [
        sys.executable,
        str(REPO / "experiments" / "gpu_pool.py"),
        "--gpus",
        "0,1",
        "--",
        "+experiment=smoke",
        "sampler=hf",
        "device=cpu",
        "rounds=1",
        "eval.at_start=false",
        "seed=0,1",
        f"hydra.sweep.dir={sweep}",
    ]
    proc = subprocess.run(argv, cwd=REPO, env=env_for(tmp_path), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = [sweep / f"+experiment=smoke,eval.at_start=False,rounds=1,sampler=hf,seed={s}" for s in (0, 1)]
    assert all((r / "summary.json").exists() for r in runs), sorted(p.name for p in sweep.iterdir())
    assert sorted(line.split(": ")[0] for line in proc.stdout.splitlines() if line.endswith(" done")) == [
        "gpu 0",
        "gpu 1",
    ]
    again = subprocess.run(argv, cwd=REPO, env=env_for(tmp_path), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stdout.startswith("0 runs on GPUs 0,1"), again.stdout


@pytest.mark.slow
def test_paper_configs_validate_at_world_size_above_one(tmp_path):
    """Every run of every paper-scale target, composed and validated at 2 and at 4 ranks (torchrun),
    including MBPP+ and MiniF2F at n_step 4, n_group 4, whose groups span ranks (rapid/policy.py)."""
    spanning = set()
    for target in PAPER:
        for world in (2, 4):
            for run in sweeps(target, tmp_path):
                register_resolvers()
                with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
                    for overrides in expand(run):
                        cfg = compose("config", overrides=overrides)
                        if cfg.algorithm.loss == "sft":
                            continue
                        validate(cfg, world=world)
                        if cfg.algorithm.n_step // world < cfg.algorithm.n_group:
                            spanning.add((world, cfg.algorithm.n_step, cfg.algorithm.n_group))
    assert (4, 4, 4) in spanning and (2, 4, 4) in spanning, sorted(spanning)  # the paper's own setting is covered
