"""Metrics: one JSON object per line in <run_dir>/metrics.jsonl, and wandb when asked for.

Keys are namespaced (`progress/`, `train/`, `iw/`, `loss/`, `eval/`, `time/`, `sampler/`) with units in the name.
Every row says where the run is: `progress/round` (rounds done) and `progress/samples` (samples generated),
training rows also `progress/epoch` and `time/wall_s`; W&B plots against `progress/samples`, so runs with
different H line up. `iw/clip_frac` is the fraction of sequence importance weights above η (RAPID's
truncation, the masked fraction of rapid_mask), `loss/clip_frac` the fraction of ratios PPO-style clipping
cut off (GRPO, DAPO, Dr. GRPO: tokens; GSPO: sequences; CISPO: tokens whose weight is capped).
Rows written under the earlier names (`round`, `samples`, `epoch`, `wall_s`, and `iw/clip_frac` for the
ratio clip) read back under today's (`read_metrics`).
With `logger.rollouts=true` every round's samples go to <run_dir>/rollouts.jsonl as well
(prompt index, completion token ids and text, reward), and for the round's first group the per-token
log μ (`logp_mu`) and log π_θ after the round's updates (`logp_pi`); every evaluation's per-problem
greedy verdicts go to <run_dir>/eval_outcomes.jsonl. Only rank 0 writes. The W&B run id is kept in
<run_dir>/wandb_id, so that a resumed run logs into the same W&B run. On resume, rows after
the checkpoint's round are dropped first, so the files read as if the run had never stopped.

`round_row` builds a training round's row (sums over ranks, then means; times and memory are rank 0's),
`summarize` the run's summary.json from the rows.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import uuid
from pathlib import Path
from statistics import mean


def git_commit() -> str | None:
    """The commit of the code that ran (recorded in every run's meta.json)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True, cwd=Path(__file__).parent
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def portable_argv(argv: list[str]) -> list[str]:
    """The command line with its script named relative to the repository (rapid/train.py), so that a run's
    meta.json does not carry the path of the machine it ran on."""
    if not argv:
        return list(argv)
    script = Path(argv[0])
    root = Path(__file__).resolve().parent.parent
    if script.is_absolute() and script.resolve().is_relative_to(root):
        script = script.resolve().relative_to(root)
    return [str(script), *argv[1:]]


def write_run_files(run_dir: Path, cfg, device, meta_name: str = "meta.json", **extra) -> None:
    """<run_dir>/config.yaml (the resolved config) and <run_dir>/<meta_name>: the commit, command line,
    device, torch version and CPU of the run, how busy the machine was at its start (`calibration`:
    rapid.profiling.calibrate), and `extra`."""
    import torch
    from omegaconf import OmegaConf

    from rapid.profiling import calibrate, cpu_description

    run_dir.mkdir(parents=True, exist_ok=True)
    OmegaConf.save(cfg, run_dir / "config.yaml", resolve=True)
    meta = {
        "git_commit": git_commit(),
        "argv": portable_argv(sys.argv),
        "device": str(device),
        "torch": torch.__version__,
        "cpu": cpu_description(),
        "calibration": calibrate(),
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
        return f"run directory: {run_dir} (config.yaml, metrics.jsonl, summary.json, the trained model in model/)"
    return f"run directory: {run_dir}"


RENAMED = {  # earlier name -> today's
    "round": "progress/round",
    "samples": "progress/samples",
    "epoch": "progress/epoch",
    "step": "progress/step",
    "wall_s": "time/wall_s",
}


def current_names(row: dict) -> dict:
    """A metrics row under today's names (module docstring), whichever names it was written with. Before the
    two clip fractions had two names, a ratio-clipping loss logged its `clip_frac` as `iw/clip_frac`; such a
    row has no `iw/staleness`, which the importance-weighted losses log beside theirs."""
    out = {RENAMED.get(k, k): v for k, v in row.items()}
    if "iw/clip_frac" in out and "iw/staleness" not in out and "loss/clip_frac" not in out:
        out["loss/clip_frac"] = out.pop("iw/clip_frac")
    return out


PHASES = ("generate", "reward", "recompute", "train", "sync")  # a round's timed phases (+ other)
STAT_NAMES = {  # a loss's statistic -> its logged name (the others: loss/<name>)
    "staleness": "iw/staleness",
    "log_w_mean": "iw/log_w_mean",
    "iw_mean": "iw/mean",
    "loss": "train/loss",
    "trained_frac": "train/trained_frac",
    "clipped_mass": "iw/clipped_mass",
    "correction_ratio_mean": "sampler/correction_ratio_mean",
    "correction_trunc_frac": "sampler/correction_trunc_frac",
}


def round_row(
    progress: dict[str, float],
    rollouts: list,
    steps: list[dict],
    *,
    phases: dict[str, float],
    round_s: float,
    world: int,
    device,
    failed: int = 0,
    mismatch: float | None = None,
    nonfinite_steps: int = 0,
    dropped: int | None = None,
    iw: bool = True,
    token_stats=lambda key: False,
) -> dict:
    """A training round's row of metrics.jsonl: where the run is (`progress`: `progress/round`,
    `progress/samples` generated, `progress/epoch`, `time/wall_s`), `round_metrics` of the round's
    `rollouts` and `steps`, the steps skipped as non-finite, `timing_metrics` (rank 0's `PhaseClock.row()`
    as `phases`) and, with DAPO's dynamic sampling, the groups it `dropped` (summed over ranks).
    `token_stats(name)`: whether a step statistic is a mean over tokens (rapid.policy.token_mean_stats)."""
    from rapid import distributed

    row = {
        **progress,
        **round_metrics(rollouts, steps, failed, mismatch, world, device, token_stats, iw),
        "train/nonfinite_steps": nonfinite_steps,
        **timing_metrics(phases, round_s, sum(len(r.completion_ids) for r in rollouts) * world),
    }
    if dropped is not None:
        row["train/dropped_groups"] = int(distributed.all_reduce_sum([dropped], device)[0])
    return row


def round_metrics(
    rollouts: list,
    steps: list[dict],
    failed: int,
    mismatch: float | None,
    world: int,
    device,
    token_stats=None,
    iw: bool = True,
) -> dict[str, float]:
    """A round's training metrics, over all ranks: reward and completion statistics per record, the
    loss's statistics averaged over the round's steps, and the sampler/trainer log-prob gap (the
    recompute's, else the first step's, where θ = μ). A statistic is averaged over the steps that
    report it: `loss` and `trained_frac` over every step, the others over the steps that ran records
    (a step whose every group has advantage 0 runs none, `rapid.policy.accumulate_gradients`), each
    step's weighted over ranks by the records it describes on each rank, or by their completion tokens
    where it is a mean over tokens (`token_stats`; `step_sums`). `iw`: the loss's statistics describe
    sequence importance weights (its `clip_frac` is `iw/clip_frac`, else `loss/clip_frac`)."""
    from rapid import distributed

    keys = dict.fromkeys(k for s in steps for k in s)
    loss_keys = [k for k in keys if k not in ("iw_max", "token_logp_gap", "grad_norm", "lr", "records", "tokens")]
    token_keys = {k for k in loss_keys if token_stats and token_stats(k)}
    gap = steps[0].get("token_logp_gap") if mismatch is None and steps else mismatch  # DAPO may end with no step
    sums = distributed.all_reduce_sum_dict(
        {
            "records": len(rollouts),
            "failures": failed,
            "reward": sum(r.reward for r in rollouts),
            "correct": sum(r.task_reward == 1.0 for r in rollouts),  # before DAPO's overlong penalty
            "tokens": sum(len(r.completion_ids) for r in rollouts),
            "truncated": sum(r.truncated for r in rollouts),
            **({"gap": gap} if gap is not None else {}),
            **step_sums(steps, loss_keys, token_keys),
        },
        device,
    )
    n = max(sums["records"], 1)
    row = {
        "train/reward_mean": sums["reward"] / n,
        "train/accuracy": sums["correct"] / n,
        "train/completion_len": sums["tokens"] / n,
        "train/truncated_frac": sums["truncated"] / n,
        "train/reward_failures": int(sums["failures"]),
        **({"sampler/logprob_mismatch": sums["gap"] / world} if "gap" in sums else {}),
        **{
            (STAT_NAMES | {"clip_frac": "iw/clip_frac" if iw else "loss/clip_frac"}).get(k, f"loss/{k}"): v
            for k in sorted(loss_keys)
            if (v := step_means(sums, len(steps), k, world, k in token_keys)) is not None
        },
        **({"train/grad_norm": steps[-1]["grad_norm"], "train/lr": steps[-1]["lr"]} if steps else {}),
    }
    if "iw_max" in keys:
        mine = max((s["iw_max"] for s in steps if "iw_max" in s and s.get("records", 1) > 0), default=-math.inf)
        if (iw_max := distributed.all_reduce_max(mine, device)) > -math.inf:  # a DDP placeholder's weights do not count
            row["iw/max"] = iw_max
    return row


PER_RANK = ("loss", "trained_frac")  # a rank's share of the minibatch's: their mean over ranks is the minibatch's


def step_sums(steps: list[dict], keys: list[str], token_keys: set[str] = frozenset()) -> dict[str, float]:
    """Each step's statistics, to be summed over ranks: `loss` and `trained_frac` as they are, the others
    weighted by the records they describe (`records`; 0 for a DDP placeholder group, whose weights must not
    count), or by those records' completion tokens for the means over tokens (`token_keys`), so that over
    ranks they average records (tokens), not ranks."""
    out = {}
    for j, s in enumerate(steps):
        n, t = s.get("records", 0), s.get("tokens", 0)
        out[f"{j}/records"], out[f"{j}/tokens"] = n, t
        out |= {f"{j}/{k}": s[k] if k in PER_RANK else s[k] * (t if k in token_keys else n) for k in keys if k in s}
    return out


def step_means(sums: dict[str, float], n_steps: int, key: str, world: int, tokens: bool = False) -> float | None:
    """The round's mean of `key` over the steps that report it (each step counts once), from `step_sums`
    summed over ranks (None: no step trained a record); `tokens`: the key is a mean over tokens."""
    weight = "tokens" if tokens else "records"
    values = [
        sums[f"{j}/{key}"] / world if key in PER_RANK else sums[f"{j}/{key}"] / sums[f"{j}/{weight}"]
        for j in range(n_steps)
        if f"{j}/{key}" in sums and (key in PER_RANK or sums[f"{j}/{weight}"] > 0)
    ]
    return mean(values) if values else None


def timing_metrics(phases: dict[str, float], round_s: float, tokens_all_ranks: int) -> dict[str, float]:
    """The round's phase times (rank 0's; PhaseClock's row, and memory), the rest as `other`, tokens/s."""
    phases = {f"time/{p}_s": 0.0 for p in PHASES} | phases
    return {
        **phases,
        "time/other_s": round_s - sum(phases[f"time/{p}_s"] for p in PHASES),
        "time/round_s": round_s,
        "sampler/tokens_per_s": tokens_all_ranks / max(phases["time/generate_s"], 1e-9),
    }


def progress_fields(row: dict, H: int) -> dict[str, str | int]:
    """The progress bar's fields after a round: reward, clipped fraction, staleness, H, seconds per round."""
    return {
        "reward": f"{row['train/reward_mean']:.3f}",
        "clip": f"{row.get('iw/clip_frac', row.get('loss/clip_frac', 0)):.2f}",
        "stale": f"{row.get('iw/staleness', 0):.3f}",
        "H": H,
        "s_round": f"{row['time/round_s']:.1f}",
    }


def summarize(rows: list[dict], final: dict) -> dict:
    """summary.json's accuracies, totals and averages from the run's logged rows (rank 0's)."""
    evals = [r for r in rows if "eval/accuracy" in r]
    train_rows = [r for r in rows if "train/reward_mean" in r]
    memory = sorted({k for r in train_rows for k in r if k.startswith("mem/") and k != "mem/peak_is_process"})
    return {
        "eval/accuracy_before": evals[0]["eval/accuracy"] if evals and evals[0]["progress/round"] == 0 else None,
        "eval/accuracy_after": final["eval/accuracy"],
        "unused_samples": sum(r.get("algorithm/unused_samples", 0) for r in train_rows),
        "optimizer_steps": sum(r.get("train/optimizer_steps", 0) for r in train_rows),
        "time/rounds_s_total": sum(r["time/round_s"] for r in train_rows),
        **{f"time/{p}_s_total": sum(r[f"time/{p}_s"] for r in train_rows) for p in (*PHASES, "other")},
        **{  # over the rounds that trained on records (paper Table 3; a round of zero advantages runs none)
            f"{k}_avg": mean(r[k] for r in train_rows if k in r)
            for k in ("iw/staleness", "iw/log_w_mean")
            if any(k in r for r in train_rows)
        },
        **{f"{k}_max": max(r[k] for r in train_rows if k in r) for k in memory},
    }


def read_metrics(path: Path) -> list[dict]:
    """The rows of a metrics.jsonl (a run directory or the file), under today's names (`current_names`)."""
    path = Path(path)
    return [current_names(r) for r in read_rows(path / "metrics.jsonl" if path.is_dir() else path)]


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
        x_axis: str = "progress/samples",
    ):
        self.path = Path(run_dir) / "metrics.jsonl"
        self.enabled, self.wandb = enabled, None
        if not enabled:
            return
        for path in (self.path, self.path.parent / "rollouts.jsonl", self.path.parent / "eval_outcomes.jsonl"):
            if resume_round is not None and path.exists():
                if path == self.path:
                    kept = [r for r in read_metrics(path) if r.get("progress/round", 0) <= resume_round]
                else:
                    kept = [r for r in read_rows(path) if r.get("round", 0) <= resume_round]
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
            self.wandb.define_metric(x_axis)  # runs with different H line up on samples generated
            self.wandb.define_metric("*", step_metric=x_axis)

    def rows(self) -> list[dict]:
        return read_metrics(self.path) if self.path.exists() else []

    def log(self, row: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self.wandb is not None:  # plotted against `x_axis` (define_metric), not W&B's own step
            self.wandb.log(row)

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
