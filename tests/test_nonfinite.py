"""No non-finite update reaches a checkpoint (rapid/nonfinite.py): a NaN reward is a failed check, a
diverging learning rate stops the run in one sentence with exit status 3, and a checkpoint is never
written from NaN weights."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rapid import checkpoint
from rapid.config import EXIT_RUN_STOPPED, RunStopped
from rapid.nonfinite import StepGuard
from tests.helpers import tiny_model
from tests.test_train import REPO, assert_one_sentence_error, launch, read_rows, train_rows


def checkpoint_weights(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {
        p.parent.parent.name: load_file(p) for p in sorted((run / "checkpoints").glob("round_*/model/*.safetensors"))
    }


def test_guard_skips_non_finite_steps_and_stops_after_the_limit():
    guard = StepGuard(limit=3, device=torch.device("cpu"))
    verdicts = [
        guard.ok(0.5, 1.0, 1),
        guard.ok(math.nan, 1.0, 2),
        guard.ok(0.5, math.inf, 3),
        guard.ok(0.5, 1.0, 4),  # a finite step resets the run of bad ones
        guard.ok(math.inf, math.nan, 5),
        guard.ok(-math.inf, 1.0, 6),
    ]
    assert verdicts == [True, False, False, True, False, False]
    assert guard.take_count() == 4 and guard.take_count() == 0
    with pytest.raises(RunStopped, match=r"^the last 3 optimizer steps \(up to step 7\) had a non-finite loss"):
        guard.ok(math.nan, math.nan, 7)


def test_checkpoint_refuses_nan_weights_and_keeps_the_last_good_one(tmp_path):
    model, _ = tiny_model()
    good = tmp_path / "checkpoints" / "round_000001"
    (good / "model").mkdir(parents=True)
    (good / "state.pt").write_bytes(b"the last good checkpoint")
    with torch.no_grad():
        model.model.layers[1].mlp.down_proj.weight[3, 5] = math.nan
    with pytest.raises(RunStopped, match=r"weights after round 2 hold NaN .*model.layers.1.mlp.down_proj.weight"):
        checkpoint.save(tmp_path, 2, model, None, None, None, None, None, elapsed_s=0.0, keep=1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round_000001"]
    assert (good / "state.pt").read_bytes() == b"the last good checkpoint"


@pytest.mark.slow
def test_a_diverging_learning_rate_stops_the_run_with_finite_checkpoints(tmp_path):
    """optim.lr=1e9 with a reward the random model earns: the first step sends the weights to ~1e9, every
    later loss is NaN; before, every parameter became NaN, the checkpoint too, and the run exited 0."""
    run = tmp_path / "run"
    proc = launch(
        ["+experiment=smoke", "optim.lr=1e9", "ckpt.every=1", "ckpt.keep=1", f"hydra.run.dir={run}"],
        tmp_path,
        shaped=True,
        check=False,
    )
    assert proc.returncode == EXIT_RUN_STOPPED, proc.stdout[-3000:]
    assert_one_sentence_error(proc.returncode, proc.stdout, ("non-finite loss or gradient norm", "optim.lr"))
    weights = checkpoint_weights(run)
    assert weights, "no checkpoint was written before the stop"
    assert all(bool(torch.isfinite(t).all()) for ws in weights.values() for t in ws.values())
    rows = train_rows(read_rows(run))
    assert sum(r["train/nonfinite_steps"] for r in rows) >= 1


NAN_TASK = """
from rapid.tasks.arithmetic import load, build_prompts

def reward(completion, record):
    if "a" in completion:           # some of a random model's completions
        return float("nan")
    return float(any(ch.isdigit() for ch in completion))
"""


@pytest.mark.slow
def test_a_nan_reward_is_a_failed_check_and_the_run_finishes(tmp_path):
    (tmp_path / "nan_task.py").write_text(NAN_TASK)
    run = tmp_path / "run"
    proc = launch(
        ["+experiment=smoke", "task.module=nan_task", "task.name=nan_task", f"hydra.run.dir={run}"],
        tmp_path,
        check=False,
        PYTHONPATH=f"{tmp_path}:{REPO}",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    warned = [line for line in proc.stdout.splitlines() if "the reward of task nan_task returned" in line]
    assert len(warned) == 1 and "non-finite value nan" in warned[0], proc.stdout[-3000:]
    rows = train_rows(read_rows(run))
    assert sum(r["train/reward_failures"] for r in rows) > 0
    assert all(math.isfinite(r["train/reward_mean"]) and math.isfinite(r["train/loss"]) for r in rows)
    assert all(r["train/nonfinite_steps"] == 0 for r in rows)
    weights = checkpoint_weights(run)
    assert weights and all(bool(torch.isfinite(t).all()) for ws in weights.values() for t in ws.values())
    assert any(r["train/grad_norm"] > 0 for r in rows)  # it trained on the finite rewards
