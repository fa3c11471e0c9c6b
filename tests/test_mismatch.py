"""Tests for rapid.mismatch: the truncated correction between the trainer's μ and the engine's
μ_engine, against hand computations, and how it composes with IW-GRPG and DAPO."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from rapid.iw_grpg import iw_grpg_loss, sequence_logprobs
from rapid.losses import dapo_loss
from rapid.mismatch import scale_gradient, truncated_is_factors

F64 = dict(rtol=0.0, atol=1e-12)

# Two completions, three positions, the last of row 1 is padding (garbage there must not matter).
# log ρ = log μ_trainer − log μ_engine: row 0: ln 3, ln 0.5, 0;  row 1: ln 1.5, ln 2.5, (masked)
ENGINE = torch.tensor([[-1.0, -2.0, -0.5], [-3.0, -0.25, -math.inf]], dtype=torch.float64)
TRAINER = ENGINE + torch.tensor(
    [[math.log(3), math.log(0.5), 0.0], [math.log(1.5), math.log(2.5), math.nan]], dtype=torch.float64
)
MASK = torch.tensor([[True, True, True], [True, True, False]])


def test_token_level_by_hand():
    factors, stats = truncated_is_factors(TRAINER, ENGINE, MASK, "token", cap=2.0)
    # min(ρ, 2): 2, 0.5, 1 | 1.5, 2, (1 on padding)
    torch.testing.assert_close(factors, torch.tensor([[2.0, 0.5, 1.0], [1.5, 2.0, 1.0]], dtype=torch.float64), **F64)
    assert stats["ratio_mean"] == pytest.approx((3 + 0.5 + 1 + 1.5 + 2.5) / 5, abs=1e-12)  # 1.7
    assert stats["trunc_frac"] == pytest.approx(2 / 5, abs=1e-12)  # ρ = 3 and 2.5


def test_sequence_level_by_hand():
    factors, stats = truncated_is_factors(TRAINER, ENGINE, MASK, "sequence", cap=2.0)
    # ρ_0 = 3 · 0.5 · 1 = 1.5 (kept), ρ_1 = 1.5 · 2.5 = 3.75 (truncated to 2)
    torch.testing.assert_close(factors, torch.tensor([[1.5, 1.5, 1.5], [2.0, 2.0, 1.0]], dtype=torch.float64), **F64)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 3.75) / 2, abs=1e-12)
    assert stats["trunc_frac"] == pytest.approx(0.5, abs=1e-12)
    _, stats = truncated_is_factors(TRAINER, ENGINE, MASK, "sequence", cap=4.0)
    assert stats["trunc_frac"] == 0.0


def test_none_is_identity_and_errors_name_the_fix():
    factors, stats = truncated_is_factors(TRAINER, ENGINE, MASK, "none", cap=2.0)
    assert torch.all(factors == 1) and stats == {"ratio_mean": 1.0, "trunc_frac": 0.0}
    with pytest.raises(ValueError, match="level"):
        truncated_is_factors(TRAINER, ENGINE, MASK, "seq", cap=2.0)
    with pytest.raises(ValueError, match="cap"):
        truncated_is_factors(TRAINER, ENGINE, MASK, "token", cap=0.0)
    with pytest.raises(ValueError, match="shape"):
        truncated_is_factors(TRAINER, ENGINE[:, :2], MASK, "token", cap=2.0)


def test_identical_distributions_give_factor_one():
    """μ_trainer = μ_engine (fp32, or behavior_logprobs=sampler): every ρ is 1, nothing is truncated."""
    for level in ("token", "sequence"):
        factors, stats = truncated_is_factors(ENGINE, ENGINE.clone(), MASK, level, cap=1.0)
        assert torch.all(factors == 1) and stats == {"ratio_mean": 1.0, "trunc_frac": 0.0}


def test_scale_gradient_keeps_values_and_scales_gradients():
    x = torch.tensor([[0.3, -1.2], [2.0, -0.7]], dtype=torch.float64, requires_grad=True)
    f = torch.tensor([[2.0, 0.5], [1.0, 0.0]], dtype=torch.float64)
    y = scale_gradient(x, f)
    assert torch.equal(y.detach(), x.detach())  # bit-identical values
    c = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    (grad,) = torch.autograd.grad((y * c).sum(), x)
    torch.testing.assert_close(grad, f * c, **F64)


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_composes_with_iw_grpg_as_documented(level):
    """∂loss/∂log π(y_nt) = −w̄_n A_n f_nt / B, with f the truncated factors; the loss value and the
    IW-GRPG statistics are those without the correction."""
    g = torch.Generator().manual_seed(0)
    B, T, eta, cap = 6, 5, 2.0, 1.5
    mask = torch.ones(B, T, dtype=torch.bool)
    mask[1, 3:] = mask[4, 2:] = False
    engine = -3 * torch.rand(B, T, generator=g, dtype=torch.float64)
    trainer = engine + 0.4 * torch.randn(B, T, generator=g, dtype=torch.float64)  # log μ (recomputed)
    token_logp = (trainer + 0.3 * torch.randn(B, T, generator=g, dtype=torch.float64)).requires_grad_()
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    ids = torch.tensor([0, 0, 0, 1, 1, 1])

    factors, _ = truncated_is_factors(trainer, engine, mask, level, cap)
    loss, stats = iw_grpg_loss(
        sequence_logprobs(scale_gradient(token_logp, factors), mask),
        sequence_logprobs(trainer, mask),
        rewards,
        ids,
        eta=eta,
    )
    (grad,) = torch.autograd.grad(loss, token_logp)
    plain, plain_stats = iw_grpg_loss(
        sequence_logprobs(token_logp, mask), sequence_logprobs(trainer, mask), rewards, ids, eta=eta
    )
    assert loss.item() == pytest.approx(plain.item(), abs=1e-12) and stats == plain_stats

    # independent numpy computation
    m, tl, tr, en = mask.numpy(), token_logp.detach().numpy(), trainer.numpy(), engine.numpy()
    log_w = np.where(m, tl - tr, 0).sum(1)
    w_bar = np.minimum(np.exp(log_w), eta)
    r = rewards.numpy()
    adv = np.array([r[n] - np.mean([w_bar[k] * r[k] for k in range(B) if ids[k] == ids[n]]) for n in range(B)])
    log_rho = np.where(m, tr - en, 0)
    f = np.minimum(np.exp(log_rho), cap) if level == "token" else np.minimum(np.exp(log_rho.sum(1)), cap)[:, None]
    want = np.where(m, -(w_bar * adv)[:, None] * f / B, 0)
    torch.testing.assert_close(grad, torch.from_numpy(want), **F64)
    assert np.any((f < cap) & (f != 1)) and np.any(np.broadcast_to(f, m.shape)[m] == cap)  # both regimes occur


def test_composes_with_dapo_per_token():
    """DAPO / GRPO: each token's gradient is multiplied by its factor."""
    g = torch.Generator().manual_seed(1)
    B, T = 4, 3
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    logp_old = -2 * torch.rand(B, T, generator=g, dtype=torch.float64)
    engine = logp_old + 0.5 * torch.randn(B, T, generator=g, dtype=torch.float64)
    adv = torch.tensor([1.0, -0.5, 0.7, -1.0], dtype=torch.float64)
    base = logp_old + 0.05 * torch.randn(B, T, generator=g, dtype=torch.float64)
    factors, _ = truncated_is_factors(logp_old, engine, mask, "token", cap=2.0)
    grads = []
    for f in (None, factors):
        x = base.clone().requires_grad_()
        loss, _ = dapo_loss(x if f is None else scale_gradient(x, f), logp_old, adv, mask)
        grads.append(torch.autograd.grad(loss, x)[0])
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0] * factors, **F64)
