"""python -m rapid.train — RAPID (arXiv 2510.03515), Algorithm 1 from top to bottom.

Each round t:
  1. take n_inference / n_group prompts X_t from the shuffled training set;
  2. sample n_group completions per prompt with the frozen current policy μ = π_θ, keeping the
     per-token log μ;
  3. score them, R(x, y);
  4. put the n_inference records Z_t in the buffer;
  5. take H = n_inference / n_step gradient steps on minibatches of n_step records (whole
     groups), each with the importance-weighted group policy gradient (IW-GRPG, Eq. 3-5):
        w_n = exp(log π_θ(y_n|x_n) − log μ(y_n|x_n)),   w̄_n = min(w_n, η)
        A_n = R_n − (1/N_k) Σ_{n'∈N_k} w̄_n' R_n'          (leave-one-out: over n' ≠ n)
        g   = (1/B) Σ_n w̄_n A_n ∇ log π_θ(y_n|x_n)
     On the first step of a round θ = μ, so w = 1 and this is plain GRPG (Eq. 2);
  6. push the new weights into the sampler, in place.
PG is the same loop with H = 1 (`algorithm=pg`). With `algorithm.H=auto` each round's H is chosen from
the previous rounds' importance weights and phase times (rapid/adaptive_h.py), and the run ends when
its sample budget (`samples`) is spent.

    python -m rapid.train                                   # the offline default run (CPU, ~5.5 min)
    python -m rapid.train +experiment=smoke                 # tiny random model, < 2 min
    python -m rapid.train -m algorithm.H=1,2,4,8 seed=0,1   # a sweep, one directory per run
    python -m rapid.train algorithm.H=auto samples=3072     # H chosen every round, 3072 samples in all
    torchrun --nproc_per_node=2 -m rapid.train ...          # DDP: each rank samples its share of prompts
    python -m rapid.train resume=outputs/<run>              # continue from the latest checkpoint
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import time
from pathlib import Path
from statistics import mean

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from rapid import adaptive_h, checkpoint, distributed, estimators
from rapid.buffer import ReplayBuffer, Rollout, keep_informative_groups, rank_share
from rapid.config import (
    ConfigError,
    check_known_keys,
    check_new_run_dir,
    exit_on_config_error,
    register_resolvers,
    resolve_dtype,
    run_length,
    skipped_groups,
    validate,
)
from rapid.data import PromptStream
from rapid.distributed import all_reduce_max, all_reduce_sum, gather_round, print0
from rapid.evaluate import evaluate
from rapid.iw_grpg import masked_mean, normalized_ess
from rapid.logger import MetricsLogger, write_run_files
from rapid.losses import overlong_penalty
from rapid.mismatch import scale_gradient, truncated_is_factors
from rapid.models import load_model_and_tokenizer
from rapid.nonfinite import StepGuard
from rapid.policy import (
    CompletionLogprobs,
    accumulate_gradients,
    autocast,
    completion_logprobs,
    recompute_behavior_logprobs,
    token_logprobs,
)
from rapid.profiling import PhaseClock
from rapid.rewards import score, self_test
from rapid.sampler import make_sampler
from rapid.seeding import BUFFER_STREAM, ENGINE_STREAM, EVAL_STREAM, PROMPT_STREAM, SAMPLE_STREAM, derive_seed
from rapid.sft import distill_and_sft
from rapid.tasks import load_splits, record_id

PHASES = ("generate", "reward", "recompute", "train", "sync")  # a round's timed phases (+ other)
STAT_NAMES = {
    "clip_frac": "iw/clip_frac",
    "staleness": "iw/staleness",
    "log_w_mean": "iw/log_w_mean",
    "iw_mean": "iw/mean",
    "loss": "train/loss",
    "trained_frac": "train/trained_frac",
    "clipped_mass": "iw/clipped_mass",
    "correction_ratio_mean": "sampler/correction_ratio_mean",
    "correction_trunc_frac": "sampler/correction_trunc_frac",
}

register_resolvers()


def lr_lambda(schedule: str, warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[schedule]

    return f


def trim_to_minibatches(rollouts: list[Rollout], local_step: int, target: int, device) -> list[Rollout]:
    """After dynamic sampling: at most `target` records, a whole number of minibatches, and the same
    number on every rank (DDP needs equal step counts)."""
    n = min(len(rollouts), target) // local_step * local_step
    n = -int(all_reduce_max(-n, device))
    if n == 0:
        raise RuntimeError(
            "dynamic sampling found no informative group within algorithm.dynamic_sampling_tries "
            "attempts; raise it or check the reward"
        )
    return rollouts[:n]


def round_metrics(
    rollouts: list[Rollout], steps: list[dict], failed: int, mismatch: float | None, world: int, device: torch.device
) -> dict[str, float]:
    """A round's training metrics, over all ranks: reward and completion statistics per record, the
    loss's statistics averaged over the round's steps, and the sampler/trainer log-prob gap (the
    recompute's, else the first step's, where θ = μ). A statistic is averaged over the steps that
    report it: `loss` and `trained_frac` over every step, the others over the steps that ran records
    (a step whose every group has advantage 0 runs none, `rapid.policy.accumulate_gradients`)."""
    keys = dict.fromkeys(k for s in steps for k in s)
    loss_keys = [k for k in keys if k not in ("iw_max", "token_logp_gap", "grad_norm", "lr", "records")]
    gap = steps[0].get("token_logp_gap") if mismatch is None else mismatch
    sums = distributed.all_reduce_sum_dict(
        {
            "records": len(rollouts),
            "failures": failed,
            "reward": sum(r.reward for r in rollouts),
            "correct": sum(r.task_reward == 1.0 for r in rollouts),  # before DAPO's overlong penalty
            "tokens": sum(len(r.completion_ids) for r in rollouts),
            "truncated": sum(r.truncated for r in rollouts),
            **({"gap": gap} if gap is not None else {}),
            **step_sums(steps, loss_keys),
        },
        device,
    )
    n = max(sums["records"], 1)
    row = {
        "train/reward_mean": sums["reward"] / n,
        "train/accuracy": sums["correct"] / n,
        "train/completion_len": sums["tokens"] / n,
        "train/truncated_frac": sums["truncated"] / n,
        "train/reward_failures": int(sums["failures"]),
        **({"sampler/logprob_mismatch": sums["gap"] / world} if "gap" in sums else {}),
        **{
            STAT_NAMES.get(k, f"loss/{k}"): v
            for k in sorted(loss_keys)
            if (v := step_means(sums, len(steps), k, world)) is not None
        },
        "train/grad_norm": steps[-1]["grad_norm"],
        "train/lr": steps[-1]["lr"],
    }
    if "iw_max" in keys:
        mine = max((s["iw_max"] for s in steps if "iw_max" in s and s.get("records", 1) > 0), default=-math.inf)
        if (iw_max := all_reduce_max(mine, device)) > -math.inf:  # a DDP placeholder group's weights do not count
            row["iw/max"] = iw_max
    return row


PER_RANK = ("loss", "trained_frac")  # a rank's share of the minibatch's: their mean over ranks is the minibatch's


def step_sums(steps: list[dict], keys: list[str]) -> dict[str, float]:
    """Each step's statistics, to be summed over ranks: `loss` and `trained_frac` as they are, the others
    weighted by the records they describe (`records`; 0 for a DDP placeholder group, whose weights must not
    count), so that over ranks they average records, not ranks."""
    out = {}
    for j, s in enumerate(steps):
        n = s.get("records", 0)
        out[f"{j}/records"] = n
        out |= {f"{j}/{k}": s[k] if k in PER_RANK else s[k] * n for k in keys if k in s}
    return out


def step_means(sums: dict[str, float], n_steps: int, key: str, world: int) -> float | None:
    """The round's mean of `key` over the steps that report it, from `step_sums` summed over ranks (None:
    no step trained a record)."""
    values = [
        sums[f"{j}/{key}"] / world if key in PER_RANK else sums[f"{j}/{key}"] / sums[f"{j}/records"]
        for j in range(n_steps)
        if f"{j}/{key}" in sums and (key in PER_RANK or sums[f"{j}/records"] > 0)
    ]
    return mean(values) if values else None


def timing_metrics(phases: dict[str, float], round_s: float, tokens_all_ranks: int) -> dict[str, float]:
    """The round's phase times (rank 0's; PhaseClock's row, and memory), the rest as `other`, tokens/s."""
    phases = {f"time/{p}_s": 0.0 for p in PHASES} | phases
    return {
        **phases,
        "time/other_s": round_s - sum(phases[f"time/{p}_s"] for p in PHASES),
        "time/round_s": round_s,
        "sampler/tokens_per_s": tokens_all_ranks / max(phases["time/generate_s"], 1e-9),
    }


def summarize(rows: list[dict], final: dict) -> dict:
    """summary.json's accuracies, totals and averages from the run's logged rows (rank 0's)."""
    evals = [r for r in rows if "eval/accuracy" in r]
    train_rows = [r for r in rows if "train/reward_mean" in r]
    memory = sorted({k for r in train_rows for k in r if k.startswith("mem/") and k != "mem/peak_is_process"})
    return {
        "eval/accuracy_before": evals[0]["eval/accuracy"] if evals and evals[0]["round"] == 0 else None,
        "eval/accuracy_after": final["eval/accuracy"],
        "unused_samples": sum(r.get("algorithm/unused_samples", 0) for r in train_rows),
        "time/rounds_s_total": sum(r["time/round_s"] for r in train_rows),
        **{f"time/{p}_s_total": sum(r[f"time/{p}_s"] for r in train_rows) for p in (*PHASES, "other")},
        **{  # over the rounds that trained on records (paper Table 3; a round of zero advantages runs none)
            f"{k}_avg": mean(r[k] for r in train_rows if k in r)
            for k in ("iw/staleness", "iw/log_w_mean")
            if any(k in r for r in train_rows)
        },
        **{f"{k}_max": max(r[k] for r in train_rows if k in r) for k in memory},
    }


@hydra.main(config_path="../conf", config_name="config", version_base=None)
@exit_on_config_error
def main(cfg: DictConfig) -> dict | None:
    try:
        if cfg.algorithm.loss == "sft":  # the SFT baseline: rapid.distill, then rapid.sft, in one run
            return distill_and_sft(cfg, Path(HydraConfig.get().runtime.output_dir))
        return train(cfg)
    finally:
        distributed.shutdown()


def train(cfg: DictConfig) -> dict:
    # ---------------------------------------------------------------- setup
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    resume_from = None
    if cfg.resume:
        run_dir = Path(cfg.resume)
        resume_from = checkpoint.latest(run_dir)
        if resume_from is None:
            raise ConfigError(
                f"resume={cfg.resume} holds no readable checkpoint (checkpoints/round_*/state.pt): "
                "point it at the directory of a run that saved one"
            )
        ignored = [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
        if ignored:
            print0(f"resume continues with the run's saved config; ignoring {' '.join(ignored)}")
        cfg = checkpoint.load_config(resume_from)  # the run continues with the config it started with
    else:  # a new run: every key known (rapid/config.py)
        check_known_keys(cfg)
    rank, world, device = distributed.init(cfg.device)
    if resume_from is None and distributed.is_main():
        check_new_run_dir(run_dir)  # never appends to an earlier run's files
    validate(cfg, world)
    a, t, o = cfg.algorithm, cfg.task, cfg.optim
    compute_dtype = resolve_dtype(cfg.model.dtype, device)
    temperature = cfg.sampler.temperature
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(
        cfg.model.path, cfg.model.gguf, cfg.model.architecture, cfg.model.gradient_checkpointing, seed=cfg.seed
    )
    model.to(device)
    task, train_records, train_prompts, eval_records, eval_prompts = load_splits(t, tokenizer, cfg.eval.n)
    cfg.rounds, cfg.samples = run_length(cfg, len(train_records))  # rounds is None with H=auto
    if distributed.is_main():
        write_run_files(run_dir, cfg, device, "meta_resume.json" if resume_from else "meta.json", world_size=world)
        (run_dir / "split.json").write_text(
            json.dumps(  # which problems trained, which were held out
                {"train": [record_id(r) for r in train_records], "eval": [record_id(r) for r in eval_records]}
            )
        )
    print0(OmegaConf.to_yaml(cfg, resolve=True))
    sampler = make_sampler(
        cfg.sampler, model, tokenizer, compute_dtype, seed=derive_seed(cfg.seed, ENGINE_STREAM, rank) % 2**31
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, fused=True
    )  # one kernel for all parameters (2.8x faster step on CPU)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(o.schedule, o.warmup_steps, cfg.samples // a.n_step * a.num_iterations)
    )
    policy = CompletionLogprobs(model, temperature, share_prompt=not cfg.model.gradient_checkpointing)
    if world > 1:
        policy = DistributedDataParallel(policy, device_ids=[device.index] if device.type == "cuda" else None)
    stream = PromptStream(len(train_records), derive_seed(cfg.seed, PROMPT_STREAM))
    auto_h = adaptive_h.Settings.from_config(a.auto_h, a.n_step) if a.H == "auto" else None
    h_state = adaptive_h.initial_state(auto_h) if auto_h else None
    # the KL reference (GRPO's) is the initial policy: copied before a resume loads the checkpoint's weights
    initial = copy.deepcopy(model) if estimators.get(a.loss).reference(a) else None
    start_round, elapsed0, samples_done = 0, 0.0, 0
    if resume_from is not None:
        state = checkpoint.load(resume_from, model, optimizer, scheduler, stream)
        start_round, elapsed0 = state["round"], state["elapsed_s"]
        samples_done = state.get("samples", start_round * a.n_inference)
        if auto_h:
            h_state = adaptive_h.State.from_state_dict(state["auto_h"])
        sampler.sync_weights(model)  # the engine was built from the initial weights: sample from the resumed ones
        print0(f"resumed from {resume_from} at round {start_round}")
    logger = MetricsLogger(
        run_dir,
        enabled=distributed.is_main(),
        wandb_cfg={"enabled": cfg.logger.wandb, "project": cfg.logger.project, "name": run_dir.name},
        config=OmegaConf.to_container(cfg, resolve=True),
        resume_round=start_round if resume_from else None,
    )

    estimator = estimators.get(a.loss)  # the loss and what it needs (rapid/estimators.py)
    reference = None  # a KL anchor (GRPO, Dr. GRPO with kl_coef > 0): a frozen copy of the initial policy
    if estimator.reference(a):
        reference = CompletionLogprobs(
            initial.requires_grad_(False).eval(),
            temperature,
            share_prompt=not cfg.model.gradient_checkpointing,
        )

    skip_groups = skipped_groups(cfg)  # groups whose advantages are all 0 are not run
    spanning = a.n_step % (a.n_group * world) != 0  # a group spans ranks (rapid/policy.py)
    guard = StepGuard(o.max_nonfinite_steps, device)  # non-finite loss or gradient: step skipped

    def loss_fn(token_logp, batch, n_records, n_tokens, peers=None):
        mask = batch.completion_mask
        correction = {}
        if a.engine_correction != "none":  # μ_engine vs the trainer's μ: rapid/mismatch.py
            factors, correction = truncated_is_factors(
                batch.logp_mu, batch.logp_engine, mask, a.engine_correction, a.engine_correction_cap
            )
            token_logp = scale_gradient(token_logp, factors)  # same values; each token's gradient times its factor
        logp_ref = None
        if reference is not None:
            with torch.no_grad(), autocast(device, compute_dtype):
                logp_ref = completion_logprobs(reference, batch).float()
        inputs = estimators.LossInputs(
            token_logp,
            batch.logp_mu,
            mask,
            batch.rewards,
            batch.group_ids,
            logp_ref,
            n_records,
            n_tokens,
            t.max_new_tokens,
            peers,  # the whole groups when groups span ranks (rapid.policy.gather_peers)
        )
        loss, stats = estimator.fn(inputs, a)
        # |log π_θ − log μ| per token; on a round's first step θ = μ, so this is sampler/trainer mismatch
        stats["token_logp_gap"] = masked_mean((token_logp.detach() - batch.logp_mu).abs(), mask).item()
        return loss, stats | {f"correction_{k}": v for k, v in correction.items()}

    def sample_and_score(
        round_: int, positions: list[int], indices: list[int], clock: PhaseClock
    ) -> tuple[list[Rollout], int]:
        """n_group completions per prompt with μ = π_θ, seeds from (round, prompt, sample), scored
        (a crashed or timed-out checker scores 0 and is counted)."""
        seeds = [derive_seed(cfg.seed, SAMPLE_STREAM, round_, p) for p in positions]
        with clock.phase("generate"):
            groups = sampler.generate(
                [train_prompts[i] for i in indices],
                n=a.n_group,
                max_new_tokens=t.max_new_tokens,
                temperature=temperature,
                seeds=seeds,
            )
        flat = [(p, i, c) for p, i, group in zip(positions, indices, groups) for c in group]
        with clock.phase("reward"):
            rewards, failed = score(
                task,
                [c.text for _, _, c in flat],
                [train_records[i] for _, i, _ in flat],
                workers=cfg.reward.workers,
                timeout=cfg.reward.timeout_s,
            )
        scores = rewards  # the task's reward; DAPO's accuracy and dynamic sampling read it
        if a.overlong_cache:  # DAPO's soft overlong punishment
            lengths = torch.tensor([len(c.token_ids) for _, _, c in flat])
            rewards = (
                torch.tensor(rewards)
                + overlong_penalty(lengths, t.max_new_tokens, a.overlong_cache, a.overlong_penalty)
            ).tolist()
        return [
            Rollout(
                prompt_ids=train_prompts[i],
                completion_ids=c.token_ids,
                logp_mu=c.logprobs,
                reward=r,
                group_id=p,
                truncated=c.finish_reason == "length",
                text=c.text,
                prompt_index=i,
                score=s,
            )
            for (p, i, c), r, s in zip(flat, rewards, scores)
        ], failed

    def run_eval(round_: int, log: bool = True) -> dict:
        t0 = time.perf_counter()
        correct = []
        row = evaluate(
            sampler,
            task,
            eval_records,
            eval_prompts,
            max_new_tokens=t.max_new_tokens,
            temperature=cfg.eval.temperature,
            n_samples=cfg.eval.n_samples,
            sample_temperature=temperature,
            ks=tuple(cfg.eval.ks),
            rank=rank,
            world=world,
            device=device,
            seed=derive_seed(cfg.seed, EVAL_STREAM) % 2**31,
            outcomes=correct,
            workers=cfg.reward.workers,
            timeout=cfg.reward.timeout_s,
        )
        row = {"round": round_, **row, "time/eval_s": time.perf_counter() - t0}
        if log:
            logger.log(row)
            logger.log_eval_outcomes(round_, correct)
        print0(f"eval @ round {round_}: accuracy {row['eval/accuracy']:.3f} on {row['eval/n']} problems")
        return row

    print0(
        self_test(task, train_records, cfg.reward.self_test, workers=cfg.reward.workers, timeout=cfg.reward.timeout_s)
    )
    t_start = time.perf_counter() - elapsed0
    if start_round == 0 and cfg.eval.at_start:
        run_eval(0)
    buffer = ReplayBuffer()
    bar = tqdm(
        total=cfg.samples,
        initial=samples_done,
        unit="samples",
        disable=not distributed.is_main() or not cfg.logger.progress,
        dynamic_ncols=True,
    )
    final = None
    # ---------------------------------------------------------------- Algorithm 1
    for round_ in itertools.count(start_round):
        if samples_done >= cfg.samples:
            break
        t0 = time.perf_counter()
        H = a.H if auto_h is None else adaptive_h.plan(h_state, cfg.samples - samples_done, a.n_step)
        n_prompts = H * a.n_step // a.n_group  # prompts per round, over all ranks
        # 1-3. prompts X_t (the round's n_inference / n_group; this rank takes every world-th), sampled and scored
        positions = list(range(rank, n_prompts, world))
        round_indices = stream.take(n_prompts)
        clock = PhaseClock(device)
        rollouts, failed = sample_and_score(round_, positions, [round_indices[p] for p in positions], clock)
        dropped = 0
        if a.dynamic_sampling:  # DAPO: drop all-equal groups, sample more prompts until full
            rollouts, dropped = keep_informative_groups(rollouts)
            for attempt in range(1, a.dynamic_sampling_tries):
                if len(rollouts) >= len(positions) * a.n_group:
                    break
                more = list(range(rank, n_prompts, world))
                extra_indices = stream.take(n_prompts)
                extra, f = sample_and_score(
                    round_, [attempt * n_prompts + p for p in more], [extra_indices[p] for p in more], clock
                )
                extra, d = keep_informative_groups(extra)
                rollouts, failed, dropped = rollouts + extra, failed + f, dropped + d
            if not spanning:
                rollouts = trim_to_minibatches(rollouts, a.n_step // world, len(positions) * a.n_group, device)
        # 4. Z_t, served as group-aligned minibatches (n_step records over all ranks), once per pass
        buffer.clear()
        if spanning:  # groups span ranks: every rank holds the whole round (group ids are prompt positions)
            every = gather_round(rollouts, world)
            if a.dynamic_sampling:
                every = trim_to_minibatches(every, a.n_step, n_prompts * a.n_group, device)
                rollouts = [r for r in every if r.group_id % n_prompts % world == rank]  # this rank's, kept
            buffer.add(every)
        else:
            buffer.add(rollouts)
        shuffle = torch.Generator().manual_seed(derive_seed(cfg.seed, BUFFER_STREAM, round_))
        passes = [buffer.minibatches(a.n_step // (1 if spanning else world), shuffle) for _ in range(a.num_iterations)]
        if spanning:  # every rank holds the round; each trains its slice of every minibatch
            passes = [rank_share(minibatches, rank, world) for minibatches in passes]
        mismatch = None
        if (
            a.behavior_logprobs == "recompute"
        ):  # exact log μ: the trainer's forward at θ = μ, in the first pass's micro-batches
            with clock.phase("recompute"):
                mismatch = recompute_behavior_logprobs(
                    policy,
                    passes[0],
                    micro_batch=cfg.train.micro_batch,
                    pad_id=sampler.pad_id,
                    device=device,
                    compute_dtype=compute_dtype,
                )
        with clock.phase("sync"):
            sampler.sleep()
        # 5. H gradient steps
        steps, ess = [], []
        with clock.phase("train"):
            for minibatch in [mb for minibatches in passes for mb in minibatches]:
                stats = accumulate_gradients(
                    policy,
                    minibatch,
                    loss_fn,
                    micro_batch=cfg.train.micro_batch,
                    pad_id=sampler.pad_id,
                    device=device,
                    compute_dtype=compute_dtype,
                    skip_groups=skip_groups,
                    spanning=spanning,
                )
                if "w_bar_mean" in stats:  # IW-GRPG: the ESS of the records trained on, over all ranks
                    n = stats["records"]  # 0 for a DDP placeholder group
                    w1, w2, n = all_reduce_sum([stats["w_bar_mean"] * n, stats["w_bar_sq_mean"] * n, n], device)
                    if n > 0:
                        ess.append((len(steps) + 1, normalized_ess(w1 / n, w2 / n)))  # (step k, e_k)
                if auto_h and adaptive_h.stop_early(ess, auto_h):  # too stale: not applied, the round ends
                    optimizer.zero_grad(set_to_none=True)
                    break
                stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip).item()
                stats["lr"] = scheduler.get_last_lr()[0]
                if guard.ok(stats["loss"], stats["grad_norm"], step=scheduler.last_epoch):  # else skipped
                    optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                steps.append(stats)
        unused = (H - len(steps)) * a.n_step if auto_h else 0  # generated, not trained on (early stop)
        for _ in range(unused // a.n_step):  # the lr schedule runs over samples generated
            scheduler.step()
        samples_done += H * a.n_step
        # 6. the new weights go to the sampler, in place
        with clock.phase("sync"):
            sampler.sync_weights(model)
        round_s = time.perf_counter() - t0
        # 7. log (sums over ranks, then means; times and memory are rank 0's)
        row = {
            "round": round_ + 1,
            "samples": samples_done,
            "epoch": stream.epoch + stream.pos / len(train_records),
            **round_metrics(rollouts, steps, failed, mismatch, world, device),
            "train/nonfinite_steps": guard.take_count(),
            **timing_metrics(clock.row(), round_s, sum(len(r.completion_ids) for r in rollouts) * world),
            "wall_s": time.perf_counter() - t_start,
        }
        if a.dynamic_sampling:
            row["train/dropped_groups"] = int(all_reduce_sum([dropped], device)[0])
        if auto_h:  # the next round's H, from this round's weights and phase times (averaged over ranks)
            times = all_reduce_sum(
                [row[f"time/{p}_s"] / world for p in ("generate", "reward", "recompute", "train", "sync", "other")],
                device,
            )
            h_state, decision = adaptive_h.update(
                h_state,
                auto_h,
                adaptive_h.Round(
                    H,
                    ess,
                    generate_s=times[0],
                    reward_s=times[1] + times[2],
                    train_s=times[3],
                    fixed_s=times[4] + times[5],
                    steps=len(steps) + (len(steps) < H),  # + the early-stopped step, computed
                ),
            )
            row |= {"algorithm/H": H, "algorithm/steps": len(steps), "algorithm/unused_samples": unused, **decision}
        logger.log(row)
        if cfg.logger.rollouts:  # + per-token log π after the round's updates, for its first group (the token log w)
            logger.log_rollouts(
                round_ + 1,
                rollouts,
                token_logprobs(
                    policy, rollouts[: a.n_group], pad_id=sampler.pad_id, device=device, compute_dtype=compute_dtype
                ),
            )
        bar.update(H * a.n_step)
        bar.set_postfix(
            reward=f"{row['train/reward_mean']:.3f}",
            clip=f"{row.get('iw/clip_frac', 0):.2f}",
            stale=f"{row.get('iw/staleness', 0):.3f}",
            H=H,
            s_round=f"{row['time/round_s']:.1f}",
        )
        last = samples_done >= cfg.samples
        every_samples = cfg.eval.get("every_samples") or cfg.samples + 1
        crossed = samples_done // every_samples > (samples_done - H * a.n_step) // every_samples
        if (cfg.eval.every and (round_ + 1) % cfg.eval.every == 0) or crossed or last:
            final = run_eval(round_ + 1)
        if (cfg.ckpt.every and (round_ + 1) % cfg.ckpt.every == 0) or last:
            if distributed.is_main():
                checkpoint.save(
                    run_dir,
                    round_ + 1,
                    model,
                    tokenizer,
                    optimizer,
                    scheduler,
                    stream,
                    cfg,
                    elapsed_s=time.perf_counter() - t_start,
                    keep=cfg.ckpt.keep,
                    extra={"samples": samples_done, "auto_h": h_state and h_state.state_dict()},
                )
    bar.close()
    # ---------------------------------------------------------------- final evaluation and summary
    if final is None:  # resumed a finished run: report, log nothing new
        final = run_eval(round_, log=False)
    summary = {
        "rounds": round_,
        "samples": samples_done,
        "sampler": sampler.name,
        "algorithm": a.name,
        "time/total_s": time.perf_counter() - t_start,
        **summarize(logger.rows() if distributed.is_main() else [], final),
    }
    if distributed.is_main():
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print0(json.dumps(summary, indent=2))
    logger.close()
    return summary


if __name__ == "__main__":
    main()
