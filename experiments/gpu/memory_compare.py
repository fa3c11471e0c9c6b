"""Measured peak memory per phase of one rapid run (its metrics.jsonl, `mem/*`, rapid/profiling.py) beside
tools/memory_estimate.py's estimate for the same run (its config.yaml, the measured prompt length, the
GPU's memory): the GPU check's memory section.

    python experiments/gpu/memory_compare.py <run dir> > memory.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
from tools.memory_estimate import ARCHITECTURES, GiB, Run, estimate  # noqa: E402

PHASES = ("generate", "reward", "recompute", "sync", "train")


def architecture(name: str):
    """tools/memory_estimate.py's architecture of a model name (a `-random` model has its original's shape)."""
    base = name.removesuffix("-random")
    return ARCHITECTURES.get(name) or next((a for k, a in ARCHITECTURES.items() if k.startswith(base + "-")), None)


def measured_table(row: dict) -> list[str]:
    lines = [
        "| phase | torch allocated peak (MiB) | torch reserved peak (MiB) | device in use at phase end (MiB) | host RSS peak (MiB) |",
        "|---|---:|---:|---:|---:|",
    ]
    for phase in PHASES:
        keys = ("cuda_alloc_mib", "cuda_reserved_mib", "cuda_device_used_mib", "rss_mib")
        if not any(f"mem/{phase}_{k}" in row for k in keys):
            continue
        cells = [f"{row[f'mem/{phase}_{k}']:.0f}" if f"mem/{phase}_{k}" in row else "–" for k in keys]
        lines.append(f"| {phase} | " + " | ".join(cells) + " |")
    return lines


def compare(run_dir: Path) -> str:
    from omegaconf import OmegaConf

    cfg = OmegaConf.load(run_dir / "config.yaml")
    meta = json.loads((run_dir / "meta.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    row = next((r for r in rows if "time/train_s" in r), None)
    if row is None:
        return f"{run_dir.name}: no training round in metrics.jsonl (see the run's log)\n"
    lines = [
        f"# Peak memory per phase: {cfg.model.name}, {cfg.task.max_new_tokens}-token completions, "
        f"micro-batch {cfg.train.micro_batch}, engine {'asleep' if cfg.sampler.get('sleep_during_train') else 'awake'} "
        f"while training ({meta.get('gpu') or meta.get('device')})",
        "",
        *measured_table(row),
    ]
    gpu_mib = row.get("mem/total_cuda_mib")
    arch = architecture(cfg.model.name)
    if arch is None:
        lines += ["", f"No estimate: tools/memory_estimate.py has no architecture named {cfg.model.name}."]
        return "\n".join(lines) + "\n"
    try:
        import torch

        gpu_bytes = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else 80 * GiB
    except Exception:  # the estimate is a label only here
        gpu_bytes = gpu_mib * 2**20 if gpu_mib else 80 * GiB
    run = Run(
        name=run_dir.name,
        arch=arch,
        micro_batch=cfg.train.micro_batch,
        prompt_len=round(row.get("train/prompt_len", 0)),
        completion_len=cfg.task.max_new_tokens,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        sleep_during_train=bool(cfg.sampler.get("sleep_during_train")),
        gpu_memory_utilization=cfg.sampler.get("gpu_memory_utilization", 0.0),
    )
    e = estimate(run, gpu_bytes)
    mib = 2**20
    measured_train = row.get("mem/train_cuda_reserved_mib")
    lines += [
        "",
        f"tools/memory_estimate.py for the same run ({gpu_bytes / GiB:.0f} GiB GPU, prompts of {run.prompt_len} tokens): "
        f"training peak {e['training_peak'] / mib:.0f} MiB (states {e['states'] / mib:.0f}, activations "
        f"{e['activations'] / mib:.0f}, logits {e['logits'] / mib:.0f}, context {e['context'] / mib:.0f}), generation "
        f"peak {e['generation_peak'] / mib:.0f} MiB (engine {e['engine'] / mib:.0f}).",
    ]
    if measured_train:
        lines.append(
            f"Measured training peak (torch reserved): {measured_train:.0f} MiB, "
            f"{measured_train / (e['training_peak'] / mib):.2f}x the estimate."
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(compare(Path(sys.argv[1])), end="")
