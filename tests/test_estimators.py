"""The estimators of rapid/estimators.py against values computed by hand (in the comments), the
micro-batching contract for every registered loss, their declared group skipping, and a short real
run of each (tiny random model, +experiment=smoke)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from rapid import estimators
from rapid.estimators import LossInputs, cispo_loss, gspo_loss, masked_iw_loss, topr_loss
from rapid.iw_grpg import iw_grpg_loss
from tests.test_train import launch, read_rows, train_rows

D = torch.float64
SETTINGS = {  # each loss's conf/algorithm yaml values (checked against the files in test_registry.py)
    "iw_grpg": {"eta": 2.0, "leave_one_out": False, "iw_baseline": True, "iw_gradient": True},
    "rapid_mask": {"eta": 2.0, "leave_one_out": False},
    "grpo": {"eps_low": 0.2, "eps_high": 0.2, "beta": 0.04, "aggregation": "seq_mean_token_mean"},
    "dapo": {"eps_low": 0.2, "eps_high": 0.28},
    "dr_grpo": {"eps_low": 0.2, "eps_high": 0.2, "beta": 0.0},
    "cispo": {"eps_high": 4.0, "eps_low": None},
    "gspo": {"eps_low": 3e-4, "eps_high": 4e-4},
    "topr": {"baseline": 0.5},
}


def grad_of(loss_fn, logp):
    logp = logp.clone().requires_grad_()
    loss, stats = loss_fn(logp)
    (g,) = torch.autograd.grad(loss, logp)
    return loss.item(), g, stats


# ----------------------------------------------------------------------------- CISPO


def test_cispo_by_hand():
    # token ratios r (logp_old = 0, logp = log r); row 1's third token is padding (nan must not leak)
    r = torch.tensor([[1.0, 2.0, 8.0], [0.5, 6.0, 1.0]], dtype=D)
    logp = r.log()
    logp[1, 2] = float("nan")
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv = torch.tensor([2.0, -1.0], dtype=D)
    # eps_high = 4: r̂ = min(r, 5) = [1, 2, 5], [0.5, 5]; 5 tokens
    # loss = −(1/5)[2(1·log1 + 2·log2 + 5·log8) − (0.5·log0.5 + 5·log6)]
    want = -(2 * (2 * math.log(2) + 5 * math.log(8)) - (0.5 * math.log(0.5) + 5 * math.log(6))) / 5
    # ∂loss/∂logp_t = −r̂_t A / 5
    want_g = torch.tensor([[-0.4, -0.8, -2.0], [0.1, 1.0, 0.0]], dtype=D)
    loss, g, stats = grad_of(lambda lp: cispo_loss(lp, torch.zeros_like(r), adv, mask, eps_high=4.0), logp)
    assert loss == pytest.approx(want, abs=1e-12)
    torch.testing.assert_close(g, want_g, rtol=0, atol=1e-12)
    assert stats["clip_frac"] == pytest.approx(2 / 5) and stats["ratio_mean"] == pytest.approx(17.5 / 5)
    # a lower bound 1 − 0.2 lifts 0.5 to 0.8; the normaliser is what the caller passes (the minibatch's tokens)
    _, g, stats = grad_of(
        lambda lp: cispo_loss(lp, torch.zeros_like(r), adv, mask, eps_high=4.0, eps_low=0.2, normalizer=10), logp
    )
    torch.testing.assert_close(g, torch.tensor([[-0.2, -0.4, -1.0], [0.08, 0.5, 0.0]], dtype=D), rtol=0, atol=1e-12)
    assert stats["clip_frac_low"] == pytest.approx(1 / 5)


def test_cispo_registered_uses_std_normalised_advantages_and_token_normaliser():
    # one group of 2, rewards 1, 0: mean 0.5, unbiased std √0.5 -> A = ±0.5/(√0.5 + 1e-4); on-policy r = 1
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.7]], dtype=D)
    x = LossInputs(logp, logp.clone(), torch.ones(2, 2, dtype=torch.bool), torch.tensor([1.0, 0.0], dtype=D),
                   torch.tensor([0, 0]), n_records=2, n_tokens=8)  # fmt: skip
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    _, g, _ = grad_of(lambda lp: estimators.compute("cispo", replace(x, logp=lp), SETTINGS["cispo"]), logp)
    torch.testing.assert_close(g, torch.tensor([[-a, -a], [a, a]], dtype=D) / 8, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- GSPO


def test_gspo_by_hand():
    # per-token log-ratios (logp_old = 0); row 1's last token is padding. B = 4, ranges [1 − 3e-4, 1 + 4e-4].
    lr = torch.tensor([[0.0015, 0.0, 0.0], [-0.0002, 0.0, 9.0], [-0.003, -0.003, -0.003], [-0.3, 0.0, 0.0]], dtype=D)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    adv = torch.tensor([1.5, -0.5, -1.0, 2.0], dtype=D)
    # log s = token mean over the completion: 5e-4, −1e-4, −3e-3, −0.1
    # row 0: A > 0, s = e^5e-4 > 1.0004: clipped, obj = 1.0004·1.5, no gradient
    # row 1: s = e^−1e-4 inside the range: obj = s·(−0.5), ∂/∂logp_t = −s A / (T_n = 2 · B = 4)
    # row 2: A < 0, s = e^−3e-3 < 0.9997: clipped, obj = 0.9997·(−1), no gradient
    # row 3: A > 0, s = e^−0.1 below the range: min(sA, 0.9997A) = sA, unclipped, ∂ = −s A / (3 · 4)
    s1, s3 = math.exp(-1e-4), math.exp(-0.1)
    want = -(1.0004 * 1.5 + s1 * -0.5 + 0.9997 * -1.0 + s3 * 2.0) / 4
    want_g = torch.tensor([[0, 0, 0], [s1 * 0.5 / 8, s1 * 0.5 / 8, 0], [0, 0, 0], [-s3 * 2 / 12] * 3], dtype=D)
    loss, g, stats = grad_of(lambda lp: gspo_loss(lp, torch.zeros_like(lr), adv, mask), lr)
    assert loss == pytest.approx(want, abs=1e-12)
    torch.testing.assert_close(g, want_g, rtol=0, atol=1e-12)
    assert (stats["clip_frac"], stats["clip_frac_low"], stats["clip_frac_high"]) == (0.5, 0.25, 0.25)
    assert stats["ratio_mean"] == pytest.approx((math.exp(5e-4) + s1 + math.exp(-3e-3) + s3) / 4, abs=1e-12)


# ----------------------------------------------------------------------------- TOPR


def test_topr_by_hand():
    # sequence log-probs: w = π/μ = 3, 0.5, 2, 0.1; A = 1, −1, −1, 0.5
    logp_old = torch.tensor([-4.0, -3.0, -2.0, -5.0], dtype=D)
    w = torch.tensor([3.0, 0.5, 2.0, 0.1], dtype=D)
    logp = logp_old + w.log()
    adv = torch.tensor([1.0, -1.0, -1.0, 0.5], dtype=D)
    # c = 1 (A ≥ 0), min(0.5, 1) = 0.5, min(2, 1) = 1, 1 (A ≥ 0, w = 0.1 ignored): ∂loss/∂logp = −c A / 4
    loss, g, stats = grad_of(lambda lp: topr_loss(lp, logp_old, adv), logp)
    torch.testing.assert_close(g, torch.tensor([-0.25, 0.125, 0.25, -0.125], dtype=D), rtol=0, atol=1e-15)
    assert loss == pytest.approx(-(logp[0] - 0.5 * logp[1] - logp[2] + 0.5 * logp[3]).item() / 4, abs=1e-12)
    assert stats["trunc_frac"] == 0.25 and stats["neg_frac"] == 0.5 and stats["iw_mean"] == pytest.approx(5.6 / 4)


def test_topr_registered_baselines():
    # two groups of 2, one token per completion, on-policy (w = 1): the constant c = 0.5 gives A = ±0.5
    # to every record, all-zero group included; group_mean gives 0 to the all-zero group
    logp = torch.tensor([[-1.0], [-2.0], [-0.5], [-0.3]], dtype=D)
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=D)
    ids = torch.tensor([0, 0, 1, 1])
    for baseline, adv in ((0.5, [0.5, -0.5, -0.5, -0.5]), ("group_mean", [0.5, -0.5, 0.0, 0.0])):
        _, g, _ = grad_of(
            lambda lp: estimators.compute(
                "topr",
                LossInputs(lp, logp.clone(), torch.ones(4, 1, dtype=torch.bool), rewards, ids, n_records=4),
                {"baseline": baseline},
            ),
            logp,
        )
        torch.testing.assert_close(g[:, 0], -torch.tensor(adv, dtype=D) / 4, rtol=0, atol=1e-15)


# ----------------------------------------------------------------------------- RAPID, masked


def test_masked_iw_by_hand():
    # one group of 4, rewards 1, 1, 0, 0, w = 3, 0.5, 1.5, 0.8, eta = 2: w̃ = 0, 0.5, 1.5, 0.8
    logp_mu = torch.tensor([-2.0, -1.0, -3.0, -1.5], dtype=D)
    w = torch.tensor([3.0, 0.5, 1.5, 0.8], dtype=D)
    logp = logp_mu + w.log()
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=D)
    ids = torch.zeros(4, dtype=torch.long)
    # baseline (0·1 + 0.5·1 + 0 + 0)/4 = 0.125 -> A = 0.875, 0.875, −0.125, −0.125; ∂/∂logp = −w̃ A / 4
    loss, g, stats = grad_of(lambda lp: masked_iw_loss(lp, logp_mu, rewards, ids, eta=2.0), logp)
    torch.testing.assert_close(g, torch.tensor([0.0, -0.109375, 0.046875, 0.025], dtype=D), rtol=0, atol=1e-15)
    assert stats["clip_frac"] == 0.25 and stats["w_bar_mean"] == pytest.approx(0.7)
    # Σ w|A| = 3·0.875 + 0.5·0.875 + 1.5·0.125 + 0.8·0.125 = 3.35, of which the masked record holds 2.625
    assert stats["clipped_mass"] == pytest.approx(2.625 / 3.35, abs=1e-12)
    assert stats["staleness"] == pytest.approx((math.log(2) + math.log(1.5) + abs(math.log(0.8))) / 3)
    # truncation instead (iw_grpg): w̄ = 2, ..., baseline (2 + 0.5)/4 = 0.625 -> a different gradient
    _, g_trunc, _ = grad_of(lambda lp: iw_grpg_loss(lp, logp_mu, rewards, ids, eta=2.0), logp)
    torch.testing.assert_close(
        g_trunc, -torch.tensor([2 * 0.375, 0.5 * 0.375, 1.5 * -0.625, 0.8 * -0.625], dtype=D) / 4
    )
    # leave-one-out: baseline of n = (0.5 − w̃_n R_n)/3 -> A = 1 − 0.5/3, 1 − 0, −0.5/3, −0.5/3
    _, g, _ = grad_of(lambda lp: masked_iw_loss(lp, logp_mu, rewards, ids, eta=2.0, leave_one_out=True), logp)
    want = -torch.tensor([0.0, 0.5 * 1.0, 1.5 * (-0.5 / 3), 0.8 * (-0.5 / 3)], dtype=D) / 4
    torch.testing.assert_close(g, want, rtol=0, atol=1e-15)


# ----------------------------------------------------------------------------- Dr. GRPO


def test_dr_grpo_registered_no_std_no_length_normalisation():
    # one group of 3, rewards 1, 0, 0: A = R − mean = 2/3, −1/3, −1/3 (no std); completions of 1, 2, 4 tokens;
    # on-policy r = 1 (no clip): ∂loss/∂logp_t = −A_n / (B · max_tokens) = −A_n / (3 · 4), whatever T_n
    logp = torch.full((3, 4), -1.0, dtype=D)
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)
    rewards = torch.tensor([1.0, 0.0, 0.0], dtype=D)
    x = dict(mask=mask, rewards=rewards, group_ids=torch.zeros(3, dtype=torch.long), n_records=3, max_tokens=4)
    _, g, _ = grad_of(
        lambda lp: estimators.compute("dr_grpo", LossInputs(lp, logp.clone(), **x), SETTINGS["dr_grpo"]), logp
    )
    adv = torch.tensor([2 / 3, -1 / 3, -1 / 3], dtype=D)
    torch.testing.assert_close(g, torch.where(mask, -adv[:, None] / 12, 0.0), rtol=0, atol=1e-15)


# ----------------------------------------------------------------------------- registry == the direct calls


def random_batch(seed: int, groups: int = 3, n: int = 4, T: int = 5, stale: float = 0.3):
    g = torch.Generator().manual_seed(seed)
    B = groups * n
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    logp_old = -torch.rand(B, T, generator=g, dtype=D) * 3
    logp = logp_old + stale * torch.randn(B, T, generator=g, dtype=D)
    logp_ref = logp_old + 0.1 * torch.randn(B, T, generator=g, dtype=D)
    rewards = (torch.rand(B, generator=g) < 0.5).to(D)
    rewards[:n] = 0.0  # an all-zero group
    rewards[n : 2 * n] = 1.0  # an all-correct group
    ids = torch.arange(groups).repeat_interleave(n)
    return logp, logp_old, logp_ref, mask, rewards, ids


def reference_loss(name: str, logp, logp_old, logp_ref, mask, rewards, ids, max_tokens: int = 5):
    """Each registered loss written out from its paper's formula (docs/estimators.md), record by record and
    token by token in plain Python floats, independently of rapid's tensor code: (loss, d loss / d logp [B][T],
    {clip_frac: ...}). Groups are runs of equal `ids`; A_std = (R − mean) / (unbiased std + 1e-4), 0 for a
    group of equal rewards; clip(r, lo, hi) = min(max(r, lo), hi)."""
    B, T = mask.shape
    lp, lo_, ref = logp.tolist(), logp_old.tolist(), logp_ref.tolist()
    m, R, g = mask.tolist(), rewards.tolist(), ids.tolist()
    toks = [[t for t in range(T) if m[n][t]] for n in range(B)]
    members = {k: [n for n in range(B) if g[n] == k] for k in set(g)}
    a = SETTINGS[name]

    def centred(n):
        rs = [R[j] for j in members[g[n]]]
        return 0.0 if len(set(rs)) == 1 else R[n] - sum(rs) / len(rs)

    def a_std(n):
        rs = [R[j] for j in members[g[n]]]
        mean = sum(rs) / len(rs)
        std = math.sqrt(sum((r - mean) ** 2 for r in rs) / (len(rs) - 1))
        return centred(n) / (std + 1e-4)

    def clip(x, lo, hi):
        return min(max(x, lo), hi)

    def ppo(
        r, A, lo, hi
    ):  # the clipped objective and its derivative in log r (r A where the unclipped term is the min)
        unclipped, clipped = r * A, clip(r, lo, hi) * A
        return min(unclipped, clipped), (r * A if unclipped <= clipped else 0.0)

    grad = [[0.0] * T for _ in range(B)]
    total, clipped_tokens, n_tok = 0.0, 0, sum(len(t) for t in toks)
    seq = [sum(lp[n][t] for t in toks[n]) for n in range(B)]
    seq_old = [sum(lo_[n][t] for t in toks[n]) for n in range(B)]
    if name in ("iw_grpg", "rapid_mask", "topr"):  # sequence REINFORCE with a weight on log π(y_n)
        w = [math.exp(seq[n] - seq_old[n]) for n in range(B)]
        if name == "iw_grpg":
            coef = [min(x, a["eta"]) for x in w]
        elif name == "rapid_mask":
            coef = [x if x <= a["eta"] else 0.0 for x in w]
        if name == "topr":
            A = [R[n] - a["baseline"] for n in range(B)]
            coef = [1.0 if A[n] >= 0 else min(w[n], 1.0) for n in range(B)]
        else:  # Eq. 4: A = R − (1/N_k) Σ_k coef R
            A = [R[n] - sum(coef[j] * R[j] for j in members[g[n]]) / len(members[g[n]]) for n in range(B)]
        for n in range(B):
            total -= coef[n] * A[n] * seq[n] / B
            for t in toks[n]:
                grad[n][t] = -coef[n] * A[n] / B
        stat = sum(x > a["eta"] for x in w) / B if name != "topr" else None
        return total, grad, {"clip_frac": stat}
    if name == "gspo":
        for n in range(B):
            s = math.exp((seq[n] - seq_old[n]) / len(toks[n]))
            A = a_std(n)
            o, d = ppo(s, A, 1 - a["eps_low"], 1 + a["eps_high"])
            total -= o / B
            clipped_tokens += o != s * A
            for t in toks[n]:
                grad[n][t] = -d / len(toks[n]) / B
        return total, grad, {"clip_frac": clipped_tokens / B}
    for n in range(B):  # token-level losses
        A = centred(n) if name == "dr_grpo" else a_std(n)
        for t in toks[n]:
            r = math.exp(lp[n][t] - lo_[n][t])
            if name == "cispo":
                rhat = min(r, 1 + a["eps_high"])
                total -= rhat * A * lp[n][t] / n_tok
                grad[n][t] = -rhat * A / n_tok
                clipped_tokens += r > 1 + a["eps_high"]
                continue
            lo, hi = 1 - a["eps_low"], 1 + a["eps_high"]
            o, d = ppo(r, A, lo, hi)
            clipped_tokens += (A < 0 and r < lo) or (A > 0 and r > hi)
            if name == "grpo":  # − β k3, k3 = e^x − x − 1 with x = log π_ref − log π: d(−β k3)/d log π = β (e^x − 1)
                x = ref[n][t] - lp[n][t]
                o, d = o - a["beta"] * (math.exp(x) - x - 1), d + a["beta"] * (math.exp(x) - 1)
            scale = {"grpo": B * len(toks[n]), "dapo": n_tok, "dr_grpo": B * max_tokens}[name]
            total -= o / scale
            grad[n][t] = -d / scale
    return total, grad, {"clip_frac": clipped_tokens / n_tok}


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_registered_losses_match_their_formulas(name):
    """Every registered loss, through the registry as rapid.train calls it, against `reference_loss`: the
    loss value, the gradient in every token's log-prob, and the clip fraction. Staleness 0.3 puts ratios on
    both sides of every clip range; GSPO's range (±4e-4) needs staleness 1e-3 for some sequences to stay
    inside it."""
    logp, logp_old, logp_ref, mask, rewards, ids = random_batch(0, stale=1e-3 if name == "gspo" else 0.3)
    x = dict(logp_old=logp_old, mask=mask, rewards=rewards, group_ids=ids, logp_ref=logp_ref)
    x |= dict(n_records=12, n_tokens=int(mask.sum()), max_tokens=5)
    loss, g, stats = grad_of(lambda lp: estimators.compute(name, LossInputs(lp, **x), SETTINGS[name]), logp)
    want, want_g, want_stats = reference_loss(name, logp, logp_old, logp_ref, mask, rewards, ids)
    assert loss == pytest.approx(want, abs=1e-12, rel=1e-12)
    torch.testing.assert_close(g, torch.tensor(want_g, dtype=D), rtol=1e-10, atol=1e-13)
    assert g.abs().max() > 1e-3  # not vacuous: some record pulls
    if want_stats["clip_frac"] is not None:
        assert stats["clip_frac"] == pytest.approx(want_stats["clip_frac"], abs=1e-12)
    if name in ("grpo", "dapo", "dr_grpo", "iw_grpg", "gspo"):
        assert 0 < want_stats["clip_frac"] < 1, want_stats  # both branches of the clip are exercised


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_micro_batch_losses_sum_to_the_minibatch_loss(name):
    """Whole-group micro-batches with the minibatch's normalisers: losses and gradients add up."""
    logp, logp_old, logp_ref, mask, rewards, ids = random_batch(1, stale=0.2 if name != "gspo" else 1e-3)
    norms = dict(n_records=12, n_tokens=int(mask.sum()), max_tokens=5)

    def run(rows):
        lp = logp[rows].clone().requires_grad_()
        x = LossInputs(lp, logp_old[rows], mask[rows], rewards[rows], ids[rows], logp_ref[rows], **norms)
        loss, _ = estimators.compute(name, x, SETTINGS[name])
        loss.backward()
        return loss.item(), lp.grad

    full_loss, full_grad = run(slice(0, 12))
    parts = [run(slice(0, 4)), run(slice(4, 12))]
    assert sum(p[0] for p in parts) == pytest.approx(full_loss, abs=1e-12)
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), full_grad, rtol=0, atol=1e-14)
    assert full_grad.abs().max() > 0


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_declared_skip_drops_only_zero_gradient_groups(name):
    """The groups the loss says train.skip_zero_advantage may skip have zero gradient, and leaving them out
    (with the minibatch's normalisers) changes neither the loss nor the others' gradient."""
    a = dict(SETTINGS[name], loss=name)
    skip = estimators.get(name).skip(a)
    expected = {"iw_grpg": "zero_rewards", "rapid_mask": "zero_rewards", "grpo": None, "topr": None}
    assert skip == expected.get(name, "equal_rewards")
    logp, logp_old, logp_ref, mask, rewards, ids = random_batch(2, stale=0.2 if name != "gspo" else 1e-3)
    if skip is None:  # the declaration is needed: an all-0 and an all-1 group pull on the gradient
        x = LossInputs(logp, logp_old, mask, rewards, ids, logp_ref, 12, int(mask.sum()), 5)
        _, g, _ = grad_of(lambda lp: estimators.compute(name, replace(x, logp=lp), a), logp)
        assert g[:4].abs().max() > 1e-4 and g[4:8].abs().max() > 1e-4  # GRPO: the KL term; TOPR: A = R − 0.5
        return
    kept = slice(4, 12) if skip == "zero_rewards" else slice(8, 12)  # group 0 all 0, group 1 all 1
    norms = dict(n_records=12, n_tokens=int(mask.sum()), max_tokens=5)

    def run(rows):
        lp = logp[rows].clone().requires_grad_()
        x = LossInputs(lp, logp_old[rows], mask[rows], rewards[rows], ids[rows], logp_ref[rows], **norms)
        loss, _ = estimators.compute(name, x, a)
        loss.backward()
        return loss.item(), lp.grad

    full_loss, full_grad = run(slice(0, 12))
    loss, grad = run(kept)
    assert loss == pytest.approx(full_loss, abs=1e-12)
    torch.testing.assert_close(grad, full_grad[kept], rtol=0, atol=1e-14)
    assert full_grad[: kept.start].abs().max() == 0


# ----------------------------------------------------------------------------- a real run of each


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cispo", "gspo", "dr_grpo", "topr", "rapid_mask"])
def test_smoke_run_per_estimator(tmp_path, name):
    """Two rounds of H = 2 on the tiny random model through python -m rapid.train algorithm=<name>: the run
    finishes, every step trains, and the loss's own statistics reach metrics.jsonl."""
    run = tmp_path / "run"
    launch(["+experiment=smoke", f"algorithm={name}", "algorithm.H=2", "rounds=2", "eval.every=0",
            "ckpt.every=0", f"hydra.run.dir={run}"], tmp_path)  # fmt: skip
    rows = train_rows(read_rows(run))
    assert [r["progress/round"] for r in rows] == [1, 2]
    for r in rows:
        assert r["train/trained_frac"] == 1.0 and math.isfinite(r["train/loss"])
    stat = {"cispo": "loss/clip_frac", "gspo": "loss/log_ratio_abs_mean", "dr_grpo": "loss/kl_mean",
            "topr": "loss/trunc_frac", "rapid_mask": "iw/clip_frac"}[name]  # fmt: skip
    assert all(stat in r for r in rows), sorted(rows[0])
