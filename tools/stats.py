"""Statistics over seeds: per configuration, the mean, standard deviation and 95% bootstrap confidence
interval of accuracy, training time, staleness and peak memory; and the Pearson correlations of H with
accuracy, time and staleness, with p-values (the paper's Table 4).

    python tools/stats.py multirun/2026-11-24_10-00-00                 # a Hydra multirun folder
    python tools/stats.py experiments/results/bench_rl_cpu             # a tools/bench_rl.py output folder
    python tools/stats.py multirun/<date> --out experiments/results/h_sweep_cpu   # + stats.md, stats.csv, correlations.csv

Runs are the directories below the given paths that hold a metrics.jsonl or a summary.json (rapid:
config.yaml, metrics.jsonl, summary.json; an `algorithm=sft` run counts as one, its stages inside).
A run's configuration is its name without the seed (and without `eval.every`, which only says when
it was evaluated): a multirun sub-directory `algorithm.H=8,seed=1` -> `algorithm.H=8`; a bench_rl run
`rapid_h8_s1` -> `rapid_h8`; a directory named only by its seed (`seed1`) takes its parent's name.
Per run:

    accuracy      held-out accuracy after training (summary.json `eval/accuracy_after`, else the last eval row)
    train_s       training wall time: the sum of `time/round_s` over the rounds (model loading, engine
                  start-up and evaluation excluded); where rows lack it, the summary's
                  `time/rounds_s_total` (TRL: trainer.train()) or `time/total_s` (SFT: distillation + SFT)
    staleness     mean over rounds of `iw/staleness` (mean |log w̄| of each round's minibatches)
    log_w_mean    mean over rounds of `iw/log_w_mean` (signed mean log w̄), where the run logs it
    clipped_mass  mean over rounds of `iw/clipped_mass`, where logged
    peak_rss_mib  the largest `mem/*_rss_mib` of any round (summary `peak_rss_mib` for TRL runs)

Per configuration, over its seeds: mean, std (n − 1 in the denominator), and the 95% percentile
bootstrap interval of the mean (10,000 resamples of the seeds, fixed generator; with 3 seeds it is
coarse, and it is no wider than the range of the seeds). Correlations: Pearson's r over runs (one point
per seed, not per configuration) of H (config `algorithm.H`) with accuracy, train_s and staleness, over
the runs of the importance-weighted loss (RAPID at any H, PG = H 1) with the most common estimator
settings (eta, leave-one-out, the IW switches: an ablated estimator is not a point of the H sweep;
`--all-runs` takes every run with an H), and the two-sided p-value of t = r √((n−2)/(1−r²)) under Student's t with n − 2 degrees of
freedom, computed here (regularised incomplete beta function; scipy is not needed).

`--versus CONFIG` adds a paired comparison: every configuration against CONFIG, by seed (the same seed
draws the same prompts and problems), the mean accuracy difference with its bootstrap and Student t
intervals and a verdict read off the t interval (`versus.csv` with --out):

    python tools/stats.py experiments/results/estimators_cpu/runs --versus algorithm=rapid
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

METRICS = ("accuracy", "train_s", "staleness", "log_w_mean", "clipped_mass", "peak_rss_mib")
CORRELATED = ("accuracy", "train_s", "staleness")
BOOTSTRAP_RESAMPLES = 10_000


# ----------------------------------------------------------------------------- statistics


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz), x < (a + 1) / (a + b + 2)."""
    tiny, c, d = 1e-300, 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-15:
            break
    return h


def regularized_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), the regularised incomplete beta function, for a, b > 0 and 0 <= x <= 1."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1.0 - math.exp(log_front) * _betacf(b, a, 1.0 - x) / b


def t_two_sided_p(t: float, df: float) -> float:
    """P(|T| >= |t|) for Student's t with df degrees of freedom: I_{df/(df+t²)}(df/2, 1/2)."""
    if math.isinf(t):
        return 0.0
    return regularized_beta(df / 2.0, 0.5, df / (df + t * t))


def pearson(x: list[float], y: list[float]) -> tuple[float, float, int]:
    """Pearson's r, its two-sided p-value (t-test with n − 2 df) and n. nan where undefined
    (fewer than 3 points, or a constant variable)."""
    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    keep = np.isfinite(xs) & np.isfinite(ys)
    xs, ys = xs[keep], ys[keep]
    n = len(xs)
    if n < 3 or np.ptp(xs) == 0 or np.ptp(ys) == 0:
        return math.nan, math.nan, n
    dx, dy = xs - xs.mean(), ys - ys.mean()
    r = float(np.clip((dx * dy).sum() / math.sqrt((dx**2).sum() * (dy**2).sum()), -1.0, 1.0))
    t = math.inf if abs(r) == 1.0 else r * math.sqrt((n - 2) / (1.0 - r * r))
    return r, t_two_sided_p(t, n - 2), n


def bootstrap_replicates(per_seed: list[list[float]], n_boot: int = BOOTSTRAP_RESAMPLES, seed: int = 0):
    """Replicates of the mean over seeds under a two-level bootstrap: each replicate draws len(per_seed)
    seeds with replacement, then within each drawn seed its values (e.g. 0/1 per problem) with replacement,
    and averages, over the drawn seeds, the drawn values' mean. With one value per seed it is the ordinary
    bootstrap of the mean over seeds."""
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(c, dtype=float) for c in per_seed]
    S = len(arrays)
    if S == 0 or any(len(a) == 0 for a in arrays):
        raise ValueError("the bootstrap needs at least one seed with at least one problem")
    stats = np.empty(n_boot)
    seeds = rng.integers(0, S, (n_boot, S))
    if len({len(a) for a in arrays}) == 1:  # vectorised, in blocks to bound memory
        M, N = np.stack(arrays), len(arrays[0])
        for lo in range(0, n_boot, 1000):
            hi = min(lo + 1000, n_boot)
            problems = rng.integers(0, N, (hi - lo, S, N))
            stats[lo:hi] = M[seeds[lo:hi, :, None], problems].mean(axis=(1, 2))
    else:
        for b in range(n_boot):
            stats[b] = np.mean([arrays[s][rng.integers(0, len(arrays[s]), len(arrays[s]))].mean() for s in seeds[b]])
    return stats


def bootstrap_accuracy(
    per_seed: list[list[float]], n_boot: int = BOOTSTRAP_RESAMPLES, level: float = 0.95, seed: int = 0
) -> tuple[float, float, float]:
    """(mean over seeds of the per-seed means, low, high): the (1 - level) / 2 and (1 + level) / 2
    percentiles of `bootstrap_replicates`."""
    stats = bootstrap_replicates(per_seed, n_boot, seed)
    low, high = np.percentile(stats, [50 * (1 - level), 50 * (1 + level)])
    return float(np.mean([np.mean(c) for c in per_seed])), float(low), float(high)


def bootstrap_ci(
    values: list[float],
    level: float = 0.95,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
    statistic: Callable[[np.ndarray], float] | None = None,
) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (resampling the values with replacement). With `statistic`,
    the interval of statistic(values[resample]) instead, its quantiles taken as order statistics (the
    inverted empirical CDF: a statistic may be inf, e.g. a time to an accuracy that is never reached); pass
    seed indices as the values to resample paired seeds together."""
    if statistic is not None:
        v = np.asarray(values)
        if len(v) == 0:
            return math.nan, math.nan
        rng = np.random.default_rng(seed)
        draws = np.array([statistic(v[i]) for i in rng.integers(0, len(v), size=(resamples, len(v)))], dtype=float)
        lo, hi = np.quantile(draws, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
        return float(lo), float(hi)
    if len(values) == 0:
        return math.nan, math.nan
    if len(values) == 1:
        return float(values[0]), float(values[0])
    _, lo, hi = bootstrap_accuracy([[v] for v in values], resamples, level, seed)
    return lo, hi


def wilson_interval(correct: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The Wilson score interval (95% for z = 1.96) of a binomial proportion correct / n."""
    p = correct / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / denom
    return max(0.0, center - half), min(1.0, center + half)


# two-sided 95% Student t quantiles by degrees of freedom (normal beyond 30)
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228}
T95 |= {15: 2.131, 20: 2.086, 30: 2.042}


def t95(dof: int) -> float:
    """The two-sided 95% quantile of Student's t for `dof`, or for the next smaller tabulated one (a wider
    interval); inf below 1 degree of freedom."""
    if dof < 1:
        return math.inf
    return 1.96 if dof > 30 else T95[max(k for k in T95 if k <= dof)]


def t_half_width(values: list[float]) -> float:
    """Half-width of the 95% Student t interval of the mean: t95(n − 1) · s / √n (inf for fewer than 2)."""
    n = len(values)
    return t95(n - 1) * float(np.std(values, ddof=1)) / math.sqrt(n) if n > 1 else math.inf


def describe(values: list[float]) -> dict[str, float]:
    """n, mean, std (ddof 1; nan for one value), 95% bootstrap CI of the mean."""
    v = [x for x in values if x is not None and math.isfinite(x)]
    lo, hi = bootstrap_ci(v)
    return {
        "n": len(v),
        "mean": float(np.mean(v)) if v else math.nan,
        "std": float(np.std(v, ddof=1)) if len(v) > 1 else math.nan,
        "ci_low": lo,
        "ci_high": hi,
    }


# ----------------------------------------------------------------------------- runs


def find_runs(paths: list[Path]) -> list[Path]:
    """Run directories under `paths`: folders with a metrics.jsonl or a summary.json, outermost first (an
    `algorithm=sft` run keeps its distill/ and sft/ stages inside itself)."""
    runs: set[Path] = set()
    for p in paths:
        if not p.exists():
            raise SystemExit(
                f"{p} does not exist: pass a Hydra multirun folder, a bench_rl output folder or run directories"
            )
        found = {f.parent for name in ("metrics.jsonl", "summary.json") for f in p.rglob(name)}
        runs |= {r for r in found if "checkpoints" not in r.parts and not any(a in found for a in r.parents)}
    return sorted(runs)


def config_and_seed(run: Path, cfg: dict) -> tuple[str, int | None]:
    """The run's configuration name (its directory name without the seed) and its seed."""
    name, seed = run.name, cfg.get("seed")
    parts = name.split(",")
    seed_parts = [p for p in parts if re.fullmatch(r"seed=\d+", p)]
    if seed_parts:  # Hydra multirun: override_dirname
        rest = [p for p in parts if p not in seed_parts and not p.startswith("eval.every=")]
        return ",".join(rest) or "(defaults)", int(seed_parts[0].split("=")[1])
    m = re.fullmatch(r"(.+)_s(\d+)", name)  # tools/bench_rl.py: <method>_s<seed>
    if m:
        return m.group(1), int(m.group(2))
    m = re.fullmatch(r"seed_?(\d+)", name)  # <experiment>/seed<k>
    if m:
        return run.parent.name, int(m.group(1))
    return name, seed


def load_yaml(path: Path) -> dict:
    if not path.exists():
        return {}
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def run_config(run: Path) -> dict:
    """rapid's resolved config.yaml, else Hydra's record of the composed one (.hydra/config.yaml)."""
    return load_yaml(run / "config.yaml") or load_yaml(run / ".hydra" / "config.yaml")


def read_rows(run: Path) -> list[dict]:
    """A run's metrics.jsonl rows under today's names, whichever names it was written with (rapid.logger)."""
    from rapid.logger import read_metrics

    return read_metrics(run / "metrics.jsonl") if (run / "metrics.jsonl").exists() else []


def read_run(run: Path) -> dict:
    """One row per run: configuration, seed, H, algorithm and the METRICS."""
    cfg = run_config(run)
    rows = read_rows(run)
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    train = [r for r in rows if "time/round_s" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    config, seed = config_and_seed(run, cfg)
    algorithm = cfg.get("algorithm", {})

    def mean_of(key: str) -> float | None:
        values = [r[key] for r in train if key in r]
        return float(np.mean(values)) if values else None

    accuracy = summary.get("eval/accuracy_after", evals[-1]["eval/accuracy"] if evals else None)
    train_s = (
        sum(r["time/round_s"] for r in train)
        if train
        else summary.get("time/rounds_s_total", summary.get("time/total_s"))
    )
    mem = [v for r in train for k, v in r.items() if k.startswith("mem/") and k.endswith("_rss_mib")]
    peak = max(mem) if mem else summary.get("peak_rss_mib")
    meta = json.loads((run / "meta.json").read_text()) if (run / "meta.json").exists() else {}
    return {
        "run": str(run),
        "config": config,
        "seed": seed,
        "H": algorithm.get("H"),
        "shape": (algorithm.get("H"), algorithm.get("n_step"), algorithm.get("n_group")),
        "cpu": meta.get("cpu"),
        "algorithm": algorithm.get("name", summary.get("algorithm")),
        "loss": algorithm.get("loss"),
        "estimator": tuple(str(algorithm.get(k)) for k in ESTIMATOR_KEYS),
        "accuracy": accuracy,
        "train_s": train_s,
        "staleness": mean_of("iw/staleness"),
        "log_w_mean": mean_of("iw/log_w_mean"),
        "clipped_mass": mean_of("iw/clipped_mass"),
        "peak_rss_mib": peak,
        **machine_load(train, meta, summary),
    }


def machine_load(train: list[dict], meta: dict, summary: dict) -> dict:
    """What a run's files say about how busy the machine was: the engine's seconds per 1,000 generated
    completion tokens (`gen_s_per_ktok`: the sum of `time/generate_s` over the tokens, `sampler/tokens_per_s`
    times `time/generate_s` per round), and, where the run recorded them (rapid.profiling.calibrate, at the
    start in meta.json and at the end in summary.json), the slower of the two fixed matrix-product timings
    (`calibration_s`) and the higher 1-minute load average (`loadavg`)."""
    gen = sum(r.get("time/generate_s", 0.0) for r in train)
    tokens = sum(r.get("sampler/tokens_per_s", 0.0) * r.get("time/generate_s", 0.0) for r in train)
    marks = [c for c in (meta.get("calibration"), summary.get("calibration")) if isinstance(c, dict)]
    timings = [c["matmul_s"] for c in marks if c.get("matmul_s") is not None]
    loads = [c["loadavg_1m"] for c in marks if c.get("loadavg_1m") is not None]
    cores = re.search(r"(\d+) cores", str(meta.get("cpu", "")))
    return {
        "cores": int(cores.group(1)) if cores else None,
        "gen_s_per_ktok": 1000 * gen / tokens if tokens > 0 else None,
        "calibration_s": max(timings) if timings else None,
        "loadavg": max(loads) if loads else None,
    }


SLOW = 1.3  # a run this many times slower than the usual one is flagged


def busy_flags(runs: list[dict]) -> dict[str, str]:
    """{run: why} for the runs whose timings a busy machine may have inflated: generation `SLOW` times
    slower per token than the median of the runs that generate in the same shape (H, n_step, n_group; at
    least 3 of them), a calibration `SLOW` times the median calibration, or a load average above the
    machine's cores (meta.json's CPU line). Their accuracies stand; their times do not."""
    flags: dict[str, list[str]] = {}
    groups: dict = {}
    for r in runs:
        if r.get("gen_s_per_ktok") is not None:
            groups.setdefault(r.get("shape"), []).append(r)
    for members in groups.values():
        if len(members) < 3:
            continue
        usual = float(np.median([r["gen_s_per_ktok"] for r in members]))
        for r in members:
            if r["gen_s_per_ktok"] > SLOW * usual:
                flags.setdefault(r["run"], []).append(
                    f"generation {r['gen_s_per_ktok']:.1f} s per 1k tokens, {r['gen_s_per_ktok'] / usual:.2f}x "
                    f"the median {usual:.1f} of {len(members)} runs alike"
                )
    timed = [r for r in runs if r.get("calibration_s") is not None]
    if len(timed) >= 3:
        usual = float(np.median([r["calibration_s"] for r in timed]))
        for r in timed:
            if r["calibration_s"] > SLOW * usual:
                flags.setdefault(r["run"], []).append(
                    f"calibration {1000 * r['calibration_s']:.0f} ms, {r['calibration_s'] / usual:.2f}x the median"
                )
    for r in runs:
        if r.get("loadavg") is not None and r.get("cores") and r["loadavg"] > r["cores"]:
            flags.setdefault(r["run"], []).append(f"load average {r['loadavg']:.1f} on {r['cores']} cores")
    return {run: "; ".join(why) for run, why in flags.items()}


def drop_common_overrides(runs: list[dict]) -> list[str]:
    """Shorten multirun configuration names to what tells them apart: the `key=value` parts shared by every
    run are dropped from every name (and returned)."""
    parts = [r["config"].split(",") for r in runs]
    if len({r["config"] for r in runs}) < 2 or not all("=" in p for ps in parts for p in ps):
        return []
    common = [p for p in parts[0] if all(p in ps for ps in parts)]
    for r, ps in zip(runs, parts):
        r["config"] = ",".join(p for p in ps if p not in common) or "(defaults)"
    return common


def table(runs: list[dict]) -> list[dict]:
    """One row per configuration: n seeds, H, and describe() of every metric."""
    out = []
    for config in sorted({r["config"] for r in runs}, key=lambda c: _config_order(c, runs)):
        members = [r for r in runs if r["config"] == config]
        row = {
            "config": config,
            "seeds": " ".join(str(r["seed"]) for r in sorted(members, key=lambda r: r["seed"] or 0)),
            "H": members[0]["H"],
            "algorithm": members[0]["algorithm"],
        }
        for m in METRICS:
            for k, v in describe([r[m] for r in members]).items():
                row[f"{m}_{k}"] = v
        out.append(row)
    return out


def _config_order(config: str, runs: list[dict]):
    first = next(r for r in runs if r["config"] == config)
    return (str(first["algorithm"]), first["H"] if isinstance(first["H"], int) else 0, config)


ESTIMATOR_KEYS = ("eta", "leave_one_out", "iw_baseline", "iw_gradient")  # the IW-GRPG ablation switches


def correlations(runs: list[dict], all_runs: bool = False) -> list[dict]:
    points = [r for r in runs if isinstance(r["H"], (int, float)) and (all_runs or r["staleness"] is not None)]
    # an H sweep of an importance-weighted loss (one that logs iw/staleness; rapid.estimators' `iw`) holds the
    # estimator fixed: ablated estimators are left out
    if not all_runs and points:
        usual = Counter(r["estimator"] for r in points).most_common(1)[0][0]
        points = [r for r in points if r["estimator"] == usual]
    out = []
    for m in CORRELATED:
        pts = [(r["H"], r[m]) for r in points if r[m] is not None]
        r, p, n = pearson([h for h, _ in pts], [v for _, v in pts])
        out.append({"quantity": m, "r": r, "p": p, "n": n, "H_values": " ".join(map(str, sorted({h for h, _ in pts})))})
    return out


def t_one_sided_p(t: float, df: float) -> float:
    """P(T >= t) for Student's t with df degrees of freedom (half the two-sided tail, on t's side)."""
    tail = 0.5 * t_two_sided_p(t, df)
    return tail if t >= 0 else 1.0 - tail


def paired_t_p(d: list[float]) -> float:
    """Two-sided p of the paired t test of mean(d) = 0 (n − 1 df); with no spread, 0 unless every d is 0."""
    n, mean = len(d), float(np.mean(d))
    se = float(np.std(d, ddof=1)) / math.sqrt(n)
    if se == 0:
        return 1.0 if mean == 0 else 0.0
    return t_two_sided_p(mean / se, n - 1)


def tost_p(d: list[float], margin: float) -> float:
    """The equivalence test (two one-sided t tests, TOST) of |mean(d)| < margin: the larger of the p-values
    of mean > −margin (P(T >= (mean + margin) / se)) and of mean < margin (P(T <= (mean − margin) / se)),
    n − 1 df. Below α exactly when the 1 − 2α t interval lies inside (−margin, margin)."""
    n, mean = len(d), float(np.mean(d))
    se = float(np.std(d, ddof=1)) / math.sqrt(n)
    if se == 0:
        return 0.0 if abs(mean) < margin else 1.0
    return max(t_one_sided_p((mean + margin) / se, n - 1), 1.0 - t_one_sided_p((mean - margin) / se, n - 1))


def holm(p: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values of a family of tests (in the given order): the k-th smallest p
    times (m − k + 1), made non-decreasing along that order, at most 1. Rejecting where the adjusted p < α
    keeps the chance of any false rejection in the family below α."""
    m = len(p)
    adjusted, running = [0.0] * m, 0.0
    for k, i in enumerate(sorted(range(m), key=lambda i: p[i])):
        running = max(running, min(1.0, (m - k) * p[i]))
        adjusted[i] = running
    return adjusted


ALPHA = 0.05
MARGIN = 0.05  # the equivalence margin of --versus: accuracy differences within ±5 points count as equal


def versus(runs: list[dict], reference: str, margin: float = MARGIN) -> list[dict]:
    """Every other configuration against `reference`, paired by seed: over the seeds both have finished,
    the per-seed accuracy differences d_s = acc(config, s) − acc(reference, s), their mean, the 95%
    percentile bootstrap interval of the mean (resampling seeds) and the 95% Student t interval
    (mean ± t95(n − 1) · sd / √n), how many seeds favour each side, and two tests, each corrected for the
    family of comparisons against `reference` (the configurations with 2 seeds or more) by Holm's method:
    the paired t test of a difference (`p`, `p_holm`) and the equivalence test against ±`margin` (TOST:
    `p_equiv`, `p_equiv_holm`). The verdict: `<config> better` or `<reference> better` where p_holm < 0.05;
    `equivalent (±margin)` where p_equiv_holm < 0.05; else `undecided` (the seeds cannot tell a
    difference from none: an interval that holds 0 is not a tie); no test from one seed."""
    acc = {(r["config"], r["seed"]): r["accuracy"] for r in runs if r["accuracy"] is not None}
    if not any(c == reference for c, _ in acc):
        known = ", ".join(sorted({c for c, _ in acc}))
        raise SystemExit(f"--versus {reference}: no run of that configuration (the configurations: {known})")
    out = []
    for config in sorted({c for c, _ in acc if c != reference}, key=lambda c: _config_order(c, runs)):
        seeds = sorted(s for c, s in acc if c == config and (reference, s) in acc)
        d = [acc[config, s] - acc[reference, s] for s in seeds]
        if not d:
            continue
        mean = float(np.mean(d))
        lo, hi = bootstrap_ci(d)
        half = t_half_width(d)
        tested = len(d) > 1
        out.append(
            {
                "config": config,
                "reference": reference,
                "seeds": " ".join(map(str, seeds)),
                "n": len(d),
                "diff_mean": mean,
                "boot_low": lo,
                "boot_high": hi,
                "t_low": mean - half,
                "t_high": mean + half,
                "config_ahead": sum(x > 0 for x in d),
                "reference_ahead": sum(x < 0 for x in d),
                "p": paired_t_p(d) if tested else math.nan,
                "p_holm": math.nan,
                "margin": margin,
                "p_equiv": tost_p(d, margin) if tested else math.nan,
                "p_equiv_holm": math.nan,
                "verdict": "one seed: no test",
            }
        )
    family = [r for r in out if r["n"] > 1]
    for key in ("p", "p_equiv"):
        for r, q in zip(family, holm([r[key] for r in family])):
            r[f"{key}_holm"] = q
    for r in family:
        if r["p_holm"] < ALPHA:
            r["verdict"] = f"{r['config'] if r['diff_mean'] > 0 else reference} better"
        elif r["p_equiv_holm"] < ALPHA:
            r["verdict"] = f"equivalent (±{margin:g})"
        else:
            r["verdict"] = "undecided"
    return out


def versus_markdown(rows: list[dict]) -> str:
    ref = rows[0]["reference"] if rows else ""
    margin = rows[0]["margin"] if rows else MARGIN
    m = sum(r["n"] > 1 for r in rows)
    lines = [
        f"Paired by seed against `{ref}`: mean accuracy difference (configuration − {ref}) over the seeds both "
        "finished, 95% bootstrap and Student t intervals of it, the seeds on which each is ahead, the paired t "
        f"test's p of a difference and the equivalence test's (TOST, margin ±{margin:g}) p, each with Holm's "
        f"adjustment for the {m} comparisons with 2 seeds or more. Verdict: a side is better where the adjusted "
        f"p < {ALPHA:g}; equivalent where the adjusted TOST p < {ALPHA:g}; otherwise undecided (an interval "
        "that holds 0 is not a tie).",
        "",
        f"| configuration | seeds | difference | 95% bootstrap CI | 95% t CI | seeds ahead (config / {ref}) "
        "| p (Holm) | TOST p (Holm) | verdict |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['config']} | {r['seeds']} | {r['diff_mean']:+.3f} | [{fmt(r['boot_low'], 3)}, {fmt(r['boot_high'], 3)}] "
            f"| [{fmt(r['t_low'], 3)}, {fmt(r['t_high'], 3)}] | {r['config_ahead']} / {r['reference_ahead']} "
            f"| {fmt(r['p'], 3)} ({fmt(r['p_holm'], 3)}) | {fmt(r['p_equiv'], 3)} ({fmt(r['p_equiv_holm'], 3)}) "
            f"| {r['verdict']} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- report

LABELS = {
    "accuracy": "accuracy",
    "train_s": "train time (s)",
    "staleness": "staleness mean abs(log w̄)",
    "log_w_mean": "mean log w̄",
    "clipped_mass": "clipped mass",
    "peak_rss_mib": "peak RSS (MiB)",
}


def fmt(x: float, digits: int) -> str:
    return "–" if x is None or not math.isfinite(x) else f"{x:.{digits}f}"


def cell(row: dict, m: str) -> str:
    digits = {"accuracy": 3, "train_s": 0, "staleness": 3, "log_w_mean": 3, "clipped_mass": 3, "peak_rss_mib": 0}[m]
    if row[f"{m}_n"] == 0:
        return "–"
    text = fmt(row[f"{m}_mean"], digits)
    if row[f"{m}_n"] > 1:
        text += (
            f" ± {fmt(row[f'{m}_std'], digits)} [{fmt(row[f'{m}_ci_low'], digits)}, {fmt(row[f'{m}_ci_high'], digits)}]"
        )
    return text


def markdown(
    rows: list[dict], corr: list[dict], all_runs: bool, common: list[str], cpus: list[str], flags: dict | None = None
) -> str:
    shown = [m for m in METRICS if any(r[f"{m}_n"] for r in rows)]
    lines = [
        f"`python tools/stats.py {' '.join(sys.argv[1:])}`",
        "",
        f"Runs made on: {'; '.join(cpus) if cpus else 'not recorded (meta.json has no cpu)'}.",
        *([f"Overrides common to every run: `{','.join(common)}`."] if common else []),
        "",
        "Per configuration: mean ± std [95% bootstrap CI of the mean] over seeds.",
        "",
        "| configuration | seeds | " + " | ".join(LABELS[m] for m in shown) + " |",
        "|---|---|" + "---:|" * len(shown),
    ]
    for r in rows:
        lines.append(f"| {r['config']} | {r['seeds']} | " + " | ".join(cell(r, m) for m in shown) + " |")
    which = (
        "every run with an H"
        if all_runs
        else "the runs of the importance-weighted loss (RAPID, PG) with the most common estimator settings (eta, leave-one-out, IW switches)"
    )
    lines += [
        "",
        f"Pearson correlation of H with each quantity over {which}, one point per run "
        "(two-sided p from Student's t with n − 2 df):",
        "",
        "| H vs | r | p | n | H values |",
        "|---|---:|---:|---:|---|",
    ]
    for c in corr:
        p = c["p"]
        p_text = fmt(p, 4) if not math.isfinite(p) or p >= 1e-3 else f"{p:.1e}"
        lines.append(f"| {LABELS[c['quantity']]} | {fmt(c['r'], 3)} | {p_text} | {c['n']} | {c['H_values']} |")
    lines += ["", busy_markdown(flags or {})]
    return "\n".join(lines) + "\n"


def busy_markdown(flags: dict[str, str]) -> str:
    head = (
        f"Runs whose times a busy machine may have inflated (generation per token or the fixed calibration "
        f"{SLOW}x the usual, or a load average above the cores; their accuracies stand, their times are in the "
        "table above as measured):"
    )
    if not flags:
        return head.replace("Runs whose", "No run's").replace(":", "; none flagged by what the runs recorded.", 1)
    return "\n".join([head, "", *(f"- `{Path(run).name}`: {why}" for run, why in sorted(flags.items()))])


# ----------------------------------------------------------------------------- RAPID against PG: time to accuracy


def time_to_accuracy(wall_s: list[float], accuracy: list[float], target: float) -> float:
    """The training-loop time at which a learning curve (its evaluations in training order: wall_s[j],
    accuracy[j]) first reaches `target`: linear between the two evaluations around the first crossing,
    wall_s[0] if the first evaluation is already there, inf if no evaluation reaches it."""
    for j, a in enumerate(accuracy):
        if a >= target:
            if j == 0:
                return float(wall_s[0])
            a0, t0, t1 = accuracy[j - 1], wall_s[j - 1], wall_s[j]
            return float(t0 + (target - a0) / (a - a0) * (t1 - t0))
    return math.inf


def eval_points(run: Path) -> list[dict]:
    """A run's held-out evaluations in training order: samples trained on, training-loop time up to them
    (the sum of `time/round_s` over the rounds before; a run resumed from a checkpoint repeats the rounds
    after it, and each round counts once, its last record), eval_n and accuracy."""
    rows = read_rows(run)
    rounds = {r["progress/round"]: r for r in rows if "time/round_s" in r and "progress/round" in r}
    evals = {r["progress/round"]: r for r in rows if "eval/accuracy" in r and "progress/round" in r}
    points = []
    for k, e in sorted(evals.items()):
        done = [rounds[j] for j in sorted(rounds) if j <= k]
        points.append(
            {
                "samples": done[-1]["progress/samples"] if done else 0,
                "wall_s": sum(r["time/round_s"] for r in done),
                "eval_n": e.get("eval/n"),
                "accuracy": e["eval/accuracy"],
            }
        )
    return points


def power_method(h) -> str:
    return "PG" if h == 1 else f"RAPID H={h}"


def power_runs(out: Path) -> list[dict]:
    """The finished runs (a summary.json) under out/runs: method, H, seed, CPU and evaluation points."""
    runs = []
    for run in find_runs([out / "runs"]):
        if not (run / "summary.json").exists():
            continue
        cfg = run_config(run)
        a = cfg.get("algorithm", {})
        h = a.get("H")
        meta = json.loads((run / "meta.json").read_text()) if (run / "meta.json").exists() else {}
        summary = json.loads((run / "summary.json").read_text())
        runs.append(
            {
                "run": str(run),
                "method": power_method(h),
                "H": h,
                "shape": (h, a.get("n_step"), a.get("n_group")),
                "seed": config_and_seed(run, cfg)[1],
                "cpu": meta.get("cpu"),
                "git": meta.get("git_commit"),
                "points": eval_points(run),
                **machine_load([r for r in read_rows(run) if "time/round_s" in r], meta, summary),
            }
        )
    return sorted(runs, key=lambda r: (r["seed"], r["H"]))


def power_summary(runs: list[dict], h_pg: int = 1, h_rapid: int = 8) -> dict:
    """RAPID H = h_rapid against PG over the seeds where both finished. The target is PG's final accuracy
    (the mean over seeds at its last evaluation); each method's time to it is read off its mean curve (mean
    accuracy against mean training-loop time at each evaluation, time_to_accuracy). The intervals are 95%
    percentile bootstraps over seeds, a resample drawing (PG, RAPID) pairs of one seed together and
    recomputing the target, both times, their difference and ratio. A run without a round-0 evaluation takes
    the base model's accuracy from the runs that made one (greedy decoding of the same weights)."""
    base = sorted({p["accuracy"] for r in runs for p in r["points"] if p["samples"] == 0})
    if len(base) > 1:
        raise SystemExit(f"the round-0 evaluations disagree ({base}): the runs did not start from the same model")
    by = {(r["H"], r["seed"]): r for r in runs}
    seeds = sorted({s for h, s in by if h == h_pg} & {s for h, s in by if h == h_rapid})
    methods = {h_pg: power_method(h_pg), h_rapid: power_method(h_rapid)}
    wall, acc, samples = {}, {}, {}
    for h in methods:
        curves = []
        for s in seeds:
            points = by[(h, s)]["points"]
            if base and points[0]["samples"] != 0:
                points = [{"samples": 0, "wall_s": 0.0, "accuracy": base[0]}, *points]
            curves.append(points)
        grids = {tuple(p["samples"] for p in c) for c in curves}
        if len(grids) > 1:
            raise SystemExit(f"{methods[h]}'s seeds were evaluated at different samples ({sorted(grids)})")
        samples[h] = list(grids.pop()) if grids else []
        wall[h] = np.array([[p["wall_s"] for p in c] for c in curves], dtype=float)
        acc[h] = np.array([[p["accuracy"] for p in c] for c in curves], dtype=float)
    n = len(seeds)
    out = {"seeds": seeds, "base": base[0] if base else None, "methods": methods, "samples": samples, "n": n}
    if n == 0:
        return out

    def target(i):
        return acc[h_pg][i].mean(0)[-1]

    def tta(h, i):
        return time_to_accuracy(wall[h][i].mean(0), acc[h][i].mean(0), target(i))

    every = np.arange(n)
    out["target"] = float(target(every))
    for h in methods:
        final = describe(list(acc[h][:, -1]))
        out[h] = {
            "final": final,
            "wall_end": describe(list(wall[h][:, -1])),
            "tta": tta(h, every),
            "tta_ci": bootstrap_ci(every, statistic=lambda i, h=h: tta(h, i)),
            "reached": int(sum(time_to_accuracy(w, a, out["target"]) < math.inf for w, a in zip(wall[h], acc[h]))),
            "curve": {
                "samples": samples[h],
                "wall_s": wall[h].mean(0),
                "mean": acc[h].mean(0),
                "ci": [bootstrap_ci(list(acc[h][:, j])) for j in range(acc[h].shape[1])],
            },
        }
    out["diff_final"] = describe(list(acc[h_rapid][:, -1] - acc[h_pg][:, -1]))
    out["diff_final_t"] = t_half_width(list(acc[h_rapid][:, -1] - acc[h_pg][:, -1]))
    # the speed question alone: RAPID's training-loop time for the whole run over PG's (same samples), from
    # the per-seed log ratios: their mean and 95% t interval, exponentiated (a bootstrap over 5 seeds is too
    # narrow); again without the seeds whose runs a busy machine may have slowed (`busy_flags`)
    log_ratio = np.log(wall[h_rapid][:, -1] / wall[h_pg][:, -1])
    out["wall_ratio"], out["wall_ratio_ci"] = log_ratio_interval(log_ratio)
    flags = busy_flags([r for r in runs if r["seed"] in seeds and r["H"] in methods])
    out["flagged"] = {
        seed: [(power_method(r["H"]), flags[r["run"]]) for r in runs if r["seed"] == seed and r["run"] in flags]
        for seed in seeds
        if any(r["seed"] == seed and r["run"] in flags for r in runs)
    }
    clean = np.array([s not in out["flagged"] for s in seeds])
    out["wall_ratio_clean"], out["wall_ratio_clean_ci"] = log_ratio_interval(log_ratio[clean])
    out["per_seed"] = [
        {
            "seed": seed,
            **{f"{k}_{h}": float(v[h][i, -1]) for h in methods for k, v in (("final", acc), ("wall", wall))},
        }
        for i, seed in enumerate(seeds)
    ]
    for h in methods:  # seeds whose run ends below the base model
        out[h]["below_base"] = None if out["base"] is None else int((acc[h][:, -1] < out["base"]).sum())
    out["diff_tta"] = tta(h_rapid, every) - tta(h_pg, every)
    out["diff_tta_ci"] = bootstrap_ci(every, statistic=lambda i: tta(h_rapid, i) - tta(h_pg, i))
    out["ratio_tta"] = time_ratio(tta(h_rapid, every), tta(h_pg, every))
    out["ratio_tta_ci"] = bootstrap_ci(every, statistic=lambda i: time_ratio(tta(h_rapid, i), tta(h_pg, i)))
    return out


def log_ratio_interval(log_ratio) -> tuple[float, tuple[float, float]]:
    """exp(mean log ratio), the geometric mean of per-seed ratios, and its 95% interval: the Student t
    interval of the mean log ratio (t95(n − 1) · sd / √n), exponentiated. nan without a seed; the
    interval is (nan, nan) with one."""
    v = [float(x) for x in log_ratio]
    if not v:
        return math.nan, (math.nan, math.nan)
    mean, half = float(np.mean(v)), t_half_width(v)
    if not math.isfinite(half):
        return math.exp(mean), (math.nan, math.nan)
    return math.exp(mean), (math.exp(mean - half), math.exp(mean + half))


def time_ratio(a: float, b: float) -> float:
    """a / b for two times to an accuracy, where either may be 0 (the target reached before training,
    when the seeds drawn have PG end at or below the base model) or inf (never reached): 0 / 0 is 1
    (both at once), a / 0 is inf."""
    if b == 0:
        return 1.0 if a == 0 else math.inf
    return a / b


def power_markdown(s: dict, runs: list[dict], h_pg: int, h_rapid: int) -> str:
    pg, rapid = s["methods"][h_pg], s["methods"][h_rapid]
    counts = Counter(r["method"] for r in runs)
    lines = [
        f"# {rapid} against {pg}: time to accuracy",
        "",
        f"Finished runs: {', '.join(f'{m} {counts[m]}' for m in (pg, rapid))}; paired seeds (both finished): "
        f"{s['n']} ({' '.join(map(str, s['seeds'])) or 'none'}). CPU: {'; '.join(sorted({str(r['cpu']) for r in runs}))}.",
        "",
    ]
    if s["n"] == 0:
        return "\n".join(lines + ["No seed has both runs finished yet.", ""])

    def ci(d, digits=3):
        return f"{d['mean']:.{digits}f} [{d['ci_low']:.{digits}f}, {d['ci_high']:.{digits}f}]"

    def t(x):
        return "not reached" if not math.isfinite(x) else f"{x:.0f}"

    lines += [
        f"Base model: {s['base']:.3f}. Target: {pg}'s final accuracy, **{s['target']:.3f}** (mean over the "
        f"paired seeds). Times are training-loop seconds (the sum of `time/round_s`; model loading, engine "
        "start-up and evaluation excluded) read off each method's mean curve; intervals are 95% percentile "
        "bootstraps over seeds (10,000 resamples, pairs of one seed drawn together, the target recomputed "
        "in each).",
        "",
    ]
    if s["base"] is not None and s["target"] <= s["base"]:
        lines += [
            f"**The target is degenerate**: {pg}'s final accuracy ({s['target']:.3f}) is at or below the base "
            f"model's ({s['base']:.3f}), so every mean curve starts at it and the time to it is 0 for both "
            "methods. On these seeds the comparison rests on the final accuracies, the curves and the "
            "training-loop time per sample (below), not on time to accuracy.",
            "",
        ]
    lines += [
        "| method | seeds | final accuracy, mean [95% CI] | training-loop s at the end | s to the target [95% CI] "
        "| seeds reaching the target on their own curve |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for h in (h_pg, h_rapid):
        m = s[h]
        lo, hi = m["tta_ci"]
        lines.append(
            f"| {s['methods'][h]} | {s['n']} | {ci(m['final'])} | {ci(m['wall_end'], 0)} | "
            f"{t(m['tta'])} [{t(lo)}, {t(hi)}] | {m['reached']} / {s['n']} |"
        )
    (dlo, dhi), (rlo, rhi) = s["diff_tta_ci"], s["ratio_tta_ci"]

    def r(x):
        return "inf" if not math.isfinite(x) else f"{x:.2f}"

    lines += [
        "",
        f"Paired, {rapid} − {pg}: final accuracy {ci(s['diff_final'])}; time to the target (s) "
        f"{t(s['diff_tta'])} [{t(dlo)}, {t(dhi)}]; "
        f"ratio of the times {r(s['ratio_tta'])} [{r(rlo)}, {r(rhi)}]. The final-accuracy difference's "
        f"95% Student t interval: [{s['diff_final']['mean'] - s['diff_final_t']:.3f}, "
        f"{s['diff_final']['mean'] + s['diff_final_t']:.3f}].",
        "",
        f"Training-loop time for the whole run, {rapid} over {pg} (same samples; the geometric mean of the "
        "per-seed ratios, with the 95% Student t interval of the mean log ratio, exponentiated): "
        f"**{r(s['wall_ratio'])}x** [{r(s['wall_ratio_ci'][0])}, {r(s['wall_ratio_ci'][1])}] over {s['n']} seeds.",
        "",
        *busy_lines(s, r),
        "Per seed (final accuracy; training-loop s). Ending below the base model: "
        + ", ".join(
            f"{s['methods'][h]} {'–' if s[h]['below_base'] is None else s[h]['below_base']} of {s['n']}"
            for h in (h_pg, h_rapid)
        )
        + ".",
        "",
        f"| seed | {pg} accuracy | {rapid} accuracy | difference | {pg} s | {rapid} s | time ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|",
        *(
            f"| {x['seed']} | {x[f'final_{h_pg}']:.3f} | {x[f'final_{h_rapid}']:.3f} | "
            f"{x[f'final_{h_rapid}'] - x[f'final_{h_pg}']:+.3f} | {x[f'wall_{h_pg}']:.0f} | {x[f'wall_{h_rapid}']:.0f} | "
            f"{x[f'wall_{h_rapid}'] / x[f'wall_{h_pg}']:.2f} |"
            for x in s["per_seed"]
        ),
        "",
        "| method | samples | training-loop s (mean) | accuracy, mean [95% CI over seeds] |",
        "|---|---:|---:|---:|",
    ]
    for h in (h_pg, h_rapid):
        c = s[h]["curve"]
        for j, n in enumerate(c["samples"]):
            lo, hi = c["ci"][j]
            lines.append(
                f"| {s['methods'][h]} | {n} | {c['wall_s'][j]:.0f} | {c['mean'][j]:.3f} [{lo:.3f}, {hi:.3f}] |"
            )
    return "\n".join(lines) + "\n"


def busy_lines(s: dict, r) -> list[str]:
    """power.md's lines on the runs a busy machine may have slowed, and the time ratio without their seeds."""
    if not s["flagged"]:
        return ["No run is flagged as slowed by a busy machine (`busy_flags`).", ""]
    kept = s["n"] - len(s["flagged"])
    lo, hi = s["wall_ratio_clean_ci"]
    return [
        "Runs whose times a busy machine may have inflated (`busy_flags`: generation per token or the fixed "
        f"calibration {SLOW}x the usual of runs alike, or a load average above the cores):",
        "",
        *(f"- seed {seed}, {method}: {why}" for seed, whys in s["flagged"].items() for method, why in whys),
        "",
        f"Without those seeds ({kept} left): **{r(s['wall_ratio_clean'])}x** [{r(lo)}, {r(hi)}]. Their "
        "accuracies stand (a slow machine changes when a run finishes, not what it computes).",
        "",
    ]


def power_report(out: Path, h_pg: int = 1, h_rapid: int = 8) -> str:
    """runs.csv (one row per finished run and evaluation), power.md and power.png in `out`."""
    runs = power_runs(out)
    if not runs:
        raise SystemExit(
            f"no finished run (with summary.json) under {out / 'runs'}: run experiments/rapid_vs_pg_power.sh"
        )
    with (out / "runs.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["method", "H", "seed", "samples", "wall_s", "eval_n", "accuracy"])
        writer.writeheader()
        for r in runs:
            for p in r["points"]:
                writer.writerow({"method": r["method"], "H": r["H"], "seed": r["seed"], **p})
    s = power_summary(runs, h_pg, h_rapid)
    text = power_markdown(s, runs, h_pg, h_rapid)
    (out / "power.md").write_text(text)
    if s["n"]:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from figures import draw_power

        draw_power(s, h_pg, h_rapid, out / "power.png")
    return text


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "paths", nargs="*", type=Path, help="multirun folders, bench_rl output folders or run directories"
    )
    parser.add_argument(
        "--power",
        type=Path,
        help="instead: RAPID against PG in this experiments/rapid_vs_pg_power.sh folder (runs.csv, power.md, power.png)",
    )
    parser.add_argument("--power-h", type=int, nargs=2, default=[1, 8], metavar=("PG_H", "RAPID_H"))
    parser.add_argument("--out", type=Path, help="also write stats.md, stats.csv and correlations.csv here")
    parser.add_argument("--all-runs", action="store_true", help="correlate H over every run that has one, any loss")
    parser.add_argument(
        "--versus",
        metavar="CONFIG",
        help="also compare every configuration with this one, paired by seed (versus.csv with --out)",
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=MARGIN,
        help=f"--versus: the equivalence margin, in accuracy (default {MARGIN}: differences within ±5 points are equal)",
    )
    args = parser.parse_args(argv)
    if args.power:
        text = power_report(args.power, *args.power_h)
        print(text)
        return text
    if not args.paths:
        parser.error("give the runs' folders (or --power <folder>)")
    runs = [read_run(r) for r in find_runs(args.paths)]
    if not runs:
        raise SystemExit(
            f"no run directories (with metrics.jsonl or summary.json) under {' '.join(map(str, args.paths))}"
        )
    common = drop_common_overrides(runs)
    rows, corr = table(runs), correlations(runs, args.all_runs)
    text = markdown(rows, corr, args.all_runs, common, sorted({r["cpu"] for r in runs if r["cpu"]}), busy_flags(runs))
    paired = versus(runs, args.versus, args.margin) if args.versus else []
    if paired:
        text += "\n" + versus_markdown(paired)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "stats.md").write_text(text)
        for name, data in (("stats.csv", rows), ("correlations.csv", corr), ("runs.csv", runs), ("versus.csv", paired)):
            if not data:
                continue
            with (args.out / name).open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=list(data[0]))
                writer.writeheader()
                writer.writerows(data)
    print(text)
    return text


if __name__ == "__main__":
    main(sys.argv[1:])
