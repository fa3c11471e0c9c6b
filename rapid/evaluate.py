"""Held-out evaluation: greedy accuracy and pass@k, during training and on its own.

    python -m rapid.evaluate eval.checkpoint=outputs/<run>/checkpoints/round_000012 eval.n_samples=8
    python -m rapid.evaluate model=qwen2.5_0.5b task=math eval.n_samples=8 eval.ks=[1,8]

pass@k uses the unbiased estimator over n samples per problem (Chen et al., 2021):
    pass@k = 1 − C(n − c, k) / C(n, k),   c = number of the n samples with reward 1,
averaged over problems. Under DDP each rank evaluates its share of the problems and the counts are
summed. Results go to <run_dir>/eval.json and the console. `outcomes`, when given a list, receives the
greedy verdict (1 or 0) of every problem in record order, gathered from all ranks: training runs keep
them in <run_dir>/eval_outcomes.jsonl, so that confidence intervals can resample problems.

Completions are graded as in training (`rapid.rewards.score`, `reward.workers` and `reward.timeout_s`):
a held-out check that hangs, crashes or raises scores 0 and is counted in `eval/reward_failures`; it
never stops the evaluation.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from rapid.config import exit_on_config_error
from rapid.distributed import all_gather_objects, all_reduce_sum
from rapid.rewards import score


def pass_at_k(n: int, c: int, k: int) -> float:
    """Probability that at least one of k samples drawn without replacement from n (c correct) is correct."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples per problem, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def evaluate(
    sampler,
    task,
    records: list[dict],
    prompts: list[list[int]],
    *,
    max_new_tokens: int,
    temperature: float = 0.0,
    n_samples: int = 1,
    sample_temperature: float = 1.0,
    ks: tuple[int, ...] = (1,),
    rank: int = 0,
    world: int = 1,
    device=torch.device("cpu"),
    seed: int = 0,
    outcomes: list[int] | None = None,
    workers: int = 0,
    timeout: float = 60.0,
) -> dict[str, float]:
    """`eval/accuracy` (greedy if temperature is 0), `eval/reward_mean`, `eval/completion_len`, `eval/n`,
    `eval/reward_failures`, and with n_samples > 1 `eval/pass@k` for each k in ks from n_samples samples
    at sample_temperature. Grading: `workers` processes (0: a killable child), `timeout` s per check."""
    mine = list(range(rank, len(records), world))
    my_prompts = [prompts[i] for i in mine]
    first = sampler.generate(
        my_prompts, n=1, max_new_tokens=max_new_tokens, temperature=temperature, seeds=[seed + i for i in mine]
    )
    rewards, failed = score(
        task, [c[0].text for c in first], [records[i] for i in mine], workers=workers, timeout=timeout
    )  # a failed check: 0
    values = [sum(r == 1.0 for r in rewards), sum(rewards), len(mine), sum(len(c[0].token_ids) for c in first)]
    values.append(failed)
    if outcomes is not None:
        by_index = {i: int(r == 1.0) for part in all_gather_objects(list(zip(mine, rewards))) for i, r in part}
        outcomes[:] = [by_index[i] for i in range(len(records))]
    ks = tuple(k for k in ks if k <= n_samples) if n_samples > 1 else ()
    if ks:
        groups = sampler.generate(
            my_prompts,
            n=n_samples,
            max_new_tokens=max_new_tokens,
            temperature=sample_temperature,
            seeds=[seed + 7919 + i for i in mine],
        )
        flat, failed = score(  # one call for all problems' samples
            task,
            [c.text for group in groups for c in group],
            [records[i] for group, i in zip(groups, mine) for _ in group],
            workers=workers,
            timeout=timeout,
        )
        values[4] += failed
        correct, at = [], 0
        for group in groups:
            correct.append(sum(r == 1.0 for r in flat[at : at + len(group)]))
            at += len(group)
        values += [sum(pass_at_k(n_samples, c, k) for c in correct) for k in ks]
    totals = all_reduce_sum(values, device)
    n = totals[2]
    row = {
        "eval/accuracy": totals[0] / n,
        "eval/reward_mean": totals[1] / n,
        "eval/completion_len": totals[3] / n,
        "eval/n": int(n),
        "eval/reward_failures": int(totals[4]),
    }
    row.update({f"eval/pass@{k}": v / n for k, v in zip(ks, totals[5:])})
    return row


def evaluate_config(
    cfg: DictConfig,
    sampler,
    task,
    records: list[dict],
    prompts: list[list[int]],
    *,
    seed: int,
    rank: int = 0,
    world: int = 1,
    device=torch.device("cpu"),
    outcomes: list[int] | None = None,
) -> dict[str, float]:
    """`evaluate` with the run's settings: task.max_new_tokens, eval.* (temperature, n_samples, ks),
    sampler.temperature for pass@k, and the training's grading pool and timeout (reward.*)."""
    return evaluate(
        sampler,
        task,
        records,
        prompts,
        max_new_tokens=cfg.task.max_new_tokens,
        temperature=cfg.eval.temperature,
        n_samples=cfg.eval.n_samples,
        sample_temperature=cfg.sampler.temperature,
        ks=tuple(cfg.eval.ks),
        rank=rank,
        world=world,
        device=device,
        seed=seed,
        outcomes=outcomes,
        workers=cfg.reward.workers,
        timeout=cfg.reward.timeout_s,
    )


@hydra.main(config_path="../conf", config_name="config", version_base=None)
@exit_on_config_error
def main(cfg: DictConfig) -> dict:
    """Evaluate a model (cfg.model) or a training checkpoint (eval.checkpoint) on the task's test split."""
    from rapid import distributed
    from rapid.config import register_resolvers, resolve_dtype
    from rapid.models import load_model_and_tokenizer
    from rapid.sampler import make_sampler, sequence_budget
    from rapid.tasks import get_task

    register_resolvers()
    rank, world, device = distributed.init(cfg.device)
    path = str(Path(cfg.eval.checkpoint) / "model") if cfg.eval.checkpoint else cfg.model.path
    gguf = None if cfg.eval.checkpoint else cfg.model.gguf
    architecture = None if cfg.eval.checkpoint else cfg.model.architecture
    model, tokenizer = load_model_and_tokenizer(path, gguf, architecture, seed=cfg.seed)
    model.to(device).eval()
    task = get_task(cfg.task.name, cfg.task.module)
    records = task.load("test", **cfg.task)[: cfg.eval.n]
    prompts = task.build_prompts(records, tokenizer, **cfg.task)
    dtype = resolve_dtype(cfg.model.dtype, device)
    sampler = make_sampler(
        cfg.sampler,
        model,
        tokenizer,
        dtype,
        seed=cfg.seed,
        max_len_needed=sequence_budget(prompts, cfg.task.max_new_tokens),
    )
    row = evaluate_config(cfg, sampler, task, records, prompts, seed=cfg.seed, rank=rank, world=world, device=device)
    row = {"model": path or cfg.model.name, "task": cfg.task.name, "sampler": sampler.name, **row}
    if distributed.is_main():
        out = Path(HydraConfig.get().runtime.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(row, indent=2))
        print(json.dumps(row, indent=2))
    sampler.close()
    distributed.shutdown()
    return row


if __name__ == "__main__":
    main()
