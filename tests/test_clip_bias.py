"""tools/clip_bias.py: its exact enumeration against the closed-form expectation and the Monte Carlo
draws of tests/test_iw_grpg.py (the same bandit), and its reported numbers where they are known by hand."""

from __future__ import annotations

import csv
import itertools
import math
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tests.test_iw_grpg import PHI, REWARD, THETA, G, expected_estimate, per_draw_gradients, sample_draws
from tests.test_train import REPO
from tools import clip_bias


def test_multisets_cover_every_ordered_group():
    members, coef = clip_bias.multisets(4, 3)
    assert len(members) == math.comb(4 + 3 - 1, 3) == 20
    assert coef.sum().item() == 4**3  # every ordered group counted once
    # {0, 0, 1}: 3 orderings; {0, 1, 2}: 6; {2, 2, 2}: 1
    as_key = {tuple(m.tolist()): c.item() for m, c in zip(members, coef)}
    assert (as_key[(0, 0, 1)], as_key[(0, 1, 2)], as_key[(2, 2, 2)]) == (3, 6, 1)


def test_exact_gradient_is_autograd_of_j():
    theta = THETA.clone().requires_grad_()
    (grad,) = torch.autograd.grad((theta.softmax(-1) * REWARD).sum(-1).mean(), theta)
    torch.testing.assert_close(clip_bias.exact_gradient(THETA, REWARD), grad, rtol=0, atol=1e-15)


@pytest.mark.parametrize("eta, leave_one_out", [(None, True), (2.0, True), (1.0, True), (None, False), (2.0, False)])
def test_enumerated_mean_is_the_closed_form_expectation(eta, leave_one_out):
    mean, *_ = clip_bias.estimator_moments(THETA, PHI, REWARD, G, eta, leave_one_out)
    torch.testing.assert_close(mean, expected_estimate(eta, leave_one_out), rtol=0, atol=1e-14)


@pytest.mark.parametrize("leave_one_out", [False, True])
def test_enumerated_variance_matches_monte_carlo(leave_one_out):
    n_draws = 40_000
    grads = per_draw_gradients(*sample_draws(n_draws, seed=3), 2.0, leave_one_out)  # [D, X, K]
    mc_mean = grads.mean(0)
    mc_var = ((grads - mc_mean) ** 2).sum((1, 2))  # [D] |ĝ − mean|²
    mean, var, *_ = clip_bias.estimator_moments(THETA, PHI, REWARD, G, 2.0, leave_one_out)
    stderr = mc_var.std().item() / math.sqrt(n_draws)
    assert abs(mc_var.mean().item() - var) < 4 * stderr, (mc_var.mean().item(), var, stderr)
    assert stderr < 0.03 * var  # the check resolves a 12% error


def test_known_values():
    theta0, reward = clip_bias.make_bandit(3, 5, seed=1)
    theta_k = clip_bias.stale_thetas(theta0, reward, lr=16.0, ks=[0, 6])
    torch.testing.assert_close(theta_k[0], theta0, rtol=0, atol=0)
    # on-policy, Eq. 4 baseline: E ĝ = (G−1)/G ∇J exactly -> relative bias 1/G, cosine 1
    for g in (2, 4):
        m = clip_bias.moments(theta0, theta0, reward, g, 2.0, False, True, True)
        assert m["rel_bias"] == pytest.approx(1 / g, abs=1e-12) and m["cos"] == pytest.approx(1.0, abs=1e-12)
        assert m["clip_mass"] == 0.0
    # leave-one-out without truncation is unbiased however stale μ is, with or without IW in the baseline
    for iw_baseline in (True, False):
        m = clip_bias.moments(theta_k[6], theta0, reward, 4, None, True, iw_baseline, True)
        assert m["rel_bias"] < 1e-12 and m["clip_mass"] == 0.0
    # ...and not without the weight in the gradient, nor with a tight truncation
    stale = clip_bias.staleness(theta_k[6], theta0, [1.5])
    assert stale["abs_log_w"] > 0.3 and stale["p_clip_1.5"] > 0
    assert clip_bias.moments(theta_k[6], theta0, reward, 4, None, True, True, False)["rel_bias"] > 0.05
    assert clip_bias.moments(theta_k[6], theta0, reward, 4, 1.5, True, True, True)["rel_bias"] > 0.05
    # the clip mass is the share by hand for one group: μ uniform over 2 actions, π = (0.8, 0.2), G = 2
    theta0 = torch.zeros(1, 2, dtype=torch.float64)
    theta = torch.tensor([[math.log(0.8), math.log(0.2)]], dtype=torch.float64)
    reward = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    # w = 1.6, 0.4; η = 1.5 clips 1.6. Groups (prob 1/4 each): {0,0}: A = R − w̄R = 1 − 1.5 = −0.5 both;
    # {1,1}: A = 0; {0,1} twice: baseline (1.5·1 + 0)/2 = 0.75 -> A = 0.25, −0.75.
    # Σ(w − w̄)|A|: {0,0}: 2·0.1·0.5 = 0.1; {0,1}: 0.1·0.25 = 0.025 -> E = (0.1 + 2·0.025)/4 = 0.0375
    # Σ w|A|: {0,0}: 2·1.6·0.5 = 1.6; {0,1}: 1.6·0.25 + 0.4·0.75 = 0.7 -> E = (1.6 + 1.4)/4 = 0.75
    m = clip_bias.moments(theta, theta0, reward, 2, 1.5, False, True, True)
    assert m["clip_mass"] == pytest.approx(0.0375 / 0.75, abs=1e-12)


def test_command_line_writes_table_csv_and_figure(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "clip_bias.py"),
            "--contexts",
            "2",
            "--actions",
            "3",
            "--ks",
            "0",
            "2",
            "--etas",
            "2",
            "none",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = (tmp_path / "clip_bias.md").read_text()
    assert "CPU: " in text and "vector extensions" in text and "| none |" in text
    rows = list(csv.DictReader((tmp_path / "clip_bias.csv").open()))
    assert len(rows) == 2 * 2 * 2 * 4  # k x eta x leave-one-out x switches
    on_policy = [r for r in rows if r["k"] == "0" and r["leave_one_out"] == "False"]
    assert all(float(r["rel_bias"]) == pytest.approx(0.25, abs=1e-9) for r in on_policy)  # 1/G, G = 4
    assert all(float(r["var_ratio"]) == pytest.approx(1.0, abs=1e-9) for r in on_policy)  # w = 1: fresh samples
    assert (tmp_path / "clip_bias.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------------------------- the estimators side by side
# An independent computation: numpy coefficients c_n of each estimator written from its paper's formula
# (not through rapid/estimators.py), every *ordered* group enumerated (not multisets).


def std_adv(r):
    c = r - r.mean()
    return c / (np.sqrt((c**2).sum() / (len(r) - 1)) + 1e-4)


def ppo(w, adv, low, high):
    """∂/∂logp of min(w A, clip(w, 1 − low, 1 + high) A): w A where the clip is not active, else 0."""
    clipped = ((adv > 0) & (w > 1 + high)) | ((adv < 0) & (w < 1 - low))
    return np.where(clipped, 0.0, w * adv)


def iw(w, r, loo=False):
    s = (w * r).sum()
    base = (s - w * r) / (len(r) - 1) if loo else s / len(r)
    return w * (r - base)


COEFFICIENTS = {  # label in tools/clip_bias.py ESTIMATORS -> c(w, r), at the conf/algorithm settings
    "RAPID": lambda w, r: iw(np.minimum(w, 2.0), r),
    "RAPID, leave-one-out": lambda w, r: iw(np.minimum(w, 2.0), r, loo=True),
    "RAPID, eta none, leave-one-out": lambda w, r: iw(w, r, loo=True),
    "RAPID, masked IS": lambda w, r: iw(np.where(w <= 2.0, w, 0.0), r),
    "uncorrected GRPG": lambda w, r: r - r.mean(),
    "GRPO (no KL)": lambda w, r: ppo(w, std_adv(r), 0.2, 0.2),
    "DAPO": lambda w, r: ppo(w, std_adv(r), 0.2, 0.28),
    "Dr. GRPO": lambda w, r: ppo(w, r - r.mean(), 0.2, 0.2),
    "CISPO": lambda w, r: np.minimum(w, 5.0) * std_adv(r),
    "GSPO": lambda w, r: ppo(w, std_adv(r), 3e-4, 4e-4),  # one token: s = w
    "TOPR": lambda w, r: np.where(r - 0.5 < 0, np.minimum(w, 1.0), 1.0) * (r - 0.5),
    "TOPR, group-mean baseline": lambda w, r: np.where(r < r.mean(), np.minimum(w, 1.0), 1.0) * (r - r.mean()),
}


def brute_force(theta, theta0, reward, group, coefficient):
    """E ĝ [X, K] and E|ĝ − E ĝ|² by enumerating every ordered group of every context."""
    pi, mu, reward = theta.softmax(-1).numpy(), theta0.softmax(-1).numpy(), reward.numpy()
    X, K = pi.shape
    mean, var = np.zeros((X, K)), 0.0
    for x in range(X):
        draws = []
        for acts in itertools.product(range(K), repeat=group):
            a = np.array(acts)
            c = coefficient(pi[x, a] / mu[x, a], reward[x, a])
            g = (np.eye(K)[a] - pi[x]).T @ c / (X * group)  # [K] row x of ĝ
            draws.append((np.prod(mu[x, a]), g))
        mean[x] = sum(p * g for p, g in draws)
        var += sum(p * ((g - mean[x]) ** 2).sum() for p, g in draws)
    return mean, var


def test_estimator_list_matches_the_independent_coefficients():
    assert [label for label, *_ in clip_bias.ESTIMATORS] == list(COEFFICIENTS)


@pytest.mark.parametrize("label, yaml, overrides", clip_bias.ESTIMATORS, ids=[e[0] for e in clip_bias.ESTIMATORS])
def test_estimator_moments_match_brute_force(label, yaml, overrides):
    theta0, reward = clip_bias.make_bandit(2, 4, seed=0)  # G = 3: 64 ordered groups per context
    thetas = clip_bias.stale_thetas(theta0, reward, lr=4.0, ks=[0, 1, 6])
    w = thetas[6].softmax(-1) / theta0.softmax(-1)
    assert w.max() > 2 and w.min() < 0.5  # stale enough that every clip, mask and truncation is active
    settings = {**clip_bias.yaml_settings(yaml), **overrides}
    loss_of = clip_bias.registered_loss(settings["loss"], settings)
    for k, theta in thetas.items():
        mean, var, _ = clip_bias.loss_moments(theta, theta0, reward, 3, loss_of)
        want_mean, want_var = brute_force(theta, theta0, reward, 3, COEFFICIENTS[label])
        np.testing.assert_allclose(mean.numpy(), want_mean, rtol=0, atol=1e-12, err_msg=f"{label} k={k}")
        assert var == pytest.approx(want_var, rel=1e-10, abs=1e-15), (label, k)
        if k < 6 and label != "GSPO":  # GSPO's 4e-4 range leaves only the pull-back terms once stale
            assert np.abs(want_mean).max() > 1e-3, (label, k)


def test_estimators_known_values():
    """By hand: on-policy (w = 1) TOPR with a constant baseline is plain REINFORCE with a baseline, unbiased;
    Dr. GRPO is GRPG, E ĝ = (G−1)/G ∇J; CISPO and GSPO equal GRPO; masking equals truncation while no
    weight exceeds eta; the unbiased RAPID variant stays unbiased at every staleness."""
    args = SimpleNamespace(contexts=3, actions=4, group=4, lr=16.0, ks=[0, 1, 8], seed=2)
    rows = {(r["estimator"], r["k"]): r for r in clip_bias.sweep_estimators(args)}
    assert rows["TOPR", 0]["rel_bias"] < 1e-12
    assert rows["Dr. GRPO", 0]["rel_bias"] == pytest.approx(1 / 4, abs=1e-12)
    for name in ("CISPO", "GSPO", "DAPO"):
        assert rows[name, 0]["rel_bias"] == pytest.approx(rows["GRPO (no KL)", 0]["rel_bias"], abs=1e-12)
    for k in (0, 1, 8):
        assert rows["RAPID, eta none, leave-one-out", k]["rel_bias"] < 1e-12
        assert rows["uncorrected GRPG", k]["noise"] == pytest.approx(rows["uncorrected GRPG", 0]["noise"], rel=1e-9)
    theta0, reward = clip_bias.make_bandit(3, 4, seed=2)
    theta1 = clip_bias.stale_thetas(theta0, reward, 16.0, [1])[1]
    assert (theta1.softmax(-1) / theta0.softmax(-1)).max() <= 2.0  # one step: no weight above eta = 2
    assert rows["RAPID, masked IS", 1]["rel_bias"] == pytest.approx(rows["RAPID", 1]["rel_bias"], abs=1e-12)
    assert rows["GSPO", 1]["cos"] < rows["GRPO (no KL)", 1]["cos"] < rows["CISPO", 1]["cos"]  # clip range
