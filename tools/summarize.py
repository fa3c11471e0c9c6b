"""Tabulate finished runs: one row per run directory, from its config.yaml and summary.json.

python tools/summarize.py multirun/2026-11-21_10-00-00/*          # a sweep
python tools/summarize.py outputs/* --keys algorithm.H seed --csv out.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

METRICS = ("eval/accuracy_before", "eval/accuracy_after", "time/total_s", "samples")


def rows(run_dirs: list[Path], keys: list[str]) -> list[dict]:
    out = []
    for d in run_dirs:
        if not (d / "summary.json").exists():
            continue
        cfg = OmegaConf.load(d / "config.yaml")
        summary = json.loads((d / "summary.json").read_text())
        out.append(
            {"run": d.name, **{k: OmegaConf.select(cfg, k) for k in keys}, **{m: summary.get(m) for m in METRICS}}
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--keys", nargs="*", default=["algorithm.name", "algorithm.H", "seed"])
    parser.add_argument("--csv", type=Path)
    args = parser.parse_args()
    table = rows(args.runs, args.keys)
    if not table:
        sys.exit("no finished runs (directories with summary.json) among the given paths")
    cols = list(table[0])
    fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)
    print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
    for r in table:
        print("| " + " | ".join(fmt(r[c]) for c in cols) + " |")
    if args.csv:
        with args.csv.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=cols)
            writer.writeheader()
            writer.writerows(table)


if __name__ == "__main__":
    main()
