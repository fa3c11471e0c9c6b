"""Metrics: one JSON object per line in <run_dir>/metrics.jsonl, and wandb when asked for.

Keys are namespaced (`train/`, `iw/`, `eval/`, `time/`, `sampler/`) with units in the name.
With `logger.rollouts=true` every round's samples go to <run_dir>/rollouts.jsonl as well
(prompt index, completion token ids and text, reward), and for the round's first group the per-token
log μ (`logp_mu`) and log π_θ after the round's updates (`logp_pi`); every evaluation's per-problem
greedy verdicts go to <run_dir>/eval_outcomes.jsonl. Only rank 0 writes. The W&B run id is kept in
<run_dir>/wandb_id, so that a resumed run logs into the same W&B run. On resume, rows after
the checkpoint's round are dropped first, so the files read as if the run had never stopped.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path


def git_commit() -> str | None:
    """The commit of the code that ran (recorded in every run's meta.json)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def write_run_files(run_dir: Path, cfg, device, meta_name: str = "meta.json", **extra) -> None:
    """<run_dir>/config.yaml (the resolved config) and <run_dir>/<meta_name>: the commit, command line,
    device, torch version and CPU of the run, and `extra`."""
    import torch
    from omegaconf import OmegaConf

    from rapid.profiling import cpu_description

    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    meta = {
        "git_commit": git_commit(),
        "argv": sys.argv,
        "device": str(device),
        "torch": torch.__version__,
        "cpu": cpu_description(),
        **extra,
    }
    (run_dir / meta_name).write_text(json.dumps(meta, indent=2))


SUMMARY_KEYS = (  # (label, dotted key) of the console's one-line summary of a run's config
    ("algorithm", "algorithm.name"),
    ("H", "algorithm.H"),
    ("n_step", "algorithm.n_step"),
    ("n_group", "algorithm.n_group"),
    ("task", "task.name"),
    ("model", "model.name"),
    ("samples", "samples"),
    ("rounds", "rounds"),
    ("seed", "seed"),
)


def config_summary(cfg, run_dir: Path) -> str:
    """The run's config in one console line (the whole resolved config is <run_dir>/config.yaml):
    algorithm, H, n_step, n_group, task, model, samples (and rounds where fixed), seed."""
    from omegaconf import OmegaConf

    parts = []
    for label, key in SUMMARY_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if value is not None:
            parts.append(f"{label}={value}")
    return " ".join(parts) + f" (the full config: {Path(run_dir) / 'config.yaml'})"


def run_dir_line(run_dir: Path, finished: bool = False) -> str:
    """Where a run writes, for the console at its start and its end."""
    if finished:
        return f"run directory: {run_dir} (config.yaml, metrics.jsonl, summary.json)"
    return f"run directory: {run_dir}"


def read_rows(path: Path) -> list[dict]:
    """The JSON rows of a .jsonl file; a line cut short (a run killed while writing it) is dropped."""
    rows = []
    for line in Path(path).read_text(errors="replace").splitlines():
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            print(f"{path}: dropping a damaged line ({line[:40]!r}...)", flush=True)
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


class MetricsLogger:
    def __init__(
        self,
        run_dir: Path,
        enabled: bool = True,
        wandb_cfg: dict | None = None,
        config: dict | None = None,
        resume_round: int | None = None,
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled, self.wandb = enabled, None
        if not enabled:
            return
        for path in (self.path, self.path.parent / "rollouts.jsonl", self.path.parent / "eval_outcomes.jsonl"):
            if resume_round is not None and path.exists():
                rows = read_rows(path)
                kept = [r for r in rows if r.get("round", 0) <= resume_round]
                path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        if wandb_cfg and wandb_cfg.get("enabled"):
            import wandb  # optional dependency (`pip install rapid[wandb]`); WANDB_MODE=offline works

            # the run's W&B id lives in the run directory, so that a resumed run continues the same W&B run
            id_file = Path(run_dir) / "wandb_id"
            if not id_file.exists():
                id_file.write_text(uuid.uuid4().hex[:12] + "\n")
            self.wandb = wandb.init(
                project=wandb_cfg.get("project"),
                name=wandb_cfg.get("name"),
                dir=str(run_dir),
                config=config,
                id=id_file.read_text().strip(),
                resume="allow",
            )

    def rows(self) -> list[dict]:
        return read_rows(self.path) if self.path.exists() else []

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if k != "round"}, step=row.get("round"))

    def log_rollouts(self, round_: int, rollouts: list, logp_pi: list[list[float]] | None = None) -> None:
        """This rank's samples of a round, one JSON object a line, in <run_dir>/rollouts.jsonl (on every rank
        that logs: the records of a multi-GPU run are rank 0's share). `logp_pi`: per-token log π_θ of the
        first len(logp_pi) records, written beside their per-token log μ."""
        if not self.enabled:
            return
        logp_pi = logp_pi or []
        with (self.path.parent / "rollouts.jsonl").open("a") as f:
            for i, r in enumerate(rollouts):
                row = {
                    "round": round_,
                    "group": r.group_id,
                    "prompt_index": r.prompt_index,
                    "completion_ids": r.completion_ids,
                    "text": r.text,
                    "reward": r.reward,
                    "truncated": r.truncated,
                }
                if i < len(logp_pi):
                    row |= {"logp_mu": list(r.logp_mu), "logp_pi": logp_pi[i]}
                f.write(json.dumps(row) + "\n")

    def log_eval_outcomes(self, round_: int, correct: list[int]) -> None:
        """One evaluation's verdicts (1 or 0 per held-out problem, in eval order)."""
        if not self.enabled:
            return
        with (self.path.parent / "eval_outcomes.jsonl").open("a") as f:
            f.write(json.dumps({"round": round_, "correct": correct}) + "\n")

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
