"""A cost model of rapid's loop: what one sample costs at each H, measured on this machine.

One round of Algorithm 1 generates n_inference = H * n_step completions in ONE engine call
(n_inference / n_group prompts, n_group completions each), takes H optimizer steps of n_step
records (forward + backward in micro-batches of `train.micro_batch` records, then clipping and
the fused AdamW step), and syncs the weights into the engine once. So the wall time per sample is

    gen(n_inference sequences per call) / n_inference      generation: falls with H while decoding
                                                           is bound by reading the weights
  + train(micro-batches of an n_step minibatch) / n_step    forward + backward: the same at any H
  + optimizer step / n_step                                 clip + AdamW + zero_grad, per step
  + sync / n_inference                                      one in-place weight reload per round
  + reward per sample  (+ GRPO's reference forward, + the recompute forward where configured)

This tool measures each term with the run's own model, sampler, dtype and task (the same Hydra
overrides as `python -m rapid.train`), at the task's prompts and a given completion length:

  generation  for 1, 2, 4, ..., 256 sequences per call (n_group per prompt where the size allows),
              every completion forced to the length (ignore_eos), once with 1 new token (prefill +
              first token: `first_s`) and once with L new tokens; a decoding step at b running
              sequences costs step_s(b) = (call_s - first_s) / (L - 1). A call whose completions
              have lengths l_1..l_B then costs first_s(B) + sum over steps t >= 2 of step_s(b_t),
              b_t = #{i : l_i >= t} (finished sequences leave the batch); both curves are
              interpolated in log-log between measured sizes and extrapolated beyond the largest
              at a constant cost per sequence (saturated throughput).
  training    forward + backward of the real `CompletionLogprobs` policy with the IW-GRPG loss
              (`accumulate_gradients`) on micro-batches of real prompts and random completions at a
              few (records, padded completion length) points, fitted by least squares to
              t = a + b * records + c * records * padded_length; the same for a no-grad forward
              (GRPO's reference, `behavior_logprobs=recompute`); the optimizer step (grad clip +
              fused AdamW + zero_grad) as a fixed cost per step.
  sync        one `sampler.sync_weights(model)` (best of 3).
  reward      task.reward over the measured completions, per sample.

Completion lengths: fixed at the mean by default; with a run's `rollouts.jsonl` the prediction draws
whole groups of real lengths (rescaled to the mean asked for), since a call decodes until its longest
completion ends and a micro-batch is padded to its longest one.

    python tools/cost_model.py                                  # the default task and model (make cost-model)
    python tools/cost_model.py task=arithmetic algorithm.n_step=4 algorithm.n_group=4 --completion-len 120
    python tools/cost_model.py --from-run outputs/<run>         # that run's config and mean completion length
    python tools/cost_model.py --predict cost_model.json --n-step 4 8 --h 1 2 4 8 16 32
    python tools/cost_model.py --predict cost_model.json --decode-step-s 0.01 --decode-saturation 256 --train-scale 0.05

The last form asks what H buys on a machine where decoding is memory-bound up to a batch of
`--decode-saturation` sequences (a flat cost per decoding step, the shape of a GPU's curve) and
training is `--train-scale` times the measured cost: a hypothetical profile, not a measurement.

Writes (--out, default experiments/results/cost_model_<device>/cost_model.json) the measurements, the
CPU model and its vector extensions, and the prediction table; prints the table and the H it
recommends: the smallest H whose predicted time per sample is within --tolerance (5%) of the best
over the H considered. The model counts compute only: what a larger H costs in staleness (clipped
importance weights, accuracy per sample) is for the benchmark to measure.
Under each table, the same predictions through H = auto's cost model (rapid.adaptive_h's fit_generation and
cost_per_sample: generation linear in the call size, the rest per sample and per round), and the H its cost
choice would take: the two models share that arithmetic rather than each having its own.
"""

from __future__ import annotations

import argparse
import bisect
import copy
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SIZES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
DEFAULT_H = (1, 2, 4, 8, 16, 32)
PHASES = ("generate", "reward", "recompute", "train", "sync")  # as rapid.train's clock names them


def needs_reference(algorithm) -> bool:
    """Whether the run's loss reads a frozen reference model (one more forward per micro-batch), as the loss
    declares it in rapid.estimators' registry. `algorithm` is the run's algorithm settings (a config node,
    or the `config` dict of a cost_model.json, whose KL weight may be named by its earlier name kl_coef)."""
    from rapid import estimators

    settings = dict(algorithm)
    settings.setdefault("beta", settings.get("kl_coef") or 0.0)
    return bool(estimators.get(settings["loss"]).reference(settings))


# ============================================================================== prediction math (pure)


def interp_loglog(xs: list[float], ys: list[float], x: float) -> float:
    """Piecewise-linear interpolation of log y against log x through the points (xs increasing, ys > 0).
    Below xs[0]: ys[0]. Above xs[-1]: y grows in proportion to x (a constant cost per sequence, i.e. the
    throughput measured at the largest size)."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1] * x / xs[-1]
    j = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[j - 1], xs[j], max(ys[j - 1], 1e-12), max(ys[j], 1e-12)
    f = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return math.exp(math.log(y0) + f * (math.log(y1) - math.log(y0)))


def call_seconds(generation: dict, lengths: list[int]) -> float:
    """Seconds of one engine call decoding len(lengths) sequences of these completion lengths:
    first_s(B) (prefill and the first token of all B), then for every later step t the cost of a decoding
    step with b_t = #{i : l_i >= t} sequences still running."""
    sizes = generation["sizes"]
    B = len(lengths)
    total = interp_loglog(sizes, generation["first_s"], B)
    done = 1  # steps accounted for (the first)
    ordered = sorted(lengths)
    for j, length in enumerate(ordered):  # while done < t <= length, B - j sequences run
        if length > done:
            total += (length - done) * interp_loglog(sizes, generation["step_s"], B - j)
            done = length
    return total


def fit_microbatch(points: list[dict], key: str) -> dict:
    """Least-squares fit of t = a + b * records + c * records * padded_length to measured micro-batches
    (dicts with records, completion_len and `key` seconds). Returns {"a", "per_record", "per_token"}."""
    import numpy as np

    X = np.array([[1.0, p["records"], p["records"] * p["completion_len"]] for p in points])
    y = np.array([p[key] for p in points])
    if np.linalg.matrix_rank(X) < 3:
        raise ValueError("the training points must span at least two record counts and two completion lengths")
    a, b, c = np.linalg.lstsq(X, y, rcond=None)[0]
    return {"a": float(a), "per_record": float(b), "per_token": float(c)}


def microbatch_seconds(fit: dict, records: int, padded_len: int) -> float:
    return max(fit["a"] + fit["per_record"] * records + fit["per_token"] * records * padded_len, 0.0)


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """(start, stop) of consecutive pieces of at most `size` out of range(n)."""
    return [(i, min(i + size, n)) for i in range(0, n, size)]


def round_seconds(
    cm: dict,
    lengths: list[int],
    *,
    H: int,
    n_step: int,
    micro_batch: int,
    passes: int = 1,
    reference: bool = False,
    recompute: bool = False,
    trained_frac: float = 1.0,
) -> dict:
    """Seconds per phase of one round whose n_inference = H * n_step completions (groups consecutive, in
    the order the buffer serves them) have these lengths; `trained_frac`: the share of the records that
    forward and backward run (train.skip_zero_advantage; the rest skipped, time taken as proportional)."""
    n = len(lengths)
    assert n == H * n_step, (n, H, n_step)
    t = cm["train"]
    padded = lambda lo, hi: max(max(lengths[lo:hi]), 1)
    step_forwards = sum(
        microbatch_seconds(t["fwd_bwd_fit"], hi - lo, padded(s + lo, s + hi))
        for s, _ in chunks(n, n_step)
        for lo, hi in chunks(n_step, micro_batch)
    )
    reference_s = (
        sum(
            microbatch_seconds(t["fwd_fit"], hi - lo, padded(s + lo, s + hi))
            for s, _ in chunks(n, n_step)
            for lo, hi in chunks(n_step, micro_batch)
        )
        if reference
        else 0.0
    )
    return {
        "generate": call_seconds(cm["generation"], lengths),
        "reward": cm["reward_s_per_sample"] * n,
        "recompute": sum(microbatch_seconds(t["fwd_fit"], hi - lo, padded(lo, hi)) for lo, hi in chunks(n, micro_batch))
        if recompute
        else 0.0,
        "train": passes * (trained_frac * step_forwards + reference_s + H * t["optimizer_step_s"]),
        "sync": cm["sync_s"],
    }


def draw_lengths(length_groups: list[list[int]], n_groups: int, n_group: int, rng) -> list[int]:
    """n_groups groups of completion lengths drawn with replacement from the pool (whole groups where the
    pool's groups have n_group members, else n_group lengths drawn one by one)."""
    if all(len(g) == n_group for g in length_groups):
        picks = rng.integers(0, len(length_groups), n_groups)
        return [length for i in picks for length in length_groups[i]]
    flat = [length for g in length_groups for length in g]
    return [flat[i] for i in rng.integers(0, len(flat), n_groups * n_group)]


def scaled_groups(length_groups: list[list[int]], mean: float) -> list[list[int]]:
    """The pool of lengths rescaled so that its mean is `mean` (each length at least 1)."""
    flat = [length for g in length_groups for length in g]
    f = mean / (sum(flat) / len(flat))
    return [[max(1, round(length * f)) for length in g] for g in length_groups]


def predict(
    cm: dict,
    *,
    H: int,
    n_step: int,
    n_group: int,
    micro_batch: int,
    completion_len: float | None = None,
    length_groups: list[list[int]] | None = None,
    passes: int = 1,
    reference: bool = False,
    recompute: bool = False,
    trained_frac: float = 1.0,
    draws: int = 64,
    seed: int = 0,
) -> dict:
    """Expected seconds per sample of each phase and in all (`total`), for one rank.

    Lengths: whole groups from `length_groups` (rescaled to `completion_len` when both are given), or every
    completion `completion_len` long (rounded), or the measurement's own length. With a pool of differing
    lengths the expectation is a Monte-Carlo mean over `draws` rounds (fixed seed)."""
    import numpy as np

    if n_step % n_group:
        raise ValueError(f"n_step={n_step} is not a multiple of n_group={n_group}")
    L = cm["completion_len"] if completion_len is None else completion_len
    pool = scaled_groups(length_groups, L) if length_groups else [[max(1, round(L))] * n_group]
    fixed = len({length for g in pool for length in g}) == 1
    rng = np.random.default_rng(seed)
    n = H * n_step
    totals = dict.fromkeys(PHASES, 0.0)
    for _ in range(1 if fixed else draws):
        lengths = draw_lengths(pool, n // n_group, n_group, rng)
        for k, v in round_seconds(
            cm,
            lengths,
            H=H,
            n_step=n_step,
            micro_batch=min(micro_batch, n_step),
            passes=passes,
            reference=reference,
            recompute=recompute,
            trained_frac=trained_frac,
        ).items():
            totals[k] += v
    rounds = 1 if fixed else draws
    row = {k: v / rounds / n for k, v in totals.items()}
    row["total"] = sum(row[k] for k in PHASES)
    row |= {
        "H": H,
        "n_step": n_step,
        "n_group": n_group,
        "n_inference": n,
        "sequences_per_call": n,
        "extrapolated": n > cm["generation"]["sizes"][-1],
    }
    return row


def recommend(rows: list[dict], tolerance: float = 0.05) -> tuple[dict, dict]:
    """(the row of the smallest H within `tolerance` of the best predicted total, the best row)."""
    best = min(rows, key=lambda r: r["total"])
    pick = min((r for r in rows if r["total"] <= best["total"] * (1 + tolerance)), key=lambda r: r["H"])
    return pick, best


def controller_view(block: list[dict], tolerance: float = 0.05) -> dict | None:
    """What H = auto's cost model makes of one (n_step, n_group)'s predictions, computed by rapid.adaptive_h's
    own functions: T_gen(b) = α + β b fitted (`fit_generation`) to the predicted generation seconds of a round
    of b = H n_step samples, λ the rest per sample (reward, recompute, train; their mean over the H), F the
    weight sync per round, and c(H) = β + λ + (α + F) / (H n_step) (`cost_per_sample`) at every H, with the
    H its cost choice takes: the smallest within `tolerance` of the cheapest (no staleness cap; `recommend`).
    None with fewer than two H (α and β cannot be told apart). Where generation is linear in the call size,
    c(H) is the prediction's total; where it is not, the difference is what the controller's line misses."""
    from rapid.adaptive_h import State, cost_per_sample, fit_generation

    fit = fit_generation({r["n_inference"]: r["generate"] * r["n_inference"] for r in block})
    if fit is None:
        return None
    alpha, beta = fit
    per_sample = sum(r["reward"] + r["recompute"] + r["train"] for r in block) / len(block)
    per_round = sum(r["sync"] * r["n_inference"] for r in block) / len(block)
    state = State(H=block[0]["H"], per_sample_s=per_sample, per_round_s=per_round)
    costs = [{"H": r["H"], "total": cost_per_sample(r["H"], alpha, beta, state, r["n_step"])} for r in block]
    return {
        "alpha_s": alpha,
        "beta_s": beta,
        "per_sample_s": per_sample,
        "per_round_s": per_round,
        "cost": {c["H"]: c["total"] for c in costs},
        "H": recommend(costs, tolerance)[0]["H"],
    }


def controller_line(view: dict) -> str:
    """controller_view in a sentence."""
    costs = ", ".join(f"H={h}: {1000 * c:.1f}" for h, c in view["cost"].items())
    return (
        f"H = auto's linear model of the same predictions (rapid.adaptive_h): T_gen(b) = {view['alpha_s']:.3f} + "
        f"{view['beta_s']:.5f} b s, λ {1000 * view['per_sample_s']:.1f} s / 1k samples, F {view['per_round_s']:.3f} s "
        f"per round; c(H) {costs} s / 1k samples; its cost choice without the staleness cap: H = {view['H']}."
    )


def hypothetical(
    cm: dict,
    *,
    gen_scale: float = 1.0,
    train_scale: float = 1.0,
    decode_step_s: float | None = None,
    decode_saturation: int = 256,
) -> dict:
    """A copy of the measurements under another profile: generation times x gen_scale, training times x
    train_scale (optimizer step and weight sync included); with decode_step_s, the generation curve is
    replaced by a flat decoding step of decode_step_s up to decode_saturation sequences and a constant cost
    per sequence beyond (first_s = one step: a memory-bound decoder)."""
    out = copy.deepcopy(cm)
    g, t = out["generation"], out["train"]
    if decode_step_s is not None:
        sizes = [
            2**k for k in range(0, 1 + max(int(math.log2(max(g["sizes"]))), int(math.log2(decode_saturation)) + 2))
        ]
        step = [decode_step_s * max(1.0, b / decode_saturation) for b in sizes]
        g.update(sizes=sizes, first_s=list(step), step_s=list(step), call_s=None)
    g["first_s"] = [x * gen_scale for x in g["first_s"]]
    g["step_s"] = [x * gen_scale for x in g["step_s"]]
    for key in ("fwd_bwd_fit", "fwd_fit"):
        t[key] = {k: v * train_scale for k, v in t[key].items()}
    t["optimizer_step_s"] *= train_scale
    out["sync_s"] *= train_scale
    out["profile"] = {
        "gen_scale": gen_scale,
        "train_scale": train_scale,
        "decode_step_s": decode_step_s,
        "decode_saturation": decode_saturation if decode_step_s is not None else None,
    }
    return out


def recommendation_line(block: list[dict], tolerance: float = 0.05) -> str:
    """The recommended H among one (n_step, n_group)'s predictions, and why, in a sentence or two."""
    pick, best = recommend(block, tolerance)
    h1 = next((r for r in block if r["H"] == 1), block[0])
    floor = min(r["train"] + r["reward"] + r["recompute"] for r in block)
    return (
        f"Recommended H = **{pick['H']}** at n_step {pick['n_step']} ({1000 * pick['total']:.1f} s / 1k samples, "
        f"{pick['total'] / h1['total']:.2f}x H = {h1['H']}): the smallest H within {100 * tolerance:.0f}% of the best "
        f"predicted (H = {best['H']}, {1000 * best['total']:.1f}). From H = {h1['H']} to H = {pick['H']} generation per "
        f"sample falls from {1000 * h1['generate']:.1f} to {1000 * pick['generate']:.1f} s / 1k ({h1['sequences_per_call']} "
        f"to {pick['sequences_per_call']} sequences per engine call) and sync from {1000 * h1['sync']:.1f} to "
        f"{1000 * pick['sync']:.1f}; training ({1000 * pick['train']:.1f}) does not fall with H and, with reward and "
        f"recompute, bounds every H at {1000 * floor:.1f} s / 1k, {floor / h1['total']:.2f}x H = {h1['H']}. "
        "Compute only: what a larger H costs in staleness is not modelled."
    )


def prediction_table(
    cm: dict,
    hs: list[int],
    n_steps: list[int],
    n_group: int,
    micro_batch: int,
    completion_len: float | None = None,
    tolerance: float = 0.05,
    **kw,
) -> tuple[str, list[dict]]:
    """Markdown table of predicted seconds per 1,000 samples for every (n_step, H), with the recommendation."""
    lines, rows = [], []
    for n_step in n_steps:
        block = [
            predict(
                cm, H=h, n_step=n_step, n_group=n_group, micro_batch=micro_batch, completion_len=completion_len, **kw
            )
            for h in hs
        ]
        h1 = next((r for r in block if r["H"] == 1), block[0])
        lines += [
            "",
            f"n_step {n_step}, n_group {n_group}, micro-batch {min(micro_batch, n_step)}:",
            "",
            "| H | sequences per call | generate | train | sync | reward | recompute | total s / 1k samples | vs H=1 |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in block:
            mark = " *" if r["extrapolated"] else ""
            lines.append(
                f"| {r['H']} | {r['sequences_per_call']}{mark} | "
                + " | ".join(f"{1000 * r[p]:.1f}" for p in ("generate", "train", "sync", "reward", "recompute"))
                + f" | **{1000 * r['total']:.1f}** | {r['total'] / h1['total']:.2f} |"
            )
        lines += ["", recommendation_line(block, tolerance)]
        view = controller_view(block, tolerance)
        if view is not None:
            lines += ["", controller_line(view)]
            for r in block:
                r["controller_total"] = view["cost"][r["H"]]
        rows += block
    if any(r["extrapolated"] for r in rows):
        lines += [
            "",
            "\\* beyond the largest measured call size: extrapolated at the largest size's cost per sequence.",
        ]
    return "\n".join(lines).lstrip("\n"), rows


# ============================================================================== the machine

VECTOR_PREFIXES = ("sse", "ssse3", "avx", "amx", "fma", "f16c", "vnni", "asimd", "sve", "neon", "fp16", "bf16", "i8mm")


def machine_info() -> dict:
    """CPU model, vector extensions (from /proc/cpuinfo), cores, and the GPU if one is visible."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())  # the first processor's
    except OSError:
        pass
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    info = {
        "cpu_model": fields.get("model name") or fields.get("Model") or platform.processor() or platform.machine(),
        "vector_extensions": sorted(f for f in flags if f.startswith(VECTOR_PREFIXES)),
        "cpu_cores": os.cpu_count(),
        "cores_allowed": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
    }
    try:
        import torch

        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
        info["torch_threads"] = torch.get_num_threads()
    except ImportError:
        pass
    return info


def machine_line(info: dict) -> str:
    gpu = f"; GPU {info['gpu']}" if info.get("gpu") else ""
    return (
        f"CPU {info['cpu_model']} ({info['cpu_cores']} cores; vector extensions: "
        f"{' '.join(info['vector_extensions']) or 'unknown'}){gpu}"
    )


# ============================================================================== measurement


def compose(overrides: list[str]):
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from rapid.config import register_resolvers

    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return hydra_compose("config", overrides=overrides)


def run_lengths(run_dir: Path) -> tuple[float, list[list[int]] | None]:
    """(mean completion length over the run's rounds, its groups of completion lengths if it logged rollouts)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    means = [r["train/completion_len"] for r in rows if "train/completion_len" in r]
    if not means:
        raise SystemExit(f"{run_dir}/metrics.jsonl has no train/completion_len: is it a finished rapid run?")
    groups = None
    if (run_dir / "rollouts.jsonl").exists():
        by_group: dict[tuple, list[int]] = {}
        for line in (run_dir / "rollouts.jsonl").read_text().splitlines():
            r = json.loads(line)
            by_group.setdefault((r["round"], r["group"]), []).append(len(r["completion_ids"]))
        groups = list(by_group.values())
    return sum(means) / len(means), groups


# The clock of every timing. "wall": time.perf_counter. "cpu": this process's CPU time, which is the wall
# time the same work takes on a core of its own when the process runs one thread on one core (taskset -c N,
# OMP_NUM_THREADS=1): a measurement that other work on a shared machine does not inflate.
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
clock = CLOCKS["wall"]


def best_of(
    fn, repeats: int, sync=lambda: None, setup=lambda: None, min_total_s: float = 1.0, max_repeats: int = 10
) -> float:
    """The shortest of at least `repeats` timings of fn(), more (up to max_repeats) while they add up to less
    than min_total_s: short timings on a shared machine need several tries. setup() runs untimed before each."""
    times: list[float] = []
    while len(times) < repeats or (sum(times) < min_total_s and len(times) < max_repeats):
        setup()
        sync()
        t0 = clock()
        fn()
        sync()
        times.append(clock() - t0)
    return min(times)


def measure(cfg, completion_len: float, sizes: list[int], repeats: int, log=print) -> dict:
    """Every term of the cost model, measured with cfg's model, sampler, dtype and task."""
    import torch

    from rapid.buffer import Rollout, collate
    from rapid.config import DTYPES
    from rapid.iw_grpg import iw_grpg_loss, sequence_logprobs
    from rapid.models import load_model_and_tokenizer
    from rapid.policy import CompletionLogprobs, accumulate_gradients, autocast, completion_logprobs
    from rapid.rewards import score
    from rapid.sampler import make_sampler
    from rapid.tasks import load_splits

    a = cfg.algorithm
    n_group, L = a.n_group, max(2, round(completion_len))
    device = torch.device("cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dtype = DTYPES[cfg.model.dtype]
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(
        cfg.model.path, cfg.model.gguf, cfg.model.architecture, cfg.model.gradient_checkpointing, seed=cfg.seed
    )
    model.to(device)
    task, train_records, train_prompts, _, _ = load_splits(cfg.task, tokenizer, cfg.eval.n)
    sampler_cfg = copy.deepcopy(cfg.sampler)
    sampler_cfg.ignore_eos = True  # every completion exactly as long as asked
    sampler = make_sampler(sampler_cfg, model, tokenizer, dtype, seed=0)
    temperature = cfg.sampler.temperature
    cursor = [0]

    def next_prompts(k: int) -> list[int]:
        idx = [(cursor[0] + i) % len(train_prompts) for i in range(k)]
        cursor[0] += k
        return idx

    def engine_call(B: int, new_tokens: int):
        n = n_group if B % n_group == 0 else 1
        idx = next_prompts(B // n)
        if hasattr(sampler, "llm"):
            sampler.llm.reset_prefix_cache()  # as after the weight sync that precedes every round's call
        return idx, sampler.generate(
            [train_prompts[i] for i in idx],
            n=n,
            max_new_tokens=new_tokens,
            temperature=temperature,
            seeds=list(range(len(idx))),
        )

    # ---- generation
    engine_call(min(8, max(sizes)), min(L, 8))  # warm-up (the first call builds kernels)
    generation = {"sizes": [], "n_per_prompt": [], "first_s": [], "call_s": [], "step_s": []}
    texts, text_records = [], []
    for B in sizes:
        first = best_of(lambda: engine_call(B, 1), repeats, sync)
        call = best_of(lambda: engine_call(B, L), repeats if B <= 64 else 1, sync)
        generation["sizes"].append(B)
        generation["n_per_prompt"].append(n_group if B % n_group == 0 else 1)
        generation["first_s"].append(first)
        generation["call_s"].append(call)
        generation["step_s"].append(max(call - first, 1e-9) / (L - 1))
        log(
            f"generation: {B:4d} sequences x {L} tokens: {call:7.3f} s per call ({B * L / call:6.1f} tokens/s), "
            f"first token {first:.3f} s"
        )
    idx, groups = engine_call(min(64, max(sizes)), L)  # completions to grade
    for i, group in zip(idx, groups):
        texts += [c.text for c in group]
        text_records += [train_records[i]] * len(group)
    # ---- reward
    t0 = clock()
    score(task, texts, text_records, workers=cfg.reward.workers, timeout=cfg.reward.timeout_s)
    reward_s = (clock() - t0) / len(texts)
    # ---- weight sync
    sync_s = best_of(lambda: sampler.sync_weights(model), 3, sync)
    log(f"weight sync {sync_s:.3f} s; reward {1000 * reward_s:.3f} ms per sample")
    # ---- training: micro-batches of real prompts and random completions
    sampler.sleep()
    policy = CompletionLogprobs(model, temperature, share_prompt=not cfg.model.gradient_checkpointing)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=cfg.optim.lr,
        betas=tuple(cfg.optim.betas),
        weight_decay=cfg.optim.weight_decay,
        fused=True,
    )  # as rapid.train's
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    vocab = min(len(tokenizer), model.config.vocab_size)
    g = torch.Generator().manual_seed(0)

    def records(m: int, C: int) -> list:
        out = []
        for k, i in enumerate(next_prompts(m // n_group)):
            for _ in range(n_group):
                ids = torch.randint(0, vocab, (C,), generator=g).tolist()
                out.append(
                    Rollout(
                        prompt_ids=train_prompts[i],
                        completion_ids=ids,
                        logp_mu=[-1.0] * C,
                        reward=float(torch.rand((), generator=g) < 0.5),
                        group_id=k,
                        truncated=False,
                    )
                )
        return out

    def loss_fn(token_logp, batch, n_records, n_tokens):  # RAPID / PG's loss, as rapid.train builds it
        mask = batch.completion_mask
        return iw_grpg_loss(
            sequence_logprobs(token_logp, mask),
            sequence_logprobs(batch.logp_mu, mask),
            batch.rewards,
            batch.group_ids,
            eta=a.eta,
            leave_one_out=a.leave_one_out,
            normalizer=n_records,
        )

    def fwd_bwd(recs):
        accumulate_gradients(
            policy, recs, loss_fn, micro_batch=len(recs), pad_id=pad_id, device=device, compute_dtype=dtype
        )

    @torch.no_grad()
    def fwd(recs):
        batch = collate(recs, pad_id).to(device)
        with autocast(device, dtype):
            completion_logprobs(policy, batch)

    # two record counts: one group, and the larger of n_step and two groups (within train.micro_batch)
    small = n_group
    micro = max(2 * n_group, n_group * (min(cfg.train.micro_batch, a.n_step) // n_group))
    shapes = [(small, max(1, L // 2)), (small, L), (small, (3 * L) // 2), (micro, L), (micro, max(1, L // 2))]
    fwd_bwd(records(small, max(1, L // 2)))  # warm-up
    points = []
    for m, C in shapes:
        recs = records(m, C)
        # each timing allocates the gradients, as a step's first micro-batch does after zero_grad(set_to_none)
        point = {
            "records": m,
            "completion_len": C,
            "fwd_bwd_s": best_of(lambda: fwd_bwd(recs), repeats, sync, setup=lambda: model.zero_grad(set_to_none=True)),
            "fwd_s": best_of(lambda: fwd(recs), repeats, sync),
        }
        points.append(point)
        log(
            f"training: {m:3d} records x {C:4d} tokens: forward+backward {point['fwd_bwd_s']:.3f} s, forward {point['fwd_s']:.3f} s"
        )

    def optimizer_step():  # as rapid.train's, after a minibatch's backward
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    tiny = records(small, 2)
    fwd_bwd(tiny)
    optimizer_step()  # warm-up: AdamW's state is created on its first step
    opt_s = best_of(optimizer_step, max(3, repeats), sync, setup=lambda: fwd_bwd(tiny))
    log(f"optimizer step (clip + fused AdamW + zero_grad): {opt_s:.3f} s")
    return {
        "completion_len": L,
        "prompt_len_mean": sum(len(p) for p in train_prompts) / len(train_prompts),
        "generation": generation,
        "train": {
            "points": points,
            "fwd_bwd_fit": fit_microbatch(points, "fwd_bwd_s"),
            "fwd_fit": fit_microbatch(points, "fwd_s"),
            "optimizer_step_s": opt_s,
        },
        "sync_s": sync_s,
        "reward_s_per_sample": reward_s,
        "device": str(device),
        "sampler": sampler.name,
    }


# ============================================================================== command line


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m rapid.train (task=..., model=...)")
    p.add_argument(
        "--completion-len",
        type=float,
        help="mean completion length in tokens to measure at (default: "
        "task.max_new_tokens); with --predict, the mean to predict at (default: the measurement's)",
    )
    p.add_argument(
        "--lengths-from",
        type=Path,
        help="a run that logged rollouts.jsonl: predict with its completion "
        "lengths (whole groups, rescaled to the mean), since a call decodes until its longest completion ends "
        "and a micro-batch is padded to its longest",
    )
    p.add_argument(
        "--from-run", type=Path, help="a finished run: its config, overrides added, and its mean completion length"
    )
    p.add_argument(
        "--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES), help="sequences per engine call to measure"
    )
    p.add_argument("--repeats", type=int, default=2, help="timings per point (the best is kept)")
    p.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="wall",
        help="wall time, or this process's CPU time (one thread on one core only: taskset -c N with "
        "OMP_NUM_THREADS=1; other work on a shared machine then does not inflate the timings)",
    )
    p.add_argument("--predict", type=Path, help="predict from this saved measurement JSON (no measuring)")
    p.add_argument("--h", type=int, nargs="+", default=list(DEFAULT_H), help="the H to predict")
    p.add_argument("--n-step", type=int, nargs="+", help="the n_step to predict (default: the config's)")
    p.add_argument("--n-group", type=int, help="n_group to predict (default: the measured config's)")
    p.add_argument("--tolerance", type=float, default=0.05, help="recommend the smallest H within this of the best")
    p.add_argument("--gen-scale", type=float, default=1.0, help="hypothetical: generation times x this")
    p.add_argument(
        "--train-scale", type=float, default=1.0, help="hypothetical: training, optimizer and sync times x this"
    )
    p.add_argument("--decode-step-s", type=float, help="hypothetical: a flat decoding step of this many seconds ...")
    p.add_argument("--decode-saturation", type=int, default=256, help="... up to this many sequences per call")
    p.add_argument(
        "--out", type=Path, help="JSON to write (default: experiments/results/cost_model_<device>/cost_model.json)"
    )
    args = p.parse_args(argv)
    from rapid.config import ConfigError

    try:
        if args.predict:
            if args.overrides or args.from_run:
                raise ConfigError("--predict reads a saved measurement: drop the Hydra overrides and --from-run")
            if not args.predict.exists():
                raise ConfigError(f"{args.predict} does not exist: measure first with tools/cost_model.py <overrides>")
            cm = json.loads(args.predict.read_text())
            out = args.out
        else:
            cm, out = measure_main(args)
        if args.lengths_from:
            groups = run_lengths(args.lengths_from)[1] if (args.lengths_from / "metrics.jsonl").exists() else None
            if not groups:
                raise ConfigError(
                    f"{args.lengths_from} has no rollouts.jsonl: pass a run made with logger.rollouts=true"
                )
            cm["length_groups"], cm["length_groups_from"] = groups, str(args.lengths_from)
    except ConfigError as e:
        print(f"cost_model: {e}")
        sys.exit(2)
    hyp = dict(
        gen_scale=args.gen_scale,
        train_scale=args.train_scale,
        decode_step_s=args.decode_step_s,
        decode_saturation=args.decode_saturation,
    )
    hypothetical_profile = args.gen_scale != 1.0 or args.train_scale != 1.0 or args.decode_step_s is not None
    model_cm = hypothetical(cm, **hyp) if hypothetical_profile else cm
    c = cm["config"]
    n_steps = args.n_step or [c["n_step"]]
    n_group = args.n_group or c["n_group"]
    predict_len = args.completion_len if args.predict else None
    table, rows = prediction_table(
        model_cm,
        args.h,
        n_steps,
        n_group,
        c["micro_batch"],
        tolerance=args.tolerance,
        completion_len=predict_len,
        length_groups=cm.get("length_groups"),
        reference=c["reference"] if "reference" in c else needs_reference(c),
        recompute=c.get("behavior_logprobs") == "recompute",
        passes=c.get("num_iterations", 1),
    )
    head = (
        f"Predicted seconds per 1,000 samples, {c['model']} ({c['dtype']}, sampler {cm['sampler']}, {cm['device']}), "
        f"task {c['task']}: prompts {cm['prompt_len_mean']:.0f} tokens on average, completions "
        f"{predict_len or cm['completion_len']} tokens"
        f"{' (lengths drawn from a run, rescaled to that mean)' if cm.get('length_groups') else ' (all of that length)'}; "
        f"{machine_line(cm['machine'])}"
        + (", timed by CPU time on one core" if cm.get("clock") == "cpu" else "")
        + (
            f", load average {cm['load_average']['before']:.1f} before and "
            f"{cm['load_average']['after']:.1f} after the measurement"
            if cm.get("load_average")
            else ""
        )
        + "."
    )
    if hypothetical_profile:
        head += (
            f" **Hypothetical profile** (not measured): generation x{args.gen_scale}, training x{args.train_scale}"
            + (
                f", a flat decoding step of {args.decode_step_s} s up to {args.decode_saturation} sequences"
                if args.decode_step_s is not None
                else ""
            )
            + "."
        )
    text = head + "\n\n" + table + "\n"
    print("\n" + text)
    if out is not None or not args.predict:
        result = {**cm, "predictions": rows, "prediction_profile": hyp if hypothetical_profile else None}
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=2))
        out.with_suffix(".md").write_text(text)
        print(f"wrote {out} and {out.with_suffix('.md')}")
    return {"measurement": cm, "predictions": rows, "table": text}


def measure_main(args) -> tuple[dict, Path]:
    from omegaconf import OmegaConf

    from rapid.config import ConfigError, validate, with_current_defaults

    overrides = list(args.overrides)
    length_groups = None
    if args.from_run:
        if not (args.from_run / "config.yaml").exists():
            raise ConfigError(f"{args.from_run} has no config.yaml: pass a rapid run directory to --from-run")
        cfg = with_current_defaults(OmegaConf.load(args.from_run / "config.yaml"))
        if overrides:
            cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
        mean_len, length_groups = run_lengths(args.from_run)
    else:
        cfg = compose(overrides)
        mean_len = None
    validate(cfg, 1)
    L = args.completion_len or mean_len or cfg.task.max_new_tokens
    if L < 2:
        raise ConfigError(f"--completion-len {L} must be at least 2 tokens")
    if any(s < 1 for s in args.sizes) or sorted(set(args.sizes)) != args.sizes:
        raise ConfigError(f"--sizes {args.sizes} must be distinct positive numbers in increasing order")
    if args.clock == "cpu":
        cores, threads = len(os.sched_getaffinity(0)), int(os.environ.get("OMP_NUM_THREADS", "0"))
        if cores != 1 or threads != 1:
            raise ConfigError(
                f"--clock cpu counts the CPU time of every thread, so it needs one thread on one core "
                f"(this process may use {cores} cores, OMP_NUM_THREADS={threads or 'unset'}): run it as "
                "`OMP_NUM_THREADS=1 taskset -c 0 python tools/cost_model.py ...`"
            )
    global clock
    clock = CLOCKS[args.clock]
    print(f"measuring at completions of {L:.1f} tokens, {args.sizes} sequences per call ...", flush=True)
    load_before = os.getloadavg()[0]
    cm = measure(cfg, L, args.sizes, args.repeats, log=lambda s: print(s, flush=True))
    # other work on the machine slows every timing (the CPU engine's threads wait for each other): say so
    cm["load_average"] = {"before": load_before, "after": os.getloadavg()[0], "cores": os.cpu_count()}
    if max(load_before, cm["load_average"]["after"]) > 1.5 * os.cpu_count():
        print(
            f"warning: the load average was {load_before:.1f} / {cm['load_average']['after']:.1f} on "
            f"{os.cpu_count()} cores during the measurement: other processes slowed it",
            flush=True,
        )
    a = cfg.algorithm
    cm["completion_len_asked"] = L
    cm["clock"] = args.clock
    cm["length_groups"] = length_groups
    cm["machine"] = machine_info()
    cm["config"] = {
        "model": cfg.model.name,
        "dtype": cfg.model.dtype,
        "task": cfg.task.name,
        "n_group": a.n_group,
        "n_step": a.n_step,
        "H": a.H,
        "micro_batch": cfg.train.micro_batch,
        "loss": a.loss,
        "beta": a.get("beta", 0.0),
        "reference": needs_reference(a),  # the loss's own declaration (rapid.estimators), not its name
        "behavior_logprobs": a.behavior_logprobs,
        "num_iterations": a.get("num_iterations", 1),
        "sampler": cfg.sampler.name,
        "temperature": cfg.sampler.temperature,
        "overrides": overrides,
        "from_run": str(args.from_run) if args.from_run else None,
    }
    cm["date"] = time.strftime("%Y-%m-%d")
    cm["command"] = " ".join(["python tools/cost_model.py", *sys.argv[1:]])
    out = args.out or REPO / "experiments" / "results" / f"cost_model_{cm['device'].split(':')[0]}" / "cost_model.json"
    return cm, out


if __name__ == "__main__":
    main()
