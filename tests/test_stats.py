"""tools/stats.py: the t-distribution p-value against closed forms, Pearson's r and the bootstrap by hand,
and the whole report on synthetic run directories whose numbers are checked by hand."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml

from tools import stats


def t3_two_sided(t: float) -> float:
    """Closed form for 3 degrees of freedom: P(|T| > t) = 1 − (2/π)(atan(u) + u / (1 + u²)), u = t/√3."""
    u = t / math.sqrt(3)
    return 1 - 2 / math.pi * (math.atan(u) + u / (1 + u * u))


@pytest.mark.parametrize(
    "t, df, want",
    [
        (1.0, 1, 0.5),  # Cauchy: P(|T| > 1) = 1/2
        (2.0, 2, 1 - 2 / math.sqrt(6)),  # df 2: P(|T| > t) = 1 − t/√(2 + t²)
        (0.0, 7, 1.0),
        (2.3094, 3, t3_two_sided(2.3094)),
        (10.0, 3, t3_two_sided(10.0)),  # a small p: 0.0021
        (2.228139, 10, 0.05),  # the textbook critical value of df 10
        (1.959964, 10**7, math.erfc(1.959964 / math.sqrt(2))),  # large df: the normal distribution
    ],
)
def test_t_two_sided_p_known_values(t, df, want):
    assert stats.t_two_sided_p(t, df) == pytest.approx(want, rel=1e-5, abs=1e-9)
    assert stats.t_two_sided_p(-t, df) == pytest.approx(want, rel=1e-5, abs=1e-9)


def test_pearson_by_hand():
    # x = 1..5, y = 2, 1, 4, 3, 5: dx = -2..2, dy = -1, -2, 1, 0, 2 -> Σdxdy = 8, Σdx² = Σdy² = 10, r = 0.8
    # t = 0.8 √(3 / 0.36) = 2.3094, df 3 -> p = 1 − (2/π)(atan(4/3) + (4/3)/(1 + 16/9))
    #   = 1 − 0.6366198 · (0.9272952 + 0.48) = 0.104088
    r, p, n = stats.pearson([1, 2, 3, 4, 5], [2, 1, 4, 3, 5])
    assert (r, n) == (pytest.approx(0.8, abs=1e-12), 5)
    assert p == pytest.approx(0.104088, abs=1e-6)
    r, p, n = stats.pearson([1, 2, 3, 4], [8, 6, 4, 2])  # exactly linear, decreasing
    assert r == pytest.approx(-1.0) and p == 0.0
    assert all(math.isnan(v) for v in stats.pearson([1, 1, 1], [1, 2, 3])[:2])  # constant H: undefined
    assert math.isnan(stats.pearson([1, 2], [1, 2])[0])  # two points: undefined


def test_bootstrap_and_describe_by_hand():
    # resampled means of (0, 0, 1) are k/3 with k ~ Binomial(3, 1/3): P(0) = 8/27, P(3) = 1/27 < 0.025,
    # P(k <= 2) = 26/27 = 0.963 < 0.975 -> the 95% interval is [0, 1]
    assert stats.bootstrap_ci([0.0, 0.0, 1.0]) == (0.0, 1.0)
    # (0, 1, 1, 1, 1, 1, 1, 1, 1, 1): P(mean = 1) = 0.9^10 = 0.349 -> upper end 1; the lower end is inside
    lo, hi = stats.bootstrap_ci([0.0] + [1.0] * 9)
    assert hi == 1.0 and 0.7 <= lo <= 0.8  # mean 0.9, sd of the mean 0.3 / √10 = 0.095 -> ≈ 0.7
    d = stats.describe([1.0, 2.0, 3.0])
    assert (d["n"], d["mean"], d["std"]) == (3, 2.0, 1.0) and 1.0 <= d["ci_low"] < 2.0 < d["ci_high"] <= 3.0
    d = stats.describe([0.4])
    assert d["mean"] == 0.4 and math.isnan(d["std"]) and (d["ci_low"], d["ci_high"]) == (0.4, 0.4)


# ----------------------------------------------------------------------------- synthetic runs


def write_run(
    path: Path,
    *,
    H: int,
    seed: int,
    accuracy: float,
    round_s: list[float],
    staleness: list[float],
    rss: list[float],
    name: str = "rapid",
    loss: str = "iw_grpg",
    summary: bool = True,
    switches: dict | None = None,
) -> None:
    path.mkdir(parents=True)
    algorithm = {"name": name, "loss": loss, "H": H, **(switches or {})}
    (path / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "algorithm": algorithm}))
    rows = [{"round": 0, "eval/accuracy": 0.1}]
    for i, (t, s, m) in enumerate(zip(round_s, staleness, rss)):
        rows.append(
            {
                "round": i + 1,
                "time/round_s": t,
                **({"iw/staleness": s, "iw/log_w_mean": -s} if s is not None else {}),
                "mem/generate_rss_mib": m - 100,
                "mem/train_rss_mib": m,
                "mem/peak_is_process": 0,
            }
        )
    rows.append({"round": len(round_s), "eval/accuracy": accuracy})
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if summary:
        (path / "summary.json").write_text(json.dumps({"eval/accuracy_after": accuracy}))


# H, seed -> accuracy, round times, staleness per round, train RSS per round
RUNS = {
    (1, 0): (0.50, [10, 10], [0.0, 0.0], [1000, 1100]),
    (1, 1): (0.70, [11, 11], [0.0, 0.0], [1000, 1200]),
    (2, 0): (0.40, [6, 6], [0.1, 0.3], [900, 1000]),
    (2, 1): (0.60, [7, 5], [0.2, 0.2], [950, 900]),
    (4, 0): (0.30, [4, 4], [0.5, 0.7], [800, 800]),
    (4, 1): (0.50, [5, 4], [0.4, 1.0], [850, 800]),
}


def test_multirun_folder_by_hand(tmp_path):
    sweep = tmp_path / "multirun" / "2026-11-24_10-00-00"
    for (h, seed), (acc, times, stale, rss) in RUNS.items():
        write_run(
            sweep / f"algorithm.H={h},seed={seed}",
            H=h,
            seed=seed,
            accuracy=acc,
            round_s=times,
            staleness=stale,
            rss=rss,
        )
    # a GRPO run: grouped on its own, left out of the correlations (no importance weights: no iw/staleness)
    write_run(
        sweep / "algorithm=grpo,seed=0",
        H=1,
        seed=0,
        accuracy=0.9,
        round_s=[50],
        staleness=[None],
        rss=[5000],
        name="grpo",
        loss="grpo",
    )
    # an ablated estimator at H = 8: its own row, but not a point of the H sweep's correlations
    write_run(
        sweep / "algorithm.iw_gradient=false,seed=0",
        H=8,
        seed=0,
        accuracy=0.0,
        round_s=[1],
        staleness=[3.0],
        rss=[900],
        switches={"iw_gradient": False},
    )
    out = tmp_path / "out"
    text = stats.main([str(sweep), "--out", str(out)])
    table = {r["config"]: r for r in csv.DictReader((out / "stats.csv").open())}
    assert set(table) == {
        "algorithm.H=1",
        "algorithm.H=2",
        "algorithm.H=4",
        "algorithm=grpo",
        "algorithm.iw_gradient=false",
    }
    h2 = table["algorithm.H=2"]
    assert h2["seeds"] == "0 1" and float(h2["accuracy_n"]) == 2
    assert float(h2["accuracy_mean"]) == pytest.approx(0.5)  # (0.4 + 0.6) / 2
    assert float(h2["accuracy_std"]) == pytest.approx(math.sqrt(0.02))  # ((0.1² + 0.1²) / 1)^½
    assert float(h2["train_s_mean"]) == pytest.approx(12.0)  # 6 + 6 and 7 + 5
    assert float(h2["train_s_std"]) == pytest.approx(0.0)
    assert float(h2["staleness_mean"]) == pytest.approx(0.2)  # means 0.2 and 0.2
    assert float(h2["log_w_mean_mean"]) == pytest.approx(-0.2)
    assert float(h2["peak_rss_mib_mean"]) == pytest.approx(975.0)  # max(900, 1000), max(950, 900)
    h4 = table["algorithm.H=4"]
    assert float(h4["train_s_mean"]) == pytest.approx(8.5)  # 8 and 9
    assert float(h4["staleness_mean"]) == pytest.approx(0.65)  # 0.6 and 0.7
    assert (float(h4["accuracy_ci_low"]), float(h4["accuracy_ci_high"])) == (pytest.approx(0.3), pytest.approx(0.5))

    corr = {c["quantity"]: c for c in csv.DictReader((out / "correlations.csv").open())}
    h = [k[0] for k in RUNS]
    acc = [v[0] for v in RUNS.values()]
    # by hand: H mean 7/3, Σ dH dA = −0.6, Σ dH² = 28/3, Σ dA² = 0.1 -> r = −0.6 / √(0.9333) = −0.621059
    assert float(corr["accuracy"]["r"]) == pytest.approx(-0.621059, abs=1e-6)
    assert float(corr["accuracy"]["r"]) == pytest.approx(np.corrcoef(h, acc)[0, 1], abs=1e-12)
    t = -0.621059 * math.sqrt(4 / (1 - 0.621059**2))
    assert float(corr["accuracy"]["p"]) == pytest.approx(stats.t_two_sided_p(t, 4), rel=1e-4)
    assert int(corr["accuracy"]["n"]) == 6 and corr["accuracy"]["H_values"] == "1 2 4"
    train = [sum(v[1]) for v in RUNS.values()]
    assert float(corr["train_s"]["r"]) == pytest.approx(np.corrcoef(h, train)[0, 1], abs=1e-12)
    assert "| algorithm.H=2 | 0 1 | 0.500 ± 0.141 [0.400, 0.600] |" in text
    assert len(list(csv.DictReader((out / "runs.csv").open()))) == 8


def test_bench_rl_and_seed_folders(tmp_path):
    runs = tmp_path / "bench" / "runs"
    write_run(runs / "rapid_h8_s0", H=8, seed=0, accuracy=0.2, round_s=[3], staleness=[1.0], rss=[100])
    write_run(runs / "rapid_h8_s1", H=8, seed=1, accuracy=0.4, round_s=[5], staleness=[2.0], rss=[300])
    # a TRL run: no config.yaml, no per-round time; the summary has the totals
    trl = runs / "trl_grpo_s0"
    trl.mkdir(parents=True)
    (trl / "metrics.jsonl").write_text(json.dumps({"loss": 0.1}) + "\n")
    (trl / "summary.json").write_text(
        json.dumps(
            {"eval/accuracy_after": 0.45, "time/rounds_s_total": 478.0, "peak_rss_mib": 9560.0, "algorithm": "trl_grpo"}
        )
    )
    default = tmp_path / "default_run"
    write_run(default / "seed0", H=8, seed=0, accuracy=0.7, round_s=[1], staleness=[0.1], rss=[10], summary=False)
    # an algorithm=sft run: its summary at the top (distillation + SFT time), the stages inside, Hydra's config
    sft = tmp_path / "multirun" / "algorithm=sft,seed=2"
    write_run(sft / "sft", H=8, seed=2, accuracy=0.33, round_s=[], staleness=[], rss=[])
    (sft / "distill").mkdir()
    (sft / "distill" / "distill_summary.json").write_text("{}")
    (sft / ".hydra").mkdir()
    (sft / ".hydra" / "config.yaml").write_text(
        yaml.safe_dump({"seed": 2, "algorithm": {"name": "sft", "loss": "sft"}})
    )
    (sft / "summary.json").write_text(json.dumps({"eval/accuracy_after": 0.33, "time/total_s": 77.0}))
    found = stats.find_runs([tmp_path])
    assert sft in found and sft / "sft" not in found
    rows = {r["config"]: r for r in stats.table([stats.read_run(p) for p in found])}
    assert set(rows) == {"rapid_h8", "trl_grpo", "default_run", "algorithm=sft"}
    assert rows["algorithm=sft"]["train_s_mean"] == 77.0 and rows["algorithm=sft"]["seeds"] == "2"
    assert rows["algorithm=sft"]["algorithm"] == "sft"
    assert rows["rapid_h8"]["accuracy_mean"] == pytest.approx(0.3) and rows["rapid_h8"]["seeds"] == "0 1"
    assert rows["trl_grpo"]["train_s_mean"] == 478.0 and rows["trl_grpo"]["peak_rss_mib_mean"] == 9560.0
    assert rows["default_run"]["accuracy_mean"] == 0.7  # no summary.json: the last eval row


def test_no_runs_is_one_sentence(tmp_path):
    with pytest.raises(SystemExit, match="no run directories"):
        stats.main([str(tmp_path)])


def test_common_overrides_are_dropped_and_the_cpu_reported(tmp_path):
    sweep = tmp_path / "multirun" / "table1_cpu"
    for alg, seed in (("grpo", 0), ("grpo", 1), ("rapid", 0)):
        every = 1 if alg == "rapid" else 8  # eval.every (older sweeps set it per H): not part of the name
        run = sweep / f"algorithm={alg},epochs=0.64,eval.every='{every}',rounds=null,seed={seed},task=arithmetic"
        write_run(run, H=1, seed=seed, accuracy=0.5, round_s=[1], staleness=[0], rss=[1])
        (run / "meta.json").write_text(json.dumps({"cpu": "Some CPU, 2 cores, vector extensions: avx2"}))
    text = stats.main([str(sweep), "--out", str(tmp_path / "out")])
    rows = {r["config"] for r in csv.DictReader((tmp_path / "out" / "stats.csv").open())}
    assert rows == {"algorithm=grpo", "algorithm=rapid"}
    assert "Overrides common to every run: `epochs=0.64,rounds=null,task=arithmetic`." in text
    assert "Runs made on: Some CPU, 2 cores, vector extensions: avx2." in text


# ----------------------------------------------------------------------------- RAPID against PG (--power)


def test_time_to_accuracy_by_hand():
    wall, acc = [0.0, 100.0, 200.0, 300.0], [0.3, 0.4, 0.6, 0.5]
    # first crossing of 0.5 between (100, 0.4) and (200, 0.6): 100 + (0.5 - 0.4) / (0.6 - 0.4) * 100 = 150
    assert stats.time_to_accuracy(wall, acc, 0.5) == pytest.approx(150.0, abs=1e-9)
    assert stats.time_to_accuracy(wall, acc, 0.6) == 200.0  # reached exactly at an evaluation
    assert stats.time_to_accuracy(wall, acc, 0.3) == 0.0  # already there before training
    assert stats.time_to_accuracy(wall, acc, 0.7) == math.inf  # never reached


def test_bootstrap_statistic_by_hand():
    # the min of 3 draws from (inf, 1, 2): P(min = inf) = (1/3)^3 = 1/27 = 0.037 > 0.025, so the 97.5%
    # quantile is inf; P(min = 1) = 1 - (2/3)^3 = 19/27 > 0.025, so the 2.5% quantile is 1
    x = np.array([math.inf, 1.0, 2.0])
    assert stats.bootstrap_ci(np.arange(3), statistic=lambda i: x[i].min()) == (1.0, math.inf)
    # paired seeds are drawn together: b = a + 1 seed by seed, so every resample's mean difference is 1
    a = np.array([0.1, 0.7, 0.4, 0.9])
    lo, hi = stats.bootstrap_ci(np.arange(4), statistic=lambda i: (a[i] + 1 - a[i]).mean())
    assert (lo, hi) == pytest.approx((1.0, 1.0), abs=1e-12)


def _power_run(root: Path, h: int, seed: int, evals: dict[int, float], round_s: list[float], finished=True):
    run = root / "runs" / f"rapid_h{h}_s{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "algorithm": {"name": "rapid", "H": h}}))
    (run / "meta.json").write_text(json.dumps({"cpu": "Test CPU, vector extensions: avx2", "git_commit": "abc"}))
    rows = [{"round": k, "eval/accuracy": a, "eval/n": 200} for k, a in evals.items() if k == 0]
    for k, s in enumerate(round_s, start=1):
        rows.append({"round": k, "samples": 4 * k, "time/round_s": s})
        if k in evals:
            rows.append({"round": k, "eval/accuracy": evals[k], "eval/n": 200})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if finished:
        (run / "summary.json").write_text(json.dumps({"eval/accuracy_after": evals[max(evals)]}))
    return run


def test_power_report_by_hand(tmp_path):
    _power_run(tmp_path, 1, 0, {0: 0.3, 1: 0.4, 2: 0.5}, [10.0, 10.0])
    pg1 = _power_run(tmp_path, 1, 1, {1: 0.5, 2: 0.7}, [12.0, 12.0])
    # resumed from the round-1 checkpoint: round 2 ran twice, its last record counts (12 s, not 99 s)
    lines = (pg1 / "metrics.jsonl").read_text().splitlines()
    (pg1 / "metrics.jsonl").write_text(
        "\n".join(lines[:2] + [json.dumps({"round": 2, "samples": 8, "time/round_s": 99.0})] + lines[2:]) + "\n"
    )
    _power_run(tmp_path, 8, 0, {0: 0.3, 1: 0.6, 2: 0.5}, [5.0, 5.0])
    _power_run(tmp_path, 8, 1, {1: 0.4, 2: 0.9}, [6.0, 6.0])
    _power_run(tmp_path, 1, 2, {1: 0.9, 2: 0.9}, [7.0, 7.0])  # no RAPID partner: in runs.csv, not paired
    _power_run(tmp_path, 8, 2, {1: 0.1}, [7.0], finished=False)  # unfinished: ignored
    text = stats.main(["--power", str(tmp_path)])
    s = stats.power_summary(stats.power_runs(tmp_path), 1, 8)
    assert s["seeds"] == [0, 1] and s["base"] == 0.3 and s["samples"][1] == [0, 4, 8]
    # PG, mean over seeds 0 and 1 (seed 1's round 0 is the base model's 0.3): accuracy (0.3, 0.45, 0.6) at
    # (0, 11, 22) s. The target is 0.6, first reached at its last point: 22 s.
    assert s["target"] == pytest.approx(0.6, abs=1e-12)
    assert s[1]["tta"] == pytest.approx(22.0, abs=1e-9)
    # RAPID: (0.3, 0.5, 0.7) at (0, 5.5, 11) s: 5.5 + (0.6 - 0.5) / (0.7 - 0.5) * 5.5 = 8.25 s
    assert s[8]["tta"] == pytest.approx(8.25, abs=1e-9)
    assert s["diff_tta"] == pytest.approx(8.25 - 22.0, abs=1e-9)
    assert s["ratio_tta"] == pytest.approx(0.375, abs=1e-12)
    # final accuracies (0.5, 0.7) and (0.5, 0.9): paired differences (0, 0.2), mean 0.1
    assert s[1]["final"]["mean"] == pytest.approx(0.6) and s["diff_final"]["mean"] == pytest.approx(0.1)
    # on their own curves: PG seed 0 (0.3, 0.4, 0.5) never reaches 0.6, seed 1 does; both RAPID seeds do
    assert (s[1]["reached"], s[8]["reached"]) == (1, 2)
    assert s[1]["wall_end"]["mean"] == pytest.approx(22.0)
    # the t interval of the paired final differences (0, 0.2): sd 0.141421, t95(1) = 12.706 -> ± 1.2706
    assert s["diff_final_t"] == pytest.approx(12.706 * 0.141421356 / math.sqrt(2), rel=1e-6)
    # whole-run training-loop time: RAPID (10 + 12) / 2 over PG (20 + 24) / 2 = 0.5; both seeds' ratios are 0.5
    assert s["wall_ratio"] == pytest.approx(0.5) and s["wall_ratio_ci"] == (pytest.approx(0.5), pytest.approx(0.5))
    assert s["per_seed"][1] == {"seed": 1, "final_1": 0.7, "final_8": 0.9, "wall_1": 24.0, "wall_8": 12.0}
    assert "| 1 | 0.700 | 0.900 | +0.200 | 24 | 12 | 0.50 |" in text
    assert "Ending below the base model: PG 0 of 2, RAPID H=8 0 of 2" in text
    assert "degenerate" not in text
    with (tmp_path / "runs.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 3 + 2 + 3 + 2 + 2
    assert list(rows[0]) == ["method", "H", "seed", "samples", "wall_s", "eval_n", "accuracy"]
    pg1_rows = [
        (r["samples"], float(r["wall_s"]), r["accuracy"]) for r in rows if r["method"] == "PG" and r["seed"] == "1"
    ]
    assert pg1_rows == [("4", 12.0, "0.5"), ("8", 24.0, "0.7")]
    assert "paired seeds (both finished): 2 (0 1)" in text and "PG 3, RAPID H=8 2" in text
    assert (tmp_path / "power.md").read_text() == text and (tmp_path / "power.png").stat().st_size > 0


def test_power_target_below_the_base_model_is_called_degenerate(tmp_path):
    # PG ends at (0.1 + 0.3) / 2 = 0.2 < the base model's 0.3: both curves start at the target
    _power_run(tmp_path, 1, 0, {0: 0.3, 1: 0.1}, [10.0])
    _power_run(tmp_path, 1, 1, {1: 0.3}, [10.0])
    _power_run(tmp_path, 8, 0, {0: 0.3, 1: 0.5}, [4.0])
    _power_run(tmp_path, 8, 1, {1: 0.0}, [6.0])
    text = stats.main(["--power", str(tmp_path)])
    s = stats.power_summary(stats.power_runs(tmp_path), 1, 8)
    assert s["target"] == pytest.approx(0.2) and s[1]["tta"] == 0.0 and s[8]["tta"] == 0.0
    assert "**The target is degenerate**: PG's final accuracy (0.200) is at or below the base model's (0.300)" in text
    assert "Ending below the base model: PG 1 of 2, RAPID H=8 1 of 2" in text
    # per-seed time ratios 4/10 and 6/10: the mean log ratio (ln 0.4 + ln 0.6) / 2 = −0.713558, its
    # geometric mean exp(−0.713558) = 0.489898 (the ratio of mean times would say 0.5); sd of the logs
    # |ln 0.4 − ln 0.6| / √2 = 0.286707, t95(1) · sd / √2 = 12.706 · 0.202733 = 2.575920 ->
    # [exp(−3.289478), exp(1.862362)] = [0.037273, 6.43893]: two seeds say little
    assert s["wall_ratio"] == pytest.approx(0.489898, abs=1e-6)
    assert s["wall_ratio_ci"] == (pytest.approx(0.037273, rel=1e-4), pytest.approx(6.43893, rel=1e-4))
    assert s["flagged"] == {} and "No run is flagged" in text


def test_power_round0_disagreement_is_one_sentence(tmp_path):
    _power_run(tmp_path, 1, 0, {0: 0.3, 1: 0.4}, [10.0])
    _power_run(tmp_path, 8, 0, {0: 0.2, 1: 0.4}, [10.0])
    with pytest.raises(SystemExit, match="round-0 evaluations disagree"):
        stats.main(["--power", str(tmp_path)])


def test_time_ratio_where_a_target_is_met_before_training():
    """Resampled seeds can make PG's final accuracy (the target) no higher than the base model's, so its
    time to the target is 0: the ratio is then inf (or 1 when both are 0), never a ZeroDivisionError."""
    assert stats.time_ratio(30.0, 60.0) == 0.5
    assert stats.time_ratio(30.0, 0.0) == math.inf
    assert stats.time_ratio(0.0, 0.0) == 1.0
    assert stats.time_ratio(math.inf, 60.0) == math.inf


def t2_two_sided(t: float) -> float:
    """Closed form for 2 degrees of freedom: P(|T| > t) = 1 − t/√(2 + t²)."""
    return 1 - abs(t) / math.sqrt(2 + t * t)


def test_one_sided_p_and_holm_by_hand():
    # df 2: P(T >= 2) = (1 − 2/√6) / 2 = 0.0917517; P(T >= −2) = 1 − that
    assert stats.t_one_sided_p(2.0, 2) == pytest.approx(0.0917517, abs=1e-7)
    assert stats.t_one_sided_p(-2.0, 2) == pytest.approx(1 - 0.0917517, abs=1e-7)
    # Holm: sorted 0.01 (x3 = 0.03), 0.03 (x2 = 0.06), 0.04 (x1 = 0.04, raised to 0.06 to stay ordered)
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06], abs=1e-12)
    assert stats.holm([0.5, 0.6]) == [1.0, 1.0] and stats.holm([0.02]) == [0.02] and stats.holm([]) == []
    # TOST with no spread: equivalent exactly when |mean| < margin
    assert stats.tost_p([0.01, 0.01], 0.05) == 0.0 and stats.tost_p([0.06, 0.06], 0.05) == 1.0
    assert stats.paired_t_p([0.0, 0.0]) == 1.0 and stats.paired_t_p([0.1, 0.1]) == 0.0


def test_versus_paired_by_seed_by_hand(tmp_path):
    sweep = tmp_path / "multirun"
    accuracy = {  # configuration -> seed -> accuracy
        "algorithm=rapid": {0: 0.5, 1: 0.6, 2: 0.7},
        "algorithm=b": {0: 0.6, 1: 0.8, 2: 0.8, 3: 0.0},  # seed 3 has no reference run: not paired
        "algorithm=c": {0: 0.7, 1: 0.85, 2: 1.0},
        "algorithm=d": {0: 0.1, 1: 0.3, 2: 0.4},
        "algorithm=e": {0: 0.9},
        "algorithm=f": {0: 0.51, 1: 0.59, 2: 0.7},
    }
    for config, by_seed in accuracy.items():
        for seed, acc in by_seed.items():
            write_run(
                sweep / f"{config},seed={seed}",
                H=8,
                seed=seed,
                accuracy=acc,
                round_s=[1.0],
                staleness=[0.0],
                rss=[100],
                name=config.split("=")[1],
            )
    out = tmp_path / "out"
    text = stats.main([str(sweep), "--out", str(out), "--versus", "algorithm=rapid"])
    rows = {r["config"]: r for r in csv.DictReader((out / "versus.csv").open())}
    assert set(rows) == {"algorithm=b", "algorithm=c", "algorithm=d", "algorithm=e", "algorithm=f"}
    b = rows["algorithm=b"]
    # d = (0.1, 0.2, 0.1): mean 0.13333, sd 0.057735, t95(2) = 4.303 -> half-width 4.303 · 0.057735 / √3
    # = 0.143433: [−0.01010, 0.27677] holds 0; the bootstrap's resampled means run from 0.1 (all three
    # draws 0.1: P = 8/27) to 0.2 (P = 1/27 > 0.025) -> [0.1, 0.2], which alone would call it for b
    assert b["seeds"] == "0 1 2" and int(b["n"]) == 3
    assert float(b["diff_mean"]) == pytest.approx(0.133333, abs=1e-6)
    assert (float(b["t_low"]), float(b["t_high"])) == (
        pytest.approx(-0.010100, abs=1e-5),
        pytest.approx(0.276767, abs=1e-5),
    )
    assert (float(b["boot_low"]), float(b["boot_high"])) == (pytest.approx(0.1), pytest.approx(0.2))
    assert (int(b["config_ahead"]), int(b["reference_ahead"])) == (3, 0)
    # paired t tests, df 2 (P(|T| > t) = 1 − t/√(2 + t²)), se = sd / √3:
    #   b: t = 0.13333 / 0.033333 = 4        p = 1 − 4/√18 = 0.057191
    #   c: d = (0.2, 0.25, 0.3), t = 0.25 / 0.028868 = 8.660254   p = 1 − 8.660254/√77 = 0.013072
    #   d: d = (−0.4, −0.3, −0.3), t = −10   p = 1 − 10/√102 = 0.009852
    #   f: d = (0.01, −0.01, 0), t = 0       p = 1
    # Holm over the 4 with 2 seeds or more (e has one): d 0.009852 x 4 = 0.039408; c 0.013072 x 3 = 0.039216,
    # raised to 0.039408; b 0.057191 x 2 = 0.114382; f 1 x 1 = 1. Alone, b's p = 0.057 and c's, d's < 0.05.
    want = {"b": (0.057191, 0.114382), "c": (0.013072, 0.039408), "d": (0.009852, 0.039408), "f": (1.0, 1.0)}
    for name, (p, p_holm) in want.items():
        r = rows[f"algorithm={name}"]
        assert (float(r["p"]), float(r["p_holm"])) == (pytest.approx(p, abs=2e-6), pytest.approx(p_holm, abs=2e-6))
    assert float(b["p"]) == pytest.approx(t2_two_sided(4.0), abs=1e-9)
    # TOST, margin 0.05: f: mean 0, se 0.0057735, t = ±0.05 / 0.0057735 = ±8.660254 -> each one-sided p =
    # 0.013072 / 2 = 0.006536 -> p_equiv 0.006536, x 4 (the smallest of the family) = 0.026144: equivalent.
    # b: t = (0.13333 − 0.05) / 0.033333 = 2.5 -> P(T <= 2.5) = 1 − (1 − 2.5/√8.25) / 2 = 0.935194 (its
    # mean lies outside the margin): not equivalent, and not different after Holm: undecided.
    f = rows["algorithm=f"]
    assert (float(f["p_equiv"]), float(f["p_equiv_holm"])) == (
        pytest.approx(0.006536, abs=2e-6),
        pytest.approx(0.026144, abs=2e-6),
    )
    assert float(b["p_equiv"]) == pytest.approx(0.935194, abs=2e-6) and float(b["p_equiv_holm"]) == 1.0
    verdicts = {name: rows[f"algorithm={name}"]["verdict"] for name in "bcdef"}
    assert verdicts == {
        "b": "undecided",
        "c": "algorithm=c better",
        "d": "algorithm=rapid better",
        "e": "one seed: no test",
        "f": "equivalent (±0.05)",
    }
    assert (
        "| algorithm=c | 0 1 2 | +0.250 | [0.200, 0.300] | [0.126, 0.374] | 3 / 0 | 0.013 (0.039) | 0.990 (1.000) "
        "| algorithm=c better |" in text
    )
    # margin 0.1: b's mean 0.133 still lies outside it (undecided); f stays equivalent
    stats.main([str(sweep), "--out", str(out), "--versus", "algorithm=rapid", "--margin", "0.1"])
    rows = {r["config"]: r for r in csv.DictReader((out / "versus.csv").open())}
    assert rows["algorithm=b"]["verdict"] == "undecided" and rows["algorithm=f"]["verdict"] == "equivalent (±0.1)"
    with pytest.raises(SystemExit, match="no run of that configuration"):
        stats.main([str(sweep), "--versus", "algorithm=nope"])


def test_log_ratio_interval_by_hand():
    """Ratios 0.5, 0.25, 1: logs −ln 2, −2 ln 2, 0; mean −ln 2 (geometric mean 0.5), sd ln 2, t95(2) = 4.303:
    half-width 4.303 · ln 2 / √3 = 1.722012 -> [0.5 e^−1.722012, 0.5 e^1.722012] = [0.089353, 2.797888]."""
    ratio, (lo, hi) = stats.log_ratio_interval(np.log([0.5, 0.25, 1.0]))
    assert ratio == pytest.approx(0.5, abs=1e-12)
    assert (lo, hi) == (pytest.approx(0.089353, rel=1e-5), pytest.approx(2.797888, rel=1e-5))
    assert stats.log_ratio_interval([math.log(0.3)])[0] == pytest.approx(0.3)
    assert math.isnan(stats.log_ratio_interval([math.log(0.3)])[1][0]) and math.isnan(stats.log_ratio_interval([])[0])


def _busy_run(root: Path, name: str, h: int, gen_s: float, tokens: float, calibration=None, load=None):
    run = root / "runs" / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        yaml.safe_dump({"seed": int(name[-1]), "algorithm": {"name": "rapid", "H": h, "n_step": 32, "n_group": 8}})
    )
    meta = {"cpu": "Test CPU, 2 cores, vector extensions: avx2"}
    if calibration is not None:
        meta["calibration"] = {"matmul_s": calibration, "python_s": 0.03, "loadavg_1m": load}
    (run / "meta.json").write_text(json.dumps(meta))
    row = {"round": 1, "samples": 4, "time/round_s": 2 * gen_s, "time/generate_s": gen_s}
    row["sampler/tokens_per_s"] = tokens / gen_s
    (run / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    (run / "summary.json").write_text(json.dumps({"eval/accuracy_after": 0.5}))
    return run


def test_busy_flags_by_hand(tmp_path):
    """Generation per 1,000 tokens, H = 8 runs: 10, 11, 12, 16 s (median 11.5; 16 / 11.5 = 1.39 > 1.3:
    flagged), and 14.9 (1.2957 after the median moves to 12: not). H = 1 runs, alike among themselves: 30,
    31 (2 runs: no median to compare with). Calibration 25, 26, 40 ms (median 26, 40 / 26 = 1.54: flagged);
    load average 3.1 on 2 cores: flagged."""
    _busy_run(tmp_path, "a_s0", 8, 10.0, 1000, calibration=0.025, load=0.5)
    _busy_run(tmp_path, "a_s1", 8, 11.0, 1000, calibration=0.026, load=3.1)
    _busy_run(tmp_path, "a_s2", 8, 12.0, 1000, calibration=0.040, load=0.9)
    _busy_run(tmp_path, "a_s3", 8, 32.0, 2000)
    _busy_run(tmp_path, "a_s4", 8, 14.9, 1000)
    _busy_run(tmp_path, "b_s0", 1, 30.0, 1000)
    _busy_run(tmp_path, "b_s1", 1, 31.0, 1000)
    runs = [stats.read_run(r) for r in stats.find_runs([tmp_path / "runs"])]
    assert {Path(r["run"]).name: r["gen_s_per_ktok"] for r in runs}["a_s3"] == pytest.approx(16.0)
    flags = {Path(k).name: v for k, v in stats.busy_flags(runs).items()}
    assert set(flags) == {"a_s1", "a_s2", "a_s3"}
    assert flags["a_s3"] == "generation 16.0 s per 1k tokens, 1.33x the median 12.0 of 5 runs alike"
    assert flags["a_s2"] == "calibration 40 ms, 1.54x the median"
    assert flags["a_s1"] == "load average 3.1 on 2 cores"


def test_correlations_take_every_importance_weighted_loss_by_what_it_logged():
    """An H sweep's correlations take the runs of a loss that logs importance weights (iw/staleness:
    rapid.estimators' `iw`), whatever its name, and leave out those that log none; no loss name is read."""
    run = lambda loss, h, acc, stale: {
        "loss": loss, "H": h, "estimator": ("2.0",), "staleness": stale, "accuracy": acc, "train_s": 10.0 * h,
        "log_w_mean": None, "peak_rss_mib": None,
    }  # fmt: skip
    runs = [run("rapid_mask", 1, 0.2, 0.0), run("rapid_mask", 2, 0.4, 0.1), run("rapid_mask", 4, 0.3, 0.3)]
    runs.append(run("grpo", 8, 0.9, None))  # logs no importance weights: not a point
    corr = {c["quantity"]: c for c in stats.correlations(runs)}
    assert corr["accuracy"]["n"] == 3 and corr["accuracy"]["H_values"] == "1 2 4"
    # by hand: H 1, 2, 4 (mean 7/3), accuracy 0.2, 0.4, 0.3 (mean 0.3): Σ dH dA = (-4/3)(-0.1) + (-1/3)(0.1) + 0
    # = 0.1, Σ dH² = 14/3, Σ dA² = 0.02 -> r = 0.1 / √(14/3 · 0.02) = 0.327327
    assert corr["accuracy"]["r"] == pytest.approx(0.327327, abs=1e-6)
