"""Tests for rapid.losses: GRPO and DAPO token-level losses (values, gradients and statistics
against hand computations and a numpy loop reference), micro-batching, and the advantage,
overlong-penalty and dynamic-sampling helpers."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rapid.losses import (
    dapo_loss,
    group_normalized_advantages,
    grpo_loss,
    overlong_penalty,
)

F64 = dict(rtol=0.0, atol=1e-12)
F32 = dict(rtol=0.0, atol=1e-6)
LN2, LN3 = math.log(2.0), math.log(3.0)
NAN, INF = math.nan, math.inf


def t64(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


# ----------------------------------------------------------------------------- references


def np_group_normalized(rewards, group_ids, eps=1e-4, scale="std") -> np.ndarray:
    """Reference: a python loop over groups; unbiased std (ddof=1), singletons get 0."""
    rewards, group_ids = np.asarray(rewards, np.float64), np.asarray(group_ids)
    out = np.zeros_like(rewards)
    for gid in set(group_ids.tolist()):
        members = [i for i in range(len(rewards)) if group_ids[i] == gid]
        if len(members) == 1:
            continue
        values = rewards[members]
        for i in members:
            out[i] = rewards[i] - values.mean()
            if scale == "std":
                out[i] /= values.std(ddof=1) + eps
    return out


def np_clipped_loss(
    logp, logp_old, logp_ref, adv, mask, eps_low, eps_high, beta, aggregation, max_tokens=None, normalizer=None
):
    """Reference: explicit loops over (n, t). Returns loss, d loss / d logp [B, T], stats.

    The clip is *active* (the token gets no PG gradient) iff A > 0 and r > 1 + eps_high, or
    A < 0 and r < 1 − eps_low; otherwise the token's objective is r·A, with derivative r·A.
    """
    b, t = logp.shape
    lengths = mask.sum(1)
    total_tokens = lengths.sum()
    loss, grad = 0.0, np.zeros((b, t))
    n_low = n_high = ratio_sum = kl_sum = 0.0
    for n in range(b):
        a = adv[n]
        if aggregation == "seq_mean_token_mean":
            coef = 1.0 / ((b if normalizer is None else normalizer) * max(lengths[n], 1))
        elif aggregation == "token_mean":
            coef = 1.0 / (total_tokens if normalizer is None else normalizer)
        else:  # constant
            coef = 1.0 / ((b if normalizer is None else normalizer) * max_tokens)
        for i in range(t):
            if not mask[n, i]:
                continue
            r = math.exp(logp[n, i] - logp_old[n, i])
            low, high = a < 0 and r < 1 - eps_low, a > 0 and r > 1 + eps_high
            n_low, n_high, ratio_sum = n_low + low, n_high + high, ratio_sum + r
            if low or high:
                pg, dpg = min(max(r, 1 - eps_low), 1 + eps_high) * a, 0.0
            else:
                pg, dpg = r * a, r * a
            k3 = dk3 = 0.0
            if logp_ref is not None:
                d = logp_ref[n, i] - logp[n, i]
                k3, dk3 = math.exp(d) - d - 1, 1 - math.exp(d)
                kl_sum += k3
            loss -= coef * (pg - beta * k3)
            grad[n, i] = -coef * (dpg - beta * dk3)
    stats = dict(
        clip_frac_low=n_low / total_tokens,
        clip_frac_high=n_high / total_tokens,
        clip_frac=(n_low + n_high) / total_tokens,
        ratio_mean=ratio_sum / total_tokens,
        kl_mean=kl_sum / total_tokens,
    )
    return loss, grad, stats


def random_batch(seed: int, b: int = 8, t: int = 7):
    """Unequal lengths (1..t), ratios in ~[0.4, 2.5], both signs of A, garbage where masked."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, t + 1, (b,), generator=gen)
    lengths[0], lengths[1] = 1, t  # the extremes, so that the aggregations surely differ
    mask = torch.arange(t)[None, :] < lengths[:, None]  # [B, T]
    logp = -3.0 * torch.rand(b, t, generator=gen, dtype=torch.float64)
    logp_old = logp + 0.4 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    logp_ref = logp + 0.5 * torch.randn(b, t, generator=gen, dtype=torch.float64)
    signs = 1.0 - 2.0 * (torch.arange(b) % 2)  # +, −, +, ...: both clip sides get exercised
    adv = signs * (0.1 + torch.rand(b, generator=gen, dtype=torch.float64))
    logp = torch.where(mask, logp, NAN)
    logp_old = torch.where(mask, logp_old, -INF)
    logp_ref = torch.where(mask, logp_ref, INF)
    return logp, logp_old, logp_ref, adv, mask


def np_args(logp, logp_old, logp_ref, adv, mask):
    ref = None if logp_ref is None else logp_ref.numpy()
    return logp.detach().numpy(), logp_old.numpy(), ref, adv.numpy(), mask.numpy()


# ----------------------------------------------------------------------------- hand batch
#
# B = 2 completions, T = 3; completion 1 has 2 tokens (position [1, 2] is padding, filled
# with nan / -inf / nan). A = +1, −2. The free variable is logp; logp_old = logp − ln r and
# logp_ref = logp + d are built from chosen ratios r and log(π_ref/π_θ) = d:
#   r = [[1.5, 0.5, r02], [0.5, 1.5, pad]]      d = [[ln 2, 0, −ln 2], [ln 3, ln 2, pad]]

LOGP = [[-1.0, -2.0, -0.5], [-1.5, -0.3, NAN]]
D = [[LN2, 0.0, -LN2], [LN3, LN2, 0.0]]
ADV = t64([1.0, -2.0])
MASK = torch.tensor([[True, True, True], [True, True, False]])


def hand_batch(r02: float):
    logp = t64(LOGP)
    ratios = t64([[1.5, 0.5, r02], [0.5, 1.5, 1.0]])
    logp_old = torch.where(MASK, logp - ratios.log(), -INF)
    logp_ref = torch.where(MASK, logp + t64(D), NAN)
    return logp.requires_grad_(), logp_old, logp_ref


def padded(rows) -> torch.Tensor:
    """[[3 values], [2 values]] -> [2, 3] with 0 at the padding."""
    return t64([rows[0], rows[1] + [0.0]])


# GRPO, ε = 0.2, r02 = 1.1. PG part min(r·A, clip(r, 0.8, 1.2)·A) and its d/dlogp:
#   seq 0 (A = +1): r 1.5 → min(1.5, 1.2) = 1.2 clipped (grad 0); r 0.5 → min(0.5, 0.8) = 0.5
#                   (A > 0: low side not clipped, grad r·A = 0.5); r 1.1 → 1.1 (grad 1.1)
#   seq 1 (A = −2): r 0.5 → min(−1.0, −1.6) = −1.6 clipped (grad 0);
#                   r 1.5 → min(−3.0, −2.4) = −3.0 (A < 0: high side not clipped,
#                   grad r·A = −3.0)
PG = [[1.2, 0.5, 1.1], [-1.6, -3.0]]
DPG = [[0.0, 0.5, 1.1], [0.0, -3.0]]
# k3 = e^d − d − 1 and dk3/dlogp = 1 − e^d:
#   d = ln 2 → 1 − ln 2, −1;    d = 0 → 0, 0;
#   d = −ln 2 → ln 2 − 0.5, 0.5;  d = ln 3 → 2 − ln 3, −2
K3 = [[1 - LN2, 0.0, LN2 - 0.5], [2 - LN3, 1 - LN2]]
DK3 = [[-1.0, 0.0, 0.5], [-2.0, -1.0]]
# the weight of a token of sequence n in the loss, per aggregation (lengths 3 and 2, B = 2):
#   seq_mean_token_mean 1/(B·T_n) = 1/6, 1/4;  token_mean 1/5;  constant (max_tokens 4) 1/8
COEF = {"seq_mean_token_mean": (1 / 6, 1 / 4), "token_mean": (1 / 5, 1 / 5), "constant": (1 / 8, 1 / 8)}
# Without KL: seq-mean −(2.8/3 − 4.6/2)/2 = 41/60; token-mean −(2.8 − 4.6)/5 = 9/25;
# constant −(2.8 − 4.6)/8 = 9/40: different numbers for the same tokens.
NO_KL_LOSS = {"seq_mean_token_mean": 41 / 60, "token_mean": 9 / 25, "constant": 9 / 40}


@pytest.mark.parametrize("aggregation", list(COEF))
@pytest.mark.parametrize("beta", [0.0, 0.04, 0.5])
def test_grpo_loss_and_gradient_by_hand(aggregation: str, beta: float):
    logp, logp_old, logp_ref = hand_batch(r02=1.1)
    loss, stats = grpo_loss(
        logp, logp_old, logp_ref, ADV, MASK, clip_eps=0.2, kl_coef=beta, aggregation=aggregation, max_tokens=4
    )
    (grad,) = torch.autograd.grad(loss, logp)
    coef = COEF[aggregation]
    want_loss = -sum(c * sum(p - beta * k for p, k in zip(pg, k3)) for c, pg, k3 in zip(coef, PG, K3))
    want_grad = padded([[-c * (g - beta * dk) for g, dk in zip(dpg, dk3)] for c, dpg, dk3 in zip(coef, DPG, DK3)])
    assert loss.item() == pytest.approx(want_loss, abs=1e-12)
    if beta == 0.0:
        assert loss.item() == pytest.approx(NO_KL_LOSS[aggregation], abs=1e-12)
    torch.testing.assert_close(grad, want_grad, **F64)  # incl. exactly 0 at the padding
    assert grad[1, 2].item() == 0.0

    # one of five tokens clipped on each side; r mean (1.5 + 0.5 + 1.1 + 0.5 + 1.5)/5 = 1.02;
    # k3 mean (1 − ln2 + 0 + ln2 − 0.5 + 2 − ln3 + 1 − ln2)/5 = (3.5 − ln 6)/5 (any β)
    assert stats["clip_frac_low"] == pytest.approx(0.2, abs=1e-12)
    assert stats["clip_frac_high"] == pytest.approx(0.2, abs=1e-12)
    assert stats["clip_frac"] == pytest.approx(0.4, abs=1e-12)
    assert stats["ratio_mean"] == pytest.approx(1.02, abs=1e-12)
    assert stats["kl_mean"] == pytest.approx((3.5 - math.log(6.0)) / 5, abs=1e-12)
    assert all(isinstance(v, float) for v in stats.values())


@pytest.mark.parametrize("aggregation", list(COEF))
def test_grpo_without_reference_has_no_kl_term(aggregation: str):
    logp, logp_old, _ = hand_batch(r02=1.1)
    loss, stats = grpo_loss(logp, logp_old, None, ADV, MASK, kl_coef=0.04, aggregation=aggregation, max_tokens=4)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(NO_KL_LOSS[aggregation], abs=1e-12)
    coef = COEF[aggregation]
    torch.testing.assert_close(grad, padded([[-c * g for g in dpg] for c, dpg in zip(coef, DPG)]), **F64)
    assert stats["kl_mean"] == 0.0


def test_grpo_float32_and_bfloat16_inputs():
    logp, logp_old, logp_ref = hand_batch(r02=1.1)
    want = -sum(c * sum(p - 0.04 * k for p, k in zip(pg, k3)) for c, pg, k3 in zip(COEF["seq_mean_token_mean"], PG, K3))
    lp32 = logp.detach().float().requires_grad_()
    loss, _ = grpo_loss(lp32, logp_old.float(), logp_ref.float(), ADV.float(), MASK)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(want, abs=1e-6)
    (grad,) = torch.autograd.grad(loss, lp32)
    assert grad.dtype == torch.float32 and torch.isfinite(grad).all()
    loss16, _ = grpo_loss(logp.detach().bfloat16(), logp_old.bfloat16(), None, ADV, MASK)
    assert loss16.dtype == torch.float32  # computed in float32, not bf16


# DAPO, ε_low = 0.2, ε_high = 0.28, r02 = 1.25 (inside the raised clip 1.28, outside GRPO's 1.2):
#   seq 0 (A = +1): r 1.5 → min(1.5, 1.28) = 1.28 clipped; r 0.5 → 0.5;
#                   r 1.25 → 1.25 (grad 1.25)
#   seq 1 (A = −2): r 0.5 → min(−1.0, −1.6) = −1.6 clipped;
#                   r 1.5 → min(−3.0, −2.56) = −3.0
#   loss = −(1.28 + 0.5 + 1.25 − 1.6 − 3.0)/5 = 1.57/5 = 0.314
#   d loss/d logp = −(1/5)·[0, 0.5, 1.25 | 0, −3.0] = [0, −0.1, −0.25 | 0, 0.6]


def test_dapo_loss_and_gradient_by_hand():
    logp, logp_old, _ = hand_batch(r02=1.25)
    loss, stats = dapo_loss(logp, logp_old, ADV, MASK, clip_low=0.2, clip_high=0.28)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(0.314, abs=1e-12)
    torch.testing.assert_close(grad, padded([[0.0, -0.1, -0.25], [0.0, 0.6]]), **F64)
    # r mean (1.5 + 0.5 + 1.25 + 0.5 + 1.5)/5 = 1.05
    assert stats == pytest.approx(
        dict(clip_frac_low=0.2, clip_frac_high=0.2, clip_frac=0.4, ratio_mean=1.05), abs=1e-12
    )

    # the same tokens under GRPO's symmetric ε = 0.2: r 1.25 is clipped (1.2), no gradient
    loss, stats = grpo_loss(logp, logp_old, None, ADV, MASK, clip_eps=0.2, aggregation="token_mean")
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(-(1.2 + 0.5 + 1.2 - 1.6 - 3.0) / 5, abs=1e-12)
    torch.testing.assert_close(grad, padded([[0.0, -0.1, 0.0], [0.0, 0.6]]), **F64)
    assert stats["clip_frac_high"] == pytest.approx(0.4, abs=1e-12)


def test_dapo_normalizer_by_hand():
    logp, logp_old, _ = hand_batch(r02=1.25)
    loss, _ = dapo_loss(logp, logp_old, ADV, MASK, normalizer=10)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(1.57 / 10, abs=1e-12)
    torch.testing.assert_close(grad, padded([[0.0, -0.05, -0.125], [0.0, 0.3]]), **F64)


# ----------------------------------------------------------------------------- numpy reference


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("aggregation", list(COEF))
def test_grpo_matches_numpy_loop(seed: int, aggregation: str):
    logp, logp_old, logp_ref, adv, mask = random_batch(seed)
    logp.requires_grad_()
    loss, stats = grpo_loss(
        logp, logp_old, logp_ref, adv, mask, clip_eps=0.2, kl_coef=0.1, aggregation=aggregation, max_tokens=9
    )
    (grad,) = torch.autograd.grad(loss, logp)
    want_loss, want_grad, want_stats = np_clipped_loss(
        *np_args(logp, logp_old, logp_ref, adv, mask), 0.2, 0.2, 0.1, aggregation, 9
    )
    assert 0 < stats["clip_frac_low"] and 0 < stats["clip_frac_high"] and stats["clip_frac"] < 0.8
    assert loss.item() == pytest.approx(want_loss, abs=1e-12)
    torch.testing.assert_close(grad, torch.from_numpy(want_grad), **F64)
    assert stats == pytest.approx(want_stats, abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dapo_matches_numpy_loop(seed: int):
    logp, logp_old, _, adv, mask = random_batch(seed)
    logp.requires_grad_()
    loss, stats = dapo_loss(logp, logp_old, adv, mask, clip_low=0.2, clip_high=0.28)
    (grad,) = torch.autograd.grad(loss, logp)
    want_loss, want_grad, want_stats = np_clipped_loss(
        *np_args(logp, logp_old, None, adv, mask), 0.2, 0.28, 0.0, "token_mean"
    )
    assert loss.item() == pytest.approx(want_loss, abs=1e-12)
    torch.testing.assert_close(grad, torch.from_numpy(want_grad), **F64)
    del want_stats["kl_mean"]
    assert stats == pytest.approx(want_stats, abs=1e-12)


def test_aggregations_differ_on_unequal_lengths():
    logp, logp_old, logp_ref, adv, mask = random_batch(0)
    losses = [grpo_loss(logp, logp_old, logp_ref, adv, mask, aggregation=a, max_tokens=7)[0].item() for a in COEF]
    assert min(abs(x - y) for i, x in enumerate(losses) for y in losses[i + 1 :]) > 1e-3


# ----------------------------------------------------------------------------- on-policy GRPO


@pytest.mark.parametrize("with_reference", [False, True])
def test_on_policy_grpo_is_group_normalized_pg(with_reference: bool):
    # r = 1 everywhere and β = 0: the objective is A_n per token, so for the default
    # aggregation d loss / d logp_nt = −A_n / (B·T_n) on completion tokens, 0 elsewhere.
    logp, _, logp_ref, _, mask = random_batch(4, b=8)
    ids = torch.tensor([3, 1, 3, 1, 3, 1, 3, 1])
    rewards = t64([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0])
    adv = group_normalized_advantages(rewards, ids)
    logp.requires_grad_()
    loss, stats = grpo_loss(logp, logp.detach().clone(), logp_ref if with_reference else None, adv, mask, kl_coef=0.0)
    (grad,) = torch.autograd.grad(loss, logp)
    a = np_group_normalized(rewards.numpy(), ids.numpy())
    lengths = mask.sum(1).numpy()
    want = np.where(mask.numpy(), (-a / (len(a) * lengths))[:, None], 0.0)
    torch.testing.assert_close(grad, torch.from_numpy(want), **F64)
    assert loss.item() == pytest.approx(-a.mean(), abs=1e-12)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


# ----------------------------------------------------------------------------- micro-batching


CHUNKS = (slice(0, 3), slice(3, 4), slice(4, 8))


@pytest.mark.parametrize("aggregation", list(COEF))
def test_grpo_micro_batches_sum_to_full_loss(aggregation: str):
    logp, logp_old, logp_ref, adv, mask = random_batch(5)
    kwargs = dict(kl_coef=0.1, aggregation=aggregation, max_tokens=9)
    full_logp = logp.clone().requires_grad_()
    full, _ = grpo_loss(full_logp, logp_old, logp_ref, adv, mask, **kwargs)
    (full_grad,) = torch.autograd.grad(full, full_logp)

    normalizer = int(mask.sum()) if aggregation == "token_mean" else len(adv)
    micro_logp = logp.clone().requires_grad_()
    total = sum(
        grpo_loss(micro_logp[s], logp_old[s], logp_ref[s], adv[s], mask[s], normalizer=normalizer, **kwargs)[0]
        for s in CHUNKS
    )
    (micro_grad,) = torch.autograd.grad(total, micro_logp)
    torch.testing.assert_close(total, full.detach(), **F64)
    torch.testing.assert_close(micro_grad, full_grad, **F64)
    # and without the normalizer each chunk normalises by itself: a different (wrong) sum
    alone = sum(grpo_loss(logp[s], logp_old[s], logp_ref[s], adv[s], mask[s], **kwargs)[0] for s in CHUNKS)
    assert abs(alone.item() - full.item()) > 1e-3


def test_dapo_micro_batches_sum_to_full_loss():
    logp, logp_old, _, adv, mask = random_batch(6)
    full_logp = logp.clone().requires_grad_()
    full, _ = dapo_loss(full_logp, logp_old, adv, mask)
    (full_grad,) = torch.autograd.grad(full, full_logp)
    micro_logp = logp.clone().requires_grad_()
    total = sum(dapo_loss(micro_logp[s], logp_old[s], adv[s], mask[s], normalizer=int(mask.sum()))[0] for s in CHUNKS)
    (micro_grad,) = torch.autograd.grad(total, micro_logp)
    torch.testing.assert_close(total, full.detach(), **F64)
    torch.testing.assert_close(micro_grad, full_grad, **F64)


# ----------------------------------------------------------------------------- masking


@pytest.mark.parametrize("loss_name", ["grpo", "dapo"])
def test_masked_garbage_contributes_nothing(loss_name: str):
    logp, logp_old, logp_ref, adv, mask = random_batch(7)  # nan / -inf / +inf where masked
    clean = [torch.where(mask, x, -1.0) for x in (logp, logp_old, logp_ref)]

    def run(lp, lo, lr):
        lp = lp.clone().requires_grad_()
        if loss_name == "grpo":
            loss, stats = grpo_loss(lp, lo, lr, adv, mask, kl_coef=0.1)
        else:
            loss, stats = dapo_loss(lp, lo, adv, mask)
        return loss, torch.autograd.grad(loss, lp)[0], stats

    loss, grad, stats = run(logp, logp_old, logp_ref)
    want_loss, want_grad, want_stats = run(*clean)
    assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in stats.values())
    torch.testing.assert_close(loss, want_loss, **F64)
    torch.testing.assert_close(grad, want_grad, **F64)
    assert stats == want_stats
    assert (grad[~mask] == 0).all()


def test_fully_masked_completion_counts_in_seq_mean_but_adds_nothing():
    # row 1 has no completion token: it adds 0 and B = 2 still divides (as TRL does)
    logp = t64([[-1.0, -2.0], [NAN, NAN]]).requires_grad_()
    mask = torch.tensor([[True, True], [False, False]])
    adv = t64([1.5, -4.0])
    loss, stats = grpo_loss(logp, logp.detach().clone(), None, adv, mask)
    (grad,) = torch.autograd.grad(loss, logp)
    assert loss.item() == pytest.approx(-1.5 / 2, abs=1e-12)  # −(mean(1.5, 1.5) + 0)/2
    torch.testing.assert_close(grad, t64([[-1.5 / 4, -1.5 / 4], [0.0, 0.0]]), **F64)
    assert stats["ratio_mean"] == 1.0


def test_huge_log_ratio_stays_finite():
    logp = torch.tensor([[0.0, -1.0]], requires_grad=True)
    loss, stats = grpo_loss(
        logp,
        torch.tensor([[-500.0, -1.0]]),
        torch.tensor([[-500.0, -1.0]]),
        torch.tensor([-1.0]),
        torch.ones(1, 2, dtype=torch.bool),
    )
    (grad,) = torch.autograd.grad(loss, logp)
    assert math.isfinite(loss.item()) and torch.isfinite(grad).all()
    assert all(math.isfinite(v) for v in stats.values())


def test_errors_name_the_fix():
    logp, logp_old, logp_ref = hand_batch(1.1)
    with pytest.raises(ValueError, match="max_tokens"):
        grpo_loss(logp, logp_old, logp_ref, ADV, MASK, aggregation="constant")
    with pytest.raises(ValueError, match="aggregation must be one of"):
        grpo_loss(logp, logp_old, logp_ref, ADV, MASK, aggregation="sum")
    with pytest.raises(ValueError, match="logp_old must have the shape"):
        grpo_loss(logp, logp_old[:, :2], logp_ref, ADV, MASK)
    with pytest.raises(ValueError, match="advantages must have shape"):
        dapo_loss(logp, logp_old, ADV[:1], MASK)
    with pytest.raises(ValueError, match="scale must be"):
        group_normalized_advantages(ADV, torch.tensor([0, 0]), scale="mad")
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(torch.tensor([3]), max_len=10, cache_len=11)


# ----------------------------------------------------------------------------- helpers

IDS = torch.tensor([7, 3, 7, 3, 7, 3, 11, 11, 5])
REWARDS = t64([1.0, 0.0, 0.0, 0.0, 2.0, 3.0, 0.5, 0.5, 4.0])


def test_group_normalized_advantages_by_hand():
    # group 7 (positions 0, 2, 4): R = 1, 0, 2; mean 1; unbiased var (0 + 1 + 1)/2 = 1 -> std 1
    #   (the population std would be sqrt(2/3) ≈ 0.816: a different answer)
    # group 3 (positions 1, 3, 5): R = 0, 0, 3; mean 1; var (1 + 1 + 4)/2 = 3 -> std √3
    # group 11: R = 0.5, 0.5 -> std 0, A = 0/(0 + eps) = 0; group 5: one member -> 0
    s7, s3 = 1.0 + 1e-4, math.sqrt(3.0) + 1e-4
    expected = t64([0.0, -1 / s3, -1 / s7, -1 / s3, 1 / s7, 2 / s3, 0.0, 0.0, 0.0])
    torch.testing.assert_close(group_normalized_advantages(REWARDS, IDS), expected, **F64)
    centred = t64([0.0, -1.0, -1.0, -1.0, 1.0, 2.0, 0.0, 0.0, 0.0])  # Dr. GRPO: R − mean only
    got = group_normalized_advantages(REWARDS, IDS, scale=None)
    torch.testing.assert_close(got, centred, **F64)
    assert not group_normalized_advantages(REWARDS.clone().requires_grad_(), IDS).requires_grad


def test_group_normalized_advantages_match_numpy_loop_randomized():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        sizes = torch.randint(1, 7, (int(torch.randint(1, 6, (1,), generator=gen)),), generator=gen)
        labels = torch.randperm(2000, generator=gen)[: len(sizes)] - 1000  # distinct, arbitrary
        ids = torch.repeat_interleave(labels, sizes)
        ids = ids[torch.randperm(len(ids), generator=gen)]
        rewards = torch.randint(0, 3, (len(ids),), generator=gen).double()
        for scale in ("std", None):
            got = group_normalized_advantages(rewards, ids, eps=1e-3, scale=scale)
            want = np_group_normalized(rewards.numpy(), ids.numpy(), 1e-3, scale)
            torch.testing.assert_close(got, torch.from_numpy(want), **F64)


def test_overlong_penalty_band_edges():
    # L_max = 100, L_cache = 20: free up to 80, then −(L − 80)/20, −1 beyond 100
    lengths = torch.tensor([0, 80, 81, 90, 99, 100, 101, 500])
    want = t64([0.0, 0.0, -0.05, -0.5, -0.95, -1.0, -1.0, -1.0])
    got = overlong_penalty(lengths, max_len=100, cache_len=20)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, **F32)
    torch.testing.assert_close(overlong_penalty(lengths.double(), 100, 20, penalty=0.5), want * 0.5, **F64)
    # no soft band: a step after L_max
    torch.testing.assert_close(
        overlong_penalty(torch.tensor([99, 100, 101]), 100, 0), torch.tensor([0.0, 0.0, -1.0]), **F32
    )
