"""tools/figures.py: the curves behind each figure on synthetic run directories (checked by hand), every
figure rendered from them, and the per-token log π dump of `logger.rollouts=true` in a real run (checked
against the final checkpoint), drawn as the token-level figure."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from omegaconf import OmegaConf

from rapid.buffer import Rollout
from rapid.models import load_model_and_tokenizer
from rapid.policy import CompletionLogprobs, token_logprobs
from rapid.tasks import load_splits
from tests.test_train import REPO, command, env_for
from tools import figures

sys.path.insert(0, str(REPO / "tools"))

PNG = b"\x89PNG\r\n\x1a\n"


def write_run(
    path: Path,
    *,
    H: int,
    seed: int,
    per_round: int,
    round_s: list[float],
    accuracy: dict[int, float],
    clip: list[float],
    stale: list[float],
    length: list[float],
    gen_s: list[float],
    name: str = "rapid",
) -> None:
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(
        yaml.safe_dump({"seed": seed, "algorithm": {"name": name, "loss": "iw_grpg", "H": H, "n_inference": per_round}})
    )
    rows = []
    for i, t in enumerate(round_s):
        rnd = i + 1
        if i in accuracy:
            rows.append({"round": i, "eval/accuracy": accuracy[i]})
        rows.append(
            {
                "round": rnd,
                "samples": rnd * per_round,
                "time/round_s": t,
                "iw/clip_frac": clip[i],
                "iw/staleness": stale[i],
                "train/completion_len": length[i],
                "time/generate_s": gen_s[i],
                "train/reward_mean": 0.5,
            }
        )
    rows.append({"round": len(round_s), "eval/accuracy": accuracy[len(round_s)]})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def synthetic_sweep(root: Path) -> Path:
    sweep = root / "multirun" / "2026-11-24_10-00-00"
    # H = 2, two seeds: evaluations at rounds 0, 2, 4; four rounds of 64 samples
    write_run(
        sweep / "algorithm.H=2,seed=0",
        H=2,
        seed=0,
        per_round=64,
        round_s=[10, 10, 20, 20],
        accuracy={0: 0.1, 2: 0.3, 4: 0.5},
        clip=[0, 0.1, 0.2, 0.3],
        stale=[0, 0.5, 1.0, 1.5],
        length=[10, 12, 14, 16],
        gen_s=[4, 4, 4, 4],
    )
    write_run(
        sweep / "algorithm.H=2,seed=1",
        H=2,
        seed=1,
        per_round=64,
        round_s=[12, 12, 12, 12],
        accuracy={0: 0.1, 2: 0.5, 4: 0.7},
        clip=[0, 0.3, 0.2, 0.1],
        stale=[0, 1.5, 1.0, 0.5],
        length=[20, 20, 20, 20],
        gen_s=[6, 6, 6, 6],
    )
    write_run(
        sweep / "algorithm.H=8,seed=0",
        H=8,
        seed=0,
        per_round=256,
        round_s=[30],
        accuracy={0: 0.1, 1: 0.2},
        clip=[0.4],
        stale=[2.0],
        length=[30],
        gen_s=[9],
    )
    return sweep


def test_curves_by_hand(tmp_path):
    runs = [figures.load(r) for r in figures.find_runs([synthetic_sweep(tmp_path)])]
    acc = figures.accuracy_curves(runs)
    h2 = acc["algorithm.H=2"]
    np.testing.assert_allclose(h2["samples"], [0, 128, 256])  # rounds 0, 2, 4 x 64
    # cumulative round time at rounds 0, 2, 4: seed 0: 0, 20, 60; seed 1: 0, 24, 48 -> means 0, 22, 54
    np.testing.assert_allclose(h2["time_s"], [0, 22, 54])
    np.testing.assert_allclose(h2["mean"], [0.1, 0.4, 0.6])
    np.testing.assert_allclose(h2["min"], [0.1, 0.3, 0.5])
    np.testing.assert_allclose(h2["max"], [0.1, 0.5, 0.7])
    np.testing.assert_allclose(acc["algorithm.H=8"]["time_s"], [0, 30])
    table = figures.accuracy_table(acc).splitlines()
    assert "| algorithm.H=2 | 2 | 128 | 22 | 0.400 (0.300-0.500) |" in table
    assert "| algorithm.H=8 | 1 | 256 | 30 | 0.200 (0.200-0.200) |" in table
    assert len(table) == 2 + 3 + 2  # header, H = 2's three evaluations, H = 8's two
    stale = figures.per_round_curves(runs, "iw/staleness")["algorithm.H=2"]
    np.testing.assert_allclose(stale["samples"], [64, 128, 192, 256])
    np.testing.assert_allclose(stale["mean"], [0, 1.0, 1.0, 1.0])  # (0.5 + 1.5)/2, (1 + 1)/2, ...
    np.testing.assert_allclose(stale["max"], [0, 1.5, 1.0, 1.5])
    vs_h = figures.versus_h(runs, ("train/completion_len", "time/generate_s"))
    # H = 2: run means 13 and 20 -> mean 16.5, min 13, max 20; H = 8: 30
    assert vs_h["train/completion_len"]["rapid"] == {2: (16.5, 13.0, 20.0), 8: (30.0, 30.0, 30.0)}
    assert vs_h["time/generate_s"]["rapid"][2] == (5.0, 4.0, 6.0)


def test_every_figure_renders_from_synthetic_runs(tmp_path):
    sweep = synthetic_sweep(tmp_path)
    run = sweep / "algorithm.H=8,seed=0"
    # a rollouts.jsonl as logger.rollouts=true writes it: per-token log μ and log π for the first group
    records = [
        {
            "round": 1,
            "group": 0,
            "completion_ids": [5, 6, 7],
            "reward": 1.0,
            "logp_mu": [-1.0, -2.0, -0.5],
            "logp_pi": [-0.5, -2.5, -0.5],
        },
        {"round": 1, "group": 0, "completion_ids": [8], "reward": 0.0, "logp_mu": [-3.0], "logp_pi": [-2.0]},
        {"round": 1, "group": 1, "completion_ids": [9], "reward": 0.0},
    ]
    (run / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    round_, found = figures.token_log_weights(run)
    assert round_ == 1 and [r["log_w"] for r in found] == [[0.5, -0.5, 0.0], [1.0]]  # log π − log μ per token
    written = figures.main([str(sweep), "--out", str(tmp_path / "figs")])
    names = sorted(p.name for p in written)
    assert names == ["accuracy.md", "accuracy.png", "clip_staleness.png", "length_time_vs_h.png", "token_log_w.png"]
    for p in (p for p in written if p.suffix == ".png"):
        assert p.read_bytes()[:8] == PNG and p.stat().st_size > 10_000


@pytest.mark.slow
def test_rollout_dump_in_a_real_run_is_log_pi_after_the_round(tmp_path):
    run = tmp_path / "run"
    args = [
        "+experiment=smoke",
        "logger.rollouts=true",
        "rounds=2",
        "sampler.temperature=1.0",
        "optim.lr=1e-3",
        "eval.every=0",
        "ckpt.every=0",
        f"hydra.run.dir={run}",
    ]
    proc = subprocess.run(
        command(args, tmp_path, shaped=True),
        cwd=REPO,
        env=env_for(tmp_path),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    dumped = [r for r in rows if "logp_pi" in r]
    assert [r["round"] for r in dumped] == [1] * 4 + [2] * 4  # the first group (n_group 4) of each round
    assert len({r["group"] for r in dumped if r["round"] == 2}) == 1
    for r in dumped:
        assert len(r["logp_pi"]) == len(r["logp_mu"]) == len(r["completion_ids"])
    # the last round's log π is the final checkpoint's: recompute it independently
    model, tokenizer = load_model_and_tokenizer(str(run / "checkpoints" / "round_000002" / "model"))
    last = [r for r in dumped if r["round"] == 2]
    cfg = OmegaConf.load(run / "config.yaml")
    _, _, prompts, _, _ = load_splits(cfg.task, tokenizer, cfg.eval.n)  # the prompts, rebuilt as the run did
    prompt = prompts[last[0]["prompt_index"]]
    records = [
        Rollout(
            prompt_ids=prompt,
            completion_ids=r["completion_ids"],
            logp_mu=r["logp_mu"],
            reward=r["reward"],
            group_id=0,
            truncated=r["truncated"],
        )
        for r in last
    ]
    policy = CompletionLogprobs(model, temperature=1.0)
    again = token_logprobs(
        policy, records, pad_id=tokenizer.pad_token_id, device=torch.device("cpu"), compute_dtype=torch.float32
    )
    for r, lp in zip(last, again):
        np.testing.assert_allclose(r["logp_pi"], lp, rtol=0, atol=1e-4)
    # θ moved during the round: the token log w leave 0
    assert max(abs(p - q) for r in dumped for p, q in zip(r["logp_pi"], r["logp_mu"])) > 1e-3
    written = figures.main([str(run), "--out", str(tmp_path / "figs")])
    assert "token_log_w.png" in [p.name for p in written]


def test_methods_are_ordered_by_numeric_h_then_the_rest_by_name():
    runs = [
        {"method": "RAPID H=auto", "H": "auto"},
        {"method": "RAPID H=8", "H": 8},
        {"method": "PG", "H": 1},
        {"method": "GRPO", "H": None},
    ]
    assert list(figures.by_method(runs)) == ["PG", "RAPID H=8", "GRPO", "RAPID H=auto"]
