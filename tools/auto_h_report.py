"""H = auto against fixed H at equal samples: the verdict and a figure of the H chosen over training,
from a finished `tools/bench_rl.py` comparison.

    python tools/bench_rl.py --h 1 2 4 8 16 auto --seeds 0 1 2 --no-grpo --no-trl --no-floors --out <dir>
    python tools/auto_h_report.py <dir>          # writes <dir>/auto_h.md and <dir>/auto_h.png

Per method, over seeds: mean held-out accuracy with its 95% confidence interval (Student t, n − 1
degrees of freedom) and mean wall seconds per 1,000 samples (the training loop, as bench_rl reports).
The target: H = auto's mean accuracy lies within the confidence interval of the best fixed H (highest
mean), and its wall time is at most 10% above that of the fastest fixed H whose mean accuracy also
lies within that interval. The figure shows, per seed of the auto runs, the H of every round and the
drift ESS of its last step (`algorithm/H`, `algorithm/ess_last` in metrics.jsonl) against samples.
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from pathlib import Path

from omegaconf import OmegaConf

if __package__ in (None, ""):  # run as a script: the repository root, for `tools.*`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from rapid.logger import read_metrics  # noqa: E402
from tools.stats import t_half_width  # noqa: E402

WALL_SLACK = 0.10  # H = auto may take this much more wall time than the fastest fixed H of equal accuracy


def summarize(rows: list[dict]) -> list[dict]:
    """One entry per method: seeds, accuracy mean and 95% half-width, mean s / 1k samples, mean rounds."""
    out = []
    for name in dict.fromkeys(r["method"] for r in rows):
        group = [r for r in rows if r["method"] == name]
        acc = [float(r["accuracy_after"]) for r in group]
        out.append(
            {
                "method": name,
                "seeds": len(group),
                "accuracy": statistics.mean(acc),
                "ci": t_half_width(acc),
                "s_per_1k": statistics.mean(float(r["s_per_1k"]) for r in group),
                "rounds": statistics.mean(float(r["rounds"]) for r in group)
                if all(r.get("rounds") for r in group)
                else None,
                "unused": statistics.mean(float(r.get("unused_samples") or 0) for r in group),
            }
        )
    return out


def verdict(table: list[dict]) -> dict:
    """The target's arithmetic (see the module docstring)."""
    # fixed H: PG (H = 1) and RAPID at each H; other methods in the folder (GRPO, TRL) are not candidates
    fixed = [
        m
        for m in table
        if m["method"] == "PG" or (m["method"].startswith("RAPID H=") and m["method"] != "RAPID H=auto")
    ]
    auto = next(m for m in table if m["method"] == "RAPID H=auto")
    best = max(fixed, key=lambda m: m["accuracy"])
    low = best["accuracy"] - best["ci"]
    fastest = min((m for m in fixed if m["accuracy"] >= low), key=lambda m: m["s_per_1k"])
    return {
        "best": best["method"],
        "best_accuracy": best["accuracy"],
        "best_ci": best["ci"],
        "fastest": fastest["method"],
        "fastest_s_per_1k": fastest["s_per_1k"],
        "auto_accuracy": auto["accuracy"],
        "auto_s_per_1k": auto["s_per_1k"],
        "accuracy_ok": auto["accuracy"] >= low,
        "wall_ratio": auto["s_per_1k"] / fastest["s_per_1k"],
        "wall_ok": auto["s_per_1k"] <= (1 + WALL_SLACK) * fastest["s_per_1k"],
    }


def plot(run_dirs: list[Path], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no figure", file=sys.stderr)
        return False
    fig, (ax_h, ax_e) = plt.subplots(2, 1, figsize=(7, 5.5), sharex=True)
    for d in run_dirs:
        rows = [r for r in read_metrics(d / "metrics.jsonl") if "algorithm/H" in r]  # any metric names
        n_step = OmegaConf.load(d / "config.yaml").algorithm.n_step
        start = [r["progress/samples"] - r["algorithm/H"] * n_step for r in rows]  # samples before the round
        label = d.name.rsplit("_", 1)[-1]
        ax_h.step(
            start + [rows[-1]["progress/samples"]],
            [r["algorithm/H"] for r in rows] + [rows[-1]["algorithm/H"]],
            where="post",
            label=label,
        )
        ax_e.plot(
            [r["progress/samples"] for r in rows], [r["algorithm/ess_last"] for r in rows], marker=".", label=label
        )
    ax_h.set_ylabel("H of the round")
    ax_h.set_yscale("log", base=2)
    ax_h.legend(title="seed")
    ax_e.set_ylabel("drift ESS, last step")
    ax_e.set_xlabel("samples generated")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", type=Path, help="a tools/bench_rl.py --out directory with fixed-H and H=auto runs")
    args = p.parse_args()
    rows = list(csv.DictReader((args.out / "runs.csv").open()))
    if not any(r["method"] == "RAPID H=auto" for r in rows):
        sys.exit(f"{args.out / 'runs.csv'} has no RAPID H=auto runs: run tools/bench_rl.py with --h ... auto")
    table = summarize(rows)
    v = verdict(table)
    lines = [
        f"# H = auto against fixed H ({args.out.name})",
        "",
        "Mean over seeds; accuracy ± the 95% confidence interval's half-width; wall seconds per 1,000 samples "
        "of the training loop; mean rounds and unused samples (early stops) per run.",
        "",
        "| method | seeds | accuracy | s / 1k samples | rounds | unused samples |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for m in table:
        rounds = "—" if m["rounds"] is None else f"{m['rounds']:.1f}"
        lines.append(
            f"| {m['method']} | {m['seeds']} | {m['accuracy']:.3f} ± {m['ci']:.3f} | {m['s_per_1k']:.1f} | "
            f"{rounds} | {m['unused']:.0f} |"
        )
    lines += [
        "",
        f"Best fixed H: {v['best']} ({v['best_accuracy']:.3f} ± {v['best_ci']:.3f}); the fastest fixed H "
        f"within its interval: {v['fastest']} ({v['fastest_s_per_1k']:.1f} s / 1k samples).",
        f"H = auto: accuracy {v['auto_accuracy']:.3f} ({'within' if v['accuracy_ok'] else 'outside'} the best's "
        f"interval), wall time {v['wall_ratio']:.2f}x the fastest ({'within' if v['wall_ok'] else 'above'} "
        f"the {1 + WALL_SLACK:.2f}x target).",
    ]
    auto_dirs = sorted((args.out / "runs").glob("rapid_hauto_s*/"))
    if auto_dirs and plot(auto_dirs, args.out / "auto_h.png"):
        lines += ["", "![H chosen per round](auto_h.png)"]
    (args.out / "auto_h.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
