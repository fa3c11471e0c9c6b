"""Rollout records and the per-round replay buffer Z_t (Algorithm 1, steps 4-5).

A `Rollout` is one completion y_n of a prompt x_n with everything the off-policy update needs:
the per-token log-probabilities under the behaviour policy μ (the frozen policy that sampled
it), the reward R_n and the id of its group N_k (the `n_group` completions of one prompt).

`ReplayBuffer.minibatches(n_step, generator)` partitions the round's records into
`H = len(buffer) / n_step` minibatches. Each record appears exactly once per round, every
minibatch is made of whole groups (the IW group baseline needs the current-policy weights of
all siblings), and the order is a seeded shuffle of the groups.

`collate` turns records into padded tensors laid out as [left-padded prompt | right-padded
completion], so that every completion starts at the same column and the policy only needs
logits for the last `C + 1` positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Rollout:
    prompt_ids: list[int]        # tokens of the prompt x_n (chat template applied)
    completion_ids: list[int]    # tokens of the completion y_n (EOS included when it stopped)
    logp_mu: list[float]         # log μ(y_n,t | x_n, y_n,<t), one per completion token
    reward: float                # R(x_n, y_n)
    group_id: int                # index of the prompt's group N_k (unique within a round)
    truncated: bool              # hit the completion length limit without stopping
    text: str = ""               # decoded completion, for logging and rewards


@dataclass
class Batch:
    input_ids: torch.Tensor        # [B, P + C]  prompt left-padded, completion right-padded
    attention_mask: torch.Tensor   # [B, P + C]  1 on real tokens
    position_ids: torch.Tensor     # [B, P + C]  0.. on real tokens (left padding skipped)
    completion_mask: torch.Tensor  # [B, C]      True on completion tokens
    logp_mu: torch.Tensor          # [B, C]      per-token log μ (0 on padding)
    rewards: torch.Tensor          # [B]
    group_ids: torch.Tensor        # [B]

    def to(self, device: torch.device | str) -> "Batch":
        return Batch(**{k: v.to(device) for k, v in self.__dict__.items()})

    def __len__(self) -> int:
        return self.input_ids.shape[0]


def collate(rollouts: list[Rollout], pad_id: int) -> Batch:
    """Pad a list of rollouts into a `Batch` (see the layout in the module docstring)."""
    B = len(rollouts)
    P = max(len(r.prompt_ids) for r in rollouts)
    C = max(max(len(r.completion_ids) for r in rollouts), 1)
    input_ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, P + C), dtype=torch.long)
    logp_mu = torch.zeros((B, C), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, P - p:P] = torch.tensor(r.prompt_ids)
        input_ids[i, P:P + c] = torch.tensor(r.completion_ids, dtype=torch.long)
        attention_mask[i, P - p:P + c] = 1
        logp_mu[i, :c] = torch.tensor(r.logp_mu, dtype=torch.float32)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        completion_mask=attention_mask[:, P:].bool(),
        logp_mu=logp_mu,
        rewards=torch.tensor([r.reward for r in rollouts], dtype=torch.float32),
        group_ids=torch.tensor([r.group_id for r in rollouts], dtype=torch.long),
    )


class ReplayBuffer:
    """The records Z_t of one round, with log μ, served as group-aligned minibatches."""

    def __init__(self) -> None:
        self.records: list[Rollout] = []

    def add(self, rollouts: list[Rollout]) -> None:
        self.records.extend(rollouts)

    def clear(self) -> None:
        self.records = []

    def __len__(self) -> int:
        return len(self.records)

    def groups(self) -> list[list[Rollout]]:
        """Records grouped by `group_id`, in order of first appearance."""
        by_id: dict[int, list[Rollout]] = {}
        for r in self.records:
            by_id.setdefault(r.group_id, []).append(r)
        return list(by_id.values())

    def minibatches(self, n_step: int, generator: torch.Generator) -> list[list[Rollout]]:
        """Partition the buffer into `len / n_step` minibatches of whole groups, seeded order."""
        groups = self.groups()
        sizes = {len(g) for g in groups}
        if len(sizes) != 1:
            raise ValueError(f"groups in the buffer have different sizes {sorted(sizes)}; "
                             "every prompt must have n_group completions")
        group_size = sizes.pop()
        if n_step % group_size or len(self.records) % n_step:
            raise ValueError(f"n_step={n_step} must be a multiple of the group size {group_size} "
                             f"and divide the buffer size {len(self.records)}")
        per_batch = n_step // group_size
        order = torch.randperm(len(groups), generator=generator).tolist()
        return [[r for k in order[i:i + per_batch] for r in groups[k]]
                for i in range(0, len(order), per_batch)]
