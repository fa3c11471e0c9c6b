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
