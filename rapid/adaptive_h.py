"""`algorithm.H=auto`: the number H of off-policy steps per round, chosen online from the importance
weights and the measured cost of each phase, between `algorithm.auto_h.min` and `max`.

A round of H steps generates n_inference = H · n_step samples, then takes H IW-GRPG steps on them.
Too small an H amortises neither generation (small engine batches) nor the per-round costs (weight
sync); too large an H trains on stale samples. After every round the controller sets the next H:

1. Staleness cap, from the importance weights. Step k of a round (k = 1..H) measures the normalised
   effective sample size of its minibatch (over all ranks), with w̄ = min(w, η) the weights the
   gradient uses:
        e_k = (Σ w̄)² / (n Σ w̄²)                                       (`rapid.iw_grpg.normalized_ess`)
   On step 1, θ = μ and e_1 reflects only the sampler/trainer log-prob mismatch (1 with exact log μ);
   H cannot change that part, so the controller works with the drift ESS d_k = e_k / e_1 and
        ℓ_k = −log d_k   (≥ 0).
   A step whose every group has advantage 0 trains nothing and measures nothing
   (`train.skip_zero_advantage`): the ESS arrive as (k, e_k) pairs of the steps measured. When step 1
   was not measured, the first measured step k_1 stands in for it: d_k = e_k / e_{k_1}, and the fit
   below uses x_k = (k − 1)² − (k_1 − 1)², the drift added since k_1 (both as written when k_1 = 1).
   If log w = mismatch + drift with independent normal parts (and few weights clipped), the ESS of
   log-normal weights gives −log e_k = Var(log w), so ℓ_k is the variance of the drift. A policy moving by a steady step per update drifts ∝ (k − 1), so
        ℓ_k ≈ s · (k − 1)²,      s = Σ_{k≥2} (k−1)² ℓ_k / Σ_{k≥2} (k−1)⁴   (least squares, the round's steps)
   predicts the drift ESS of the last step of a round of H steps as exp(−s (H − 1)²). The cap is the
   largest H whose prediction stays at or above ρ = `ess_target`:
        H_cap = clamp(1 + ⌊√(log(1/ρ) / s)⌋, min, max)     (max when s = 0 or no step k ≥ 2 was measured)

2. Cost, from the phase times. A round of H steps generates b = H · n_step samples; generation is
   modelled as T_gen(b) = α + β·b (α: what batching amortises, e.g. memory-bound decoding; β: the
   per-sequence compute), fitted by non-negative least squares to the generation times measured at
   each batch size seen (an exponential average per size). The rest of a round costs λ per sample
   (reward, recompute, train) and F per round (weight sync, everything else). Wall time per sample:
        c(H) = β + λ + (α + F) / (H · n_step)
   It falls with H, ever more slowly. The cost choice is the smallest H within τ = `cost_tolerance`
   of the cheapest H the cap allows:
        H_cost = min{H ∈ [min, H_cap] : c(H) ≤ (1 + τ) · c(H_cap)}
   so samples stay fresh unless staleness buys more than τ of wall time. τ = 0 always takes H_cap:
   the choice then depends on the weights alone, not on timing. Until two batch sizes have been
   timed, α and β cannot be told apart and H_cost = H_cap: the next round grows where the weights
   allow it, which times a second size.

3. The next round's H is
        H_{t+1} = clamp(min(H_cost, 2 · H_t), min, max)
   It shrinks at once when the last round drifted more than ρ allows or the cost says so, and at
   most doubles per round, so that both fits are extrapolated one doubling beyond what was measured.
   The last round of the run's sample budget is cut to the samples left (`plan`).

Early stop within a round (`stop_early`): when a step after the first measured one has drift ESS d_k < `ess_floor`, that
step's gradient is not applied and the round ends. The samples of that minibatch and of the ones
not reached are not trained on: they still count in `samples` (samples generated) and are logged as
`algorithm/unused_samples`. The learning-rate schedule runs over (sample budget / n_step) steps and
advances over the unused ones too, so it ends where the budget ends.

`update` returns the round's log: `algorithm/ess_last` (d of the last measured step),
`algorithm/drift` (s), `algorithm/next_H` and what decided it: `algorithm/next_H_ess` (H_cap),
`algorithm/next_H_cost`, `algorithm/gen_alpha_s` (α), `algorithm/predicted_s_per_sample` (c(next H)).

All inputs are averaged over ranks before they reach the controller, so every rank computes the
same H. `State.state_dict()` goes into the checkpoint: a resumed run continues with the same H
sequence (exactly so with τ = 0; with τ > 0 as far as the times it measures after resuming agree).
Pure functions of plain numbers: no model, no config object, no I/O; `end_round`, what rapid.train
calls after each round, adds the one collective (the phase times averaged over ranks).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace

EMA = 0.5  # weight of the newest measurement in the per-size averages of the phase times
MIN_DRIFT_ESS = 1e-12  # d_k is floored here so that ℓ_k stays finite


@dataclass(frozen=True)
class Settings:
    """`algorithm.auto_h` (conf/algorithm/rapid.yaml) and `algorithm.n_step`."""

    h_min: int
    h_max: int
    ess_target: float  # ρ
    ess_floor: float  # early stop below this drift ESS
    cost_tolerance: float  # τ
    n_step: int

    @classmethod
    def from_config(cls, auto_h, n_step: int) -> Settings:
        return cls(
            int(auto_h.min),
            int(auto_h.max),
            float(auto_h.ess_target),
            float(auto_h.ess_floor),
            float(auto_h.cost_tolerance),
            int(n_step),
        )


@dataclass
class State:
    H: int  # the next round's H
    generate_s: dict[int, float] = field(default_factory=dict)  # samples per round -> averaged generation seconds
    per_sample_s: float | None = None  # λ, averaged
    per_round_s: float | None = None  # F, averaged

    def state_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_state_dict(cls, state: dict) -> State:
        return cls(**state)


@dataclass(frozen=True)
class Round:
    """What one round measured (every value already averaged over ranks)."""

    H: int  # steps planned; H · n_step samples were generated
    ess: Sequence[tuple[int, float]]  # (k, e_k) of the steps measured, k = 1..H (a fully skipped step has none)
    generate_s: float  # generation phase
    reward_s: float  # reward (and recompute) phases: per generated sample
    train_s: float  # train phase: per measured step's samples
    fixed_s: float  # weight sync and everything else in the round
    steps: int | None = None  # steps computed (an early-stopped one included); None: one per measured step


def initial_state(settings: Settings) -> State:
    return State(H=settings.h_min)


def plan(state: State, samples_left: int, n_step: int) -> int:
    """This round's H: the controller's, cut to the samples left in the budget."""
    return max(1, min(state.H, samples_left // n_step))


def drift_ess(ess: Sequence[tuple[int, float]]) -> list[float]:
    """d_k = e_k / e_{k_1} for every measured (k, e_k), k_1 the first (d = 1 there), floored at
    MIN_DRIFT_ESS, at most 1."""
    if not ess or ess[0][1] <= 0:
        return [MIN_DRIFT_ESS] * len(ess)
    return [min(1.0, max(MIN_DRIFT_ESS, e / ess[0][1])) for _, e in ess]


def stop_early(ess: Sequence[tuple[int, float]], settings: Settings) -> bool:
    """After the latest measured step: whether its drift ESS fell below the floor (never on the first
    measured step)."""
    return len(ess) >= 2 and drift_ess(ess)[-1] < settings.ess_floor


def drift_rate(ess: Sequence[tuple[int, float]]) -> float | None:
    """s of ℓ_k ≈ s ((k − 1)² − (k_1 − 1)²), least squares over the measured steps after the first, k_1;
    None when no such step was measured."""
    d = drift_ess(ess)
    if len(d) < 2:
        return None
    k1 = ess[0][0]
    x = [(k - 1) ** 2 - (k1 - 1) ** 2 for k, _ in ess[1:]]
    ell = [-math.log(v) for v in d[1:]]
    return sum(xi * li for xi, li in zip(x, ell)) / sum(xi * xi for xi in x)


def ess_cap(ess: Sequence[tuple[int, float]], settings: Settings) -> int:
    """H_cap: the largest H in [min, max] whose predicted last-step drift ESS stays >= ess_target."""
    s = drift_rate(ess)
    h_ess = math.inf if not s else 1 + math.floor(math.sqrt(math.log(1 / settings.ess_target) / s))
    return int(max(settings.h_min, min(h_ess, settings.h_max)))


def fit_generation(generate_s: dict[int, float]) -> tuple[float, float] | None:
    """(α, β) >= 0 of T_gen(b) = α + β b by least squares over the sizes seen; None with fewer than two."""
    if len(generate_s) < 2:
        return None
    b, t = zip(*sorted(generate_s.items()))
    mb, mt = sum(b) / len(b), sum(t) / len(t)
    beta = sum((bi - mb) * (ti - mt) for bi, ti in zip(b, t)) / sum((bi - mb) ** 2 for bi in b)
    alpha = mt - beta * mb
    if beta < 0:  # more samples took less time (noise): all of it per round
        return mt, 0.0
    if alpha < 0:  # nothing to amortise: a line through the origin
        return 0.0, sum(bi * ti for bi, ti in zip(b, t)) / sum(bi * bi for bi in b)
    return alpha, beta


def cost_per_sample(H: int, alpha: float, beta: float, state: State, n_step: int) -> float:
    """c(H) = β + λ + (α + F) / (H n_step), seconds per sample."""
    return beta + state.per_sample_s + (alpha + state.per_round_s) / (H * n_step)


def average(old: float | None, new: float) -> float:
    return new if old is None else (1 - EMA) * old + EMA * new


def update(state: State, settings: Settings, r: Round) -> tuple[State, dict]:
    """The next round's H from what round `r` measured: (new state, the round's `algorithm/*` log)."""
    n = settings.n_step
    b = r.H * n
    generate_s = dict(state.generate_s)
    generate_s[b] = average(generate_s.get(b), r.generate_s)
    state = replace(
        state,
        generate_s=generate_s,
        per_sample_s=average(state.per_sample_s, r.reward_s / b + r.train_s / (max(1, r.steps or len(r.ess)) * n)),
        per_round_s=average(state.per_round_s, r.fixed_s),
    )
    h_cap = ess_cap(r.ess, settings)
    log = {"algorithm/ess_last": drift_ess(r.ess)[-1] if r.ess else 1.0, "algorithm/next_H_ess": h_cap}
    s = drift_rate(r.ess)
    if s is not None:
        log["algorithm/drift"] = s
    h_cost = h_cap  # τ = 0, or one batch size timed so far
    fit = fit_generation(generate_s)
    if fit is not None and settings.cost_tolerance > 0:
        alpha, beta = fit
        cheapest = cost_per_sample(h_cap, alpha, beta, state, n)
        h_cost = next(
            h
            for h in range(settings.h_min, h_cap + 1)
            if cost_per_sample(h, alpha, beta, state, n) <= (1 + settings.cost_tolerance) * cheapest
        )
    h_next = max(settings.h_min, min(h_cost, 2 * r.H, settings.h_max))
    log |= {"algorithm/next_H_cost": h_cost, "algorithm/next_H": h_next}
    if fit is not None:
        log |= {
            "algorithm/gen_alpha_s": fit[0],
            "algorithm/predicted_s_per_sample": cost_per_sample(h_next, *fit, state, n),
        }
    return replace(state, H=h_next), log


def end_round(
    state: State,
    settings: Settings,
    H: int,
    ess: Sequence[tuple[int, float]],
    steps: int,
    row: dict,
    world: int,
    device,
) -> tuple[State, dict]:
    """After a round of `H` planned steps, `steps` of them applied (fewer when it stopped early) with the
    ESS `ess`: its phase times (`row`'s `time/*_s`) averaged over ranks, `update`, and the round's
    `algorithm/*` log (H, steps, the samples generated but not trained on, and `update`'s)."""
    from rapid.distributed import all_reduce_sum

    times = all_reduce_sum(
        [row[f"time/{p}_s"] / world for p in ("generate", "reward", "recompute", "train", "sync", "other")], device
    )
    measured = Round(
        H,
        ess,
        generate_s=times[0],
        reward_s=times[1] + times[2],
        train_s=times[3],
        fixed_s=times[4] + times[5],
        steps=steps + (steps < H),  # + the early-stopped step, computed
    )
    state, decision = update(state, settings, measured)
    unused = (H - steps) * settings.n_step
    return state, {"algorithm/H": H, "algorithm/steps": steps, "algorithm/unused_samples": unused, **decision}
