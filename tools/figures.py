"""The paper's figures from run directories (PNG, matplotlib).

    python tools/figures.py multirun/<date> --out experiments/results/figures_cpu
    python tools/figures.py experiments/results/bench_rl_cpu --out /tmp/figures

Runs are found and grouped into methods as tools/stats.py does (a method = a configuration without
its seed). Each figure is written where its data exists, and skipped with a note where it does not:

    accuracy.png          held-out accuracy against training samples and against training-loop wall
                          time (the cumulative sum of `time/round_s` up to each evaluation round; model
                          loading, engine start-up and evaluation excluded), one line per method: the
                          mean over seeds, with a band from the seeds' minimum to their maximum (on the
                          time axis a point sits at the seeds' mean time); the same points as a
                          table in accuracy.md
    length_time_vs_h.png  completion length and generation time per round against H (the paper's
                          Fig. 2): per run the mean over rounds of `train/completion_len` and
                          `time/generate_s`; mean over seeds, bars from min to max; one line per
                          algorithm (PG is RAPID's H = 1)
    token_log_w.png       the token-level log importance weight log π_θ(y_t|…) − log μ(y_t|…) along the
                          completions of one group (the paper's Fig. 3), θ after the round's H updates;
                          needs a run made with `logger.rollouts=true` (the last such round of the
                          first such run, or `--token-run`)
    clip_staleness.png    `iw/clip_frac` and `iw/staleness` per round against samples (the paper's
                          Fig. 4), mean over seeds with a min-max band
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

if __package__ in (None, ""):  # run as a script: the repository root, for `tools.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tools.stats import config_and_seed, drop_common_overrides, find_runs, read_rows, run_config  # noqa: E402


def load(run: Path) -> dict:
    """A run's method, seed, H, training rows and evaluation rows (with samples and cumulative time)."""
    cfg = run_config(run)
    method, seed = config_and_seed(run, cfg)
    rows = read_rows(run)
    train = [r for r in rows if "time/round_s" in r and "progress/round" in r]
    evals = [r for r in rows if "eval/accuracy" in r and "progress/round" in r]
    per_round = cfg.get("algorithm", {}).get("n_inference")
    samples = {0: 0, **{r["progress/round"]: r["progress/samples"] for r in train if "progress/samples" in r}}
    elapsed, cumulative = {0: 0.0}, 0.0
    for r in sorted(train, key=lambda r: r["progress/round"]):
        cumulative += r["time/round_s"]
        elapsed[r["progress/round"]] = cumulative
    points = [
        (
            samples.get(e["progress/round"], e["progress/round"] * per_round if isinstance(per_round, int) else None),
            elapsed.get(e["progress/round"]),
            e["eval/accuracy"],
        )
        for e in evals
    ]
    algorithm = cfg.get("algorithm", {})
    return {
        "run": run,
        "method": method,
        "config": method,
        "seed": seed,
        "H": algorithm.get("H"),
        "algorithm": algorithm.get("name"),
        "train": train,
        "evals": [p for p in points if p[0] is not None and p[1] is not None],
    }


def by_method(runs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in runs:
        out.setdefault(r["method"], []).append(r)

    def order(item):  # numeric H first, ascending; then H = auto and methods without an H, by name
        h = item[1][0]["H"]
        return (not isinstance(h, (int, float)), h if isinstance(h, (int, float)) else 0, item[0])

    return dict(sorted(out.items(), key=order))


def spread(columns: list[list[float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Mean, min and max over seeds of equally long series (truncated to the shortest)."""
    n = min(len(c) for c in columns)
    a = np.array([c[:n] for c in columns], dtype=float)
    return a.mean(0), a.min(0), a.max(0)


def accuracy_curves(runs: list[dict]) -> dict[str, dict[str, np.ndarray]]:
    """Per method: samples, mean time, and mean / min / max accuracy at each evaluation."""
    out = {}
    for method, members in by_method(runs).items():
        members = [m for m in members if m["evals"]]
        if not members:
            continue
        samples = [[p[0] for p in m["evals"]] for m in members]
        mean, lo, hi = spread([[p[2] for p in m["evals"]] for m in members])
        out[method] = {
            "samples": spread(samples)[0],
            "time_s": spread([[p[1] for p in m["evals"]] for m in members])[0],
            "mean": mean,
            "min": lo,
            "max": hi,
            "seeds": len(members),
        }
    return out


def accuracy_table(curves: dict[str, dict[str, np.ndarray]]) -> str:
    """The points of accuracy.png as a markdown table: per method and evaluation, the training samples,
    the mean training-loop time and the accuracy's mean and min-max over seeds."""
    lines = [
        "| method | seeds | samples | training-loop time (s) | held-out accuracy: mean (min-max) |",
        "|---|---:|---:|---:|---|",
    ]
    for method, c in curves.items():
        for i in range(len(c["mean"])):
            lines.append(
                f"| {method} | {c['seeds']} | {c['samples'][i]:.0f} | {c['time_s'][i]:.0f} | "
                f"{c['mean'][i]:.3f} ({c['min'][i]:.3f}-{c['max'][i]:.3f}) |"
            )
    return "\n".join(lines) + "\n"


def per_round_curves(runs: list[dict], key: str) -> dict[str, dict[str, np.ndarray]]:
    """Per method: samples and mean / min / max of `key` per round."""
    out = {}
    for method, members in by_method(runs).items():
        members = [m for m in members if m["train"] and all(key in r for r in m["train"])]
        if not members:
            continue
        mean, lo, hi = spread([[r[key] for r in m["train"]] for m in members])
        out[method] = {
            "samples": spread([[r.get("progress/samples", r["progress/round"]) for r in m["train"]] for m in members])[
                0
            ],
            "mean": mean,
            "min": lo,
            "max": hi,
        }
    return out


def versus_h(runs: list[dict], keys: tuple[str, ...]) -> dict[str, dict[str, dict[int, tuple[float, float, float]]]]:
    """{key: {algorithm: {H: (mean, min, max) over seeds of the run means of key}}} over runs with an H
    (PG is RAPID's H = 1 point; GRPO at its own H is another line)."""
    out: dict[str, dict[str, dict[int, tuple[float, float, float]]]] = {}
    for key in keys:
        per: dict[str, dict[int, list[float]]] = {}
        for r in runs:
            values = [row[key] for row in r["train"] if key in row]
            if isinstance(r["H"], int) and values:
                name = "rapid" if r["algorithm"] in ("rapid", "pg") else str(r["algorithm"])
                per.setdefault(name, {}).setdefault(r["H"], []).append(float(np.mean(values)))
        out[key] = {
            name: {h: (float(np.mean(v)), min(v), max(v)) for h, v in sorted(points.items())}
            for name, points in sorted(per.items())
        }
    return out


def token_log_weights(run: Path) -> tuple[int, list[dict]] | None:
    """The last round of rollouts.jsonl with per-token log π and log μ: (round, records with `log_w`)."""
    path = run / "rollouts.jsonl"
    if not path.exists():
        return None
    dumped = [r for r in map(json.loads, path.read_text().splitlines()) if "logp_pi" in r]
    if not dumped:
        return None
    last = max(r["round"] for r in dumped)
    records = [r for r in dumped if r["round"] == last]
    for r in records:
        r["log_w"] = [p - q for p, q in zip(r["logp_pi"], r["logp_mu"])]
    return last, records


# ----------------------------------------------------------------------------- drawing


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def band(ax, x, curve, label, color):
    ax.plot(x, curve["mean"], marker="o", ms=3, color=color, label=label)
    ax.fill_between(x, curve["min"], curve["max"], color=color, alpha=0.2, linewidth=0)


def draw_accuracy(curves, colors: dict[str, str], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for method, c in curves.items():
        band(axes[0], c["samples"], c, method, colors[method])
        band(axes[1], c["time_s"], c, method, colors[method])
    axes[0].set_xlabel("training samples")
    axes[1].set_xlabel("training-loop wall time (s)")
    for ax in axes:
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("held-out accuracy (mean over seeds, band: min-max)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_power(summary: dict, h_pg: int, h_rapid: int, path: Path) -> None:
    """tools/stats.py --power's figure: held-out accuracy against training-loop wall time and against samples,
    each method's mean over the paired seeds with its 95% bootstrap band, the target (PG's final accuracy)
    and where each mean curve reaches it."""
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for h, color in ((h_pg, "tab:blue"), (h_rapid, "tab:orange")):
        c, label = summary[h]["curve"], f"{summary['methods'][h]} ({summary['n']} seeds)"
        lo, hi = (np.array([ci[k] for ci in c["ci"]]) for k in (0, 1))
        for ax, x in ((axes[0], c["wall_s"]), (axes[1], c["samples"])):
            ax.plot(x, c["mean"], marker="o", ms=3, color=color, label=label)
            ax.fill_between(x, lo, hi, color=color, alpha=0.2, linewidth=0)
        if math.isfinite(summary[h]["tta"]):
            axes[0].axvline(summary[h]["tta"], color=color, ls=":", lw=1)
    for ax in axes:
        ax.axhline(summary["target"], color="gray", ls="--", lw=1, label="PG's final accuracy")
        ax.set_ylabel("held-out accuracy")
        ax.grid(alpha=0.3)
    axes[0].set_xlabel("training-loop wall time (s; dotted: time to PG's final accuracy)")
    axes[1].set_xlabel("training samples")
    axes[0].legend(fontsize=7)
    fig.suptitle("held-out accuracy (mean over seeds, band: 95% bootstrap interval over seeds)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_versus_h(data, path: Path) -> None:
    plt = _plt()
    titles = {"train/completion_len": "completion length (tokens)", "time/generate_s": "generation time per round (s)"}
    fig, axes = plt.subplots(1, len(data), figsize=(5 * len(data), 3.8))
    for ax, (key, lines) in zip(np.atleast_1d(axes), data.items()):
        all_h = sorted({h for points in lines.values() for h in points})
        for name, points in lines.items():
            hs = list(points)
            mean = np.array([points[h][0] for h in hs])
            err = np.array([[points[h][0] - points[h][1] for h in hs], [points[h][2] - points[h][0] for h in hs]])
            ax.errorbar(hs, mean, yerr=err, marker="o", capsize=3, label=name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_h, [str(h) for h in all_h])
        ax.legend(fontsize=7)
        ax.set_xlabel("H (minibatch steps per round)")
        ax.set_title(titles.get(key, key))
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_token_log_w(run: Path, round_: int, records: list[dict], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for i, r in enumerate(records):
        label = f"sample {i} (R = {r['reward']:g}, log w = {sum(r['log_w']):+.3f})"
        axes[0].plot(range(len(r["log_w"])), r["log_w"], marker=".", color=f"C{i % 10}", label=label)
        axes[1].plot(range(len(r["log_w"])), np.cumsum(r["log_w"]), color=f"C{i % 10}")
    axes[0].axhline(0, color="k", lw=0.5)
    axes[0].set_ylabel("log π_θ(y_t) − log μ(y_t)")
    axes[1].set_ylabel("cumulative: log w of the prefix")
    for ax in axes:
        ax.set_xlabel("completion token t")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"token-level log importance weight after round {round_}'s updates ({run.name})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def draw_clip_staleness(clip, stale, colors: dict[str, str], path: Path) -> None:
    plt = _plt()
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, curves, title in (
        (axes[0], clip, "clip fraction per round (RAPID: w > eta; GRPO: token ratio)"),
        (axes[1], stale, "staleness mean |log w̄| per round"),
    ):
        for method, c in curves.items():
            band(ax, c["samples"], c, method, colors[method])
        ax.set_xlabel("training samples")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "paths", nargs="+", type=Path, help="multirun folders, bench_rl output folders or run directories"
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--token-run", type=Path, help="the run whose rollouts.jsonl gives the token-level figure")
    args = parser.parse_args(argv)
    runs = [load(r) for r in find_runs(args.paths)]
    if not runs:
        raise SystemExit(
            f"no run directories (with metrics.jsonl or summary.json) under {' '.join(map(str, args.paths))}"
        )
    drop_common_overrides(runs)
    for r in runs:
        r["method"] = r["config"]
    args.out.mkdir(parents=True, exist_ok=True)
    written = []

    def done(name: str) -> None:
        written.append(args.out / name)
        print(f"wrote {args.out / name}")

    colors = {m: f"C{i % 10}" for i, m in enumerate(by_method(runs))}  # one colour per method in every figure
    curves = accuracy_curves(runs)
    if curves:
        draw_accuracy(curves, colors, args.out / "accuracy.png")
        done("accuracy.png")
        (args.out / "accuracy.md").write_text(accuracy_table(curves))
        done("accuracy.md")
    h_data = versus_h(runs, ("train/completion_len", "time/generate_s"))
    if all(h_data.values()):
        draw_versus_h(h_data, args.out / "length_time_vs_h.png")
        done("length_time_vs_h.png")
    else:
        print("length_time_vs_h.png: no run with algorithm.H and per-round completion length / generation time")
    candidates = [args.token_run] if args.token_run else [r["run"] for r in runs]
    token = next(((run, found) for run in candidates if (found := token_log_weights(run))), None)
    if token:
        draw_token_log_w(token[0], *token[1], args.out / "token_log_w.png")
        done("token_log_w.png")
    else:
        print("token_log_w.png: no rollouts.jsonl with per-token log π (run with logger.rollouts=true)")
    clip, stale = per_round_curves(runs, "iw/clip_frac"), per_round_curves(runs, "iw/staleness")
    if clip and stale:
        draw_clip_staleness(clip, stale, colors, args.out / "clip_staleness.png")
        done("clip_staleness.png")
    else:
        print("clip_staleness.png: no run logs iw/clip_frac and iw/staleness")
    return written


if __name__ == "__main__":
    main(sys.argv[1:])
