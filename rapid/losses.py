"""Token-level losses of the paper's baselines: GRPO (DeepSeekMath) and DAPO, with their helpers.

Pure tensor math: no model, no config, no state. RAPID's own loss is in ``rapid.iw_grpg``; every loss
is registered under its `algorithm.loss` name in ``rapid.estimators`` (with CISPO, GSPO, Dr. GRPO, TOPR).

A minibatch holds ``B`` completions of at most ``T`` tokens: ``logp`` [B, T] are the token
log-probs under the current policy π_θ (differentiable), ``logp_old`` [B, T] under the policy
that sampled them (constant), ``logp_ref`` [B, T] under a frozen reference (constant), ``mask``
[B, T] marks completion tokens (bool or 0/1), ``advantages`` [B] one number per completion.
Per token, with ``r = exp(logp − logp_old)``:

    GRPO   o_t = min(r·A, clip(r, 1−ε, 1+ε)·A) − β·k3
           k3  = exp(logp_ref − logp) − (logp_ref − logp) − 1
    DAPO   o_t = min(r·A, clip(r, 1−ε_low, 1+ε_high)·A)              (clip-higher, no KL)

k3 is Schulman's unbiased, non-negative estimator of KL(π_θ‖π_ref);
∂k3/∂logp = 1 − exp(logp_ref − logp).
The losses are −(aggregate of o_t over completion tokens):

    "seq_mean_token_mean"  −(1/B) Σ_n (1/T_n) Σ_t o_nt        GRPO: DeepSeekMath, TRL (default)
    "token_mean"           −(1/Σ_n T_n) Σ_n Σ_t o_nt          DAPO's token-level normalisation
    "constant"             −(1/(B·max_tokens)) Σ_n Σ_t o_nt   Dr. GRPO (no length bias)

Where the clip is active (A > 0 and r > 1+ε_high, or A < 0 and r < 1−ε_low) the token's
policy-gradient term has zero gradient (the KL term still has its own). Masked positions contribute exactly nothing to the loss, its gradient or the
statistics, even where any input holds -inf or nan there.

Micro-batching: pass ``normalizer`` = the full minibatch's count (sequences for the
seq-mean and constant aggregations, completion tokens for "token_mean" and DAPO) to every
micro-batch call, and the micro-batch losses (and gradients) sum to the full minibatch's.

Helpers: ``group_normalized_advantages`` (GRPO's std-normalised group advantage, or Dr. GRPO's
mean-centred one) and ``overlong_penalty`` (DAPO's soft overlong punishment, added to the reward).
DAPO's dynamic sampling filter is ``rapid.buffer.keep_informative_groups``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rapid.iw_grpg import LOG_RATIO_MAX, equal_rewards, group_index

__all__ = [
    "group_normalized_advantages",
    "grpo_loss",
    "dapo_loss",
    "overlong_penalty",
    "AGGREGATIONS",
]

AGGREGATIONS = ("seq_mean_token_mean", "token_mean", "constant")


# ----------------------------------------------------------------------------- advantages


def group_normalized_advantages(
    rewards: Tensor, group_ids: Tensor, eps: float = 1e-4, scale: str | None = "std"
) -> Tensor:
    """GRPO's group-normalised advantage: A_n = (R_n − mean_k) / (std_k + eps).

    rewards [B] float, group_ids [B] int (any values; members need not be adjacent; groups may
    differ in size) -> advantages [B], dtype of ``rewards``, never requiring grad.

    ``std_k`` is the *unbiased* sample std of the group, sqrt(Σ (R − mean_k)² / (N_k − 1)), as
    ``torch.std``'s default and TRL's GRPOTrainer (DeepSeekMath's "normalised by the group's
    std"). A group of one member gets A = 0; a group with equal rewards gets A = 0.
    ``scale=None`` only centres, A_n = R_n − mean_k (Dr. GRPO, and the paper's Eq. 2).
    """
    if scale not in ("std", None):
        raise ValueError(f"scale must be 'std' or None (mean-centred only); got {scale!r}.")
    rewards = rewards.detach()
    if not rewards.is_floating_point():
        rewards = rewards.to(torch.get_default_dtype())
    inverse, counts = group_index(rewards, group_ids)
    sums = torch.zeros_like(counts).index_add_(0, inverse, rewards)  # [K] Σ R
    centred = rewards - (sums / counts)[inverse]  # [B] R − mean_k
    # equal rewards: exactly 0 (Σ R / N of equal non-binary rewards is not R in floating point, and the
    # std normalisation would inflate that rounding to ~1e-3)
    centred = torch.where(equal_rewards(rewards, inverse, counts)[inverse], 0.0, centred)
    if scale is None:
        return centred
    sq = torch.zeros_like(counts).index_add_(0, inverse, centred**2)  # [K] Σ (R − mean)²
    std = (sq / (counts - 1).clamp(min=1)).sqrt()  # [K] unbiased; 0 for a singleton
    return centred / (std[inverse] + eps)  # singleton: centred is 0


# ----------------------------------------------------------------------------- losses


def _check_shapes(logp: Tensor, others: dict[str, Tensor | None], advantages: Tensor) -> None:
    if logp.dim() != 2:
        raise ValueError(f"logp must have shape [B, T]; got {tuple(logp.shape)}.")
    for name, x in others.items():
        if x is not None and x.shape != logp.shape:
            raise ValueError(f"{name} must have the shape of logp {tuple(logp.shape)}; got {tuple(x.shape)}.")
    if advantages.shape != logp.shape[:1]:
        raise ValueError(f"advantages must have shape [B] = [{logp.shape[0]}]; got {tuple(advantages.shape)}.")


def _clipped_surrogate(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    keep: Tensor,
    clip_low: float,
    clip_high: float,
    dtype: torch.dtype,
) -> tuple[Tensor, list[Tensor]]:
    """PPO clipped objective per token: [B, T] (0 where not kept) and the clip/ratio statistics.

    Inputs are zeroed where masked *before* any arithmetic, so that neither a nan value nor a
    nan gradient can leak from a padded position. The log-ratio is clamped to ±LOG_RATIO_MAX
    (so that r stays finite in float32; such a token is far outside any clip range anyway).
    """
    zero = torch.zeros((), dtype=dtype, device=logp.device)
    lp = torch.where(keep, logp.to(dtype), zero)  # [B, T] differentiable
    lp_old = torch.where(keep, logp_old.detach().to(dtype), zero)  # [B, T]
    ratio = (lp - lp_old).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX).exp()  # [B, T] r, 1 where masked
    adv = advantages.detach().to(dtype)[:, None]  # [B, 1]
    obj = torch.minimum(ratio * adv, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv)
    obj = torch.where(keep, obj, zero)  # [B, T]

    r = ratio.detach()
    n_tokens = keep.sum().clamp(min=1).to(dtype)
    low = (keep & (adv < 0) & (r < 1.0 - clip_low)).sum() / n_tokens  # clip active, low side
    high = (keep & (adv > 0) & (r > 1.0 + clip_high)).sum() / n_tokens  # clip active, high side
    ratio_mean = torch.where(keep, r, zero).sum() / n_tokens
    return obj, [low, high, low + high, ratio_mean]


def _aggregate(obj: Tensor, keep: Tensor, aggregation: str, normalizer: float | None, max_tokens: int | None) -> Tensor:
    """−(aggregate of the per-token objective obj [B, T]) -> loss []; see the module docstring."""
    if aggregation == "seq_mean_token_mean":
        per_seq = obj.sum(-1) / keep.sum(-1).clamp(min=1)  # [B] token mean of each completion
        n = obj.shape[0] if normalizer is None else normalizer  # sequences
        return -per_seq.sum() / n
    if aggregation == "token_mean":
        n = keep.sum().clamp(min=1).to(obj.dtype) if normalizer is None else normalizer  # tokens
        return -obj.sum() / n
    if aggregation == "constant":
        if max_tokens is None or max_tokens <= 0:
            raise ValueError(
                "aggregation='constant' (Dr. GRPO) divides by B·max_tokens: pass max_tokens, "
                f"the maximum completion length (a positive int); got {max_tokens!r}."
            )
        n = obj.shape[0] if normalizer is None else normalizer  # sequences
        return -obj.sum() / (n * max_tokens)
    raise ValueError(f"aggregation must be one of {AGGREGATIONS}; got {aggregation!r}.")


def _compute_dtype(logp: Tensor) -> torch.dtype:
    return torch.float64 if logp.dtype == torch.float64 else torch.float32


def grpo_loss(
    logp: Tensor,
    logp_old: Tensor,
    logp_ref: Tensor | None,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    kl_coef: float = 0.04,
    aggregation: str = "seq_mean_token_mean",
    clip_eps_high: float | None = None,
    max_tokens: int | None = None,
    normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GRPO loss (DeepSeekMath): PPO ratio clipping plus a k3 KL penalty to a reference.

    logp, logp_old, logp_ref [B, T] (logp_ref may be None), advantages [B], mask [B, T]
    -> loss [] (float32, or float64 for float64 ``logp``), stats. Only ``logp`` gets a gradient.

    Per token o = min(r·A, clip(r, 1−ε, 1+ε_high)·A) − β·k3 with ε = ``clip_eps``, ε_high =
    ``clip_eps_high`` (None: ε), β = ``kl_coef``; the KL term is left out when ``logp_ref`` is None or ``kl_coef`` is 0.
    ``aggregation`` is one of ``AGGREGATIONS`` (module docstring); "constant" needs
    ``max_tokens``. The log-ratios in r and k3 are clamped to ±LOG_RATIO_MAX (finite in float32).

    ``normalizer`` (default: this call's count) is the number of sequences for
    "seq_mean_token_mean" and "constant", and the number of completion tokens for
    "token_mean": pass the full minibatch's count when splitting it into micro-batches.

    stats (Python floats, token means over this call's completion tokens, so micro-batched
    callers combine them by a token-weighted mean): ``clip_frac_low`` (A < 0 and r < 1−ε),
    ``clip_frac_high`` (A > 0 and r > 1+ε), ``clip_frac`` (their sum), ``kl_mean`` (mean k3;
    0.0 without ``logp_ref``), ``ratio_mean`` (mean r).
    """
    _check_shapes(logp, {"logp_old": logp_old, "logp_ref": logp_ref, "mask": mask}, advantages)
    dtype = _compute_dtype(logp)
    keep = mask.bool()
    high = clip_eps if clip_eps_high is None else clip_eps_high
    obj, stats = _clipped_surrogate(logp, logp_old, advantages, keep, clip_eps, high, dtype)

    zero = torch.zeros((), dtype=dtype, device=logp.device)
    kl_mean = zero
    if logp_ref is not None:
        lp = torch.where(keep, logp.to(dtype), zero)  # [B, T]
        lp_ref = torch.where(keep, logp_ref.detach().to(dtype), zero)  # [B, T]
        d = (lp_ref - lp).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)  # [B, T] log(π_ref/π_θ)
        k3 = d.exp() - d - 1.0  # [B, T] ≥ 0, exactly 0 where masked
        kl_mean = k3.detach().sum() / keep.sum().clamp(min=1).to(dtype)
        if kl_coef != 0:
            obj = obj - kl_coef * k3

    loss = _aggregate(obj, keep, aggregation, normalizer, max_tokens)
    names = ("clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean", "kl_mean")
    values = torch.stack([*stats, kl_mean]).tolist()  # one device sync
    return loss, dict(zip(names, values))


def dapo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """DAPO loss: clip-higher, token-level normalisation, no KL.

    logp, logp_old [B, T], advantages [B], mask [B, T] -> loss [], stats (as ``grpo_loss``,
    without ``kl_mean``). Per token o = min(r·A, clip(r, 1−clip_low, 1+clip_high)·A);
    loss = −Σ_{n,t} o_nt / ``normalizer``, where ``normalizer`` defaults to this call's number
    of completion tokens: pass the full minibatch's token count to every micro-batch call and
    the micro-batch losses sum to the minibatch loss.
    """
    _check_shapes(logp, {"logp_old": logp_old, "mask": mask}, advantages)
    keep = mask.bool()
    obj, stats = _clipped_surrogate(logp, logp_old, advantages, keep, clip_low, clip_high, _compute_dtype(logp))
    loss = _aggregate(obj, keep, "token_mean", normalizer, None)
    names = ("clip_frac_low", "clip_frac_high", "clip_frac", "ratio_mean")
    return loss, dict(zip(names, torch.stack(stats).tolist()))


# ----------------------------------------------------------------------------- DAPO helpers


def overlong_penalty(lengths: Tensor, max_len: int, cache_len: int, penalty: float = 1.0) -> Tensor:
    """DAPO's soft overlong punishment, added to the reward: lengths [B] (int) -> [B] float.

    With L_max = ``max_len`` and L_cache = ``cache_len``:
        0                                    if L ≤ L_max − L_cache
        −penalty · (L − (L_max − L_cache)) / L_cache   if L_max − L_cache < L ≤ L_max
        −penalty                             if L > L_max
    (DAPO: L_max = 20480, L_cache = 4096, penalty 1.) ``cache_len = 0`` is a step at L_max.
    """
    if not 0 <= cache_len <= max_len:
        raise ValueError(f"need 0 <= cache_len <= max_len; got cache_len={cache_len}, max_len={max_len}.")
    dtype = lengths.dtype if lengths.is_floating_point() else torch.get_default_dtype()
    over = (lengths.to(dtype) - (max_len - cache_len)).clamp(min=0)  # [B] tokens into the band
    ramp = (over / max(cache_len, 1)).clamp(max=1.0)  # [B] 0 → 1 across the band
    return -penalty * torch.where(lengths > max_len, torch.ones_like(ramp), ramp)
