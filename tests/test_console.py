"""The console at a run's start and end: the run directory, and the config in one line (the whole resolved
config goes to <run_dir>/config.yaml, not to the console)."""

from __future__ import annotations

from hydra import compose, initialize_config_dir

from rapid.config import register_resolvers
from rapid.logger import config_summary, run_dir_line
from tests.test_train import REPO


def composed(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=list(overrides))


def test_config_summary_is_one_line_with_the_runs_axes(tmp_path):
    cfg = composed()
    cfg.samples = 14 * 8 * 32  # as rapid.config.run_length sets it: rounds x H x n_step
    line = config_summary(cfg, tmp_path / "run")
    assert line == (
        "algorithm=rapid H=8 n_step=32 n_group=8 task=arithmetic model=SmolLM2-135M-Instruct samples=3584 rounds=14 "
        f"seed=0 (the full config: {tmp_path / 'run' / 'config.yaml'})"
    )
    # H = auto runs to a sample budget: no round count; another task, model, seed
    cfg = composed("algorithm.H=auto", "samples=512", "rounds=null", "task=multistep", "model=tiny", "seed=3")
    line = config_summary(cfg, tmp_path)
    assert "\n" not in line and line.startswith(
        "algorithm=rapid H=auto n_step=32 n_group=8 task=multistep model=tiny-llama samples=512 seed=3 "
    )


def test_run_directory_lines(tmp_path):
    assert run_dir_line(tmp_path) == f"run directory: {tmp_path}"
    assert (
        run_dir_line(tmp_path, finished=True) == f"run directory: {tmp_path} (config.yaml, metrics.jsonl, summary.json, the trained model in model/)"
    )
