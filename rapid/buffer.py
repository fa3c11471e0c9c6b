"""Rollout records and the per-round replay buffer Z_t (Algorithm 1, steps 4-5).

A `Rollout` is one completion y_n of a prompt x_n with everything the off-policy update needs:
the per-token log-probabilities under the behaviour policy μ (the frozen policy that sampled
it), the reward R_n and the id of its group N_k (the `n_group` completions of one prompt).

`ReplayBuffer.minibatches(n_step, generator)` partitions the round's records into
`H = len(buffer) / n_step` minibatches. Each record appears exactly once per round, every
minibatch is made of whole groups (the IW group baseline needs the current-policy weights of
all siblings), and the order is a seeded shuffle of the groups.

`collate` turns whole groups into padded tensors: one left-padded prompt row per group and one
right-padded completion row per record, so that the policy can run each shared prompt once.

`dynamic_sampling` is DAPO's: a round keeps only the groups whose rewards differ, samples more prompts
until it has its records back or the run's sample budget is spent, and trains on a whole number of
minibatches; `schedule_positions` spreads the samples a round generated over the steps it took, so that
the learning-rate schedule follows the samples spent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from rapid.distributed import all_reduce_max


@dataclass
class Rollout:
    prompt_ids: list[int]  # tokens of the prompt x_n (chat template applied)
    completion_ids: list[int]  # tokens of the completion y_n (EOS included when it stopped)
    logp_mu: list[float]  # log μ(y_n,t | x_n, y_n,<t), one per completion token
    reward: float  # R(x_n, y_n)
    group_id: int  # index of the prompt's group N_k (unique within a round)
    truncated: bool  # hit the completion length limit without stopping
    text: str = ""  # decoded completion, for logging and rewards
    prompt_index: int = -1  # position of the problem in the task's training split
    logp_engine: list[float] | None = None  # the sampler's own log-probs, kept when log μ is recomputed
    score: float | None = None  # the task's own reward, before shaping (DAPO's overlong penalty); None: `reward`

    @property
    def task_reward(self) -> float:
        """The task's reward of the completion (correct: 1.0), whatever shaping `reward` adds."""
        return self.reward if self.score is None else self.score


@dataclass
class Batch:
    """Whole groups of n completions; the members of a group are consecutive rows and share
    one prompt row. Prompts are left-padded, completions right-padded, so that every
    completion starts right after column P of its prompt."""

    prompt_ids: torch.Tensor  # [G, P]  one prompt per group, left-padded
    prompt_mask: torch.Tensor  # [G, P]  1 on real tokens
    completion_ids: torch.Tensor  # [B, C]  B = G * n, right-padded
    completion_mask: torch.Tensor  # [B, C]  True on completion tokens
    logp_mu: torch.Tensor  # [B, C]  per-token log μ (0 on padding)
    rewards: torch.Tensor  # [B]
    group_ids: torch.Tensor  # [B]
    group_size: int  # n
    logp_engine: torch.Tensor | None = None  # [B, C]  the sampler's log-probs (= logp_mu unless recomputed)

    def to(self, device: torch.device | str) -> Batch:
        return Batch(**{k: v.to(device) if torch.is_tensor(v) else v for k, v in self.__dict__.items()})

    def __len__(self) -> int:
        return self.completion_ids.shape[0]


def collate(rollouts: list[Rollout], pad_id: int) -> Batch:
    """Pad rollouts (whole groups, members consecutive) into a `Batch`."""
    B = len(rollouts)
    n = next((i for i, r in enumerate(rollouts) if r.group_id != rollouts[0].group_id), B)
    if B % n or any(
        rollouts[i].group_id != rollouts[i - i % n].group_id or rollouts[i].prompt_ids != rollouts[i - i % n].prompt_ids
        for i in range(B)
    ):
        raise ValueError("collate needs whole groups of equal size, members consecutive, sharing one prompt")
    heads = rollouts[::n]
    P = max(len(r.prompt_ids) for r in heads)
    C = max(max(len(r.completion_ids) for r in rollouts), 1)
    prompt_ids = torch.full((len(heads), P), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((len(heads), P), dtype=torch.long)
    for g, r in enumerate(heads):
        prompt_ids[g, P - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        prompt_mask[g, P - len(r.prompt_ids) :] = 1
    completion_ids = torch.full((B, C), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((B, C), dtype=torch.bool)
    logp_mu = torch.zeros((B, C), dtype=torch.float32)
    logp_engine = torch.zeros((B, C), dtype=torch.float32)
    for i, r in enumerate(rollouts):
        c = len(r.completion_ids)
        completion_ids[i, :c] = torch.tensor(r.completion_ids, dtype=torch.long)
        completion_mask[i, :c] = True
        logp_mu[i, :c] = torch.tensor(r.logp_mu, dtype=torch.float32)
        logp_engine[i, :c] = torch.tensor(r.logp_mu if r.logp_engine is None else r.logp_engine, dtype=torch.float32)
    return Batch(
        prompt_ids=prompt_ids,
        prompt_mask=prompt_mask,
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        logp_mu=logp_mu,
        rewards=torch.tensor([r.reward for r in rollouts], dtype=torch.float32),
        group_ids=torch.tensor([r.group_id for r in rollouts], dtype=torch.long),
        group_size=n,
        logp_engine=logp_engine,
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
        if not groups:  # DAPO's last round, when the budget ran out before a minibatch was found
            return []
        sizes = {len(g) for g in groups}
        if len(sizes) != 1:
            raise ValueError(
                f"groups in the buffer have different sizes {sorted(sizes)}; every prompt must have n_group completions"
            )
        group_size = sizes.pop()
        if n_step % group_size or len(self.records) % n_step:
            raise ValueError(
                f"n_step={n_step} must be a multiple of the group size {group_size} "
                f"and divide the buffer size {len(self.records)}"
            )
        per_batch = n_step // group_size
        order = torch.randperm(len(groups), generator=generator).tolist()
        return [[r for k in order[i : i + per_batch] for r in groups[k]] for i in range(0, len(order), per_batch)]


def rank_share(minibatches: list[list[Rollout]], rank: int, world: int) -> list[list[Rollout]]:
    """This rank's equal slice of each minibatch (of every rank's records), for groups that span ranks."""
    return [mb[rank * len(mb) // world : (rank + 1) * len(mb) // world] for mb in minibatches]


def groups_with_gradient(records: list[Rollout], skip: str) -> list[Rollout]:
    """The records whose gradient can be non-zero (groups stay contiguous and in order), dropping the
    groups whose every member has advantage 0:

        skip="equal_rewards"  groups of equal rewards: a plain group-mean baseline (GRPO's and DAPO's
                              normalised advantage, Eq. 2, IW-GRPG with iw_baseline=false) equals them
        skip="zero_rewards"   groups of all-zero rewards: IW-GRPG's Eq. 4 baseline (1/N_k) Σ w̄ R is not
                              R off-policy (an all-correct group has A = 1 − mean w̄), but is 0 for them

    Their policy-gradient term is 0, so forward and backward over them can be skipped with the
    minibatch's gradient unchanged (not GRPO's KL term: rapid.train skips nothing when beta > 0).
    With no group left this is empty: the minibatch's gradient is exactly 0."""
    if skip not in ("equal_rewards", "zero_rewards"):
        raise ValueError(f"skip must be 'equal_rewards' or 'zero_rewards'; got {skip!r}")
    buffer = ReplayBuffer()
    buffer.add(records)
    return [r for group in buffer.groups() if group_has_gradient([r.reward for r in group], skip) for r in group]


def group_has_gradient(rewards: list[float], skip: str) -> bool:
    """Whether a group of these rewards keeps a gradient under `skip` (`groups_with_gradient`)."""
    distinct = set(rewards)
    return len(distinct) > 1 or (skip == "zero_rewards" and distinct != {0.0})


def keep_informative_groups(rollouts: list[Rollout]) -> tuple[list[Rollout], int]:
    """DAPO's dynamic sampling: drop the groups whose task rewards are all equal (DAPO keeps a group
    with 0 < correct < G, judged by accuracy, not by the reward after its overlong penalty). Returns the
    kept records (groups stay contiguous) and the number of dropped groups."""
    buffer = ReplayBuffer()
    buffer.add(rollouts)
    kept, dropped = [], 0
    for group in buffer.groups():
        if len({r.task_reward for r in group}) > 1:
            kept += group
        else:
            dropped += 1
    return kept, dropped


def trim_to_minibatches(
    rollouts: list[Rollout], local_step: int, target: int, device, allow_empty: bool = False
) -> list[Rollout]:
    """After dynamic sampling: at most `target` records, a whole number of minibatches, and the same
    number on every rank (DDP needs equal step counts). None left is an error unless `allow_empty` (the
    run's sample budget is spent: the round ends without a step)."""
    n = min(len(rollouts), target) // local_step * local_step
    n = -int(all_reduce_max(-n, device))
    if n == 0 and not allow_empty:
        raise RuntimeError(
            "dynamic sampling found no informative group within algorithm.dynamic_sampling_tries "
            "attempts; raise it or check the reward"
        )
    return rollouts[:n]


def dynamic_sampling(
    rollouts: list[Rollout],
    failed: int,
    sample_more: Callable[[int, int], tuple[list[Rollout], int]],
    tries: int,
    target: int,
    local_step: int,
    device,
    *,
    draw: int,
    n_group: int,
    budget: int,
    world: int = 1,
    trim: bool = True,
) -> tuple[list[Rollout], int, int, int, int]:
    """DAPO's dynamic sampling of one round on this rank: keep the informative groups of `rollouts` (the
    round's first batch, `draw` prompts over all ranks; `keep_informative_groups`); while some rank has
    fewer than `target` records kept, every rank calls `sample_more(attempt, prompts)` (attempt = 1 ..
    tries - 1: `prompts` fresh prompts over all ranks, sampled and scored, and its reward failures) and
    keeps its informative groups too. A draw is `draw` prompts, fewer where the round would otherwise
    generate more than `budget` samples (the run's samples not yet generated, first batch included), and
    none once the budget is spent: dynamic sampling never overshoots the run's budget. The decision is
    collective, so every rank draws the same batches from its prompt stream and the streams stay aligned.
    Then `trim_to_minibatches` (unless `trim` is false: where groups span ranks the gathered round is
    trimmed, alike on every rank); a round that spent the budget may end with no record. Returns
    (records, reward failures, groups dropped, batches drawn, samples generated over all ranks)."""
    rollouts, dropped = keep_informative_groups(rollouts)
    batches, generated = 1, draw * n_group
    for attempt in range(1, tries):
        prompts = min(draw, (budget - generated) // n_group // world * world)  # alike on every rank
        if prompts <= 0 or all_reduce_max(float(len(rollouts) < target), device) == 0.0:  # spent, or all full
            break
        extra, f = sample_more(attempt, prompts)
        extra, d = keep_informative_groups(extra)
        rollouts, failed, dropped = rollouts + extra, failed + f, dropped + d
        batches, generated = batches + 1, generated + prompts * n_group
    if trim:
        rollouts = trim_to_minibatches(rollouts, local_step, target, device, allow_empty=generated >= budget)
    return rollouts, failed, dropped, batches, generated


def schedule_positions(done: int, generated: int, steps: int, n_step: int, num_iterations: int) -> list[float]:
    """Where a round's optimizer steps sit on the learning-rate schedule, then where the round ends
    (`steps` + 1 positions). The schedule's unit is one planned step, n_step / num_iterations samples
    generated (it spans samples / n_step * num_iterations of them); the round's share of the budget, from
    `done` to `done + generated` samples, is spread evenly over the `steps` it really takes. With a fixed
    H every round generates n_step / num_iterations samples per step and step k sits at k, as with a plain
    step counter; where DAPO's dynamic sampling generated more samples per step, each step advances the
    schedule by more, so that the schedule follows the samples spent (the budget every method shares)
    instead of jumping at the end of the round."""
    unit = n_step / num_iterations
    positions = [(done + generated * k / max(steps, 1)) / unit for k in range(steps)] + [(done + generated) / unit]
    return [int(p) if p == int(p) else p for p in positions]


def set_schedule_position(scheduler: torch.optim.lr_scheduler.LRScheduler, position: float) -> None:
    """Move a LambdaLR-style schedule to `position` (a float: `schedule_positions`) and apply its lr."""
    scheduler.last_epoch = position - 1
    scheduler.step()  # last_epoch += 1, then every param group's lr from the schedule at `position`
