"""How biased, and how noisy, is the IW-GRPG gradient? Exact answers on a tabular softmax bandit, as
functions of the truncation level eta, of the behaviour policy's staleness, of leave-one-out and of
the two ablation switches (importance weights in the baseline / in the gradient).

    python tools/clip_bias.py                          # -> experiments/results/clip_bias/ (seconds)
    python tools/clip_bias.py --group 8 --lr 4 --out /tmp/clip_bias

The problem (the bandit of tests/test_iw_grpg.py, larger): X contexts, K actions,
π_θ(a|x) = softmax(θ[x])_a, a 0/1 reward table r[x, a], J(θ) = (1/X) Σ_x Σ_a π_θ(a|x) r[x, a], whose
exact gradient is ∂J/∂θ[x] = (1/X) π_x ⊙ (r_x − π_x·r_x).

Staleness: θ_0 (random) is the behaviour policy μ. θ_k is k steps of exact gradient ascent on J
with learning rate ``lr`` from θ_0: the situation of the (k+1)-th minibatch of a RAPID round, whose
samples μ drew k updates ago. (Exact steps, not SGD: the staleness is then a number, not a random
variable.) For each k the table gives E_μ|log w| with w = π_θk/μ, and P_μ(w > eta).

One draw of the estimator is one group of G actions per context sampled from μ (B = X·G records),

    ĝ = (1/B) Σ_n c_n ∇_θ log π_θ(a_n|x_n),    c_n = −B ∂loss/∂logp_n from rapid.iw_grpg.iw_grpg_loss

(c_n = w̄_n A_n, or A_n with ``iw_gradient`` off): the code under study computes the coefficients.
E[ĝ] and Var[ĝ] are exact: every multiset of G actions of a context is enumerated, weighted by its
multinomial probability under μ (ĝ is symmetric in a group's members); contexts are independent, so
means and covariances add over contexts. There is no sampling error to report.

Reported, against the exact gradient ∇J(θ_k):

    rel. bias   |E ĝ − ∇J| / |∇J|
    cos         cosine(E ĝ, ∇J)                (1: the bias is only a change of step size)
    rel. var    E|ĝ − E ĝ|² / |∇J|²            (one draw; a minibatch of m draws divides it by m)
    var ratio   E|ĝ − E ĝ|² / the same for fresh samples (μ = π_θk, every w = 1) at the same θ_k:
                what staleness does to the noise, apart from how large ∇J happens to be at θ_k
    rel. MSE    rel. bias² + rel. var
    clip mass   E Σ(w − w̄)|A| / E Σ w|A|        (the share of weighted gradient mass clipping removes,
                                                 the bandit's counterpart of iw/clipped_mass)

Without leave-one-out, Eq. 4 puts a record in its own baseline, which on-policy (k = 0) scales the
expected gradient by (G−1)/G: rel. bias 1/G, cos 1. With leave-one-out and eta = none the estimator is
unbiased at every k (tests/test_clip_bias.py checks both).
"""

from __future__ import annotations

import argparse
import csv
import itertools
import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from rapid.iw_grpg import group_advantages, iw_grpg_loss  # noqa: E402
from rapid.profiling import cpu_description  # noqa: E402

SWITCHES = {  # (iw_baseline, iw_gradient) -> name
    (True, True): "IW-GRPG",
    (False, True): "no IW in baseline",
    (True, False): "no IW in gradient",
    (False, False): "uncorrected GRPG",
}


def make_bandit(contexts: int, actions: int, seed: int, correct_frac: float = 0.3):
    """θ_0 [X, K] ~ N(0, 1) and a 0/1 reward table [X, K] with at least one right and one wrong action
    per context."""
    gen = torch.Generator().manual_seed(seed)
    theta0 = torch.randn(contexts, actions, generator=gen, dtype=torch.float64)
    reward = (torch.rand(contexts, actions, generator=gen, dtype=torch.float64) < correct_frac).double()
    reward[:, 0], reward[:, 1] = 1.0, 0.0
    return theta0, reward


def exact_gradient(theta: torch.Tensor, reward: torch.Tensor) -> torch.Tensor:
    """∂J/∂θ [X, K] of J = (1/X) Σ_x π_x · r_x."""
    pi = theta.softmax(-1)
    return pi * (reward - (pi * reward).sum(-1, keepdim=True)) / theta.shape[0]


def stale_thetas(theta0: torch.Tensor, reward: torch.Tensor, lr: float, ks: list[int]) -> dict[int, torch.Tensor]:
    """{k: θ_k}, θ_{j+1} = θ_j + lr ∇J(θ_j)."""
    out, theta = {}, theta0.clone()
    for j in range(max(ks) + 1):
        if j in ks:
            out[j] = theta.clone()
        theta = theta + lr * exact_gradient(theta, reward)
    return out


def multisets(actions: int, group: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every multiset of `group` actions out of `actions`: members [M, G] (sorted action ids) and the
    multinomial coefficients [M] (number of orderings)."""
    members = torch.tensor(list(itertools.combinations_with_replacement(range(actions), group)), dtype=torch.long)
    counts = torch.zeros(len(members), actions, dtype=torch.long).scatter_add_(1, members, torch.ones_like(members))
    log_coef = math.lgamma(group + 1) - torch.lgamma(counts.double() + 1).sum(1)
    return members, log_coef.exp().round()


def estimator_moments(
    theta: torch.Tensor,
    theta0: torch.Tensor,
    reward: torch.Tensor,
    group: int,
    eta: float | None,
    leave_one_out: bool,
    iw_baseline: bool = True,
    iw_gradient: bool = True,
) -> tuple[torch.Tensor, float, float, float]:
    """Exact E[ĝ] [X, K], E|ĝ − E ĝ|², E Σ(w − w̄)|A| and E Σ w|A| at θ, with groups sampled from μ = π_θ0."""
    X, K = theta.shape
    B = X * group
    pi, mu = theta.softmax(-1), theta0.softmax(-1)
    members, coef = multisets(K, group)  # [M, G], [M]
    M = len(members)
    mean = torch.zeros(X, K, dtype=torch.float64)
    var, removed, mass = 0.0, 0.0, 0.0
    ids = torch.arange(M).repeat_interleave(group)  # one group per multiset
    for x in range(X):
        prob = coef * mu[x][members].prod(1)  # [M] probability of each multiset under μ
        logp = pi[x].log()[members].reshape(-1).requires_grad_()
        logp_mu = mu[x].log()[members].reshape(-1)
        rewards = reward[x][members].reshape(-1)
        loss, _ = iw_grpg_loss(
            logp,
            logp_mu,
            rewards,
            ids,
            eta=eta,
            leave_one_out=leave_one_out,
            normalizer=1.0,
            iw_baseline=iw_baseline,
            iw_gradient=iw_gradient,
        )
        (dlogp,) = torch.autograd.grad(loss, logp)
        c = -dlogp.view(M, group)  # [M, G] c_n
        # row x of ĝ for each multiset: (1/B) Σ_n c_n (onehot(a_n) − π_x)
        g = torch.zeros(M, K, dtype=torch.float64).scatter_add_(1, members, c) - c.sum(1, keepdim=True) * pi[x]
        g = g / B  # [M, K]
        mean[x] = (prob[:, None] * g).sum(0)
        var += float((prob * ((g - mean[x]) ** 2).sum(1)).sum())
        # clipped gradient mass, as iw/clipped_mass (A as this configuration computes it)
        w = (logp.detach() - logp_mu).exp()
        w_bar = w if eta is None else w.clamp(max=eta)
        adv = group_advantages(rewards, ids, w_bar if iw_baseline else None, leave_one_out).abs()
        removed += float((prob * ((w - w_bar) * adv).view(M, group).sum(1)).sum())
        mass += float((prob * (w * adv).view(M, group).sum(1)).sum())
    return mean, var, removed, mass


def moments(
    theta: torch.Tensor,
    theta0: torch.Tensor,
    reward: torch.Tensor,
    group: int,
    eta: float | None,
    leave_one_out: bool,
    iw_baseline: bool,
    iw_gradient: bool,
) -> dict[str, float]:
    """The reported numbers (module docstring) for one configuration."""
    mean, var, removed, mass = estimator_moments(
        theta, theta0, reward, group, eta, leave_one_out, iw_baseline, iw_gradient
    )
    truth = exact_gradient(theta, reward)
    norm2 = float((truth**2).sum())
    bias = float(((mean - truth) ** 2).sum()) ** 0.5 / norm2**0.5
    cos = float((mean * truth).sum()) / (float((mean**2).sum()) ** 0.5 * norm2**0.5)
    return {
        "rel_bias": bias,
        "cos": cos,
        "rel_var": var / norm2,
        "rel_mse": bias**2 + var / norm2,
        "clip_mass": removed / mass if mass > 0 else 0.0,
    }


def staleness(theta: torch.Tensor, theta0: torch.Tensor, etas: list[float | None]) -> dict[str, float]:
    """E_μ|log w| and P_μ(w > eta), averaged over contexts."""
    log_w = theta.log_softmax(-1) - theta0.log_softmax(-1)  # [X, K]
    mu = theta0.softmax(-1)
    out = {"abs_log_w": float((mu * log_w.abs()).sum(-1).mean())}
    for eta in etas:
        if eta is not None:
            out[f"p_clip_{eta:g}"] = float((mu * (log_w > math.log(eta))).sum(-1).mean())
    return out


def sweep(args) -> tuple[list[dict], dict[int, dict]]:
    theta0, reward = make_bandit(args.contexts, args.actions, args.seed)
    thetas = stale_thetas(theta0, reward, args.lr, args.ks)
    fresh = {
        (k, loo): moments(thetas[k], thetas[k], reward, args.group, None, loo, True, True)["rel_var"]
        for k in args.ks
        for loo in (False, True)
    }  # on-policy at θ_k: every w = 1
    rows = []
    for k, eta, loo, (iw_b, iw_g) in itertools.product(args.ks, args.etas, (False, True), SWITCHES):
        m = moments(thetas[k], theta0, reward, args.group, eta, loo, iw_b, iw_g)
        rows.append(
            {
                "k": k,
                "eta": "none" if eta is None else f"{eta:g}",
                "leave_one_out": loo,
                "estimator": SWITCHES[(iw_b, iw_g)],
                "iw_baseline": iw_b,
                "iw_gradient": iw_g,
                **m,
                "var_ratio": m["rel_var"] / fresh[(k, loo)],
            }
        )
    return rows, {k: staleness(thetas[k], theta0, args.etas) for k in args.ks}


def pick(rows, **match) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


def grid(rows: list[dict], ks: list[int], etas: list[str], value: str, **match) -> list[str]:
    """A markdown table: one row per eta, one column per k."""
    lines = ["| eta | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for eta in etas:
        cells = [pick(rows, k=k, eta=eta, **match)[0][value] for k in ks]
        lines.append(f"| {eta} | " + " | ".join(f"{v:.3f}" for v in cells) + " |")
    return lines


def report(rows: list[dict], stale: dict[int, dict], args, out: Path) -> str:
    ks = args.ks
    etas = ["none" if e is None else f"{e:g}" for e in args.etas]
    finite = [e for e in args.etas if e is not None]
    text = [
        "# Bias and variance of the IW-GRPG gradient on a tabular softmax bandit (exact)",
        "",
        f"`python tools/clip_bias.py {' '.join(sys.argv[1:])}`".replace(
            "`python tools/clip_bias.py `", "`python tools/clip_bias.py`"
        ),
        "",
        f"CPU: {cpu_description()} (exact enumeration, no sampling error; seconds on any CPU).",
        "",
        f"Bandit: {args.contexts} contexts x {args.actions} actions, 0/1 rewards, θ_0 ~ N(0, 1) (seed {args.seed}); "
        f"groups of G = {args.group} actions per context drawn from μ = π_θ0; the current policy θ_k is k exact "
        f"gradient-ascent steps (lr {args.lr:g}) past μ. Definitions in the docstring of tools/clip_bias.py.",
        "",
        "Staleness of μ at each k (E_μ|log w|, and P_μ(w > eta)):",
        "",
        "| | " + " | ".join(f"k={k}" for k in ks) + " |",
        "|---|" + "---:|" * len(ks),
        "| E_μ abs(log w) | " + " | ".join(f"{stale[k]['abs_log_w']:.3f}" for k in ks) + " |",
    ]
    for eta in finite:
        text.append(f"| P(w > {eta:g}) | " + " | ".join(f"{stale[k][f'p_clip_{eta:g}']:.3f}" for k in ks) + " |")
    for loo in (False, True):
        name = "leave-one-out baseline" if loo else "Eq. 4 baseline (RAPID's default)"
        for value, what in (
            ("rel_bias", "relative bias |E ĝ − ∇J| / |∇J|"),
            ("cos", "cosine(E ĝ, ∇J)"),
            ("rel_var", "relative variance E|ĝ − E ĝ|² / |∇J|² (one group per context)"),
            ("var_ratio", "variance against fresh samples at the same θ_k"),
            ("clip_mass", "clipped gradient mass E Σ(w − w̄)|A| / E Σ w|A|"),
        ):
            if value == "clip_mass" and loo:
                continue
            text += ["", f"## IW-GRPG, {name}: {what}", ""]
            text += grid(rows, ks, etas, value, leave_one_out=loo, estimator="IW-GRPG")
    for loo in (False, True):
        text += [
            "",
            f"## Ablations at eta = 2, {'leave-one-out' if loo else 'Eq. 4'} baseline: "
            "relative bias / cosine / variance against fresh samples",
            "",
            "| estimator | " + " | ".join(f"k={k}" for k in ks) + " |",
            "|---|" + "---:|" * len(ks),
        ]
        for est in SWITCHES.values():
            cells = [pick(rows, k=k, eta="2", leave_one_out=loo, estimator=est)[0] for k in ks]
            text.append(
                f"| {est} | "
                + " | ".join(f"{c['rel_bias']:.3f} / {c['cos']:.3f} / {c['var_ratio']:.2f}" for c in cells)
                + " |"
            )
    text += [
        "",
        "Every configuration (eta x k x leave-one-out x switches) is in clip_bias.csv; the figure is clip_bias.png.",
        "",
    ]
    (out / "clip_bias.md").write_text("\n".join(text))
    with (out / "clip_bias.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return "\n".join(text)


def plot(rows: list[dict], stale: dict[int, dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = args.ks
    x = [stale[k]["abs_log_w"] for k in ks]
    etas = ["none" if e is None else f"{e:g}" for e in args.etas]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for loo, style in ((False, "-"), (True, "--")):
        for i, eta in enumerate(etas):
            color = f"C{i}"
            bias = [pick(rows, k=k, eta=eta, leave_one_out=loo, estimator="IW-GRPG")[0]["rel_bias"] for k in ks]
            var = [pick(rows, k=k, eta=eta, leave_one_out=loo, estimator="IW-GRPG")[0]["var_ratio"] for k in ks]
            label = f"eta={eta}" + (", leave-one-out" if loo else "")
            axes[0].plot(x, bias, style, color=color, marker="o", ms=3, label=label)
            axes[1].plot(x, var, style, color=color, marker="o", ms=3, label=label)
        for j, est in enumerate(SWITCHES.values()):
            bias = [pick(rows, k=k, eta="2", leave_one_out=loo, estimator=est)[0]["rel_bias"] for k in ks]
            axes[2].plot(
                x, bias, style, color=f"C{j}", marker="o", ms=3, label=est + (", leave-one-out" if loo else "")
            )
    axes[0].set_title("IW-GRPG: relative bias |E ĝ − ∇J| / |∇J|")
    axes[1].set_title("IW-GRPG: variance / fresh-sample variance at θ_k")
    axes[1].set_yscale("log")
    for ax in (axes[0], axes[2]):
        ax.set_yscale("symlog", linthresh=0.01)  # 0 (unbiased) stays on the axis
    axes[2].set_title("ablations at eta = 2: relative bias")
    for ax in axes:
        ax.set_xlabel("staleness E_μ|log w| (k = " + ", ".join(map(str, ks)) + ")")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6, ncol=2)
    axes[2].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_eta(s: str) -> float | None:
    return None if s.lower() in ("none", "null", "inf") else float(s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--contexts", type=int, default=8)
    parser.add_argument("--actions", type=int, default=8)
    parser.add_argument("--group", type=int, default=4, help="G = n_group (paper: 4)")
    parser.add_argument(
        "--lr", type=float, default=16.0, help="step size of the exact gradient steps that make μ stale"
    )
    parser.add_argument("--ks", type=int, nargs="+", default=[0, 1, 2, 4, 8, 16, 32], help="staleness in steps")
    parser.add_argument(
        "--etas",
        type=parse_eta,
        nargs="+",
        default=[1.5, 2.0, 4.0, 10.0, None],
        help="truncation levels (none: no clipping)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=REPO / "experiments" / "results" / "clip_bias")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows, stale = sweep(args)
    print(report(rows, stale, args, args.out))
    plot(rows, stale, args, args.out / "clip_bias.png")


if __name__ == "__main__":
    main()
