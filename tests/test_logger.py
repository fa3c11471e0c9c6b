"""MetricsLogger: a resumed run continues its W&B run (the same id), instead of starting another."""

from __future__ import annotations

import pytest

from rapid.logger import MetricsLogger


def test_resumed_run_continues_the_same_wandb_run(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is not installed (pip install -e '.[wandb]')")
    for key, sub in (("WANDB_CONFIG_DIR", "config"), ("WANDB_CACHE_DIR", "cache"), ("WANDB_DATA_DIR", "data")):
        monkeypatch.setenv(key, str(tmp_path / "wandb_home" / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = tmp_path / "run"
    run.mkdir()
    ids = []
    for resume_round in (None, 1):  # the run, then its resumption
        logger = MetricsLogger(
            run,
            wandb_cfg={"enabled": True, "project": "rapid", "name": run.name},
            config={"seed": 0},
            resume_round=resume_round,
        )
        logger.log({"round": 1 if resume_round is None else 2, "train/reward_mean": 0.5})
        ids.append(logger.wandb.id)
        logger.close()
    assert ids[0] == ids[1], ids
    assert (run / "wandb_id").read_text().strip() == ids[0]
    # every local run directory (wandb adds a "-1" suffix when both start within the same second) logs one id
    logs = list((run / "wandb").glob("offline-run-*/run-*.wandb"))
    assert logs and {p.name for p in logs} == {f"run-{ids[0]}.wandb"}, logs


def test_round_row_by_hand():
    """A round of 2 records (3 and 1 completion tokens, rewards 1 and 0), one step, on one process:
    times the clock did not see are 0, `other` is the rest of the round (4 − 2 − 1 = 1 s), tokens/s
    over generation (4 / 2), DAPO's dropped groups only when given, keys in the logged order."""
    import torch

    from rapid.buffer import Rollout
    from rapid.logger import round_row

    rollouts = [
        Rollout([1], [2, 3, 4], [0.0] * 3, 1.0, group_id=0, truncated=True),
        Rollout([1], [2], [0.0], 0.0, group_id=0, truncated=False),
    ]
    # the step reports the records it trained, as accumulate_gradients does
    step = {"loss": 0.5, "clip_frac": 0.25, "records": 2, "grad_norm": 2.0, "lr": 1e-3}
    phases = {"time/generate_s": 2.0, "time/train_s": 1.0, "mem/peak_gb": 0.5}
    progress = {"progress/round": 7, "progress/samples": 64, "progress/epoch": 1.5, "time/wall_s": 9.0}
    kwargs = dict(phases=phases, round_s=4.0, world=1, device=torch.device("cpu"), failed=1)
    row = round_row(progress, rollouts, [step], **kwargs)
    assert row == {
        "progress/round": 7,
        "progress/samples": 64,
        "progress/epoch": 1.5,
        "time/wall_s": 9.0,
        "train/reward_mean": 0.5,
        "train/accuracy": 0.5,
        "train/completion_len": 2.0,
        "train/truncated_frac": 0.5,
        "train/reward_failures": 1,
        "iw/clip_frac": 0.25,
        "train/loss": 0.5,
        "train/grad_norm": 2.0,
        "train/lr": 1e-3,
        "train/nonfinite_steps": 0,
        "time/generate_s": 2.0,
        "time/reward_s": 0.0,
        "time/recompute_s": 0.0,
        "time/train_s": 1.0,
        "time/sync_s": 0.0,
        "mem/peak_gb": 0.5,
        "time/other_s": 1.0,
        "time/round_s": 4.0,
        "sampler/tokens_per_s": 2.0,
    }
    assert list(row)[:5] == ["progress/round", "progress/samples", "progress/epoch", "time/wall_s", "train/reward_mean"]
    assert round_row(progress, rollouts, [step], **kwargs, dropped=3)["train/dropped_groups"] == 3
    # a ratio-clipping loss's clip_frac is the PPO clip fraction: loss/clip_frac, not iw/clip_frac
    ratio = round_row(progress, rollouts, [step], **kwargs, iw=False)
    assert ratio["loss/clip_frac"] == 0.25 and "iw/clip_frac" not in ratio


def test_rows_written_under_the_earlier_names_read_under_todays(tmp_path):
    """Committed results were written with `round`, `samples`, `epoch`, `wall_s`, `step`, and a ratio-clipping
    loss's clip fraction as `iw/clip_frac`; read_metrics gives them today's names, and leaves today's alone."""
    import json

    from rapid.logger import current_names, read_metrics

    old = [
        {"round": 0, "eval/accuracy": 0.1},
        {"round": 1, "samples": 16, "epoch": 0.5, "wall_s": 3.0, "iw/clip_frac": 0.1, "iw/staleness": 0.2},
        {"round": 2, "samples": 32, "iw/clip_frac": 0.3, "loss/kl_mean": 0.01},  # GRPO: no iw/staleness
        {"step": 4, "epoch": 1.0, "train/loss": 0.7},  # rapid.sft
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    assert read_metrics(tmp_path) == [
        {"progress/round": 0, "eval/accuracy": 0.1},
        {
            "progress/round": 1,
            "progress/samples": 16,
            "progress/epoch": 0.5,
            "time/wall_s": 3.0,
            "iw/clip_frac": 0.1,
            "iw/staleness": 0.2,
        },
        {"progress/round": 2, "progress/samples": 32, "loss/clip_frac": 0.3, "loss/kl_mean": 0.01},
        {"progress/step": 4, "progress/epoch": 1.0, "train/loss": 0.7},
    ]
    today = {"progress/round": 3, "iw/clip_frac": 0.0, "iw/staleness": 0.0, "loss/clip_frac": 0.5}
    assert current_names(today) == today


def test_token_means_combine_over_ranks_by_tokens():
    """One step on two ranks: rank 0 ran 2 records of 2 tokens with clip fraction 0.5 (1 token clipped),
    rank 1 ran 2 records of 6 tokens with none clipped. The step's token clip fraction is 1 / 8 = 0.125
    (weighted by records it would be 0.25); a per-record statistic, staleness 0.2 and 0.6, is their
    record-weighted mean 0.4."""
    from rapid.logger import step_means, step_sums

    ranks = [
        [{"clip_frac": 0.5, "staleness": 0.2, "records": 2, "tokens": 2}],
        [{"clip_frac": 0.0, "staleness": 0.6, "records": 2, "tokens": 6}],
    ]
    parts = [step_sums(steps, ["clip_frac", "staleness"], {"clip_frac"}) for steps in ranks]
    summed = {k: parts[0][k] + parts[1][k] for k in parts[0]}
    assert step_means(summed, 1, "clip_frac", 2, tokens=True) == pytest.approx(0.125)
    assert step_means(summed, 1, "staleness", 2) == pytest.approx(0.4)


def test_meta_names_the_script_relative_to_the_repository():
    """meta.json's argv carries no machine path: a script inside the repository is named from its root."""
    from pathlib import Path

    from rapid import logger

    root = Path(logger.__file__).resolve().parent.parent
    assert logger.portable_argv([str(root / "rapid" / "train.py"), "seed=1"]) == ["rapid/train.py", "seed=1"]
    assert logger.portable_argv(["-m", "x"]) == ["-m", "x"]
    assert logger.portable_argv(["/elsewhere/run.py"]) == ["/elsewhere/run.py"]
