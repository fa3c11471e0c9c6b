"""Held-out evaluation: accuracy of greedy (or sampled) completions on a task's test prompts.

Under DDP each rank evaluates its share of the problems and the counts are summed.
"""
from __future__ import annotations

import torch

from rapid.distributed import all_reduce_sum


def evaluate(sampler, task, records: list[dict], prompts: list[list[int]], *, max_new_tokens: int,
             temperature: float = 0.0, rank: int = 0, world: int = 1, device=torch.device("cpu"),
             seed: int = 0) -> dict[str, float]:
    """`eval/accuracy` (mean reward 1.0), `eval/reward_mean`, `eval/completion_len`, `eval/n`."""
    mine = list(range(rank, len(records), world))
    completions = sampler.generate([prompts[i] for i in mine], n=1, max_new_tokens=max_new_tokens,
                                   temperature=temperature, seeds=[seed + i for i in mine])
    rewards = [task.reward(c[0].text, records[i]) for c, i in zip(completions, mine)]
    correct, total, n, length = all_reduce_sum(
        [sum(r == 1.0 for r in rewards), sum(rewards), len(mine), sum(len(c[0].token_ids) for c in completions)],
        device)
    return {"eval/accuracy": correct / n, "eval/reward_mean": total / n, "eval/completion_len": length / n,
            "eval/n": int(n)}
