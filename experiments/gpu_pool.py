"""Run a Hydra multirun of `rapid.train` as independent runs, one per GPU, N at a time.

    python experiments/gpu_pool.py --gpus 0,1,2,3 -- +experiment=mbpp_h8 algorithm=rapid,pg seed=0,1,2 \
        hydra.sweep.dir=multirun/table1/mbpp_h8

takes the overrides of `python -m rapid.train -m ...`, expands them into runs as Hydra's basic sweeper
does, and runs each as `python -m rapid.train <its overrides>` in <sweep.dir>/<its override_dirname>
(the directory the multirun would have given it, so tools/stats.py reads the result the same way), with
CUDA_VISIBLE_DEVICES set to one GPU of `--gpus`. A GPU starts the next run when its run ends. A run
whose directory already holds summary.json is not run again, so that a stopped table continues where
it stopped. Each run's console output goes to <sweep.dir>/<override_dirname>.log. Exits non-zero if
any run failed, naming them, after the others have finished.

`--dry-run` prints one line per run (GPU, directory, command) and runs nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

from hydra._internal.config_loader_impl import get_overrides_dirname
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "conf"


def expand(overrides: list[str]) -> list[list[str]]:
    """Every run of a multirun's (non-hydra) overrides, in the order Hydra's basic sweeper runs them."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [run for batch in BasicSweeper.split_arguments(parsed, None) for run in batch]


def override_dirname(run: list[str], exclude: list[str]) -> str:
    """hydra.job.override_dirname of a run, by Hydra's own function ('=' and ',' as conf/base.yaml keeps them)."""
    return get_overrides_dirname(OverridesParser.create().parse_overrides(run), exclude, item_sep=",", kv_sep="=")


def excluded_keys() -> list[str]:
    """conf/base.yaml's hydra.job.config.override_dirname.exclude_keys: left out of a run's directory name."""
    return list(OmegaConf.load(CONF / "base.yaml").hydra.job.config.override_dirname.exclude_keys)


def quoted(path: Path) -> str:
    """A path as a quoted override value: a run directory holds '=' and ',' (Hydra's override grammar)."""
    return "'" + str(path).replace("\\", "\\\\").replace("'", "\\'") + "'"


def jobs(overrides: list[str], exclude: list[str]) -> tuple[Path, list[tuple[list[str], Path]]]:
    """(sweep directory, [(a run's overrides, its directory)]) of a `rapid.train -m` command line."""
    hydra_args = [o for o in overrides if o.startswith("hydra.")]
    sweep_dir = next((o.split("=", 1)[1] for o in hydra_args if o.startswith("hydra.sweep.dir=")), None)
    if sweep_dir is None:
        sweep_dir = f"multirun/{time.strftime('%Y-%m-%d_%H-%M-%S')}"
    passed = [o for o in hydra_args if not o.startswith(("hydra.sweep.", "hydra.run.dir="))]
    runs = expand([o for o in overrides if not o.startswith("hydra.")])
    return Path(sweep_dir), [([*run, *passed], Path(sweep_dir) / override_dirname(run, exclude)) for run in runs]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gpus", required=True, help="comma-separated GPU ids, one run on each at a time: 0,1,2,3")
    parser.add_argument("--dry-run", action="store_true", help="print the runs and their GPUs, run nothing")
    parser.add_argument("overrides", nargs="*", help="the overrides of `python -m rapid.train -m`")
    args = parser.parse_args(argv)
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    if not gpus:
        parser.error(f"--gpus={args.gpus!r} names no GPU: give comma-separated ids such as 0,1,2,3")
    sweep_dir, todo = jobs(args.overrides, excluded_keys())
    done = [d for _, d in todo if (d / "summary.json").exists()]
    todo = [(run, d) for run, d in todo if d not in done]
    print(f"{len(todo)} runs on GPUs {','.join(gpus)} into {sweep_dir} ({len(done)} already finished)", flush=True)
    if args.dry_run:
        for i, (run, d) in enumerate(todo):
            print(f"gpu {gpus[i % len(gpus)]}\t{d}\t{' '.join(run)}")
        return 0
    sweep_dir.mkdir(parents=True, exist_ok=True)
    free, running, failed = list(gpus), {}, []
    queue = list(todo)
    while queue or running:
        while queue and free:
            run, d = queue.pop(0)
            gpu = free.pop(0)
            log = open(f"{d}.log", "w")
            proc = subprocess.Popen(
                [sys.executable, "-m", "rapid.train", *run, f"hydra.run.dir={quoted(d)}"],
                env={**os.environ, "CUDA_VISIBLE_DEVICES": gpu},
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            running[proc] = (gpu, d, log)
            print(f"gpu {gpu}: {d}", flush=True)
        time.sleep(1)
        for proc in [p for p in running if p.poll() is not None]:
            gpu, d, log = running.pop(proc)
            log.close()
            free.append(gpu)
            if proc.returncode != 0:
                failed.append(d)
            print(f"gpu {gpu}: {d} {'done' if proc.returncode == 0 else f'FAILED ({proc.returncode})'}", flush=True)
    if failed:
        print(f"{len(failed)} runs failed (see their .log): {' '.join(map(str, failed))}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
