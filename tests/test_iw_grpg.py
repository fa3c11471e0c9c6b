"""Tests for rapid.iw_grpg: hand computations, a numpy loop reference, and a Monte Carlo check
of the IW-GRPG gradient against the exact policy gradient of a tabular softmax bandit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rapid.iw_grpg import group_advantages, iw_grpg_loss, masked_mean, normalized_ess, sequence_logprobs

F64 = dict(rtol=0.0, atol=1e-12)
F32 = dict(rtol=0.0, atol=1e-6)


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def np_advantages(rewards, group_ids, weights=None, leave_one_out=False) -> np.ndarray:
    """Reference: an explicit python loop over groups and members."""
    rewards = np.asarray(rewards, dtype=np.float64)
    weights = np.ones_like(rewards) if weights is None else np.asarray(weights, np.float64)
    group_ids = np.asarray(group_ids)
    out = np.empty_like(rewards)
    for gid in set(group_ids.tolist()):
        members = [i for i in range(len(rewards)) if group_ids[i] == gid]
        for i in members:
            others = [j for j in members if j != i] if leave_one_out else members
            out[i] = rewards[i] - sum(weights[j] * rewards[j] for j in others) / len(others)
    return out


# ----------------------------------------------------------------------------- advantages

IDS = torch.tensor([5, 9, 5, 9, 5, 9])
R = t64([1.0, 0.0, 0.0, 2.0, 2.0, 1.0])  # group 5: R = 1, 0, 2; group 9: R = 0, 2, 1
W = t64([0.5, 1.0, 2.0, 1.5, 1.0, 0.5])  # group 5: w = 0.5, 2, 1; group 9: w = 1, 1.5, 0.5


def test_eq2_two_interleaved_groups_by_hand():
    # group 5 (positions 0, 2, 4): mean (1 + 0 + 2)/3 = 1 -> A = 0, -1, 1
    # group 9 (positions 1, 3, 5): mean (0 + 2 + 1)/3 = 1 -> A = -1, 1, 0
    expected = t64([0.0, -1.0, -1.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(group_advantages(R, IDS), expected, **F64)


def test_eq4_weighted_by_hand():
    # group 5: Σ wR = 0.5·1 + 2·0 + 1·2 = 2.5, baseline 2.5/3 = 5/6 -> A = 1/6, -5/6, 7/6
    # group 9: Σ wR = 1·0 + 1.5·2 + 0.5·1 = 3.5, baseline 3.5/3 = 7/6 -> A = -7/6, 5/6, -1/6
    expected = t64([1 / 6, -7 / 6, -5 / 6, 5 / 6, 7 / 6, -1 / 6])
    torch.testing.assert_close(group_advantages(R, IDS, W), expected, **F64)


def test_leave_one_out_unweighted_by_hand():
    # group 5 (R = 1, 0, 2): baselines (0+2)/2 = 1, (1+2)/2 = 1.5, (1+0)/2 = 0.5 -> 0, -1.5, 1.5
    # group 9 (R = 0, 2, 1): baselines (2+1)/2 = 1.5, (0+1)/2 = 0.5, (0+2)/2 = 1 -> -1.5, 1.5, 0
    expected = t64([0.0, -1.5, -1.5, 1.5, 1.5, 0.0])
    torch.testing.assert_close(group_advantages(R, IDS, leave_one_out=True), expected, **F64)


def test_leave_one_out_weighted_by_hand():
    # group 5: wR = 0.5, 0, 2 -> baselines (0+2)/2 = 1, (0.5+2)/2 = 1.25, (0.5+0)/2 = 0.25
    #          A = 1-1 = 0, 0-1.25 = -1.25, 2-0.25 = 1.75
    # group 9: wR = 0, 3, 0.5 -> baselines (3+0.5)/2 = 1.75, (0+0.5)/2 = 0.25, (0+3)/2 = 1.5
    #          A = 0-1.75 = -1.75, 2-0.25 = 1.75, 1-1.5 = -0.5
    expected = t64([0.0, -1.75, -1.25, 1.75, 1.75, -0.5])
    torch.testing.assert_close(group_advantages(R, IDS, W, leave_one_out=True), expected, **F64)


def test_unequal_group_sizes_and_negative_ids_by_hand():
    ids = torch.tensor([-3, 42, 42, 7, 42, 7, 42])
    rewards = t64([3.0, 1.0, 0.0, 5.0, 3.0, 1.0, 0.0])
    # group -3: {3}, mean 3 -> 0; group 42: {1, 0, 3, 0}, mean 1 -> 0, -1, 2, -1;
    # group 7: {5, 1}, mean 3 -> 2, -2
    expected = t64([0.0, 0.0, -1.0, 2.0, 2.0, -2.0, -1.0])
    torch.testing.assert_close(group_advantages(rewards, ids), expected, **F64)


@pytest.mark.parametrize("leave_one_out", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_advantages_match_numpy_loop_randomized(weighted: bool, leave_one_out: bool):
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        sizes = torch.randint(2, 7, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen)
        labels = torch.randint(-1000, 1000, (len(sizes),), generator=gen)
        while len(set(labels.tolist())) < len(labels):  # distinct arbitrary ids
            labels = torch.randint(-1000, 1000, (len(sizes),), generator=gen)
        ids = torch.repeat_interleave(labels, sizes)
        ids = ids[torch.randperm(len(ids), generator=gen)]  # scatter group members
        rewards = torch.randn(len(ids), generator=gen, dtype=torch.float64)
        weights = torch.rand(len(ids), generator=gen, dtype=torch.float64) * 3 if weighted else None
        got = group_advantages(rewards, ids, weights, leave_one_out)
        np_weights = None if weights is None else weights.numpy()
        want = np_advantages(rewards.numpy(), ids.numpy(), np_weights, leave_one_out)
        torch.testing.assert_close(got, torch.from_numpy(want), **F64)


def test_advantages_are_constants():
    weights = W.clone().requires_grad_()
    adv = group_advantages(R.float(), IDS, weights)
    assert not adv.requires_grad
    assert adv.dtype == torch.float32


# ----------------------------------------------------------------------------- loss


def random_batch(seed: int, n_groups: int = 6, group_size: int = 4, dtype=torch.float64):
    """Interleaved groups with arbitrary ids; log-ratios spread so that some w exceed 2."""
    gen = torch.Generator().manual_seed(seed)
    b = n_groups * group_size
    ids = torch.arange(n_groups).repeat(group_size) * 11 - 20  # ids -20, -9, 2, ... interleaved
    rewards = torch.randint(0, 2, (b,), generator=gen).to(dtype)
    logp_mu = -5.0 * torch.rand(b, generator=gen, dtype=dtype)
    logp = logp_mu + 0.8 * torch.randn(b, generator=gen, dtype=dtype)
    return logp, logp_mu, rewards, ids


def test_on_policy_equals_plain_grpg():
    logp, _, rewards, ids = random_batch(1, dtype=torch.float32)
    logp = logp.requires_grad_()
    loss, stats = iw_grpg_loss(logp, logp.detach().clone(), rewards, ids, eta=2.0)
    (grad,) = torch.autograd.grad(loss, logp)
    eq2 = np_advantages(rewards.numpy(), ids.numpy())  # w = 1: Eq. 4 is Eq. 2
    torch.testing.assert_close(grad.double(), torch.from_numpy(-eq2 / len(logp)), **F32)
    assert stats["clip_frac"] == 0.0 and stats["staleness"] == 0.0 and stats["log_w_mean"] == 0.0
    assert stats["iw_mean"] == 1.0 and stats["iw_max"] == 1.0


@pytest.mark.parametrize("normalizer", [None, 17.0])
@pytest.mark.parametrize("leave_one_out", [False, True])
def test_surrogate_gradient_is_eq3(normalizer: float | None, leave_one_out: bool):
    eta = 2.0
    logp, logp_mu, rewards, ids = random_batch(2)
    logp = logp.requires_grad_()
    loss, stats = iw_grpg_loss(logp, logp_mu, rewards, ids, eta, leave_one_out, normalizer)
    (grad,) = torch.autograd.grad(loss, logp)

    w = np.exp(logp.detach().numpy() - logp_mu.numpy())
    w_bar = np.minimum(w, eta)
    assert 0 < (w > eta).sum() < len(w)  # clipping really happens, but not everywhere
    assert stats["clip_frac"] == pytest.approx((w > eta).mean(), abs=1e-12)
    assert stats["log_w_mean"] == pytest.approx(np.log(w_bar).mean(), abs=1e-12)
    assert stats["staleness"] == pytest.approx(np.abs(np.log(w_bar)).mean(), abs=1e-12)
    adv = np_advantages(rewards.numpy(), ids.numpy(), w_bar, leave_one_out)
    b = len(w) if normalizer is None else normalizer
    torch.testing.assert_close(grad, torch.from_numpy(-w_bar * adv / b), **F64)
    want_loss = -(w_bar * adv * logp.detach().numpy()).sum() / b
    assert loss.item() == pytest.approx(want_loss, abs=1e-12)


def test_stats_by_hand():
    # log-ratios ln 4, ln 0.5, 0, ln 1.5 -> w = 4, 0.5, 1, 1.5; one group, R = 1, 0, 1, 0
    logp_mu = t64([-2.0, -1.0, -3.0, -1.5])
    logp = logp_mu + t64([math.log(4.0), math.log(0.5), 0.0, math.log(1.5)])
    rewards, ids = t64([1.0, 0.0, 1.0, 0.0]), torch.zeros(4, dtype=torch.long)
    _, s = iw_grpg_loss(logp, logp_mu, rewards, ids, eta=2.0)
    # w̄ = 2, 0.5, 1, 1.5: one of four clipped; |log w̄| = ln 2, ln 2, 0, ln 1.5
    # baseline Σ w̄R / 4 = (2 + 1)/4 = 0.75 -> A = 0.25, -0.75, 0.25, -0.75
    assert s["clip_frac"] == pytest.approx(0.25, abs=1e-12)
    assert s["staleness"] == pytest.approx((2 * math.log(2) + math.log(1.5)) / 4, abs=1e-12)
    # signed: (ln 2 − ln 2 + 0 + ln 1.5) / 4 = ln 1.5 / 4
    assert s["log_w_mean"] == pytest.approx(math.log(1.5) / 4, abs=1e-12)
    assert s["iw_mean"] == pytest.approx((4 + 0.5 + 1 + 1.5) / 4, abs=1e-12)
    assert s["iw_max"] == pytest.approx(4.0, abs=1e-12)
    assert s["adv_mean"] == pytest.approx(-0.25, abs=1e-12)
    assert s["adv_abs_mean"] == pytest.approx(0.5, abs=1e-12)
    # moments of w̄: (2 + 0.5 + 1 + 1.5)/4 = 1.25, (4 + 0.25 + 1 + 2.25)/4 = 1.875;
    # ESS/B = (Σ w̄)² / (B Σ w̄²) = 5² / (4 · 7.5) = 5/6
    assert s["w_bar_mean"] == pytest.approx(1.25, abs=1e-12)
    assert s["w_bar_sq_mean"] == pytest.approx(1.875, abs=1e-12)
    assert normalized_ess(s["w_bar_mean"], s["w_bar_sq_mean"]) == pytest.approx(5 / 6, abs=1e-12)

    _, s = iw_grpg_loss(logp, logp_mu, rewards, ids, eta=None)
    # no clipping: |log w| = ln 4, ln 2, 0, ln 1.5; baseline (4 + 1)/4 = 1.25
    # A = -0.25, -1.25, -0.25, -1.25 -> mean -0.75, |A| mean 0.75
    assert s["clip_frac"] == 0.0
    assert s["staleness"] == pytest.approx((3 * math.log(2) + math.log(1.5)) / 4, abs=1e-12)
    # signed: (ln 4 − ln 2 + 0 + ln 1.5) / 4 = (ln 2 + ln 1.5) / 4
    assert s["log_w_mean"] == pytest.approx((math.log(2) + math.log(1.5)) / 4, abs=1e-12)
    assert s["adv_mean"] == pytest.approx(-0.75, abs=1e-12)
    assert s["adv_abs_mean"] == pytest.approx(0.75, abs=1e-12)
    # unclipped: Σ w = 7, Σ w² = 16 + 0.25 + 1 + 2.25 = 19.5 -> ESS/B = 49 / 78
    assert normalized_ess(s["w_bar_mean"], s["w_bar_sq_mean"]) == pytest.approx(49 / 78, abs=1e-12)


def test_normalized_ess_extremes_and_micro_batch_moments():
    assert normalized_ess(1.0, 1.0) == 1.0  # on-policy: every w̄ = 1
    # one weight of 2 and three of 0 (B = 4): (Σ w̄)² / (B Σ w̄²) = 4 / (4 · 4) = 1/4 = 1/B
    assert normalized_ess(2 / 4, 4 / 4) == pytest.approx(0.25, abs=1e-15)
    assert normalized_ess(0.0, 0.0) == 0.0
    # the moments of a minibatch are the size-weighted means of its micro-batches' moments
    logp, logp_mu, rewards, ids = random_batch(4, n_groups=6, group_size=4)
    _, full = iw_grpg_loss(logp, logp_mu, rewards, ids, eta=2.0)
    w_bar = np.minimum(np.exp(logp.numpy() - logp_mu.numpy()), 2.0)
    assert normalized_ess(full["w_bar_mean"], full["w_bar_sq_mean"]) == pytest.approx(
        w_bar.sum() ** 2 / (len(w_bar) * (w_bar**2).sum()), abs=1e-12
    )
    m1 = m2 = 0.0
    for chunk in (ids.unique()[:2], ids.unique()[2:]):  # 8 and 16 of the 24 records
        idx = torch.isin(ids, chunk).nonzero().squeeze(1)
        _, s = iw_grpg_loss(logp[idx], logp_mu[idx], rewards[idx], ids[idx], eta=2.0)
        m1, m2 = m1 + s["w_bar_mean"] * len(idx) / 24, m2 + s["w_bar_sq_mean"] * len(idx) / 24
    assert (m1, m2) == (pytest.approx(full["w_bar_mean"], abs=1e-12), pytest.approx(full["w_bar_sq_mean"], abs=1e-12))


# One group of four: w = 4, 0.5, 1, 1.5 (η = 2 clips the first to 2), R = 1, 0, 1, 0.
ABL_MU = t64([-2.0, -1.0, -3.0, -1.5])
ABL_LOGP = ABL_MU + t64([math.log(4.0), math.log(0.5), 0.0, math.log(1.5)])
ABL_R, ABL_IDS = t64([1.0, 0.0, 1.0, 0.0]), torch.zeros(4, dtype=torch.long)


@pytest.mark.parametrize(
    "iw_baseline, iw_gradient, coef",
    [
        # w̄ = 2, 0.5, 1, 1.5; Eq. 4 baseline Σ w̄R / 4 = (2 + 1)/4 = 0.75 -> A = 0.25, -0.75, 0.25, -0.75
        # w̄·A = 0.5, -0.375, 0.25, -1.125
        (True, True, [0.5, -0.375, 0.25, -1.125]),
        # plain baseline (1 + 0 + 1 + 0)/4 = 0.5 -> A = 0.5, -0.5, 0.5, -0.5; w̄·A = 1, -0.25, 0.5, -0.75
        (False, True, [1.0, -0.25, 0.5, -0.75]),
        # Eq. 4 baseline, no weight in the gradient: coefficient = A = 0.25, -0.75, 0.25, -0.75
        (True, False, [0.25, -0.75, 0.25, -0.75]),
        # both off: Eq. 2 on μ's samples, the weights play no part: 0.5, -0.5, 0.5, -0.5
        (False, False, [0.5, -0.5, 0.5, -0.5]),
    ],
)
def test_ablation_switches_by_hand(iw_baseline: bool, iw_gradient: bool, coef: list[float]):
    logp = ABL_LOGP.clone().requires_grad_()
    loss, s = iw_grpg_loss(logp, ABL_MU, ABL_R, ABL_IDS, eta=2.0, iw_baseline=iw_baseline, iw_gradient=iw_gradient)
    (grad,) = torch.autograd.grad(loss, logp)
    torch.testing.assert_close(grad, -t64(coef) / 4, **F64)  # ∂loss/∂logp_n = −coef_n / B
    assert loss.item() == pytest.approx(-(t64(coef) * ABL_LOGP).sum().item() / 4, abs=1e-12)
    assert s["clip_frac"] == pytest.approx(0.25, abs=1e-12)  # the weights are measured either way


def test_ablation_switches_with_leave_one_out_by_hand():
    # w̄R = 2, 0, 1, 0. Leave-one-out Eq. 4 baselines: (0+1+0)/3, (2+1+0)/3, (2+0+0)/3, (2+0+1)/3
    #   = 1/3, 1, 2/3, 1 -> A = 2/3, -1, 1/3, -1
    # iw_baseline=False: plain leave-one-out baselines (0+1+0)/3, (1+1+0)/3, (1+0+0)/3, (1+0+1)/3
    #   = 1/3, 2/3, 1/3, 2/3 -> A = 2/3, -2/3, 2/3, -2/3
    for iw_baseline, adv in ((True, [2 / 3, -1.0, 1 / 3, -1.0]), (False, [2 / 3, -2 / 3, 2 / 3, -2 / 3])):
        for iw_gradient, weight in ((True, [2.0, 0.5, 1.0, 1.5]), (False, [1.0, 1.0, 1.0, 1.0])):
            logp = ABL_LOGP.clone().requires_grad_()
            loss, _ = iw_grpg_loss(
                logp,
                ABL_MU,
                ABL_R,
                ABL_IDS,
                eta=2.0,
                leave_one_out=True,
                iw_baseline=iw_baseline,
                iw_gradient=iw_gradient,
            )
            (grad,) = torch.autograd.grad(loss, logp)
            torch.testing.assert_close(grad, -t64(weight) * t64(adv) / 4, **F64)


def test_clipped_mass_by_hand():
    # η = 2: A = 0.25, -0.75, 0.25, -0.75 (above); w|A| = 1, 0.375, 0.25, 1.125 -> Σ = 2.75;
    # only w = 4 is clipped: (4 − 2)·0.25 = 0.5 -> 0.5 / 2.75 = 2/11
    _, s = iw_grpg_loss(ABL_LOGP, ABL_MU, ABL_R, ABL_IDS, eta=2.0)
    assert s["clipped_mass"] == pytest.approx(2 / 11, abs=1e-12)
    # η = 1.2 clips w = 4 and 1.5: w̄ = 1.2, 0.5, 1, 1.2; baseline (1.2 + 1)/4 = 0.55
    # A = 0.45, -0.55, 0.45, -0.55; w|A| = 1.8, 0.275, 0.45, 0.825 -> Σ = 3.35
    # removed: (4 − 1.2)·0.45 + (1.5 − 1.2)·0.55 = 1.26 + 0.165 = 1.425 -> 1.425 / 3.35
    _, s = iw_grpg_loss(ABL_LOGP, ABL_MU, ABL_R, ABL_IDS, eta=1.2)
    assert s["clipped_mass"] == pytest.approx(1.425 / 3.35, abs=1e-12)
    _, s = iw_grpg_loss(ABL_LOGP, ABL_MU, ABL_R, ABL_IDS, eta=None)  # nothing clipped
    assert s["clipped_mass"] == 0.0
    _, s = iw_grpg_loss(ABL_LOGP, ABL_MU, torch.ones(4, dtype=torch.float64), ABL_IDS, eta=2.0, iw_baseline=False)
    assert s["clipped_mass"] == 0.0  # equal rewards, plain baseline: every A = 0, no mass to remove


def test_huge_log_ratio_stays_finite():
    logp = torch.tensor([0.0, -1.0], requires_grad=True)
    loss, s = iw_grpg_loss(logp, torch.tensor([-500.0, -1.0]), torch.tensor([1.0, 0.0]), torch.tensor([0, 0]), eta=None)
    (grad,) = torch.autograd.grad(loss, logp)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
    assert s["iw_max"] == pytest.approx(math.exp(20.0), rel=1e-6)  # log-ratio clamped at 20


def test_micro_batches_of_whole_groups_sum_to_full_loss():
    logp, logp_mu, rewards, ids = random_batch(3, n_groups=6, group_size=4)
    b = len(logp)
    full_logp = logp.clone().requires_grad_()
    full, _ = iw_grpg_loss(full_logp, logp_mu, rewards, ids, leave_one_out=True)
    (full_grad,) = torch.autograd.grad(full, full_logp)

    micro_logp = logp.clone().requires_grad_()
    total = torch.zeros((), dtype=torch.float64)
    labels = ids.unique()
    for chunk in (labels[:1], labels[1:4], labels[4:]):  # chunks of 1, 3, 2 whole groups
        idx = torch.isin(ids, chunk).nonzero().squeeze(1)
        loss, _ = iw_grpg_loss(micro_logp[idx], logp_mu[idx], rewards[idx], ids[idx], leave_one_out=True, normalizer=b)
        total = total + loss
    (micro_grad,) = torch.autograd.grad(total, micro_logp)
    torch.testing.assert_close(total, full.detach(), **F64)
    torch.testing.assert_close(micro_grad, full_grad, **F64)


# ----------------------------------------------------------------------------- Monte Carlo
#
# Tabular softmax bandit: X contexts, K actions, π_θ(a|x) = softmax(θ[x])_a, behaviour
# μ = softmax(φ), reward table r[x, a]. Objective J(θ) = (1/X) Σ_x Σ_a π_θ(a|x) r[x, a].
#
# One draw = a group of G actions per context, sampled from μ: B = X·G records, normalizer B.
# −∇_θ loss = (1/(X·G)) Σ_n w̄_n A_n s_n with s_n = ∇_θ log π_θ(a_n|x_n), which for the
# tabular softmax is onehot(a_n) − π_θ(·|x_n) in row x_n (zero in the other rows).
# Per context, with w = π/μ and a baseline b_n that depends only on the siblings of n:
#   E[(1/G) Σ_n w̄_n (R_n − b_n) s_n] = E_μ[w̄ R s] − E_μ[w̄ s] E[b_n]   (siblings independent)
# With η = ∞: E_μ[w R s] = Σ_a π r s = ∇ E_π[r], and E_μ[w s] = Σ_a ∇π = ∇ 1 = 0, so the
# baseline term vanishes and the leave-one-out estimator is unbiased: E[−∇loss] = ∇J.
# With clipping, E_μ[w̄ s] ≠ 0 and E_μ[w̄ R s] ≠ ∇E_π[r]: biased. Eq. 4 without leave-one-out
# has n itself in its baseline: b_n = (1/G)(w_n R_n + Σ_{n'≠n} w_{n'} R_{n'}), which adds
# −(1/G) E_μ[w̄² R s] − ((G−1)/G) E_μ[w̄ s] E_μ[w̄ R]  (biased even with η = ∞).

X, K, G = 3, 4, 4
THETA = t64([[0.5, -0.3, 0.1, 0.0], [1.0, 0.0, -1.0, 0.2], [-0.5, 0.4, 0.3, -0.2]])
# behaviour logits: the ratios π/μ range over [0.27, 2.85]
PHI = t64([[-0.5, 0.5, 0.1, 0.3], [0.0, 0.2, 0.3, 0.5], [0.6, 0.0, -0.6, 0.2]])
REWARD = t64([[1.0, 0.0, 0.5, 0.0], [0.0, 1.0, 1.0, 0.0], [0.2, 1.0, 0.0, 0.7]])


def exact_gradient() -> torch.Tensor:
    theta = THETA.clone().requires_grad_()
    objective = (theta.softmax(-1) * REWARD).sum(-1).mean()
    return torch.autograd.grad(objective, theta)[0]  # [X, K]


def expected_estimate(eta: float | None, leave_one_out: bool) -> torch.Tensor:
    """E[−∇loss] in closed form (the derivation above): [X, K]."""
    pi, mu = THETA.softmax(-1), PHI.softmax(-1)  # [X, K]
    w_bar = pi / mu if eta is None else (pi / mu).clamp(max=eta)
    s = torch.eye(K, dtype=torch.float64) - pi[:, None, :]  # [X, a, K]: ∇ log π(a|x)

    def e_mu(f):  # E_{a~μ}[f(a) s(a)] per context: f [X, a] -> [X, K]
        return ((mu * f)[..., None] * s).sum(1)

    e_wr = (mu * w_bar * REWARD).sum(1, keepdim=True)  # [X, 1] E_μ[w̄ R]
    if leave_one_out:
        per_context = e_mu(w_bar * REWARD) - e_mu(w_bar) * e_wr
    else:
        per_context = e_mu(w_bar * REWARD) - e_mu(w_bar**2 * REWARD) / G - (G - 1) / G * e_mu(w_bar) * e_wr
    return per_context / X


def sample_draws(n_draws: int, seed: int):
    """n_draws independent batches of G actions per context, all sampled from μ."""
    mu = PHI.softmax(-1)
    gen = torch.Generator().manual_seed(seed)
    actions = torch.multinomial(mu, n_draws * G, replacement=True, generator=gen)  # [X, D·G]
    actions = actions.view(X, n_draws, G).permute(1, 0, 2)  # [D, X, G]
    contexts = torch.arange(X).view(1, X, 1).expand_as(actions)  # [D, X, G]
    group_ids = torch.arange(n_draws).view(-1, 1, 1) * X + contexts  # one group per (draw, x)
    return actions, contexts, group_ids


def per_draw_gradients(actions, contexts, group_ids, eta, leave_one_out) -> torch.Tensor:
    """−∇_θ loss for every draw, through iw_grpg_loss's own autograd: [D, X, K]."""
    n_draws = actions.shape[0]
    pi, mu = THETA.softmax(-1), PHI.softmax(-1)
    logp = pi.log()[contexts, actions].reshape(-1).requires_grad_()  # [D·X·G]
    logp_mu = mu.log()[contexts, actions].reshape(-1)
    rewards = REWARD[contexts, actions].reshape(-1)
    # all draws in one call: each draw's groups are separate and normalizer = X·G per draw
    loss, _ = iw_grpg_loss(
        logp, logp_mu, rewards, group_ids.reshape(-1), eta=eta, leave_one_out=leave_one_out, normalizer=X * G
    )
    (dloss_dlogp,) = torch.autograd.grad(loss, logp)
    coef = -dloss_dlogp.view(n_draws, X, G)  # w̄ A / (X·G)
    onehot_sum = torch.zeros(n_draws, X, K, dtype=torch.float64).scatter_add_(2, actions, coef)
    return onehot_sum - coef.sum(-1, keepdim=True) * pi  # Σ_n coef_n (onehot(a_n) − π(·|x_n))


def test_closed_form_per_draw_gradient_matches_autograd():
    actions, contexts, group_ids = sample_draws(3, seed=1)
    theta = THETA.clone().requires_grad_()
    logp = theta.log_softmax(-1)[contexts, actions].reshape(-1)
    logp_mu = PHI.log_softmax(-1)[contexts, actions].reshape(-1)
    loss, _ = iw_grpg_loss(
        logp,
        logp_mu,
        REWARD[contexts, actions].reshape(-1),
        group_ids.reshape(-1),
        eta=1.5,
        leave_one_out=True,
        normalizer=X * G,
    )
    (grad,) = torch.autograd.grad(loss, theta)
    closed = per_draw_gradients(actions, contexts, group_ids, 1.5, True).sum(0)
    torch.testing.assert_close(closed, -grad, **F64)


def test_analytic_expectation_of_leave_one_out_is_exact_gradient():
    torch.testing.assert_close(expected_estimate(None, True), exact_gradient(), **F64)


@pytest.mark.parametrize(
    "eta, leave_one_out, unbiased",
    [(None, True, True), (1.0, True, False), (2.0, True, False), (None, False, False)],
)
def test_monte_carlo_bias(eta: float | None, leave_one_out: bool, unbiased: bool):
    n_draws = 50_000
    grads = per_draw_gradients(*sample_draws(n_draws, seed=0), eta, leave_one_out)
    mean, stderr = grads.mean(0), grads.std(0) / math.sqrt(n_draws)  # [X, K]
    exact = exact_gradient()
    # the estimator's mean matches its closed-form expectation...
    z_expected = ((mean - expected_estimate(eta, leave_one_out)) / stderr).abs()
    assert z_expected.max() < 4.0, z_expected
    z_exact = ((mean - exact) / stderr).abs()
    if unbiased:  # ...which is the exact gradient for leave-one-out with η = ∞
        assert z_exact.max() < 4.0, z_exact
    else:  # ...and measurably not, with clipping or with n in its own baseline
        assert z_exact.max() > 8.0, z_exact


# ----------------------------------------------------------------------------- edge cases


def test_leave_one_out_with_singleton_group_raises():
    with pytest.raises(ValueError, match="at least 2 completions"):
        group_advantages(t64([1.0, 0.0, 1.0]), torch.tensor([3, 3, 8]), leave_one_out=True)


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.float32])
def test_sequence_logprobs_ignores_masked_inf_and_nan(mask_dtype):
    token_logp = torch.tensor([[-0.5, -1.0, -math.inf], [-2.0, math.nan, -0.25]])
    token_logp.requires_grad_()
    mask = torch.tensor([[1, 1, 0], [1, 0, 1]]).to(mask_dtype)
    out = sequence_logprobs(token_logp, mask)
    torch.testing.assert_close(out, torch.tensor([-1.5, -2.25]), **F32)  # -0.5-1; -2-0.25
    out.sum().backward()
    assert torch.equal(token_logp.grad, torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 1.0]]))


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0, math.nan], [4.0, -math.inf, 6.0]])
    mask = torch.tensor([[True, True, False], [True, False, True]])
    assert masked_mean(x, mask).item() == pytest.approx((1 + 2 + 4 + 6) / 4, abs=1e-6)
    torch.testing.assert_close(masked_mean(x, mask, dim=1), torch.tensor([1.5, 5.0]), **F32)
    torch.testing.assert_close(masked_mean(x, mask, dim=0), torch.tensor([2.5, 2.0, 6.0]), **F32)
