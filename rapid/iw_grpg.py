"""Importance-weighted group policy gradient (IW-GRPG): the loss of RAPID (arXiv 2510.03515).

Pure tensor math: no model, no config, no state. Notation follows the paper.

A minibatch holds ``B`` records ``n`` = (prompt x_n, completion y_n, reward R_n), grouped by
prompt into groups ``N_k`` of size ``N_k`` (the paper's ``n_group`` completions per prompt).
The completions were sampled from the behaviour policy ``μ`` (the policy at the start of the
round); the current policy is ``π_θ``. With sequence log-probabilities
``logp_n = log π_θ(y_n|x_n)`` and ``logp_mu_n = log μ(y_n|x_n)``:

    importance weight      w_n = exp(logp_n − logp_mu_n),   w̄_n = min(w_n, η)   (η = ``eta``)
    Eq. 2 (GRPG)           A_n = R_n − (1/N_k) Σ_{n'∈N_k} R_{n'}
    Eq. 4/5 (IW-GRPG)      A_n = R_n − (1/N_k) Σ_{n'∈N_k} w̄_{n'} R_{n'}
    leave-one-out          A_n = R_n − (1/(N_k−1)) Σ_{n'∈N_k, n'≠n} w̄_{n'} R_{n'}
    Eq. 3 gradient         g = (1/B) Σ_n w̄_n A_n ∇_θ logp_n      (w̄_n, A_n held constant)

The Eq. 3 gradient is produced by the surrogate

    loss = −(1/B) Σ_n sg(w̄_n) · sg(A_n) · logp_n,    so  ∂loss/∂logp_n = −w̄_n A_n / B,

where ``sg`` stops the gradient. With ``η = ∞`` (``eta=None``) and the leave-one-out baseline
the gradient is an unbiased estimate of ∇_θ E_{π_θ}[R]: the baseline of record n depends only
on its siblings, which are independent of y_n, and E_μ[w ∇logπ_θ] = ∇ Σ_y π_θ(y) = 0. With
``θ = μ`` (first minibatch of a round) every w = 1 and IW-GRPG is exactly GRPG.

Ablation switches (``iw_baseline``, ``iw_gradient``; both default on):

    iw_baseline=False      the baseline averages plain rewards (Eq. 2, or its leave-one-out form)
    iw_gradient=False      the gradient drops the weight:  g = (1/B) Σ_n A_n ∇_θ logp_n
    both off               uncorrected off-policy GRPG: Eq. 2 applied to samples of μ

Clipped gradient mass (``clipped_mass``, logged as ``iw/clipped_mass``): the share of the
weighted gradient coefficients' total magnitude that truncation at η removes,

    clipped_mass = Σ_n (w_n − w̄_n)·|A_n| / Σ_n w_n·|A_n|      (0 when the denominator is 0),

with A_n the advantage this call uses. Only records with w_n > η contribute to the numerator
(w_n − w̄_n = w_n − η there, 0 elsewhere). It describes the weights, whatever the switches.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["group_advantages", "iw_advantages", "iw_grpg_loss", "normalized_ess", "sequence_logprobs", "masked_mean"]

# exp(20) ≈ 4.9e8: a larger log-ratio is clamped before exp so that w stays finite even in
# float32; such a weight is clipped to η anyway whenever η is finite.
LOG_RATIO_MAX = 20.0


def group_index(rewards: Tensor, group_ids: Tensor) -> tuple[Tensor, Tensor]:
    """rewards [B], group_ids [B] (any values, members need not be adjacent) -> inverse [B] (each
    record's group in [0, K)), counts [K] N_k in the dtype of ``rewards``."""
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must both have shape [B]; got {tuple(rewards.shape)} and {tuple(group_ids.shape)}."
        )
    labels, inverse = torch.unique(group_ids, return_inverse=True)  # [K], [B] in [0, K)
    counts = torch.zeros(labels.numel(), dtype=rewards.dtype, device=rewards.device)
    counts.index_add_(0, inverse, torch.ones_like(rewards))  # [K] N_k
    return inverse, counts


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor,
    weights: Tensor | None = None,
    leave_one_out: bool = False,
) -> Tensor:
    """Group-baselined advantages A_n (Eq. 2, or Eq. 4 when ``weights`` are given).

    rewards [B] float, group_ids [B] int (any values; members need not be adjacent; groups
    may differ in size), weights [B] float or None (all ones) -> advantages [B], dtype of
    ``rewards``. With ``leave_one_out`` the baseline of n averages the other N_k − 1 members.
    Rewards and weights are treated as constants: the output never requires grad.
    """
    rewards = rewards.detach()
    inverse, counts = group_index(rewards, group_ids)
    w = torch.ones_like(rewards) if weights is None else weights.detach().to(rewards.dtype)
    weighted = w * rewards
    sums = torch.zeros_like(counts).index_add_(0, inverse, weighted)  # [K] Σ w R
    w_sums = torch.zeros_like(counts).index_add_(0, inverse, w)  # [K] Σ w
    if leave_one_out:
        if bool((counts < 2).any()):
            raise ValueError(
                "leave_one_out=True needs at least 2 completions in every group, but a group "
                "has only 1; sample n_group >= 2 completions per prompt or set leave_one_out=False."
            )
        baseline = (sums[inverse] - weighted) / (counts[inverse] - 1)  # [B]
        w_mean = (w_sums[inverse] - w) / (counts[inverse] - 1)
    else:
        baseline = sums[inverse] / counts[inverse]  # [B]
        w_mean = w_sums[inverse] / counts[inverse]
    # a group of equal rewards c: the baseline is c · mean w, exactly c when the weights are 1 (Σ R / N
    # of equal non-binary rewards is not c in floating point: 0.1 · 3 / 3 != 0.1)
    baseline = torch.where(equal_rewards(rewards, inverse, counts)[inverse], rewards * w_mean, baseline)
    return rewards - baseline


def equal_rewards(rewards: Tensor, inverse: Tensor, counts: Tensor) -> Tensor:
    """[K] bool: whether all of group k's rewards are equal (`group_index`'s inverse and counts)."""
    lowest = torch.full_like(counts, torch.inf).scatter_reduce(0, inverse, rewards, "amin")
    highest = torch.full_like(counts, -torch.inf).scatter_reduce(0, inverse, rewards, "amax")
    return lowest == highest


def iw_grpg_loss(
    logp: Tensor,
    logp_mu: Tensor,
    rewards: Tensor,
    group_ids: Tensor,
    eta: float | None = 2.0,
    leave_one_out: bool = False,
    normalizer: float | None = None,
    iw_baseline: bool = True,
    iw_gradient: bool = True,
    advantages: Tensor | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """IW-GRPG surrogate loss (Eq. 3 with the Eq. 4/5 advantage) and per-call statistics.

    logp [B] (log π_θ, differentiable), logp_mu [B] (log μ, constant), rewards [B],
    group_ids [B] -> loss [] (float32, or float64 for float64 ``logp``), stats.

    ``eta`` is the truncation level η (None: no clipping). ``normalizer`` is the B of the
    1/B factor (default len(logp)); pass the full minibatch size when a minibatch is split
    into micro-batches of whole groups, and the summed micro-batch losses equal the full loss.
    ``iw_baseline`` / ``iw_gradient`` switch w̄ off in the baseline / the gradient (module docstring).
    ``advantages`` [B]: A computed elsewhere (``iw_advantages`` over a group whose members live on other
    ranks too); None: from this call's records.

    stats (Python floats, means over this call's B, so micro-batched callers aggregate them
    by a size-weighted mean, and ``iw_max`` by max): ``clip_frac`` fraction with w > η;
    ``staleness`` mean |log w̄|; ``log_w_mean`` the signed mean of log w̄ (the paper's Table 3
    "staleness": the clipped weight averaged in log scale); ``iw_mean``, ``iw_max`` of the unclipped w;
    ``w_bar_mean``, ``w_bar_sq_mean`` the first two moments of the clipped w̄ (their size-weighted means
    over micro-batches or ranks give the whole minibatch's, hence its ESS, see ``normalized_ess``);
    ``adv_mean``, ``adv_abs_mean`` of A; ``clipped_mass`` (module docstring; a ratio over this call's
    records, so a micro-batched minibatch reports the size-weighted mean of its micro-batches' ratios).
    Weights use log-ratios clamped at ``LOG_RATIO_MAX``.
    """
    if eta is not None and eta <= 0:
        raise ValueError(f"eta must be positive or None (no clipping); got {eta}.")
    if logp.dim() != 1 or logp_mu.shape != logp.shape:
        raise ValueError(
            f"logp and logp_mu must both have shape [B]; got {tuple(logp.shape)} and {tuple(logp_mu.shape)}."
        )
    dtype = torch.float64 if logp.dtype == torch.float64 else torch.float32
    log_ratio = (logp.detach().to(dtype) - logp_mu.detach().to(dtype)).clamp(max=LOG_RATIO_MAX)
    w = log_ratio.exp()  # [B]
    w_bar = w if eta is None else w.clamp(max=eta)  # [B] min(w, η)
    log_w_bar = log_ratio if eta is None else log_ratio.clamp(max=math.log(eta))  # [B]
    if advantages is None:
        advantages = group_advantages(rewards, group_ids, w_bar if iw_baseline else None, leave_one_out)
    adv = advantages.detach().to(dtype)  # [B]
    coef = w_bar if iw_gradient else torch.ones_like(w_bar)  # [B] the weight in Eq. 3
    b = float(logp.shape[0]) if normalizer is None else float(normalizer)
    loss = -(coef * adv * logp.to(dtype)).sum() / b

    clipped = torch.zeros_like(w) if eta is None else (w > eta).to(dtype)
    mass = (w * adv.abs()).sum()  # Σ w|A|
    removed = ((w - w_bar) * adv.abs()).sum()  # Σ (w − w̄)|A|
    clipped_mass = torch.where(mass > 0, removed / mass.clamp(min=torch.finfo(dtype).tiny), 0.0)
    values = torch.stack(
        [
            clipped.mean(),
            log_w_bar.abs().mean(),
            log_w_bar.mean(),
            w.mean(),
            w.max(),
            w_bar.mean(),
            w_bar.square().mean(),
            adv.mean(),
            adv.abs().mean(),
            clipped_mass,
        ]
    ).tolist()  # one device sync
    names = (
        "clip_frac",
        "staleness",
        "log_w_mean",
        "iw_mean",
        "iw_max",
        "w_bar_mean",
        "w_bar_sq_mean",
        "adv_mean",
        "adv_abs_mean",
        "clipped_mass",
    )
    return loss, dict(zip(names, values))


def iw_advantages(
    logp: Tensor,
    logp_mu: Tensor,
    rewards: Tensor,
    group_ids: Tensor,
    eta: float | None = 2.0,
    leave_one_out: bool = False,
    iw_baseline: bool = True,
) -> Tensor:
    """The advantages ``iw_grpg_loss`` uses (Eq. 4/5 with w̄ = min(w, η); Eq. 2 without ``iw_baseline``):
    logp, logp_mu, rewards, group_ids [M] -> [M], the same arithmetic as inside the loss. For a group that
    spans ranks: the members' detached numbers gathered from every rank, then each rank takes its own."""
    dtype = torch.float64 if logp.dtype == torch.float64 else torch.float32
    w = (logp.detach().to(dtype) - logp_mu.detach().to(dtype)).clamp(max=LOG_RATIO_MAX).exp()
    w_bar = w if eta is None else w.clamp(max=eta)
    return group_advantages(rewards, group_ids, w_bar if iw_baseline else None, leave_one_out)


def normalized_ess(w_bar_mean: float, w_bar_sq_mean: float) -> float:
    """Normalised effective sample size of the weights w̄_1..w̄_B of a minibatch, from their moments:

        ESS / B = (Σ w̄)² / (B Σ w̄²) = mean(w̄)² / mean(w̄²)   in (0, 1]

    1 when all weights are equal (on-policy: w̄ = 1); 1/B when one weight carries the whole
    minibatch. Moments rather than per-call ESS values, because the moments of a minibatch split
    into micro-batches (or over ranks) are the size-weighted means of theirs, while ESS values are
    not. All-zero weights (every log-ratio below float range) give 0.
    """
    return w_bar_mean**2 / w_bar_sq_mean if w_bar_sq_mean > 0 else 0.0


def sequence_logprobs(token_logp: Tensor, mask: Tensor) -> Tensor:
    """Sequence log-probs: token_logp [B, T], mask [B, T] (bool or 0/1 float) -> [B].

    Masked positions contribute exactly 0, even where token_logp is -inf or nan.
    """
    keep = mask.bool()
    return torch.where(keep, token_logp, torch.zeros_like(token_logp)).sum(dim=-1)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of x over positions where mask is true: x [...], mask broadcastable to x.

    dim=None reduces everything to a scalar []; otherwise that dim is reduced. Masked
    positions are ignored even if x is -inf or nan there; an all-masked slice gives 0.
    """
    keep = mask.bool().expand_as(x)
    total = torch.where(keep, x, torch.zeros_like(x))
    if dim is None:
        return total.sum() / keep.sum().clamp(min=1)
    return total.sum(dim=dim) / keep.sum(dim=dim).clamp(min=1)
