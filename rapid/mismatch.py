"""Training-inference mismatch: truncated importance correction between the trainer's μ and the
engine's μ_engine (`algorithm.engine_correction`).

Pure tensor math: no model, no config, no state.

The completions of a round are sampled by the inference engine, so they come from the engine's
distribution μ_engine. With `algorithm.behavior_logprobs=recompute`, log μ is the trainer's own
forward pass at the round's starting weights, μ_trainer: the same policy computed with the
trainer's kernels. In fp32 the two agree to ~1e-6 per token; in bf16 they differ per token
(experiments/results/iw_bf16/). IW-GRPG's weight is taken against the trainer's μ,

    w_n = π_θ(y_n|x_n) / μ_trainer(y_n|x_n),        w̄_n = min(w_n, η),

which is 1 on a round's first step as the algorithm assumes. The exact off-policy weight of a
sample drawn from μ_engine is π_θ / μ_engine = w_n · ρ_n, with the mismatch ratio

    ρ_n = μ_trainer(y_n|x_n) / μ_engine(y_n|x_n) = Π_t ρ_nt,
    ρ_nt = exp(log μ_trainer(y_nt|·) − log μ_engine(y_nt|·)).

The correction multiplies the gradient of each sample (or token) by a truncated ratio, at
truncation level C (`algorithm.engine_correction_cap`):

    sequence   g = (1/B) Σ_n min(ρ_n, C) · w̄_n A_n ∇_θ log π_θ(y_n|x_n)
    token      g = (1/B) Σ_n w̄_n A_n Σ_t min(ρ_nt, C) ∇_θ log π_θ(y_nt|x_n, y_n,<t)

The sequence variant is the exact ratio, truncated (bias only where ρ_n > C; its variance grows
with the completion length, as log ρ_n is a sum over tokens). The token variant keeps each
factor near 1 and has low variance, at the price of a bias: it corrects each token's term by its
own ratio instead of the product over the sequence. The two truncations are separate: η bounds
the policy's drift within a round, C the numerical gap, so a sample's total weight is at most ηC.
The group baseline of A_n keeps the trainer-relative w̄ (the baseline needs only to be
independent of y_n, not exact). With `behavior_logprobs=sampler`, μ_trainer is μ_engine, every
ρ = 1 and the correction is the identity; it is therefore only offered with `recompute`.

The same factors apply to GRPO's and DAPO's token-level losses: every token's term of the
objective (its clipped ratio term and its KL term) is multiplied by its factor.

They are applied through the gradient only (`scale_gradient`): the values of the log-probs, and
so of the weights, the losses and every statistic, are unchanged.
"""

from __future__ import annotations

import torch
from torch import Tensor

from rapid.iw_grpg import LOG_RATIO_MAX

__all__ = ["LEVELS", "truncated_is_factors", "scale_gradient"]

LEVELS = ("none", "token", "sequence")


def truncated_is_factors(
    logp_trainer: Tensor, logp_engine: Tensor, mask: Tensor, level: str, cap: float
) -> tuple[Tensor, dict[str, float]]:
    """Per-token gradient factors min(ρ, C) and their statistics.

    logp_trainer, logp_engine, mask [B, T] (token log-probs under μ_trainer and μ_engine; mask
    marks completion tokens) -> factors [B, T] (float32, or float64 for float64 inputs), stats.

    ``level`` "token": factor min(ρ_nt, C) at token t; "sequence": min(ρ_n, C) at every token of
    completion n; "none": all ones. Masked positions get 1 (they carry no gradient anyway).
    Log-ratios are clamped at ±LOG_RATIO_MAX before the exponential.

    stats (Python floats, over this call's tokens for "token", over its completions for
    "sequence"): ``ratio_mean`` mean ρ before truncation, ``trunc_frac`` fraction with ρ > C.
    """
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}; got {level!r}.")
    if cap <= 0:
        raise ValueError(f"cap (the truncation level C) must be positive; got {cap}.")
    if logp_trainer.shape != logp_engine.shape or mask.shape != logp_trainer.shape or logp_trainer.dim() != 2:
        raise ValueError(
            f"logp_trainer, logp_engine and mask must share one shape [B, T]; got "
            f"{tuple(logp_trainer.shape)}, {tuple(logp_engine.shape)}, {tuple(mask.shape)}."
        )
    dtype = torch.float64 if logp_trainer.dtype == torch.float64 else torch.float32
    keep = mask.bool()
    zero = torch.zeros((), dtype=dtype, device=logp_trainer.device)
    log_rho = torch.where(keep, logp_trainer.detach().to(dtype) - logp_engine.detach().to(dtype), zero)  # [B, T]
    if level == "none":
        return torch.ones_like(log_rho), {"ratio_mean": 1.0, "trunc_frac": 0.0}
    if level == "token":
        rho = log_rho.clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX).exp()  # [B, T]
        factors = torch.where(keep, rho.clamp(max=cap), torch.ones_like(rho))
        n = keep.sum().clamp(min=1).to(dtype)
        values = torch.stack([torch.where(keep, rho, zero).sum() / n, (keep & (rho > cap)).to(dtype).sum() / n])
    else:
        rho = log_rho.sum(-1).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX).exp()  # [B]
        factors = torch.where(keep, rho.clamp(max=cap)[:, None], torch.ones_like(log_rho))
        values = torch.stack([rho.mean(), (rho > cap).to(dtype).mean()])
    ratio_mean, trunc_frac = values.tolist()  # one device sync
    return factors, {"ratio_mean": ratio_mean, "trunc_frac": trunc_frac}


def scale_gradient(x: Tensor, factors: Tensor) -> Tensor:
    """x with its value unchanged and its gradient multiplied by ``factors`` (constant):
    x [...] , factors broadcastable to x -> [...].  Forward: x exactly; backward: factors · dL/dx."""
    x_const = x.detach()
    return x_const + factors.detach().to(x.dtype) * (x - x_const)
