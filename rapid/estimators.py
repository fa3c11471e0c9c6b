"""The loss registry: every policy-gradient estimator rapid trains with, one function each, selected by
`algorithm.loss` (conf/algorithm/<name>.yaml). docs/estimators.md has the math of each and how to add one.

A loss is a pure function ``fn(x: LossInputs, a: Mapping) -> (loss [], stats {name: float})``: ``x``
holds the minibatch's tensors and normalisers, ``a`` the algorithm's settings (the `algorithm.*`
config, or a plain dict in tests; a loss reads only the keys it declares). It is registered with

    @register("name", level="token" | "sequence", keys=(...), reference=..., skip=..., check=...,
              iw=..., group_relative=...)

declaring what rapid.train must give it and what it gives back: a frozen reference model
(``reference``: bool or a function of ``a``); which zero-gradient groups `train.skip_zero_advantage`
may leave out (``skip``: "equal_rewards", "zero_rewards" or None, or a function of ``a`` returning one;
see ``rapid.buffer.groups_with_gradient``); ``check(a)``, one sentence when a setting is wrong;
``iw``, whether its statistics describe truncated sequence importance weights w̄ (``clip_frac`` the
fraction with w > η, ``staleness``, and the moments ``w_bar_mean`` / ``w_bar_sq_mean``, from which
rapid.train takes each step's effective sample size, which `algorithm.H=auto` reads; logged under
`iw/`); ``group_relative(a)``, whether a completion's advantage is relative to its group's (a group of
one then learns nothing). Adding a loss touches its function here, its conf/algorithm/<name>.yaml and
its test, nothing else. A baseline that is a program of its own rather than a loss in this loop (SFT:
distil, then fine-tune) is registered with ``register_program(name, "module:function")``.

Micro-batching contract (the one of rapid.losses and rapid.iw_grpg): ``x.n_records`` and
``x.n_tokens`` are the whole minibatch's record and completion-token counts; a micro-batch of whole
groups computes its share, and the micro-batch losses (and gradients) sum to the minibatch's. Stats
are means over this call's records or tokens (rapid.policy.accumulate_gradients averages them).

With ``w`` the sequence importance weight π_θ(y|x)/μ(y|x), ``r_t`` the token ratio, ``s`` GSPO's
length-normalised sequence ratio, ``A`` the advantage, ``B`` records, ``T_n`` the length of completion n:

    iw_grpg     RAPID / PG     −(1/B) Σ_n sg(min(w_n, η)) A_n^IW log π(y_n)        A^IW: Eq. 4/5 baseline
    rapid_mask  RAPID, masked  −(1/B) Σ_n sg(w_n 1[w_n ≤ η]) A_n log π(y_n)        same baseline, masked w
    grpo        DeepSeekMath   −(1/B) Σ_n (1/T_n) Σ_t [min(r A, clip(r, 1±ε) A) − β k3]
    dapo        DAPO           −(1/Σ T) Σ_{n,t} min(r A, clip(r, 1−ε_l, 1+ε_h) A)
    dr_grpo     Dr. GRPO       −(1/(B L)) Σ_{n,t} min(r A, clip(r, 1±ε) A),   A = R − mean_k R,  L = max tokens
    cispo       MiniMax-M1     −(1/Σ T) Σ_{n,t} sg(min(r_t, 1+ε_h)) A_n log π(y_nt)
    gspo        GSPO           −(1/B) Σ_n min(s_n A_n, clip(s_n, 1−ε_l, 1+ε_h) A_n),  s = exp(mean_t log r_t)
    topr        TOPR           −(1/B) Σ_n sg(c_n) A_n log π(y_n),   c = 1 if A ≥ 0 else min(w, 1)

GRPO, DAPO, CISPO and GSPO use the std-normalised group advantage (rapid.losses.group_normalized_advantages).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from rapid import iw_grpg as _iw_grpg
from rapid import losses as _losses
from rapid.iw_grpg import LOG_RATIO_MAX, group_advantages, iw_advantages, sequence_logprobs

__all__ = [
    "LossInputs",
    "Peers",
    "Estimator",
    "register",
    "register_program",
    "program",
    "upgrade_settings",
    "get",
    "names",
    "compute",
    "cispo_loss",
    "gspo_loss",
    "topr_loss",
    "masked_iw_loss",
]


@dataclass(frozen=True)
class LossInputs:
    """One (micro-)batch as every loss receives it. Only ``logp`` carries a gradient."""

    logp: Tensor  # [B, T] token log π_θ (differentiable)
    logp_old: Tensor  # [B, T] token log μ, the policy that sampled (0 on padding)
    mask: Tensor  # [B, T] True (or 1) on completion tokens
    rewards: Tensor  # [B]
    group_ids: Tensor  # [B]
    logp_ref: Tensor | None = None  # [B, T] token log π_ref, for losses that declare reference=True
    n_records: float | None = None  # the whole minibatch's records (default: this call's B)
    n_tokens: float | None = None  # the whole minibatch's completion tokens (default: this call's)
    max_tokens: int | None = None  # the maximum completion length (task.max_new_tokens)
    peers: Peers | None = None  # the whole groups, when groups span ranks (None: this call holds whole groups)


@dataclass(frozen=True)
class Peers:
    """A minibatch whose groups span ranks: every record's numbers gathered from all ranks (detached), so
    that a loss computes its group baselines over whole groups, exactly as one process would, and keeps
    this call's rows (``index``). Sequence log-probs, so that IW baselines see every member's current w̄."""

    rewards: Tensor  # [M] every record of the minibatch (all ranks, rank order)
    group_ids: Tensor  # [M]
    logp: Tensor  # [M] sequence log π_θ
    logp_old: Tensor  # [M] sequence log μ
    index: Tensor  # [B] the positions of this call's records in the above


LossFn = Callable[[LossInputs, Mapping[str, Any]], tuple[Tensor, dict[str, float]]]
Flag = Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class Estimator:
    """A registered loss and what it needs (module docstring)."""

    name: str
    fn: LossFn
    level: str  # "token" or "sequence": where the importance ratio lives
    keys: tuple[str, ...]  # the algorithm.* keys fn reads
    reference: Flag  # a -> whether a frozen reference model's log-probs are needed
    skip: Flag  # a -> "equal_rewards" | "zero_rewards" | None
    check: Flag  # a -> None, or one sentence saying what is wrong
    iw: bool = False  # stats describe the truncated sequence weights w̄ (clip_frac, staleness, w_bar_*): ESS, H=auto
    group_relative: Flag = lambda a: True  # a -> whether the advantage is relative to the group's
    program: str | None = None  # "module:function(cfg, run_dir)" run instead of the RL loop (fn is then None)


REGISTRY: dict[str, Estimator] = {}
SKIPS = ("equal_rewards", "zero_rewards", None)


def _as_flag(value) -> Flag:
    return value if callable(value) else (lambda a: value)


def register(
    name: str,
    *,
    level: str,
    keys: tuple[str, ...] = (),
    reference: bool | Flag = False,
    skip: str | None | Flag = "equal_rewards",
    check: Flag | None = None,
    iw: bool = False,
    group_relative: bool | Flag = True,
) -> Callable[[LossFn], LossFn]:
    """Decorator: register ``fn`` as `algorithm.loss=name` (module docstring)."""
    if level not in ("token", "sequence"):
        raise ValueError(f"level must be 'token' or 'sequence'; got {level!r}.")
    if not callable(skip) and skip not in SKIPS:
        raise ValueError(f"skip must be one of {SKIPS} or a function of the settings; got {skip!r}.")

    def decorate(fn: LossFn) -> LossFn:
        if name in REGISTRY:
            raise ValueError(f"a loss named {name!r} is already registered ({REGISTRY[name].fn.__qualname__}).")
        REGISTRY[name] = Estimator(
            name,
            fn,
            level,
            tuple(keys),
            _as_flag(reference),
            _as_flag(skip),
            check or (lambda a: None),
            iw,
            _as_flag(group_relative),
        )
        return fn

    return decorate


def register_program(name: str, program: str) -> None:
    """Register `algorithm.loss=name` as a baseline that is a program of its own, `program` = "module:function",
    called as function(cfg, run_dir) -> summary instead of rapid.train's loop (imported only when run)."""
    if name in REGISTRY:
        raise ValueError(f"a loss named {name!r} is already registered.")
    REGISTRY[name] = Estimator(
        name, None, "sequence", (), _as_flag(False), _as_flag(None), lambda a: None, program=program
    )


def program(name: str) -> Callable | None:
    """The function that runs `algorithm.loss=name` when it is a program of its own (`register_program`), else None."""
    est = REGISTRY.get(name)
    if est is None or est.program is None:
        return None
    import importlib

    module, _, function = est.program.partition(":")
    return getattr(importlib.import_module(module), function)


def names() -> list[str]:
    """The registered losses (not the baselines registered as programs of their own)."""
    return sorted(name for name, est in REGISTRY.items() if est.fn is not None)


def get(name: str) -> Estimator:
    """The registered loss ``name``; an unknown name raises KeyError with one sentence naming the known ones."""
    if name not in REGISTRY:
        programs = sorted(n for n, est in REGISTRY.items() if est.program)
        raise KeyError(
            f"algorithm.loss={name} is not a registered loss: use one of {', '.join(names())}"
            + (f" (or {', '.join(programs)}, a baseline run as a program of its own)" if programs else "")
        )
    return REGISTRY[name]


def problem(a: Mapping[str, Any]) -> str | None:
    """One sentence saying what is wrong with the loss settings ``a`` (`algorithm.*`), or None."""
    try:
        est = get(a["loss"])
    except KeyError as e:
        return e.args[0]
    missing = [k for k in est.keys if k not in a]
    if missing:
        return (
            f"algorithm.loss={est.name} reads algorithm.{', algorithm.'.join(missing)}, which the config lacks: "
            f"start from conf/algorithm/{est.name}.yaml (algorithm={est.name})"
        )
    return est.check(a)


# Earlier names of loss settings -> today's (one name per knob: the papers' ε_low / ε_high, TRL's β).
DEPRECATED = {
    "clip_eps": ("eps_low", "eps_high"),
    "clip_low": ("eps_low",),
    "clip_high": ("eps_high",),
    "kl_coef": ("beta",),
}


def upgrade_settings(a) -> list[str]:
    """Read the earlier names of `DEPRECATED` in the `algorithm.*` settings ``a`` (a DictConfig or dict, changed in
    place) as today's: a set one is copied to its new names (where it wins over their defaults) and set back to
    null (conf/algorithm/rapid.yaml keeps them, null). Returns one notice per earlier name that was set."""
    notices = []
    for old, new in DEPRECATED.items():
        value = a.get(old)
        if value is None:
            continue
        a[old] = None
        for key in new:
            a[key] = value
        notices.append(
            f"algorithm.{old} is an earlier name: read as {' '.join(f'algorithm.{k}={value}' for k in new)} "
            "(set those instead)"
        )
    return notices


def compute(name: str, x: LossInputs, a: Mapping[str, Any]) -> tuple[Tensor, dict[str, float]]:
    """loss, stats of the registered loss ``name`` on ``x`` with settings ``a``."""
    return get(name).fn(x, a)


# ----------------------------------------------------------------------------- helpers


def _dtype(logp: Tensor) -> torch.dtype:
    return torch.float64 if logp.dtype == torch.float64 else torch.float32


def _masked(x: Tensor, keep: Tensor, dtype: torch.dtype) -> Tensor:
    """x in ``dtype`` with exact zeros where not kept (no nan from padding reaches a value or gradient)."""
    return torch.where(keep, x.to(dtype), torch.zeros((), dtype=dtype, device=x.device))


def _positive(a: Mapping[str, Any], *keys: str) -> str | None:
    for key in keys:
        value = a[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            return f"algorithm.{key}={value} must be a number > 0 for algorithm.loss={a['loss']}"
    return None


# ----------------------------------------------------------------------------- new losses (pure)


def cispo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_high: float = 4.0,
    eps_low: float | None = None,
    normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """CISPO (MiniMax-M1, arXiv 2506.13585, Eq. 4): token-level REINFORCE with a clipped, stop-gradient
    importance weight and token-level normalisation.

    logp, logp_old, mask [B, T], advantages [B] -> loss [], stats. With r_t = exp(logp − logp_old)
    and r̂_t = clip(r_t, 1 − eps_low, 1 + eps_high) (``eps_low`` None: no lower bound, the paper's choice),

        loss = −(1/normalizer) Σ_{n,t} sg(r̂_nt) · A_n · logp_nt,     ∂loss/∂logp_nt = −r̂_nt A_n / normalizer,

    ``normalizer`` the completion tokens of the whole minibatch (default: this call's). Unlike PPO no
    token loses its gradient: the weight is bounded, the token is kept. stats: ``clip_frac`` (tokens
    with r > 1 + eps_high), ``clip_frac_low`` (r < 1 − eps_low), ``ratio_mean`` (token mean of r).
    """
    dtype = _dtype(logp)
    keep = mask.bool()
    lp, lp_old = _masked(logp, keep, dtype), _masked(logp_old.detach(), keep, dtype)
    ratio = (lp.detach() - lp_old).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX).exp()  # [B, T] r, 1 where masked
    weight = ratio.clamp(min=None if eps_low is None else 1.0 - eps_low, max=1.0 + eps_high)  # [B, T] r̂
    obj = weight * advantages.detach().to(dtype)[:, None] * lp  # [B, T], 0 where masked
    n = keep.sum().clamp(min=1).to(dtype)
    loss = -obj.sum() / (n if normalizer is None else normalizer)
    high = (keep & (ratio > 1.0 + eps_high)).sum() / n
    low = (keep & (ratio < 1.0 - eps_low)).sum() / n if eps_low is not None else torch.zeros_like(high)
    ratio_mean = torch.where(keep, ratio, 0.0).sum() / n
    values = torch.stack([high, low, ratio_mean]).tolist()
    return loss, dict(zip(("clip_frac", "clip_frac_low", "ratio_mean"), values))


def gspo_loss(
    logp: Tensor,
    logp_old: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float = 3e-4,
    eps_high: float = 4e-4,
    normalizer: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """GSPO (arXiv 2507.18071, Eq. 5-7): PPO clipping of the length-normalised sequence ratio.

    logp, logp_old, mask [B, T], advantages [B] -> loss [], stats. With
    s_n = exp((1/T_n) Σ_t (logp_nt − logp_old_nt)) (the geometric mean of the token ratios),

        loss = −(1/normalizer) Σ_n min(s_n A_n, clip(s_n, 1 − eps_low, 1 + eps_high) A_n),

    ``normalizer`` the records of the whole minibatch (default: this call's B). Unclipped,
    ∂loss/∂logp_nt = −s_n A_n / (T_n · normalizer); a clipped sequence has no gradient. stats
    (means over this call's records): ``clip_frac`` (clip active), ``clip_frac_low`` (A < 0,
    s < 1 − eps_low), ``clip_frac_high`` (A > 0, s > 1 + eps_high), ``ratio_mean`` (mean s),
    ``log_ratio_abs_mean`` (mean |log s|).
    """
    dtype = _dtype(logp)
    keep = mask.bool()
    lp, lp_old = _masked(logp, keep, dtype), _masked(logp_old.detach(), keep, dtype)
    lengths = keep.sum(-1).clamp(min=1).to(dtype)  # [B] T_n
    log_s = ((lp - lp_old).sum(-1) / lengths).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX)  # [B]
    s = log_s.exp()
    adv = advantages.detach().to(dtype)
    obj = torch.minimum(s * adv, s.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)  # [B]
    b = float(logp.shape[0]) if normalizer is None else float(normalizer)
    loss = -obj.sum() / b
    sd = s.detach()
    low = ((adv < 0) & (sd < 1.0 - eps_low)).to(dtype).mean()
    high = ((adv > 0) & (sd > 1.0 + eps_high)).to(dtype).mean()
    values = torch.stack([low + high, low, high, sd.mean(), log_s.detach().abs().mean()]).tolist()
    return loss, dict(zip(("clip_frac", "clip_frac_low", "clip_frac_high", "ratio_mean", "log_ratio_abs_mean"), values))


def topr_loss(
    logp: Tensor, logp_old: Tensor, advantages: Tensor, normalizer: float | None = None
) -> tuple[Tensor, dict[str, float]]:
    """TOPR (Tapered Off-Policy REINFORCE, arXiv 2503.14286, Eq. 8): sequence-level REINFORCE, truncated
    importance sampling on the negative samples only.

    logp, logp_old [B] (sequence log-probs), advantages [B] (R − baseline) -> loss [], stats. With
    w_n = exp(logp_n − logp_old_n) and c_n = 1 if A_n ≥ 0 else min(w_n, 1) (the paper's [w]_0^1),

        loss = −(1/normalizer) Σ_n sg(c_n) · A_n · logp_n,     ∂loss/∂logp_n = −c_n A_n / normalizer.

    Positive samples are pulled up as in SFT, whatever π_θ now thinks of them; a negative one is pushed
    down only as far as π_θ still produces it. stats: ``trunc_frac`` (records with A < 0 and w < 1:
    the taper is active), ``neg_frac`` (A < 0), ``iw_mean``, ``adv_mean``, ``adv_abs_mean``.
    """
    dtype = _dtype(logp)
    if logp.dim() != 1 or logp_old.shape != logp.shape or advantages.shape != logp.shape:
        raise ValueError(
            f"logp, logp_old and advantages must all have shape [B]; got {tuple(logp.shape)}, "
            f"{tuple(logp_old.shape)} and {tuple(advantages.shape)}."
        )
    w = (logp.detach().to(dtype) - logp_old.detach().to(dtype)).clamp(-LOG_RATIO_MAX, LOG_RATIO_MAX).exp()
    adv = advantages.detach().to(dtype)
    negative = adv < 0
    coef = torch.where(negative, w.clamp(max=1.0), torch.ones_like(w))
    b = float(logp.shape[0]) if normalizer is None else float(normalizer)
    loss = -(coef * adv * logp.to(dtype)).sum() / b
    values = torch.stack(
        [(negative & (w < 1.0)).to(dtype).mean(), negative.to(dtype).mean(), w.mean(), adv.mean(), adv.abs().mean()]
    ).tolist()
    return loss, dict(zip(("trunc_frac", "neg_frac", "iw_mean", "adv_mean", "adv_abs_mean"), values))


def masked_iw_loss(
    logp: Tensor,
    logp_mu: Tensor,
    rewards: Tensor,
    group_ids: Tensor,
    eta: float = 2.0,
    leave_one_out: bool = False,
    normalizer: float | None = None,
    peers: Peers | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """RAPID with masked instead of truncated importance sampling (verl's / TRL's "mask" modes at the
    sequence level): a record whose weight exceeds η leaves the gradient and the baseline.

    logp, logp_mu [B] (sequence log-probs), rewards, group_ids [B] -> loss [], stats. With
    w_n = exp(logp_n − logp_mu_n) and w̃_n = w_n · 1[w_n ≤ η],

        A_n  = R_n − (1/N_k) Σ_{n'∈N_k} w̃_n' R_n'       (leave-one-out: over n' ≠ n, divided by N_k − 1)
        loss = −(1/normalizer) Σ_n sg(w̃_n) · A_n · logp_n.

    Truncation keeps a stale record at weight η; masking drops it (biased towards the records the
    policy has not moved to). stats as ``rapid.iw_grpg.iw_grpg_loss``'s, for w̃: ``clip_frac`` is the
    masked fraction (w > η), ``staleness`` mean |log w| over the kept records, ``w_bar_mean`` /
    ``w_bar_sq_mean`` the moments of w̃ (its ESS), ``iw_mean`` / ``iw_max`` of w, ``clipped_mass``
    Σ_masked w|A| / Σ w|A|. ``peers``: the whole groups when they span ranks (``Peers``); the baseline
    is then computed over them.
    """
    if eta <= 0:
        raise ValueError(f"eta must be positive; got {eta}.")
    if logp.dim() != 1 or logp_mu.shape != logp.shape:
        raise ValueError(
            f"logp and logp_mu must both have shape [B]; got {tuple(logp.shape)} and {tuple(logp_mu.shape)}."
        )
    dtype = _dtype(logp)
    log_w = (logp.detach().to(dtype) - logp_mu.detach().to(dtype)).clamp(max=LOG_RATIO_MAX)
    w = log_w.exp()
    kept = w <= eta
    w_tilde = torch.where(kept, w, torch.zeros_like(w))
    if peers is None:
        adv = group_advantages(rewards, group_ids, w_tilde, leave_one_out).to(dtype)
    else:
        w_all = (peers.logp.to(dtype) - peers.logp_old.to(dtype)).clamp(max=LOG_RATIO_MAX).exp()
        w_all = torch.where(w_all <= eta, w_all, torch.zeros_like(w_all))
        adv = group_advantages(peers.rewards, peers.group_ids, w_all, leave_one_out)[peers.index].to(dtype)
    b = float(logp.shape[0]) if normalizer is None else float(normalizer)
    loss = -(w_tilde * adv * logp.to(dtype)).sum() / b
    mass = (w * adv.abs()).sum()
    removed = (torch.where(kept, 0.0, w) * adv.abs()).sum()
    clipped_mass = torch.where(mass > 0, removed / mass.clamp(min=torch.finfo(dtype).tiny), 0.0)
    n_kept = kept.sum().clamp(min=1)
    values = torch.stack(
        [
            (~kept).to(dtype).mean(),
            torch.where(kept, log_w.abs(), 0.0).sum() / n_kept,
            w.mean(),
            w.max(),
            w_tilde.mean(),
            w_tilde.square().mean(),
            adv.mean(),
            adv.abs().mean(),
            clipped_mass,
        ]
    ).tolist()
    names_ = (
        "clip_frac",
        "staleness",
        "iw_mean",
        "iw_max",
        "w_bar_mean",
        "w_bar_sq_mean",
        "adv_mean",
        "adv_abs_mean",
        "clipped_mass",
    )
    return loss, dict(zip(names_, values))


# ----------------------------------------------------------------------------- the registry


# The existing losses are looked up in their modules at call time (rapid.losses.grpo_loss, not a copy
# bound at import), so that a function replaced there (tests/test_ablations.py traces them) is the one run.


def _seq(x: LossInputs) -> tuple[Tensor, Tensor]:
    return sequence_logprobs(x.logp, x.mask), sequence_logprobs(x.logp_old, x.mask)


def _advantages(x: LossInputs, fn: Callable[[Tensor, Tensor], Tensor]) -> Tensor:
    """fn(rewards, group_ids) -> A [B] of this call's records: over the whole groups when they span ranks."""
    if x.peers is None:
        return fn(x.rewards, x.group_ids)
    return fn(x.peers.rewards, x.peers.group_ids)[x.peers.index]


@register(
    "iw_grpg",
    level="sequence",
    keys=("eta", "leave_one_out", "iw_baseline", "iw_gradient"),
    # Eq. 4's baseline is 0 only for all-zero groups (an all-correct group has A = 1 − mean w̄)
    skip=lambda a: "zero_rewards" if a["iw_baseline"] else "equal_rewards",
    iw=True,
)
def iw_grpg(x: LossInputs, a: Mapping[str, Any]) -> tuple[Tensor, dict[str, float]]:
    """RAPID (and PG at H = 1): IW-GRPG, Eq. 3-5 (rapid/iw_grpg.py)."""
    p = x.peers  # a group spanning ranks: its baseline from every member's current w̄
    adv = None
    if p is not None:
        adv = iw_advantages(p.logp, p.logp_old, p.rewards, p.group_ids, a["eta"], a["leave_one_out"], a["iw_baseline"])[
            p.index
        ]
    return _iw_grpg.iw_grpg_loss(
        *_seq(x),
        x.rewards,
        x.group_ids,
        eta=a["eta"],
        leave_one_out=a["leave_one_out"],
        normalizer=x.n_records,
        iw_baseline=a["iw_baseline"],
        iw_gradient=a["iw_gradient"],
        advantages=adv,
    )


@register(
    "rapid_mask",
    level="sequence",
    keys=("eta", "leave_one_out"),
    skip="zero_rewards",  # the masked-IW baseline, like Eq. 4's, is 0 for an all-zero group only
    iw=True,
    check=lambda a: (
        None
        if a["eta"] is not None and a["eta"] >= 1
        else f"algorithm.eta={a['eta']} must be a number >= 1 for algorithm.loss=rapid_mask (the mask is w > eta)"
    ),
)
def rapid_mask(x: LossInputs, a: Mapping[str, Any]) -> tuple[Tensor, dict[str, float]]:
    return masked_iw_loss(
        *_seq(x),
        x.rewards,
        x.group_ids,
        eta=a["eta"],
        leave_one_out=a["leave_one_out"],
        normalizer=x.n_records,
        peers=x.peers,
    )


def _kl_check(a: Mapping[str, Any]) -> str | None:
    return _clip_check(a) or (
        None if a["beta"] >= 0 else f"algorithm.beta={a['beta']} must be >= 0 (0: no reference model)"
    )


def _clip_check(a: Mapping[str, Any]) -> str | None:
    """The ratio clip [1 − eps_low, 1 + eps_high]: both > 0, and 1 − eps_low > 0."""
    return _positive(a, "eps_low", "eps_high") or (
        None
        if a["eps_low"] < 1
        else f"algorithm.eps_low={a['eps_low']} must be < 1 (the clip is [1 − eps_low, 1 + eps_high])"
    )


@register(
    "grpo",
    level="token",
    keys=("eps_low", "eps_high", "beta", "aggregation"),
    reference=lambda a: a["beta"] > 0,
    skip=lambda a: None if a["beta"] > 0 else "equal_rewards",  # the KL term pulls on every group
    check=_kl_check,
)
def grpo(x: LossInputs, a: Mapping[str, Any]) -> tuple[Tensor, dict[str, float]]:
    """GRPO (DeepSeekMath): rapid.losses.grpo_loss on std-normalised group advantages."""
    return _losses.grpo_loss(
        x.logp,
        x.logp_old,
        x.logp_ref,
        _advantages(x, _losses.group_normalized_advantages),
        x.mask,
        clip_eps=a["eps_low"],
        clip_eps_high=a["eps_high"],
        kl_coef=a["beta"],
        aggregation=a["aggregation"],
        max_tokens=x.max_tokens,
        normalizer=x.n_tokens if a["aggregation"] == "token_mean" else x.n_records,
    )


@register("dapo", level="token", keys=("eps_low", "eps_high"), check=_clip_check)
def dapo(x: LossInputs, a: Mapping[str, Any]) -> tuple[Tensor, dict[str, float]]:
    """DAPO: rapid.losses.dapo_loss on std-normalised group advantages."""
    return _losses.dapo_loss(
        x.logp,
        x.logp_old,
        _advantages(x, _losses.group_normalized_advantages),
        x.mask,
        clip_low=a["eps_low"],
        clip_high=a["eps_high"],
        normalizer=x.n_tokens,
    )


@register(
    "dr_grpo",
    level="token",
    keys=("eps_low", "eps_high", "beta"),
    reference=lambda a: a["beta"] > 0,
    skip=lambda a: None if a["beta"] > 0 else "equal_rewards",
    check=_kl_check,
)
def dr_grpo(x: LossInputs, a: Mapping[str, Any]) -> tuple[Tensor, dict[str, float]]:
    """Dr. GRPO (arXiv 2503.20783, Eq. 3): GRPO without the std in the advantage (A = R − mean_k R)
    and without the per-completion length normalisation (a constant, B · max_tokens)."""
    return _losses.grpo_loss(
        x.logp,
        x.logp_old,
        x.logp_ref,
        _advantages(x, lambda r, g: _losses.group_normalized_advantages(r, g, scale=None)),
        x.mask,
        clip_eps=a["eps_low"],
        clip_eps_high=a["eps_high"],
        kl_coef=a["beta"],
        aggregation="constant",
        max_tokens=x.max_tokens,
        normalizer=x.n_records,
    )


@register(
    "cispo",
    level="token",
    keys=("eps_high", "eps_low"),
    check=lambda a: _positive(a, "eps_high") or (None if a["eps_low"] is None else _positive(a, "eps_low")),
)
def cispo(x: LossInputs, a: Mapping[str, Any]) -> tuple[Tensor, dict[str, float]]:
    return cispo_loss(
        x.logp,
        x.logp_old,
        _advantages(x, _losses.group_normalized_advantages),
        x.mask,
        eps_high=a["eps_high"],
        eps_low=a["eps_low"],
        normalizer=x.n_tokens,
    )


@register(
    "gspo",
    level="sequence",
    keys=("eps_low", "eps_high"),
    check=_clip_check,
)
def gspo(x: LossInputs, a: Mapping[str, Any]) -> tuple[Tensor, dict[str, float]]:
    return gspo_loss(
        x.logp,
        x.logp_old,
        _advantages(x, _losses.group_normalized_advantages),
        x.mask,
        eps_low=a["eps_low"],
        eps_high=a["eps_high"],
        normalizer=x.n_records,
    )


def topr_advantages(rewards: Tensor, group_ids: Tensor, baseline: float | str) -> Tensor:
    """TOPR's A = R − c: c a constant (the paper's baseline), or "group_mean" (R − mean_k R)."""
    if baseline == "group_mean":
        return group_advantages(rewards, group_ids)
    return (
        rewards.detach().to(torch.get_default_dtype() if not rewards.is_floating_point() else rewards.dtype) - baseline
    )


def _topr_check(a: Mapping[str, Any]) -> str | None:
    c = a["baseline"]
    if c == "group_mean" or (isinstance(c, (int, float)) and not isinstance(c, bool) and math.isfinite(c)):
        return None
    return f"algorithm.baseline={c} must be a number (TOPR's constant c, A = R − c) or group_mean"


@register(
    "topr",
    level="sequence",
    keys=("baseline",),
    # a constant baseline gives every group a non-zero advantage; the group mean zeroes equal-reward groups
    skip=lambda a: "equal_rewards" if a["baseline"] == "group_mean" else None,
    check=_topr_check,
    group_relative=lambda a: a["baseline"] == "group_mean",  # a constant c: A = R - c learns from a group of one
)
def topr(x: LossInputs, a: Mapping[str, Any]) -> tuple[Tensor, dict[str, float]]:
    return topr_loss(
        *_seq(x), _advantages(x, lambda r, g: topr_advantages(r, g, a["baseline"])), normalizer=x.n_records
    )


register_program("sft", "rapid.sft:distill_and_sft")  # the paper's SFT baseline: rapid.distill, then rapid.sft
