"""End-to-end tests of `python -m rapid.train`: the real entry point, run in a subprocess on the
tiny random model (`+experiment=smoke`), checked through what a run leaves in its directory
(config.yaml, metrics.jsonl, summary.json, checkpoints).

A random model never writes `\\boxed{<right answer>}`, so with the real arithmetic reward every
advantage is 0 and the parameters never move. The tests that compare two trajectories (resume,
DDP) would then compare nothing, so they run through `SHAPED_LAUNCHER`: the same entry point
(`runpy` of `rapid.train`, as `-m` does) with the task's reward replaced by "1 if the completion
contains a digit" — about half of the random model's 8-character completions do, so every group
has a non-zero advantage, the gradient is non-zero and the importance weights leave 1.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300

# `python LAUNCHER <overrides>` is `python -m rapid.train <overrides>` with a reward a random model earns.
SHAPED_LAUNCHER = """\
import runpy
import rapid.tasks.arithmetic as arithmetic

def contains_digit(completion, record):
    return float(any(ch.isdigit() for ch in completion))

arithmetic.reward = contains_digit   # train.py calls task.reward(...) through the module
runpy.run_module("rapid.train", run_name="__main__", alter_sys=True)
"""

TRAIN_KEYS = (
    "progress/round",
    "progress/samples",
    "progress/epoch",
    "train/reward_mean",
    "train/accuracy",
    "train/completion_len",
    "train/truncated_frac",
    "train/loss",
    "train/grad_norm",
    "train/lr",
    "iw/clip_frac",
    "iw/staleness",
    "iw/log_w_mean",
    "iw/mean",
    "iw/max",
    "time/generate_s",
    "time/reward_s",
    "time/train_s",
    "time/sync_s",
    "time/recompute_s",
    "time/other_s",
    "time/round_s",
    "sampler/tokens_per_s",
    "time/wall_s",
    "mem/generate_rss_mib",
    "mem/reward_rss_mib",
    "mem/train_rss_mib",
    "mem/sync_rss_mib",
)
EVAL_KEYS = (
    "progress/round",
    "progress/samples",
    "eval/accuracy",
    "eval/reward_mean",
    "eval/completion_len",
    "eval/n",
    "time/eval_s",
)
SUMMARY_KEYS = (
    "eval/accuracy_before",
    "eval/accuracy_after",
    "rounds",
    "samples",
    "sampler",
    "algorithm",
    "time/total_s",
    "time/generate_s_total",
    "time/reward_s_total",
    "time/train_s_total",
    "time/sync_s_total",
    "time/recompute_s_total",
    "time/other_s_total",
    "time/rounds_s_total",
    "mem/train_rss_mib_max",
    "iw/staleness_avg",
    "iw/log_w_mean_avg",
)


# ----------------------------------------------------------------------------- helpers


def is_timing(key: str) -> bool:
    """Wall-clock and memory measurements: the only values allowed to differ between equivalent runs."""
    return key.startswith(("time/", "mem/")) or key in (
        "sampler/tokens_per_s",
        "algorithm/gen_alpha_s",
        "algorithm/predicted_s_per_sample",
        "calibration",  # the machine's speed and load at the run's end (rapid.profiling.calibrate)
    )


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "HYDRA_"))}
    env.update(
        OMP_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        RAPID_CACHE=str(tmp / "rapid_cache"),
        PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        WANDB_MODE="disabled",
    )
    env.update(extra)
    return env


def command(args: list[str], tmp: Path, *, shaped: bool = False, nproc: int = 1) -> list[str]:
    """argv of `python -m rapid.train <args>` (through SHAPED_LAUNCHER if `shaped`, torchrun if nproc > 1)."""
    if shaped:  # the shaped reward credits any digit, so arithmetic's reward self-test would (rightly) refuse it
        launcher = tmp / "shaped_launcher.py"
        launcher.write_text(SHAPED_LAUNCHER)
        entry = [str(launcher)]
        args = [*args, "reward.self_test=0"]
    else:
        entry = ["-m", "rapid.train"]
    if nproc > 1:
        entry = [
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc_per_node={nproc}",
            *(entry if shaped else ["--module", "rapid.train"]),
        ]
    if not any(a.startswith("sampler=") for a in args):
        args = [*args, "sampler=hf"]  # per-sample seeds: runs are exactly reproducible (see test_vllm_sampler.py)
    return [sys.executable, *entry, *args]


def launch(
    args: list[str], tmp: Path, *, shaped: bool = False, nproc: int = 1, check: bool = True, **env: str
) -> subprocess.CompletedProcess:
    """Run rapid.train with Hydra `args` (stdout and stderr together in .stdout)."""
    proc = subprocess.run(
        command(args, tmp, shaped=shaped, nproc=nproc),
        cwd=REPO,
        env=env_for(tmp, **env),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=TIMEOUT_S,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"rapid.train {' '.join(args)} exited with {proc.returncode}:\n{proc.stdout[-6000:]}")
    return proc


def launch_all(cases: dict[str, list[str]], tmp: Path) -> dict[str, tuple[int, str]]:
    """Run several short (failing) launches at once: {name: (exit code, stdout + stderr)}."""
    procs = {
        name: subprocess.Popen(
            command(args, tmp), cwd=REPO, env=env_for(tmp), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for name, args in cases.items()
    }
    return {name: (p.communicate(timeout=TIMEOUT_S)[0], p.returncode)[::-1] for name, p in procs.items()}


def assert_one_sentence_error(code: int, out: str, words: tuple[str, ...]) -> None:
    """Exit code != 0, one `rapid: ...` line naming `words`, and no stack trace."""
    assert code != 0, f"the run was accepted:\n{out[-3000:]}"
    assert "Traceback" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if line.startswith("rapid:")]
    assert len(lines) == 1, out[-3000:]
    assert all(w in lines[0] for w in words), lines[0]


def read_rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def train_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "train/reward_mean" in r]


def eval_rows(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "eval/accuracy" in r]


def final_weights(run_dir: Path, round_: int) -> dict[str, torch.Tensor]:
    return load_file(run_dir / "checkpoints" / f"round_{round_:06d}" / "model" / "model.safetensors")


def assert_rows_equal(got: list[dict], want: list[dict], tol: float = 1e-6) -> None:
    """Same rows, same keys, same non-timing values (to `tol` relative and absolute)."""
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    for g, w in zip(got, want):
        for key in w:
            if not is_timing(key):
                assert g[key] == pytest.approx(w[key], rel=tol, abs=tol), (w["progress/round"], key)


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float) -> float:
    assert sorted(got) == sorted(want)
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst <= atol, f"largest parameter difference {worst:.3g} > {atol}"
    return worst


# ----------------------------------------------------------------------------- tests


def test_smoke_run_writes_config_metrics_summary(tmp_path):
    run = tmp_path / "run"
    # T = 0.7: log μ (sampler) and log π_θ (trainer) must both be taken at the sampling temperature
    launch(["+experiment=smoke", "sampler.temperature=0.7", "logger.rollouts=true", f"hydra.run.dir={run}"], tmp_path)

    cfg = yaml.safe_load((run / "config.yaml").read_text())
    a = cfg["algorithm"]
    assert (a["H"], a["n_step"], a["n_group"]) == (2, 8, 4)
    assert a["n_inference"] == a["H"] * a["n_step"] == 16  # the `mul` resolver, resolved
    assert cfg["model"]["name"] == "tiny-llama" and cfg["rounds"] == 3 and cfg["sampler"]["temperature"] == 0.7
    assert json.loads((run / "meta.json").read_text())["world_size"] == 1
    split = json.loads((run / "split.json").read_text())
    assert len(split["train"]) == 384 and len(split["eval"]) == 16 and not set(split["train"]) & set(split["eval"])

    rows = read_rows(run)
    trains, evals = train_rows(rows), eval_rows(rows)
    assert [r["progress/round"] for r in trains] == [1, 2, 3]
    assert [r["progress/round"] for r in evals] == [0, 2, 3]  # before, eval.every=2, after
    for r in trains:
        assert set(TRAIN_KEYS) <= set(r), set(TRAIN_KEYS) - set(r)
        assert all(isinstance(r[k], (int, float)) and math.isfinite(r[k]) for k in TRAIN_KEYS), r
        assert r["progress/samples"] == 16 * r["progress/round"]
        assert r["progress/epoch"] == pytest.approx(16 / 4 * r["progress/round"] / (400 - 16))  # 384 training problems
        assert 0.0 <= r["train/reward_mean"] <= 1.0 and 0.0 <= r["train/truncated_frac"] <= 1.0
        assert 1.0 <= r["train/completion_len"] <= 8.0  # max_new_tokens
        # cosine decay of lr 2e-5 over rounds * H = 6 steps; the row reports the round's last step
        step = 2 * r["progress/round"] - 1
        assert r["train/lr"] == pytest.approx(2e-5 * 0.5 * (1 + math.cos(math.pi * step / 6)))
        assert r["time/round_s"] > 0 and r["sampler/tokens_per_s"] > 0
        # the phases and "other" partition the round; no recompute with behavior_logprobs=sampler
        phases = [r[f"time/{p}_s"] for p in ("generate", "reward", "recompute", "train", "sync", "other")]
        assert min(phases) >= 0 and r["time/recompute_s"] == 0 and sum(phases) == pytest.approx(r["time/round_s"])
        assert all(100 < r[f"mem/{p}_rss_mib"] < 24 * 1024 for p in ("generate", "reward", "train", "sync"))
        # The random model earns no reward, so every advantage is 0 and θ never moves: every
        # importance weight is π_θ/μ = 1 up to float error, which checks that the sampler's
        # log μ and the trainer's log π_θ are the same distribution (same tokens, same T).
        assert r["train/reward_mean"] == 0.0 and r["train/grad_norm"] == 0.0
        assert r["iw/mean"] == pytest.approx(1.0, abs=1e-4)
        assert 1.0 <= r["iw/max"] < 1.0 + 1e-4
        assert 0.0 <= r["iw/staleness"] < 1e-4 and r["iw/clip_frac"] == 0.0
        assert abs(r["iw/log_w_mean"]) <= r["iw/staleness"] + 1e-12
    assert [r["time/wall_s"] for r in trains] == sorted(r["time/wall_s"] for r in trains)
    for r in evals:
        assert set(EVAL_KEYS) <= set(r) and r["eval/n"] == 16 and 0.0 <= r["eval/accuracy"] <= 1.0
    # eval_outcomes.jsonl: each evaluation's per-problem greedy verdicts, agreeing with its accuracy
    outcomes = [json.loads(line) for line in (run / "eval_outcomes.jsonl").read_text().splitlines()]
    assert [o["round"] for o in outcomes] == [r["progress/round"] for r in evals]
    for o, r in zip(outcomes, evals):
        assert len(o["correct"]) == 16 and set(o["correct"]) <= {0, 1}
        assert sum(o["correct"]) / 16 == r["eval/accuracy"]

    summary = json.loads((run / "summary.json").read_text())
    assert set(SUMMARY_KEYS) <= set(summary), set(SUMMARY_KEYS) - set(summary)
    assert summary["sampler"] == "hf" and summary["algorithm"] == "rapid"
    assert summary["rounds"] == 3 and summary["samples"] == 48
    assert summary["eval/accuracy_before"] == evals[0]["eval/accuracy"]
    assert summary["eval/accuracy_after"] == evals[-1]["eval/accuracy"]
    assert summary["time/generate_s_total"] == pytest.approx(sum(r["time/generate_s"] for r in trains))
    assert summary["time/total_s"] >= trains[-1]["time/wall_s"]
    assert summary["time/rounds_s_total"] == pytest.approx(sum(r["time/round_s"] for r in trains))
    assert summary["mem/train_rss_mib_max"] == max(r["mem/train_rss_mib"] for r in trains)
    assert summary["iw/log_w_mean_avg"] == pytest.approx(sum(r["iw/log_w_mean"] for r in trains) / 3, abs=1e-12)

    # logger.rollouts: every round's 16 samples, in the order trained, with their prompt's training index
    samples = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    assert [s["round"] for s in samples] == [k for k in (1, 2, 3) for _ in range(16)]
    assert all(0 <= s["prompt_index"] < 384 and 1 <= len(s["completion_ids"]) <= 8 for s in samples)
    assert [sum(s["reward"] for s in samples if s["round"] == r["progress/round"]) / 16 for r in trains] == [
        r["train/reward_mean"] for r in trains
    ]

    # ckpt.every=2, keep=1: round 2 was saved, then replaced by the final round 3
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["round_000003"]
    state = torch.load(run / "checkpoints" / "round_000003" / "state.pt", weights_only=False)
    assert state["round"] == 3 and state["config"]["algorithm"]["n_inference"] == 16
    assert (run / "checkpoints" / "round_000003" / "model" / "model.safetensors").exists()


@pytest.mark.slow
def rewind_to_round_2(run: Path, rows: list[dict]) -> None:
    """Leave a finished 4-round run as if it had been killed during round 3 (checkpoint of round 2 kept)."""
    shutil.rmtree(run / "checkpoints" / "round_000004")
    (run / "summary.json").unlink()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["progress/round"] <= 2))


@pytest.mark.slow
def test_resume_reproduces_uninterrupted_run(tmp_path):
    overrides = ["+experiment=smoke", "device=cpu", "rounds=4", "ckpt.every=2", "ckpt.keep=5", "optim.lr=1e-3"]
    run_a = tmp_path / "a"
    launch([*overrides, f"hydra.run.dir={run_a}"], tmp_path, shaped=True)
    rows_a = read_rows(run_a)
    assert sorted(p.name for p in (run_a / "checkpoints").iterdir()) == ["round_000002", "round_000004"]
    # not vacuous: the parameters move every step, so off-policy weights leave 1 on the 2nd step
    assert all(r["train/grad_norm"] > 0 for r in train_rows(rows_a))
    assert max(r["iw/staleness"] for r in train_rows(rows_a)) > 1e-3
    assert len({r["train/reward_mean"] for r in train_rows(rows_a)}) > 1

    # B: the state of run A killed during round 3
    run_b = tmp_path / "b"
    shutil.copytree(run_a, run_b)
    rewind_to_round_2(run_b, rows_a)
    proc = launch([f"resume={run_b}", f"hydra.run.dir={tmp_path / 'resume_hydra'}"], tmp_path, shaped=True)
    assert "at round 2" in proc.stdout

    rows_b = read_rows(run_b)
    assert rows_b[: len(rows_b) - sum(r["progress/round"] > 2 for r in rows_b)] == [
        r for r in rows_a if r["progress/round"] <= 2
    ]
    assert_rows_equal([r for r in rows_b if r["progress/round"] > 2], [r for r in rows_a if r["progress/round"] > 2])
    assert [r["progress/round"] for r in rows_b if r["progress/round"] > 2] == [3, 4, 4]  # train 3, train 4, final eval
    assert_same_weights(final_weights(run_b, 4), final_weights(run_a, 4), atol=1e-6)
    # and the optimizer moments, so that a second resume would also continue exactly
    opt_a = torch.load(run_a / "checkpoints" / "round_000004" / "state.pt", weights_only=False)["optimizer"]
    opt_b = torch.load(run_b / "checkpoints" / "round_000004" / "state.pt", weights_only=False)["optimizer"]
    for i, s in opt_a["state"].items():
        for k in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt_b["state"][i][k], s[k], rtol=1e-6, atol=1e-9)
    summary_a, summary_b = (json.loads((d / "summary.json").read_text()) for d in (run_a, run_b))
    assert {k: v for k, v in summary_b.items() if not is_timing(k)} == {
        k: v for k, v in summary_a.items() if not is_timing(k)
    }


@pytest.mark.slow
def test_auto_h_moves_stops_early_and_resumes(tmp_path):
    """algorithm.H=auto on the tiny model with a learnable reward (lr 1e-2, so the policy moves fast):
    H grows from 1 while the importance weights stay fresh, shrinks when they go stale, a round whose
    ESS falls below the floor stops early, and the sample budget is spent exactly. With
    cost_tolerance=0 the choice depends on the weights alone, so a run resumed from a mid-run
    checkpoint repeats the same H sequence and ends with the same weights."""
    budget, n_step = 192, 8
    overrides = [
        "+experiment=smoke",
        "device=cpu",
        "algorithm.H=auto",
        f"samples={budget}",
        "algorithm.auto_h.max=8",
        "algorithm.auto_h.cost_tolerance=0",
        "algorithm.auto_h.ess_floor=0.45",
        "optim.lr=1e-2",
        "eval.every=0",
        "eval.every_samples=64",
        "ckpt.every=2",
        "ckpt.keep=20",
    ]
    run_a = tmp_path / "a"
    launch([*overrides, f"hydra.run.dir={run_a}"], tmp_path, shaped=True)
    cfg = yaml.safe_load((run_a / "config.yaml").read_text())
    assert (cfg["algorithm"]["H"], cfg["algorithm"]["n_inference"], cfg["rounds"], cfg["samples"]) == (
        "auto",
        "auto",
        None,
        budget,
    )
    rows_a = read_rows(run_a)
    trains = train_rows(rows_a)
    hs = [r["algorithm/H"] for r in trains]
    assert hs[0] == 1 and max(hs) >= 4, hs  # starts at min, grows
    assert any(b < a for a, b in zip(hs, hs[1:])), hs  # and shrinks
    samples = 0
    for r, nxt in zip(trains, trains[1:] + [None]):
        samples += r["algorithm/H"] * n_step
        assert r["progress/samples"] == samples  # generated, cumulative
        assert r["algorithm/steps"] * n_step + r["algorithm/unused_samples"] == r["algorithm/H"] * n_step
        if r["algorithm/unused_samples"]:  # stopped: the step below the floor was measured, not applied
            assert r["algorithm/ess_last"] < 0.45 and r["algorithm/steps"] < r["algorithm/H"]
        else:
            assert r["algorithm/ess_last"] >= 0.45 and r["algorithm/steps"] == r["algorithm/H"]
        assert 1 <= r["algorithm/next_H"] <= min(8, 2 * r["algorithm/H"], r["algorithm/next_H_ess"])
        if nxt is not None:  # the next round runs the chosen H, cut to the budget left
            assert nxt["algorithm/H"] == min(r["algorithm/next_H"], (budget - samples) // n_step)
        # the cosine schedule runs over budget / n_step = 24 steps indexed by samples generated: the
        # row's lr is that of its last applied step
        step = (r["progress/samples"] - r["algorithm/H"] * n_step) // n_step + r["algorithm/steps"] - 1
        assert r["train/lr"] == pytest.approx(1e-2 * 0.5 * (1 + math.cos(math.pi * step / 24)), rel=1e-6)
    assert samples == budget and any(r["algorithm/unused_samples"] for r in trains)
    # eval.every_samples=64: after the rounds that cross 64, 128 and 192 samples, and before training
    crossing = [
        r["progress/round"]
        for r in trains
        if r["progress/samples"] // 64 > (r["progress/samples"] - r["algorithm/H"] * n_step) // 64
    ]
    assert [r["progress/round"] for r in eval_rows(rows_a)] == [0, *crossing] and len(crossing) == 3
    summary = json.loads((run_a / "summary.json").read_text())
    assert (summary["samples"], summary["rounds"]) == (budget, len(trains))
    assert summary["unused_samples"] == sum(r["algorithm/unused_samples"] for r in trains) > 0
    last = sorted((run_a / "checkpoints").iterdir())[-1]
    assert torch.load(last / "state.pt", weights_only=False)["auto_h"]["H"] == trains[-1]["algorithm/next_H"]

    # B: the state of run A killed during round 5
    run_b = tmp_path / "b"
    shutil.copytree(run_a, run_b)
    for ckpt in (run_b / "checkpoints").iterdir():
        if ckpt.name > "round_000004":
            shutil.rmtree(ckpt)
    (run_b / "summary.json").unlink()
    (run_b / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows_a if r["progress/round"] <= 4))
    proc = launch([f"resume={run_b}", f"hydra.run.dir={tmp_path / 'resume_hydra'}"], tmp_path, shaped=True)
    assert "at round 4" in proc.stdout
    assert_rows_equal(
        [r for r in read_rows(run_b) if r["progress/round"] > 4], [r for r in rows_a if r["progress/round"] > 4]
    )
    assert_same_weights(final_weights(run_b, len(trains)), final_weights(run_a, len(trains)), atol=1e-6)


@pytest.mark.slow
def test_ddp_two_ranks_match_single_process(tmp_path):
    # H = 1: one gradient step per round on the whole round (16 records, 4 prompts); on 2 ranks
    # each takes 2 prompts and 2 micro-batches of one group; DDP averages the two halves.
    overrides = [
        "+experiment=smoke",
        "device=cpu",
        "algorithm.H=1",
        "algorithm.n_step=16",
        "train.micro_batch=4",
        "optim.lr=1e-3",
        "rounds=2",
        "ckpt.every=1",
        "ckpt.keep=2",
    ]
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    launch([*overrides, f"hydra.run.dir={single}"], tmp_path, shaped=True)
    launch([*overrides, f"hydra.run.dir={ddp}"], tmp_path, shaped=True, nproc=2)
    assert json.loads((ddp / "meta.json").read_text())["world_size"] == 2

    rows_1, rows_2 = read_rows(single), read_rows(ddp)
    t1, t2 = train_rows(rows_1), train_rows(rows_2)
    assert [r["progress/round"] for r in t2] == [1, 2]
    assert all(r["train/grad_norm"] > 0 for r in t1)  # not vacuous
    for r1, r2 in zip(t1, t2):
        # the same completions (seeded per round, prompt, sample), so the same rewards and lengths
        for key in (
            "progress/samples",
            "train/reward_mean",
            "train/accuracy",
            "train/completion_len",
            "train/truncated_frac",
        ):
            assert r2[key] == r1[key], (r1["progress/round"], key)
        for key in ("train/loss", "train/grad_norm", "iw/mean", "iw/staleness"):
            assert r2[key] == pytest.approx(r1[key], rel=1e-4, abs=1e-5), (r1["progress/round"], key)
        # on-policy (H = 1): π_θ = μ on every step, so every importance weight is 1
        assert r2["iw/mean"] == pytest.approx(1.0, abs=1e-4) and r2["iw/staleness"] < 1e-4
    assert [(r["progress/round"], r["eval/accuracy"], r["eval/n"]) for r in eval_rows(rows_2)] == [
        (r["progress/round"], r["eval/accuracy"], r["eval/n"]) for r in eval_rows(rows_1)
    ]
    # Only rank 0 saves. Rank 1's parameters after round 1 decide its half of round 2's samples
    # and gradient, so round-2 rows and final weights equal to the single process's also show
    # that the ranks stayed in sync.
    for round_ in (1, 2):
        assert_same_weights(final_weights(ddp, round_), final_weights(single, round_), atol=1e-5)
    step_2 = max((final_weights(single, 2)[k] - w).abs().max().item() for k, w in final_weights(single, 1).items())
    assert step_2 > 1e-4  # Adam at lr 1e-3 moved the weights


@pytest.mark.slow
def test_ddp_groups_spanning_ranks_match_single_process(tmp_path):
    """The paper's n_step 4, n_group 4 on 2 ranks: every step trains one group, two records per rank,
    so each rank's loss needs the other's rewards and weights (rapid.policy.gather_peers). H = 2, so the
    second step of a round is off-policy (w != 1). Rounds and weights equal the single process's."""
    overrides = [
        "+experiment=smoke",
        "device=cpu",
        "algorithm.H=2",
        "algorithm.n_step=4",
        "algorithm.n_group=4",
        "train.micro_batch=4",
        "optim.lr=1e-2",
        "rounds=2",
        "eval.every=0",
        "ckpt.every=1",
        "ckpt.keep=2",
    ]
    single, ddp = tmp_path / "single", tmp_path / "ddp"
    launch([*overrides, f"hydra.run.dir={single}"], tmp_path, shaped=True)
    launch([*overrides, f"hydra.run.dir={ddp}"], tmp_path, shaped=True, nproc=2)
    t1, t2 = train_rows(read_rows(single)), train_rows(read_rows(ddp))
    assert [r["progress/round"] for r in t2] == [1, 2]
    assert any(r["iw/staleness"] > 1e-3 for r in t1)  # off-policy steps
    for r1, r2 in zip(t1, t2):
        for key in ("progress/samples", "train/reward_mean", "train/completion_len"):
            assert r2[key] == r1[key], (r1["progress/round"], key)
        for key in ("train/loss", "iw/mean", "iw/staleness"):
            assert r2[key] == pytest.approx(r1[key], rel=1e-4, abs=1e-5), (r1["progress/round"], key)
    # AdamW divides by sqrt(v): where a gradient coordinate is ~0, the float rounding of two 2-record
    # forwards against one 4-record forward moves a weight by a small fraction of lr (1e-2); the exact
    # gradient comparison, with plain SGD, is tests/test_span_ranks.py
    for round_ in (1, 2):
        assert_same_weights(final_weights(ddp, round_), final_weights(single, round_), atol=1e-4)


@pytest.mark.slow
def test_fsdp_run_matches_ddp(tmp_path):
    """train.parallel=fsdp on 2 ranks: parameters, gradients and AdamW state sharded (FSDP2), the engine
    synced from whole gathered weights, checkpoints gathered on rank 0. Its rounds and weights equal
    DDP's, and a run killed after round 1 resumes from its checkpoint to the same weights."""
    overrides = ["+experiment=smoke", "device=cpu", "sampler=vllm", "model.dtype=float32", "algorithm.H=2",
                 "optim.lr=1e-2", "rounds=2", "eval.every=0", "ckpt.every=1", "ckpt.keep=2"]  # fmt: skip
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    launch([*overrides, f"hydra.run.dir={ddp}"], tmp_path, shaped=True, nproc=2)
    launch([*overrides, "train.parallel=fsdp", f"hydra.run.dir={fsdp}"], tmp_path, shaped=True, nproc=2)
    t1, t2 = train_rows(read_rows(ddp)), train_rows(read_rows(fsdp))
    assert [r["progress/round"] for r in t2] == [1, 2] and t2[0]["train/grad_norm"] > 0
    for r1, r2 in zip(t1, t2):
        for key in ("progress/samples", "train/reward_mean", "train/completion_len"):
            assert r2[key] == r1[key], (r1["progress/round"], key)
        for key in ("train/loss", "train/grad_norm", "iw/mean", "iw/staleness"):
            assert r2[key] == pytest.approx(r1[key], rel=1e-4, abs=1e-5), (r1["progress/round"], key)
    for round_ in (1, 2):
        assert_same_weights(final_weights(fsdp, round_), final_weights(ddp, round_), atol=1e-4)
    # killed during round 2: the sharded run resumes from its gathered round-1 checkpoint, exactly (on CPU the
    # engines sample from torch's global generator, seeded per rank: each rank restores its own RNG states)
    resumed = tmp_path / "resumed"
    shutil.copytree(fsdp, resumed)
    shutil.rmtree(resumed / "checkpoints" / "round_000002")
    (resumed / "summary.json").unlink()
    rows = read_rows(fsdp)
    (resumed / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows if r["progress/round"] <= 1))
    proc = launch([f"resume={resumed}", f"hydra.run.dir={tmp_path / 'resume_hydra'}"], tmp_path, shaped=True, nproc=2)
    assert "at round 1" in proc.stdout
    assert_same_weights(final_weights(resumed, 2), final_weights(fsdp, 2), atol=1e-6)


def test_fsdp_refuses_the_hf_sampler():
    from hydra import compose, initialize_config_dir

    from rapid.config import ConfigError, register_resolvers, validate

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=["+experiment=smoke", "sampler=hf", "train.parallel=fsdp"])
    validate(cfg, world=1)  # one process: nothing is sharded
    with pytest.raises(ConfigError, match="train.parallel=fsdp .* sampler=vllm"):
        validate(cfg, world=2)


@pytest.mark.slow
def test_dapo_dynamic_sampling_with_groups_spanning_ranks(tmp_path):
    """DAPO's dynamic sampling at n_step 4, n_group 4 on 2 ranks: the kept groups of both ranks form one
    round, trimmed to whole minibatches of 4 on every rank alike, so both take the same steps."""
    run = tmp_path / "ddp"
    overrides = ["+experiment=smoke", "device=cpu", "algorithm=dapo", "algorithm.H=4", "algorithm.n_step=4"]
    launch([*overrides, "algorithm.n_group=4", "train.micro_batch=4", "rounds=2", "eval.every=0",
            "ckpt.every=0", f"hydra.run.dir={run}"], tmp_path, shaped=True, nproc=2)  # fmt: skip
    rows = train_rows(read_rows(run))
    assert [r["progress/round"] for r in rows] == [1, 2]
    assert all("train/dropped_groups" in r and math.isfinite(r["train/loss"]) for r in rows), rows
    # every draw counts as generated samples, never past the run's budget (2 rounds x 16), and the lr
    # schedule ends where the samples generated put it, whether or not trimming trained them all
    assert rows[0]["progress/samples"] <= rows[-1]["progress/samples"] <= 32 and rows[-1]["progress/samples"] % 4 == 0
    state = torch.load(run / "checkpoints" / f"round_{len(rows):06d}" / "state.pt", weights_only=False)
    assert state["scheduler"]["last_epoch"] == rows[-1]["progress/samples"] // 4


@pytest.mark.slow
def test_auto_h_under_ddp(tmp_path):
    """Two ranks with H=auto: every rank decides H and early stops from the ESS of the whole minibatch
    (moments all-reduced) and from phase times averaged over ranks, so all take the same number of
    steps. Ranks that disagreed would issue different collectives (DDP's gradient all-reduce, the ESS
    all-reduce) and the run would hang or fail; here it finishes with H moving and rounds stopped early."""
    run = tmp_path / "ddp"
    launch(
        [
            "+experiment=smoke",
            "device=cpu",
            "algorithm.H=auto",
            "samples=96",
            "algorithm.auto_h.max=8",
            "algorithm.auto_h.ess_target=0.9",
            "algorithm.auto_h.ess_floor=0.8",
            "train.micro_batch=4",
            "optim.lr=1e-2",
            "eval.every=0",
            "ckpt.every=0",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
        shaped=True,
        nproc=2,
    )
    assert json.loads((run / "meta.json").read_text())["world_size"] == 2
    rows = train_rows(read_rows(run))
    assert len({r["algorithm/H"] for r in rows}) >= 2 and any(r["algorithm/unused_samples"] for r in rows)
    assert sum(r["algorithm/H"] for r in rows) * 8 == rows[-1]["progress/samples"] == 96
    assert all(r["algorithm/steps"] * 8 + r["algorithm/unused_samples"] == r["algorithm/H"] * 8 for r in rows)


@pytest.mark.slow
def test_invalid_config_one_sentence(tmp_path):
    cases = {
        "n_step": (["algorithm.n_step=6", "algorithm.n_group=4"], ("n_step=6", "n_group=4")),
        "n_inference": (["algorithm.n_inference=100"], ("n_inference=100", "H * n_step")),
        "cuda": (["device=cuda"], ("device=cuda", "GPU")),
        "top_p": (["sampler.top_p=0.9"], ("sampler.top_p=0.9", "top_p=1.0")),
        "correction": (["algorithm.engine_correction=token"], ("engine_correction=token", "recompute")),
    }
    if torch.cuda.is_available():
        del cases["cuda"]
    results = launch_all(
        {
            name: ["+experiment=smoke", *overrides, f"hydra.run.dir={tmp_path / name}"]
            for name, (overrides, _) in cases.items()
        },
        tmp_path,
    )
    for name, (overrides, words) in cases.items():
        assert_one_sentence_error(*results[name], words)
        assert not (tmp_path / name / "metrics.jsonl").exists(), overrides


@pytest.mark.slow
def test_invalid_task_or_sampler_one_sentence(tmp_path):
    """Unknown task, unknown sampler and an impossible eval split stop with one `rapid:` line."""
    cases = {
        "n_eval": (["task.n_eval=400"], ("task.n_eval=400",)),
        "task": (["task.name=nope"], ("nope",)),
        "sampler": (["sampler.name=nope"], ("nope",)),
    }
    results = launch_all(
        {
            name: ["+experiment=smoke", *overrides, f"hydra.run.dir={tmp_path / name}"]
            for name, (overrides, _) in cases.items()
        },
        tmp_path,
    )
    for name, (_, words) in cases.items():
        assert_one_sentence_error(*results[name], words)


@pytest.mark.slow
def test_multirun_sweep_dirs(tmp_path):
    sweep = tmp_path / "sweep"
    launch(["-m", "algorithm.H=1,2", "+experiment=smoke", "rounds=1", f"hydra.sweep.dir={sweep}"], tmp_path)
    runs = sorted(p for p in sweep.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert len(runs) == 2, [p.name for p in runs]
    for H, run in zip((1, 2), runs):
        assert f"algorithm.H={H}" in run.name and "rounds=1" in run.name, run.name
        cfg = yaml.safe_load((run / "config.yaml").read_text())
        assert cfg["algorithm"]["H"] == H and cfg["algorithm"]["n_inference"] == 8 * H
        summary = json.loads((run / "summary.json").read_text())
        assert summary["rounds"] == 1 and summary["samples"] == 8 * H
        assert [r["progress/samples"] for r in train_rows(read_rows(run))] == [8 * H]


@pytest.mark.slow
def test_wandb_offline(tmp_path):
    try:
        import wandb  # noqa: F401
    except ImportError:
        pytest.skip("wandb is not installed (pip install -e '.[wandb]'); logger.wandb=true cannot be tested")
    run = tmp_path / "run"
    wandb_home = tmp_path / "wandb_home"
    launch(
        ["+experiment=smoke", "rounds=1", "logger.wandb=true", f"hydra.run.dir={run}"],
        tmp_path,
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_CONFIG_DIR=str(wandb_home / "config"),
        WANDB_CACHE_DIR=str(wandb_home / "cache"),
        WANDB_DATA_DIR=str(wandb_home / "data"),
    )
    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, list((run / "wandb").iterdir()) if (run / "wandb").exists() else "no wandb/"
    records = list(offline[0].glob("run-*.wandb"))
    assert len(records) == 1, list(offline[0].iterdir())
    data = records[0].read_bytes()  # protobuf records: keys are stored as plain strings
    for key in ("train/reward_mean", "iw/staleness", "eval/accuracy", "n_inference"):
        assert key.encode() in data, f"{key} was not logged to wandb"
    assert json.loads((run / "summary.json").read_text())["rounds"] == 1


@pytest.mark.slow
def test_training_raises_a_learnable_reward(tmp_path):
    """The whole loop climbs the reward: with "contains a digit" as the reward, RAPID (H = 2, so
    the second step of every round is off-policy) takes the random model from about half of
    its samples rewarded to nearly all within 10 rounds (1.0 on this machine), and greedy
    decoding follows. A sign error anywhere on the gradient path drives it to ~0 instead."""
    run = tmp_path / "run"
    launch(
        [
            "+experiment=smoke",
            "train.skip_zero_advantage=true",  # the default: groups of equal rewards 0 are not run
            "device=cpu",
            "rounds=10",
            "algorithm.n_step=16",
            "optim.lr=1e-2",
            "eval.every=0",
            "ckpt.every=0",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
        shaped=True,
    )
    rewards = [r["train/reward_mean"] for r in train_rows(read_rows(run))]
    assert len(rewards) == 10
    assert 0.3 < rewards[0] < 0.8  # the random model: about half
    late = sum(rewards[-3:]) / 3
    assert late >= 0.85 and late >= rewards[0] + 0.25, rewards
    summary = json.loads((run / "summary.json").read_text())
    assert summary["eval/accuracy_after"] > summary["eval/accuracy_before"], summary


@pytest.mark.slow
def test_steps_of_zero_advantage_run_nothing_and_log_what_they_can(tmp_path):
    """train.skip_zero_advantage (the default): the random model earns no reward, so every group has
    advantage 0 and no step runs a forward. The rows say so (trained_frac 0, loss 0, gradient norm 0)
    and leave out the statistics that only records run could give (importance weights, the
    sampler/trainer gap), instead of reporting made-up values."""
    run = tmp_path / "run"
    launch(["+experiment=smoke", "train.skip_zero_advantage=true", "rounds=2", f"hydra.run.dir={run}"], tmp_path)
    trains = train_rows(read_rows(run))
    assert [r["progress/round"] for r in trains] == [1, 2]
    for r in trains:
        assert r["train/reward_mean"] == 0.0
        assert r["train/trained_frac"] == 0.0 and r["train/loss"] == 0.0 and r["train/grad_norm"] == 0.0
        assert not [k for k in r if k.startswith("iw/")] and "sampler/logprob_mismatch" not in r


def test_summary_averages_staleness_over_the_rounds_that_trained():
    """A round whose every group has advantage 0 trains on no record and logs no importance weights;
    the summary's averages are over the rounds that did (3 of 4 here), wherever the missing round falls."""
    from rapid.logger import summarize

    def row(stale=None):
        times = {f"time/{p}_s": 1.0 for p in ("generate", "reward", "recompute", "train", "sync", "other")}
        iw = {} if stale is None else {"iw/staleness": stale, "iw/log_w_mean": -stale / 2}
        return {"train/reward_mean": 0.5, "time/round_s": 6.0, **times, **iw}

    for rows in ([row(0.1), row(), row(0.2), row(0.6)], [row(), row(0.1), row(0.2), row(0.6)]):
        s = summarize(rows, {"eval/accuracy": 0.5})
        assert s["iw/staleness_avg"] == pytest.approx(0.3, abs=1e-12)  # (0.1 + 0.2 + 0.6) / 3, not / 4
        assert s["iw/log_w_mean_avg"] == pytest.approx(-0.15, abs=1e-12)
        assert s["time/rounds_s_total"] == 24.0
    assert "iw/staleness_avg" not in summarize([row(), row()], {"eval/accuracy": 0.5})


@pytest.mark.slow
def test_resume_with_the_vllm_engine_samples_from_the_resumed_weights(tmp_path):
    """The engine is built from the initial weights; a resumed run must push the checkpoint's weights into
    it before its first round. The first minibatch of a round has θ = μ, so the engine's and the trainer's
    log-probs agree to fp32 noise (~1e-5) if the engine holds the resumed weights, and differ by the
    distance trained so far if it still holds the initial ones (0.25 nats a token measured without the sync)."""
    overrides = [
        "+experiment=smoke",
        "sampler=vllm",
        "device=cpu",
        "rounds=4",
        "ckpt.every=2",
        "ckpt.keep=5",
        "optim.lr=1e-3",
    ]
    run = tmp_path / "run"
    launch([*overrides, f"hydra.run.dir={run}"], tmp_path, shaped=True)
    rows = read_rows(run)
    assert max(r["iw/staleness"] for r in train_rows(rows)) > 1e-3  # the weights moved before round 3
    rewind_to_round_2(run, rows)
    proc = launch([f"resume={run}", f"hydra.run.dir={tmp_path / 'resume_hydra'}"], tmp_path, shaped=True)
    assert "at round 2" in proc.stdout
    gaps = {r["progress/round"]: r["sampler/logprob_mismatch"] for r in train_rows(read_rows(run))}
    assert set(gaps) == {1, 2, 3, 4}
    assert max(gaps.values()) < 1e-3, gaps


@pytest.mark.slow
def test_resume_of_finished_run_adds_no_rows(tmp_path):
    """Resuming a run that already finished re-reports its final evaluation but logs no new rows."""
    run = tmp_path / "run"
    launch(["+experiment=smoke", "rounds=1", f"hydra.run.dir={run}"], tmp_path)
    before = read_rows(run)
    launch([f"resume={run}", f"hydra.run.dir={tmp_path / 'resume_hydra'}"], tmp_path)
    after = read_rows(run)
    assert [(r["progress/round"], "eval/accuracy" in r) for r in after] == [
        (r["progress/round"], "eval/accuracy" in r) for r in before
    ]


@pytest.mark.slow
@pytest.mark.parametrize(
    "algorithm, keys",
    [
        ("pg", ("iw/clip_frac", "iw/staleness", "iw/mean")),
        ("grpo", ("loss/clip_frac", "loss/kl_mean", "loss/ratio_mean", "loss/clip_frac_low", "loss/clip_frac_high")),
        ("dapo", ("loss/clip_frac", "loss/ratio_mean", "train/dropped_groups")),
    ],
)
@pytest.mark.slow
def test_baselines_run_in_the_same_loop(tmp_path, algorithm, keys):
    """PG, GRPO and DAPO run end to end through the same loop, log their own statistics, and raise the reward."""
    run = tmp_path / "run"
    launch(
        [
            "+experiment=smoke",
            f"algorithm={algorithm}",
            "algorithm.H=1",
            "rounds=6",
            "algorithm.n_step=16",
            "optim.lr=1e-2",
            "eval.every=0",
            "ckpt.every=0",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
        shaped=True,
    )
    rows = train_rows(read_rows(run))
    if algorithm == "dapo":  # dynamic sampling's extra draws count against the 6 rounds' 96 samples, and stop there
        assert rows[-1]["progress/samples"] == 96 and 1 <= len(rows) <= 6
        assert sum(r["train/optimizer_steps"] for r in rows) <= 6
        summary = json.loads((run / "summary.json").read_text())  # both budgets, and how busy the machine was
        assert summary["optimizer_steps"] == sum(r["train/optimizer_steps"] for r in rows)
        assert summary["calibration"]["matmul_s"] > 0
    else:
        assert len(rows) == 6 and rows[-1]["progress/samples"] == 96
    for key in keys:  # a DAPO round that spent the budget before a minibatch was found trains no step
        assert all(key in r and math.isfinite(r[key]) for r in rows if r["train/optimizer_steps"]), key
    cfg = yaml.safe_load((run / "config.yaml").read_text())["algorithm"]
    assert cfg["name"] == algorithm and (cfg["H"] == 1)
    if algorithm == "pg":  # on-policy: every importance weight is 1
        assert all(abs(r["iw/mean"] - 1) < 1e-4 and r["iw/staleness"] < 1e-4 for r in rows)
    if algorithm == "grpo":  # the policy moves away from the reference
        assert rows[-1]["loss/kl_mean"] > 0
    assert sum(r["train/reward_mean"] for r in rows[-2:]) / 2 > rows[0]["train/reward_mean"]


@pytest.mark.slow
def test_bf16_recomputes_log_mu_and_corrects_for_the_engine(tmp_path):
    """model.dtype=bfloat16 resolves behavior_logprobs=auto to recompute (the saved config says so),
    so the first step's weights are exactly 1; engine_correction logs its statistics."""
    run = tmp_path / "run"
    launch(
        [
            "+experiment=smoke",
            "model.dtype=bfloat16",
            "algorithm.H=1",
            "algorithm.engine_correction=sequence",
            "rounds=2",
            "eval.every=0",
            "ckpt.every=0",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
        shaped=True,
    )
    assert yaml.safe_load((run / "config.yaml").read_text())["algorithm"]["behavior_logprobs"] == "recompute"
    rows = train_rows(read_rows(run))
    for r in rows:
        assert r["time/recompute_s"] > 0 and r["train/grad_norm"] > 0
        assert r["iw/staleness"] < 1e-3 and abs(r["iw/log_w_mean"]) < 1e-3  # recomputed: w = 1 at θ = μ
        assert r["sampler/logprob_mismatch"] > 0  # the bf16 sampler/trainer gap
        assert 0.5 < r["sampler/correction_ratio_mean"] < 2 and 0 <= r["sampler/correction_trunc_frac"] <= 1


@pytest.mark.slow
def test_lr_schedule_spans_every_pass(tmp_path):
    """With num_iterations = 2 a round takes 2 * H steps, and the cosine decay runs over all of them:
    rounds 2 * H 2 passes = 8 steps, and the row of round r reports step 4r - 1 (0-based)."""
    run = tmp_path / "run"
    launch(
        [
            "+experiment=smoke",
            "algorithm=grpo",
            "algorithm.H=2",
            "algorithm.num_iterations=2",
            "rounds=2",
            "eval.every=0",
            "ckpt.every=0",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    rows = train_rows(read_rows(run))
    for r in rows:
        step = 4 * r["progress/round"] - 1
        assert r["train/lr"] == pytest.approx(2e-5 * 0.5 * (1 + math.cos(math.pi * step / 8)), rel=1e-9)
