"""Accounting defects found by an audit of the training loop (issue 24, item 4), each against values
worked out by hand."""

from __future__ import annotations

import math

import torch

from rapid.iw_grpg import group_advantages
from rapid.losses import group_normalized_advantages


def test_equal_non_binary_rewards_have_exactly_zero_advantage():
    """0.1 · 8 / 8 != 0.1 in float32: today's mean leaves A ~ 7e-9 per record, which GRPO's std
    normalisation (std ~ 0, + eps 1e-4) inflates to ~ 7e-5 (0.7: ~ 6e-4). A group of equal rewards
    has advantage exactly 0; other groups are unchanged."""
    rewards = torch.tensor([0.1] * 8 + [0.7] * 8 + [0.1, 0.7], dtype=torch.float32)
    groups = torch.tensor([0] * 8 + [1] * 8 + [2, 2])
    # group 2: mean 0.4, R − mean = ∓0.3, unbiased std sqrt((0.09 + 0.09) / 1) = sqrt(0.18)
    a = 0.3 / (math.sqrt(0.18) + 1e-4)
    want = torch.tensor([0.0] * 16 + [-a, a])
    got = group_normalized_advantages(rewards, groups)
    assert torch.equal(got[:16], torch.zeros(16))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=0)
    centred = group_normalized_advantages(rewards, groups, scale=None)  # Dr. GRPO
    assert torch.equal(centred[:16], torch.zeros(16))
    torch.testing.assert_close(centred[16:], torch.tensor([-0.3, 0.3]), rtol=1e-6, atol=0)
    # the same in float64, where 0.1 · 3 / 3 != 0.1
    three = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    assert torch.equal(group_normalized_advantages(three, torch.zeros(3, dtype=torch.long)), torch.zeros(3))


def test_equal_rewards_under_the_group_mean_baseline_are_exactly_zero():
    """rapid.iw_grpg.group_advantages (Eq. 2, RAPID with iw_baseline=false, TOPR's group mean):
    without weights, or with weights all 1 (a round's first step), an equal group's A is exactly 0."""
    rewards = torch.tensor([0.1] * 8 + [0.7] * 8, dtype=torch.float32)
    groups = torch.tensor([0] * 8 + [1] * 8)
    for loo in (False, True):
        assert torch.equal(group_advantages(rewards, groups, leave_one_out=loo), torch.zeros(16))
        assert torch.equal(group_advantages(rewards, groups, torch.ones(16), leave_one_out=loo), torch.zeros(16))
    three = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    zeros = torch.zeros(3, dtype=torch.long)
    assert torch.equal(group_advantages(three, zeros, leave_one_out=True), torch.zeros(3, dtype=torch.float64))


def test_equal_rewards_under_the_weighted_baseline_keep_their_off_policy_advantage():
    """Eq. 4 with weights: an equal group's A_n = c (1 − mean w̄) is not 0 off-policy, and stays so.
    c = 0.1, w̄ = (0.5, 1, 1): mean 2.5/3, A = 0.1 / 6 for each; leave-one-out, A_n = 0.1 (1 − (2.5 − w̄_n) / 2):
    0 for n = 1, 0.1 · 0.25 = 0.025 for n = 2, 3."""
    c = torch.tensor([0.1, 0.1, 0.1], dtype=torch.float64)
    w = torch.tensor([0.5, 1.0, 1.0], dtype=torch.float64)
    g = torch.zeros(3, dtype=torch.long)
    torch.testing.assert_close(group_advantages(c, g, w), torch.full((3,), 0.1 / 6, dtype=torch.float64))
    torch.testing.assert_close(
        group_advantages(c, g, w, leave_one_out=True), torch.tensor([0.0, 0.025, 0.025], dtype=torch.float64)
    )


def test_accuracy_counts_correct_answers_before_the_overlong_penalty():
    """train/accuracy is the share of correct completions (task reward 1): a correct answer that DAPO's
    overlong penalty pulls to 0.75 is still correct. 4 records: scores 1, 1, 0, 1 with penalties
    0, -0.25, 0, -1 -> rewards 1, 0.75, 0, 0: accuracy 3/4, reward mean 1.75 / 4."""
    from rapid.buffer import Rollout
    from rapid.logger import round_metrics

    scores, penalties = [1.0, 1.0, 0.0, 1.0], [0.0, -0.25, 0.0, -1.0]
    rollouts = [
        Rollout([1], [2, 3], [0.0, 0.0], s + p, group_id=0, truncated=False, score=s) for s, p in zip(scores, penalties)
    ]
    row = round_metrics(rollouts, [{"loss": 0.0, "grad_norm": 0.0, "lr": 1e-3}], 0, None, 1, torch.device("cpu"))
    assert row["train/accuracy"] == 0.75
    assert row["train/reward_mean"] == 1.75 / 4
