"""rapid.adaptive_h: the H = auto controller as pure functions, driven by hand-made sequences of
per-step ESS values and phase times; every expected number is worked out in the comments."""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rapid import adaptive_h as ah
from rapid.config import ConfigError, register_resolvers, run_length, validate

REPO = Path(__file__).resolve().parents[1]

SETTINGS = ah.Settings(h_min=1, h_max=16, ess_target=0.5, ess_floor=0.2, cost_tolerance=0.05, n_step=32)


def on_curve(s: float, steps: int, e1: float = 1.0) -> list[tuple[int, float]]:
    """(k, e_k) of steps 1..steps of a round whose drift follows ℓ_k = s (k − 1)² exactly: e_k = e_1 exp(−s (k−1)²)."""
    return [(k, e1 * math.exp(-s * (k - 1) ** 2)) for k in range(1, steps + 1)]


def numbered(ess: list[float]) -> list[tuple[int, float]]:
    """(k, e_k) of a round whose every step k = 1.. was measured."""
    return list(enumerate(ess, start=1))


# ----------------------------------------------------------------------------- staleness


def test_drift_rate_by_hand():
    # ℓ = 0.1, 0.4, 0.9 at (k−1)² = 1, 4, 9: s = (0.1·1 + 0.4·4 + 0.9·9) / (1 + 16 + 81) = 9.8 / 98 = 0.1
    assert ah.drift_rate(on_curve(0.1, 4)) == pytest.approx(0.1, abs=1e-12)
    # a step-1 mismatch (e_1 = 0.8 instead of 1) scales every e_k alike: the drift is the same
    assert ah.drift_rate(on_curve(0.1, 4, e1=0.8)) == pytest.approx(0.1, abs=1e-12)
    # off the curve: ℓ_2 = 0.2, ℓ_3 = 0.2 -> s = (0.2·1 + 0.2·4) / (1 + 16) = 1/17
    assert ah.drift_rate(numbered([1.0, math.exp(-0.2), math.exp(-0.2)])) == pytest.approx(1 / 17, abs=1e-12)
    # a later step with a larger ESS than step 1 counts as no drift (ℓ = 0), not as negative drift
    assert ah.drift_rate(numbered([0.9, 0.95])) == 0.0
    assert ah.drift_rate(numbered([1.0])) is None  # on-policy only: nothing measured


def test_ess_cap_by_hand():
    # s = 0.1, ρ = 0.5: 1 + ⌊√(ln 2 / 0.1)⌋ = 1 + ⌊√6.93⌋ = 1 + ⌊2.63⌋ = 3;
    # check: exp(−0.1·2²) = 0.67 >= 0.5 at H = 3, exp(−0.1·3²) = 0.41 < 0.5 at H = 4
    assert ah.ess_cap(on_curve(0.1, 4), SETTINGS) == 3
    # s = 0.001: 1 + ⌊√693.1⌋ = 27, clamped to max = 16
    assert ah.ess_cap(on_curve(0.001, 2), SETTINGS) == 16
    # s = 2: 1 + ⌊√0.347⌋ = 1
    assert ah.ess_cap(on_curve(2.0, 2), SETTINGS) == 1
    # no drift, or nothing measured: the bound
    assert ah.ess_cap(numbered([1.0, 1.0]), SETTINGS) == 16 and ah.ess_cap(numbered([1.0]), SETTINGS) == 16
    assert ah.ess_cap(on_curve(2.0, 2), ah.Settings(4, 16, 0.5, 0.2, 0.05, 32)) == 4  # min


def test_stop_early_below_the_floor_never_on_step_one():
    assert not ah.stop_early(numbered([0.1]), SETTINGS)  # step 1: θ = μ, mismatch only
    assert not ah.stop_early(numbered([1.0, 0.5]), SETTINGS)
    assert not ah.stop_early(numbered([1.0, 0.5, 0.21]), SETTINGS)
    assert ah.stop_early(numbered([1.0, 0.5, 0.19]), SETTINGS)
    # relative to step 1: 0.09 / 0.5 = 0.18 < 0.2 stops, 0.11 / 0.5 = 0.22 does not
    assert ah.stop_early(numbered([0.5, 0.09]), SETTINGS) and not ah.stop_early(numbered([0.5, 0.11]), SETTINGS)


# ----------------------------------------------------------------------------- cost


def test_fit_generation_by_hand():
    assert ah.fit_generation({32: 10.0}) is None
    # two sizes: β = (12 − 10) / (64 − 32) = 1/16, α = 10 − 32/16 = 8
    assert ah.fit_generation({32: 10.0, 64: 12.0}) == (pytest.approx(8.0), pytest.approx(1 / 16))
    # three points on T = 2 + 0.5 b
    assert ah.fit_generation({8: 6.0, 16: 10.0, 64: 34.0}) == (pytest.approx(2.0), pytest.approx(0.5))
    # the larger batch took less time (noise): β = 0, α = mean = 9
    assert ah.fit_generation({32: 10.0, 64: 8.0}) == (9.0, 0.0)
    # the line would cross below 0 (α = 10 − 32·(30 − 10)/32 = −10): through the origin instead,
    # β = Σ bT / Σ b² = (320 + 1920) / (1024 + 4096) = 0.4375
    assert ah.fit_generation({32: 10.0, 64: 30.0}) == (0.0, pytest.approx(2240 / 5120))


def test_cost_choice_by_hand():
    """A GPU-like generator (α = 8 s per call, β = 1/16 s per sample), λ = 0.5 s per sample, F = 1 s per
    round, n_step = 32: c(H) = 0.0625 + 0.5 + 9 / (32 H)."""
    state = ah.State(H=2, generate_s={32: 10.0, 64: 12.0}, per_sample_s=0.5, per_round_s=1.0)
    assert ah.cost_per_sample(16, 8.0, 1 / 16, state, 32) == pytest.approx(0.5625 + 9 / 512)
    # a round at H = 2 that repeats the same times and barely drifts (s = 0.001, H_cap = 16):
    # c(16) = 0.580078, 1.05 c(16) = 0.609082, so 9 / (32 H) <= 0.046582, H >= 6.04: H_cost = 7,
    # and growth at most doubles: H = min(7, 2·2) = 4
    r = ah.Round(H=2, ess=on_curve(0.001, 2), generate_s=12.0, reward_s=0.0, train_s=32.0, fixed_s=1.0)
    new, log = ah.update(state, SETTINGS, r)
    assert (log["algorithm/next_H_ess"], log["algorithm/next_H_cost"], log["algorithm/next_H"], new.H) == (16, 7, 4, 4)
    assert log["algorithm/gen_alpha_s"] == pytest.approx(8.0)
    assert log["algorithm/predicted_s_per_sample"] == pytest.approx(0.5625 + 9 / 128)
    assert log["algorithm/drift"] == pytest.approx(0.001) and log["algorithm/ess_last"] == pytest.approx(
        math.exp(-0.001)
    )
    # a round at H = 4 on the same line (T(128) = 8 + 128/16 = 16 s): the fit is unchanged, H = min(7, 8) = 7
    at_4 = ah.Round(4, on_curve(0.001, 4), 16.0, 0.0, 64.0, 1.0)
    new, log = ah.update(state, SETTINGS, at_4)
    assert new.H == 7 and log["algorithm/gen_alpha_s"] == pytest.approx(8.0)
    # with τ = 0 the cost is ignored: H = min(H_cap, 2 H) = 8
    assert ah.update(state, ah.Settings(1, 16, 0.5, 0.2, 0.0, 32), at_4)[0].H == 8


def test_flat_generation_cost_keeps_samples_fresh():
    """A CPU-like generator (no per-call cost: T = 0.2 b) and a weight sync of 0.2 s per round: larger H
    saves 0.2 / (32 H) s of ~0.34 s per sample, under 5% even at H = 1, so H = 1 though the weights
    would allow 16."""
    state = ah.State(H=2, generate_s={32: 6.4}, per_sample_s=0.14, per_round_s=0.2)
    new, log = ah.update(state, SETTINGS, ah.Round(2, numbered([1.0, 1.0]), 12.8, 0.0, 2 * 32 * 0.14, 0.2))
    assert log["algorithm/gen_alpha_s"] == 0.0
    assert (log["algorithm/next_H_ess"], log["algorithm/next_H"]) == (16, 1)


# ----------------------------------------------------------------------------- sequences


def test_sequence_grow_cap_shrink_and_early_stop():
    """τ = 0 (the weights alone decide): from H = 1 the controller doubles while the drift allows,
    is capped by max, shrinks at once when the policy starts moving fast, and an early-stopped round
    shrinks it to what the fit allows."""
    settings = ah.Settings(h_min=1, h_max=8, ess_target=0.5, ess_floor=0.2, cost_tolerance=0.0, n_step=32)
    state = ah.initial_state(settings)
    history = []
    for s in [None, 0.001, 0.001, 0.001, 0.001, 0.1, 0.01]:
        H = ah.plan(state, 10_000, 32)
        ess = numbered([1.0]) if s is None else on_curve(s, H)
        state, log = ah.update(state, settings, ah.Round(H, ess, 1.0, 0.0, 1.0, 0.1))
        history.append((H, log["algorithm/next_H_ess"], state.H))
    # (this round's H, H_cap, next H):
    # H=1: no drift measured, cap = 8, grow to 2 | s = 0.001: cap = min(27, 8) = 8, doubling 2 -> 4 -> 8,
    # then held at max | s = 0.1: cap 3 (test_ess_cap_by_hand), shrink 8 -> 3 |
    # s = 0.01: 1 + ⌊√69.3⌋ = 9 -> cap 8, doubling 3 -> 6
    assert history == [(1, 8, 2), (2, 8, 4), (4, 8, 8), (8, 8, 8), (8, 8, 8), (8, 3, 3), (3, 8, 6)]

    # an early-stopped round of 8: steps 1..5 pass (d_5 = exp(−1.6) = 0.202), step 6 (exp(−2.5) = 0.082)
    # is below the floor and stops it; the fit over the six measured steps gives s = 0.1 -> H = 3
    ess = on_curve(0.1, 8)
    measured = next(ess[:k] for k in range(1, 9) if ah.stop_early(ess[:k], settings))
    assert len(measured) == 6
    new, log = ah.update(ah.State(H=8), settings, ah.Round(8, measured, 1.0, 0.0, 1.0, 0.1))
    assert new.H == 3 and log["algorithm/ess_last"] == pytest.approx(math.exp(-2.5))


def test_plan_cuts_the_last_round_to_the_budget():
    state = ah.State(H=8)
    assert ah.plan(state, 10_000, 32) == 8
    assert ah.plan(state, 96, 32) == 3  # 96 samples left: 3 steps of 32


def test_state_round_trips_through_a_checkpoint(tmp_path):
    state = ah.State(H=2, generate_s={32: 10.0, 64: 12.0}, per_sample_s=0.5, per_round_s=1.0)
    torch.save({"auto_h": state.state_dict()}, tmp_path / "state.pt")
    loaded = ah.State.from_state_dict(torch.load(tmp_path / "state.pt", weights_only=False)["auto_h"])
    assert loaded == state
    r = ah.Round(2, on_curve(0.001, 2), 12.0, 0.0, 32.0, 1.0)
    assert ah.update(loaded, SETTINGS, r) == ah.update(state, SETTINGS, r)


# ----------------------------------------------------------------------------- config


def composed(*overrides: str):
    from hydra import compose, initialize_config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=["+experiment=smoke", *overrides])


def test_auto_config_validates_and_derives_the_run_length():
    cfg = composed("algorithm.H=auto", "samples=160")
    validate(cfg, world=1)
    assert cfg.algorithm.n_inference == "auto"  # the `mul` resolver with an auto factor
    assert run_length(cfg, n_train=384) == (None, 160)
    # fixed H: the resolver still multiplies, and the length is rounds * n_inference, or `samples`
    fixed = composed("algorithm.H=4")
    validate(fixed, world=1)
    assert fixed.algorithm.n_inference == 32 and run_length(fixed, 384) == (3, 96)
    assert run_length(composed("algorithm.H=4", "samples=64"), 384) == (2, 64)
    # epochs (rounds=null): 1 epoch of 384 problems x 4 completions = 1536 samples = 48 rounds of 32;
    # with H=auto the same budget, in samples (a multiple of n_step = 8)
    assert run_length(composed("algorithm.H=4", "rounds=null", "epochs=1"), 384) == (48, 1536)
    assert run_length(composed("algorithm.H=auto", "rounds=null", "epochs=0.5"), 384) == (None, 768)


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["algorithm.H=auto"], ("H=auto", "samples=")),  # rounds=3 is no budget
        (["algorithm.H=auto", "samples=100"], ("samples=100", "n_step", "8")),
        (["algorithm.H=4", "samples=100"], ("samples=100", "32")),
        (["algorithm=grpo", "algorithm.H=auto", "samples=160"], ("iw_grpg", "grpo")),
        (["algorithm.H=auto", "samples=160", "algorithm.auto_h.min=4", "algorithm.auto_h.max=2"], ("min=4", "max=2")),
        (["algorithm.H=auto", "samples=160", "algorithm.auto_h.ess_floor=0.6"], ("ess_floor=0.6", "ess_target=0.5")),
        (["algorithm.H=auto", "samples=160", "algorithm.auto_h.cost_tolerance=-1"], ("cost_tolerance=-1",)),
        # the paper's n_step 4: a step's relative ESS is >= 1/4 = 0.25, so a floor of 0.2 could never stop a round
        (
            ["algorithm.H=auto", "samples=160", "algorithm.n_step=4", "algorithm.auto_h.ess_floor=0.2"],
            ("ess_floor=0.2", "n_step=4", "0.25", "above 5"),
        ),
        (["algorithm.H=0"], ("H=0", "auto")),
        (["algorithm.H=auto", "samples=160", "algorithm.n_inference=64"], ("n_inference=64",)),
    ],
)
def test_bad_auto_config_is_one_sentence(overrides, words):
    with pytest.raises(ConfigError) as e:
        validate(composed(*overrides), world=1)
    assert all(w in str(e.value) for w in words), str(e.value)


# ----------------------------------------------------------------------------- tools/auto_h_report.py


def test_auto_h_report_verdict_by_hand(tmp_path):
    from tools import auto_h_report as report

    runs = {
        "PG": ([0.40, 0.50, 0.45], 200.0),
        "RAPID H=2": ([0.44, 0.46, 0.42], 180.0),
        "RAPID H=4": ([0.30, 0.32, 0.34], 150.0),
        "RAPID H=auto": ([0.40, 0.41, 0.42], 190.0),
        "GRPO": ([0.60, 0.61, 0.62], 100.0),  # in the same folder, but not a fixed H: neither best nor fastest
    }
    with (tmp_path / "runs.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, ["method", "seed", "accuracy_after", "s_per_1k", "rounds", "unused_samples"])
        writer.writeheader()
        for method, (accs, s) in runs.items():
            for seed, acc in enumerate(accs):
                writer.writerow(
                    {
                        "method": method,
                        "seed": seed,
                        "accuracy_after": acc,
                        "s_per_1k": s,
                        "rounds": 4,
                        "unused_samples": 8 if method == "RAPID H=auto" else 0,
                    }
                )
    run = tmp_path / "runs" / "rapid_hauto_s0"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text("algorithm:\n  n_step: 8\n")
    (run / "metrics.jsonl").write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in [
                {"round": 1, "samples": 8, "algorithm/H": 1, "algorithm/ess_last": 1.0},
                {"round": 2, "samples": 24, "algorithm/H": 2, "algorithm/ess_last": 0.7},
            ]
        )
    )
    table = {m["method"]: m for m in report.summarize(list(csv.DictReader((tmp_path / "runs.csv").open())))}
    # PG: mean 0.45, sd 0.05, half-width t(0.975, 2) · 0.05 / √3 = 4.303 · 0.028868 = 0.12422
    assert table["PG"]["accuracy"] == pytest.approx(0.45) and table["PG"]["ci"] == pytest.approx(0.124217, abs=1e-5)
    v = report.verdict(list(table.values()))
    # best PG, interval down to 0.32578: H = 2 (0.44) is in it, H = 4 (0.32) is not -> fastest in it: H = 2, 180 s;
    # auto: 0.41 is in it, 190 / 180 = 1.056 <= 1.10
    assert (v["best"], v["fastest"], v["accuracy_ok"], v["wall_ok"]) == ("PG", "RAPID H=2", True, True)
    assert v["wall_ratio"] == pytest.approx(190 / 180)
    subprocess.run(
        [sys.executable, str(REPO / "tools" / "auto_h_report.py"), str(tmp_path)], check=True, capture_output=True
    )
    text = (tmp_path / "auto_h.md").read_text()
    assert "| RAPID H=auto | 3 | 0.410 ± 0.025 | 190.0 | 4.0 | 8 |" in text and "1.06x the fastest" in text
    assert (tmp_path / "auto_h.png").stat().st_size > 1000


@pytest.mark.slow
def test_bench_rl_runs_auto_to_the_same_sample_budget(tmp_path):
    """tools/bench_rl.py --h auto: the H=auto run gets the sample budget (not a round count) and its
    evaluation every so many samples; the per-run table records its rounds."""
    from tests.test_train import env_for

    out = tmp_path / "bench"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "bench_rl.py"),
            "+experiment=smoke",
            "sampler=hf",
            "device=cpu",
            "--samples",
            "64",
            "--eval-every-samples",
            "32",
            "--h",
            "auto",
            "--no-grpo",
            "--no-trl",
            "--no-floors",
            "--out",
            str(out),
        ],
        cwd=REPO,
        env=env_for(tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = list(csv.DictReader((out / "runs.csv").open()))
    assert row["method"] == "RAPID H=auto" and int(row["samples"]) == 64
    cfg = yaml.safe_load((out / "runs" / "rapid_hauto_s0" / "config.yaml").read_text())
    assert (cfg["samples"], cfg["rounds"], cfg["eval"]["every_samples"]) == (64, None, 32)
    metrics = [
        json.loads(line) for line in (out / "runs" / "rapid_hauto_s0" / "metrics.jsonl").read_text().splitlines()
    ]
    trains = [r for r in metrics if "algorithm/H" in r]
    assert int(row["rounds"]) == len(trains) and sum(r["algorithm/H"] for r in trains) * 8 == 64


def test_skipped_steps_keep_their_step_numbers():
    """A step whose every group has advantage 0 measures no ESS. The drift is fitted at the steps that
    were measured, not at 1, 2, 3, ... of the list: s = 0.1 in every case below.
    Steps 1, 3 measured, ℓ_3 = 0.4 at (3 − 1)² = 4: s = 0.4 / 4 = 0.1 (numbered 1, 2 it would read 0.4 at 1).
    Step 1 skipped, steps 2, 4 measured: the drift since step 2, ℓ = −log(e_4 / e_2) = 0.9 − 0.1 = 0.8 at
    (4 − 1)² − (2 − 1)² = 8: s = 0.1."""
    e = dict(on_curve(0.1, 8))
    assert ah.drift_rate([(1, e[1]), (3, e[3])]) == pytest.approx(0.1, abs=1e-12)
    assert ah.drift_rate([(2, e[2]), (4, e[4])]) == pytest.approx(0.1, abs=1e-12)
    assert ah.drift_rate([(1, e[1]), (3, e[3]), (4, e[4]), (7, e[7])]) == pytest.approx(0.1, abs=1e-12)
    # the cap of s = 0.1 is 3 (test_ess_cap_by_hand), whichever steps were measured
    assert ah.ess_cap([(2, e[2]), (4, e[4])], SETTINGS) == 3
    # a round of 4 whose steps 2 and 3 were skipped: the train time is per step computed (4), not measured (2)
    state = ah.State(H=4)
    r = ah.Round(4, [(1, e[1]), (4, e[4])], 1.0, 0.0, train_s=4 * 32 * 0.5, fixed_s=0.0, steps=4)
    new, log = ah.update(state, SETTINGS, r)
    assert new.per_sample_s == pytest.approx(0.5) and log["algorithm/drift"] == pytest.approx(0.1, abs=1e-12)


def test_end_round_averages_the_phase_times_and_logs_the_round():
    """rapid.train's call after a round (one process): H = 4 planned, 2 steps applied, the third stopped
    early (computed, so the train time is per 3 steps' samples). By hand, n_step = 8, b = 32:
    λ = (reward + recompute) / b + train / (3 · 8) = 0.75 / 32 + 1 / 24, F = sync + other = 0.5;
    d_2 = 0.9, s = −log 0.9, H_cap = 1 + ⌊√(log 2 / s)⌋ = 1 + ⌊2.565⌋ = 3; next H = min(3, 2 · 4) = 3;
    unused samples (4 − 2) · 8 = 16."""
    settings = ah.Settings(h_min=1, h_max=8, ess_target=0.5, ess_floor=0.1, cost_tolerance=0.0, n_step=8)
    times = {"generate": 2.0, "reward": 0.5, "recompute": 0.25, "train": 1.0, "sync": 0.125, "other": 0.375}
    row = {f"time/{p}_s": s for p, s in times.items()}
    state, log = ah.end_round(ah.initial_state(settings), settings, 4, [(1, 1.0), (2, 0.9)], 2, row, 1, "cpu")
    assert state.generate_s == {32: 2.0}
    assert state.per_sample_s == pytest.approx(0.75 / 32 + 1 / 24, abs=1e-15)
    assert state.per_round_s == 0.5
    assert state.H == 3
    assert log["algorithm/drift"] == pytest.approx(-math.log(0.9), abs=1e-15)
    assert {k: log[k] for k in ("algorithm/H", "algorithm/steps", "algorithm/unused_samples")} == {
        "algorithm/H": 4,
        "algorithm/steps": 2,
        "algorithm/unused_samples": 16,
    }
    assert log["algorithm/next_H_ess"] == 3 and log["algorithm/next_H"] == 3
