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

from rapid import estimators  # noqa: E402
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


def loss_moments(
    theta: torch.Tensor, theta0: torch.Tensor, reward: torch.Tensor, group: int, loss_of
) -> tuple[torch.Tensor, float, list[tuple]]:
    """Exact E[ĝ] [X, K] and E|ĝ − E ĝ|² at θ for groups sampled from μ = π_θ0, where the coefficients
    c_n = −∂loss/∂logp_n come from ``loss_of(logp [M·G], logp_mu [M·G], rewards [M·G], ids [M·G])``, the
    loss of one multiset per group with normaliser 1. Also, per context, (prob [M], logp, logp_mu,
    rewards, ids) for callers that need more of the enumeration."""
    X, K = theta.shape
    B = X * group
    pi, mu = theta.softmax(-1), theta0.softmax(-1)
    members, coef = multisets(K, group)  # [M, G], [M]
    M = len(members)
    mean = torch.zeros(X, K, dtype=torch.float64)
    var, per_context = 0.0, []
    ids = torch.arange(M).repeat_interleave(group)  # one group per multiset
    for x in range(X):
        prob = coef * mu[x][members].prod(1)  # [M] probability of each multiset under μ
        logp = pi[x].log()[members].reshape(-1).requires_grad_()
        logp_mu = mu[x].log()[members].reshape(-1)
        rewards = reward[x][members].reshape(-1)
        (dlogp,) = torch.autograd.grad(loss_of(logp, logp_mu, rewards, ids), logp)
        c = -dlogp.view(M, group)  # [M, G] c_n
        # row x of ĝ for each multiset: (1/B) Σ_n c_n (onehot(a_n) − π_x)
        g = torch.zeros(M, K, dtype=torch.float64).scatter_add_(1, members, c) - c.sum(1, keepdim=True) * pi[x]
        g = g / B  # [M, K]
        mean[x] = (prob[:, None] * g).sum(0)
        var += float((prob * ((g - mean[x]) ** 2).sum(1)).sum())
        per_context.append((prob, logp.detach(), logp_mu, rewards, ids))
    return mean, var, per_context


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
    """Exact E[ĝ] [X, K], E|ĝ − E ĝ|², E Σ(w − w̄)|A| and E Σ w|A| at θ of IW-GRPG (rapid.iw_grpg), with
    groups sampled from μ = π_θ0."""

    def loss_of(logp, logp_mu, rewards, ids):
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
        return loss

    mean, var, per_context = loss_moments(theta, theta0, reward, group, loss_of)
    removed, mass = 0.0, 0.0
    for prob, logp, logp_mu, rewards, ids in per_context:  # clipped gradient mass, as iw/clipped_mass
        w = (logp - logp_mu).exp()
        w_bar = w if eta is None else w.clamp(max=eta)
        adv = group_advantages(rewards, ids, w_bar if iw_baseline else None, leave_one_out).abs()
        removed += float((prob * ((w - w_bar) * adv).view(len(prob), group).sum(1)).sum())
        mass += float((prob * (w * adv).view(len(prob), group).sum(1)).sum())
    return mean, var, removed, mass


def registered_loss(name: str, settings: dict):
    """loss_of for loss_moments from the registered loss ``name`` (rapid/estimators.py): each action is a
    one-token completion, so token- and sequence-level ratios coincide and every normaliser (records,
    tokens, records x max_tokens) is 1."""

    def loss_of(logp, logp_mu, rewards, ids):
        mask = torch.ones(len(logp), 1, dtype=torch.bool)
        x = estimators.LossInputs(logp[:, None], logp_mu[:, None], mask, rewards, ids, None, 1.0, 1.0, 1)
        loss, _ = estimators.compute(name, x, {**settings, "loss": name})
        return loss

    return loss_of


def scored(mean: torch.Tensor, var: float, truth: torch.Tensor) -> dict[str, float]:
    """rel_bias, cos, rel_var against the exact gradient; noise = var / |E ĝ|² (free of the estimator's scale)."""
    norm2 = float((truth**2).sum())
    mean2 = float((mean**2).sum())
    bias = float(((mean - truth) ** 2).sum()) ** 0.5 / norm2**0.5
    cos = float((mean * truth).sum()) / (mean2**0.5 * norm2**0.5) if mean2 > 0 else 0.0
    return {"rel_bias": bias, "cos": cos, "rel_var": var / norm2, "noise": var / mean2 if mean2 > 0 else math.inf}


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


# (label, conf/algorithm yaml, overrides): the estimators of rapid/estimators.py at their yaml settings.
# GRPO's KL term is left out: it pulls towards a reference policy, it is not part of the gradient estimate.
ESTIMATORS = [
    ("RAPID", "rapid", {}),
    ("RAPID, leave-one-out", "rapid", {"leave_one_out": True}),
    ("RAPID, eta none, leave-one-out", "rapid", {"eta": None, "leave_one_out": True}),
    ("RAPID, masked IS", "rapid_mask", {}),
    ("uncorrected GRPG", "rapid", {"iw_baseline": False, "iw_gradient": False}),
    ("GRPO (no KL)", "grpo", {"beta": 0.0}),
    ("DAPO", "dapo", {}),
    ("Dr. GRPO", "dr_grpo", {}),
    ("CISPO", "cispo", {}),
    ("GSPO", "gspo", {}),
    ("TOPR", "topr", {}),
    ("TOPR, group-mean baseline", "topr", {"baseline": "group_mean"}),
]


def yaml_settings(name: str) -> dict:
    """conf/algorithm/<name>.yaml over conf/algorithm/rapid.yaml, as plain values (the one home of each setting)."""
    from omegaconf import OmegaConf

    conf = REPO / "conf" / "algorithm"
    merged = OmegaConf.merge(OmegaConf.load(conf / "rapid.yaml"), OmegaConf.load(conf / f"{name}.yaml"))
    settings = OmegaConf.to_container(merged)  # unresolved: n_inference's resolver is not needed here
    return {k: v for k, v in settings.items() if k not in ("defaults", "n_inference")}


def sweep_estimators(args) -> list[dict]:
    """Every estimator of ESTIMATORS at every staleness k: scored() against ∇J(θ_k), and var_ratio, its
    variance against its own variance on fresh samples (μ = π_θk) at the same θ_k."""
    theta0, reward = make_bandit(args.contexts, args.actions, args.seed)
    thetas = stale_thetas(theta0, reward, args.lr, args.ks)
    rows = []
    for label, yaml, overrides in ESTIMATORS:
        settings = {**yaml_settings(yaml), **overrides}
        loss_of = registered_loss(settings["loss"], settings)
        for k in args.ks:
            truth = exact_gradient(thetas[k], reward)
            mean, var, _ = loss_moments(thetas[k], theta0, reward, args.group, loss_of)
            _, fresh, _ = loss_moments(thetas[k], thetas[k], reward, args.group, loss_of)
            rows.append({"estimator": label, "loss": settings["loss"], "k": k, **scored(mean, var, truth),
                         "var_ratio": var / fresh if fresh > 0 else math.inf})  # fmt: skip
    return rows


def pick(rows, **match) -> list[dict]:
    return [r for r in rows if all(r[k] == v for k, v in match.items())]


def grid(rows: list[dict], ks: list[int], etas: list[str], value: str, **match) -> list[str]:
    """A markdown table: one row per eta, one column per k."""
    lines = ["| eta | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---:|" * len(ks)]
    for eta in etas:
        cells = [pick(rows, k=k, eta=eta, **match)[0][value] for k in ks]
        lines.append(f"| {eta} | " + " | ".join(f"{v:.3f}" for v in cells) + " |")
    return lines


def report(rows: list[dict], stale: dict[int, dict], args, out: Path, est_rows: list[dict] | None = None) -> str:
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
    if est_rows:
        text += estimator_tables(est_rows, stale, ks)
    text += [
        "",
        "Every configuration (eta x k x leave-one-out x switches) is in clip_bias.csv; the figure is clip_bias.png."
        + (" The estimators are in estimators.csv and estimators.png." if est_rows else ""),
        "",
    ]
    (out / "clip_bias.md").write_text("\n".join(text))
    if est_rows:
        with (out / "estimators.csv").open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(est_rows[0]))
            writer.writeheader()
            writer.writerows(est_rows)
    with (out / "clip_bias.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return "\n".join(text)


def estimator_tables(est_rows: list[dict], stale: dict[int, dict], ks: list[int]) -> list[str]:
    """The estimators side by side (rapid/estimators.py at their conf/algorithm settings), one table per measure."""
    text = [
        "",
        "## Off-policy estimators side by side (rapid/estimators.py, settings from conf/algorithm/)",
        "",
        "The same bandit, groups and staleness; each action is a one-token completion, so token- and "
        "sequence-level ratios coincide (GSPO is then PPO with its 3e-4 / 4e-4 ranges on the sequence ratio) and "
        "every loss normaliser is the number of records. GRPO, DAPO, CISPO and GSPO divide the advantage by the "
        "group's std, which rescales the gradient by a per-group factor: for them the relative bias mixes scale "
        "and direction, and the cosine is the measure of direction. noise = E|ĝ − E ĝ|² / |E ĝ|², free of scale.",
        "",
        "| staleness | " + " | ".join(f"k={k}" for k in ks) + " |",
        "|---|" + "---:|" * len(ks),
        "| E_μ abs(log w) | " + " | ".join(f"{stale[k]['abs_log_w']:.3f}" for k in ks) + " |",
    ]
    labels = list(dict.fromkeys(r["estimator"] for r in est_rows))
    for value, what in (
        ("rel_bias", "relative bias |E ĝ − ∇J| / |∇J|"),
        ("cos", "cosine(E ĝ, ∇J)"),
        ("noise", "noise E|ĝ − E ĝ|² / |E ĝ|² (one group per context)"),
        ("var_ratio", "variance against the same estimator on fresh samples at θ_k"),
    ):
        text += ["", f"### {what}", "", "| estimator | " + " | ".join(f"k={k}" for k in ks) + " |"]
        text.append("|---|" + "---:|" * len(ks))
        for label in labels:
            cells = [pick(est_rows, estimator=label, k=k)[0][value] for k in ks]
            text.append(f"| {label} | " + " | ".join(f"{v:.3f}" for v in cells) + " |")
    return text


def plot_estimators(est_rows: list[dict], stale: dict[int, dict], args, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = args.ks
    x = [stale[k]["abs_log_w"] for k in ks]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.4))
    for i, label in enumerate(dict.fromkeys(r["estimator"] for r in est_rows)):
        style = "-" if i < 10 else "--"
        for ax, value in zip(axes, ("rel_bias", "cos", "var_ratio")):
            ys = [pick(est_rows, estimator=label, k=k)[0][value] for k in ks]
            ax.plot(x, ys, style, color=f"C{i % 10}", marker="o", ms=3, label=label)
    axes[0].set_title("relative bias |E ĝ − ∇J| / |∇J|")
    axes[0].set_yscale("symlog", linthresh=0.01)
    axes[1].set_title("cosine(E ĝ, ∇J)")
    axes[2].set_title("variance / the same estimator's on fresh samples")
    axes[2].set_yscale("log")
    for ax in axes:
        ax.set_xlabel("staleness E_μ|log w| (k = " + ", ".join(map(str, ks)) + ")")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


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
    est_rows = sweep_estimators(args)
    print(report(rows, stale, args, args.out, est_rows))
    plot(rows, stale, args, args.out / "clip_bias.png")
    plot_estimators(est_rows, stale, args, args.out / "estimators.png")


if __name__ == "__main__":
    main()
