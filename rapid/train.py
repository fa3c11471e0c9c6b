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
import functools
import itertools
import json
import math
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from rapid import adaptive_h, checkpoint, console, distributed, estimators
from rapid.buffer import ReplayBuffer, Rollout, dynamic_sampling, rank_share, trim_to_minibatches
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
from rapid.distributed import all_reduce_sum, gather_round, print0
from rapid.evaluate import evaluate_config
from rapid.iw_grpg import masked_mean, normalized_ess
from rapid.logger import (
    MetricsLogger,
    config_summary,
    progress_fields,
    round_row,
    run_dir_line,
    summarize,
    write_run_files,
)
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
from rapid.sampler import make_sampler, sequence_budget
from rapid.seeding import BUFFER_STREAM, ENGINE_STREAM, EVAL_STREAM, PROMPT_STREAM, SAMPLE_STREAM, derive_seed
from rapid.tasks import load_splits, record_id

register_resolvers()


def lr_lambda(schedule: str, warmup: int, total: int):
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))  # a last round may overshoot `total`
        return {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[schedule]

    return f


def minibatch_loss(
    token_logp: torch.Tensor,
    batch,
    n_records: int,
    n_tokens: int,
    peers=None,
    *,
    a: DictConfig,
    estimator: estimators.Estimator,
    reference: torch.nn.Module | None,
    max_new_tokens: int,
    device: torch.device,
    compute_dtype: torch.dtype,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The loss of one micro-batch (rapid.policy.accumulate_gradients calls it with the minibatch's
    normalisers): the engine correction where asked (rapid/mismatch.py), the reference's log-probs where
    the loss needs them, then the registered estimator `algorithm.loss` (rapid/estimators.py), and the
    sampler/trainer gap per token."""
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
        max_new_tokens,
        peers,  # the whole groups when groups span ranks (rapid.policy.gather_peers)
    )
    loss, stats = estimator.fn(inputs, a)
    # |log π_θ − log μ| per token; on a round's first step θ = μ, so this is sampler/trainer mismatch
    stats["token_logp_gap"] = masked_mean((token_logp.detach() - batch.logp_mu).abs(), mask).item()
    return loss, stats | {f"correction_{k}": v for k, v in correction.items()}


def sample_and_score(
    cfg: DictConfig,
    sampler,
    task,
    records: list[dict],
    prompts: list[list[int]],
    stream: PromptStream,
    round_: int,
    attempt: int,
    n_prompts: int,
    clock: PhaseClock,
    *,
    rank: int,
    world: int,
) -> tuple[list[Rollout], int]:
    """Algorithm 1's steps 1-3 on this rank: the stream's next `n_prompts` training problems (over all
    ranks; this rank takes every world-th), n_group completions each with μ = π_θ, seeds from (round,
    prompt, sample), scored (a crashed or timed-out checker scores 0 and is counted). Returns the
    rollouts, with DAPO's overlong penalty in their reward, and the failures. `attempt` > 0: DAPO's
    dynamic sampling drawing more prompts for the same round (their positions follow the first's)."""
    a, t = cfg.algorithm, cfg.task
    taken = stream.take(n_prompts)
    positions = list(range(rank, n_prompts, world))
    indices = [taken[p] for p in positions]
    positions = [attempt * n_prompts + p for p in positions]
    seeds = [derive_seed(cfg.seed, SAMPLE_STREAM, round_, p) for p in positions]
    with clock.phase("generate"):
        groups = sampler.generate(
            [prompts[i] for i in indices],
            n=a.n_group,
            max_new_tokens=t.max_new_tokens,
            temperature=cfg.sampler.temperature,
            seeds=seeds,
        )
    flat = [(p, i, c) for p, i, group in zip(positions, indices, groups) for c in group]
    with clock.phase("reward"):
        rewards, failed = score(
            task,
            [c.text for _, _, c in flat],
            [records[i] for _, i, _ in flat],
            workers=cfg.reward.workers,
            timeout=cfg.reward.timeout_s,
        )
    scores = rewards  # the task's reward; DAPO's accuracy and dynamic sampling read it
    if a.overlong_cache:  # DAPO's soft overlong punishment
        lengths = torch.tensor([len(c.token_ids) for _, _, c in flat])
        rewards = (
            torch.tensor(rewards) + overlong_penalty(lengths, t.max_new_tokens, a.overlong_cache, a.overlong_penalty)
        ).tolist()
    return [
        Rollout(
            prompt_ids=prompts[i],
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


def eval_and_log(
    cfg: DictConfig,
    sampler,
    task,
    records: list[dict],
    prompts: list[list[int]],
    logger: MetricsLogger,
    round_: int,
    samples: int,
    *,
    rank: int,
    world: int,
    device: torch.device,
    log: bool = True,
) -> dict:
    """The held-out evaluation (rapid/evaluate.py) after `round_` rounds: its row, logged with the
    per-problem verdicts unless `log` is false, and a console line."""
    t0 = time.perf_counter()
    correct = []
    row = evaluate_config(
        cfg,
        sampler,
        task,
        records,
        prompts,
        seed=derive_seed(cfg.seed, EVAL_STREAM) % 2**31,
        rank=rank,
        world=world,
        device=device,
        outcomes=correct,
    )
    row = {"progress/round": round_, "progress/samples": samples, **row, "time/eval_s": time.perf_counter() - t0}
    if log:
        logger.log(row)
        logger.log_eval_outcomes(round_, correct)
    if distributed.is_main():  # above the progress bar, not inside it
        tqdm.write(f"eval @ round {round_}: accuracy {row['eval/accuracy']:.3f} on {row['eval/n']} problems")
    return row


@hydra.main(config_path="../conf", config_name="config", version_base=None)
@exit_on_config_error
def main(cfg: DictConfig) -> dict | None:
    try:
        program = estimators.program(cfg.algorithm.loss)  # a baseline run as its own program (SFT)
        if program is not None:
            return program(cfg, Path(HydraConfig.get().runtime.output_dir))
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
    else:  # a new run: earlier key names read as today's, then every key known (rapid/config.py)
        with open_dict(cfg):
            for notice in estimators.upgrade_settings(cfg.algorithm):
                print0(notice)
        check_known_keys(cfg)
    rank, world, device = distributed.init(cfg.device)
    if resume_from is None and distributed.is_main():
        check_new_run_dir(run_dir)  # never appends to an earlier run's files
    validate(cfg, world)
    log_file, verbose = console.log_file_of(run_dir), cfg.logger.get("verbose", False)
    console.quiet_libraries(log_file, verbose)  # the libraries' warnings to <run_dir>/train.log (rapid/console.py)
    print0(run_dir_line(run_dir))
    a, t, o = cfg.algorithm, cfg.task, cfg.optim
    compute_dtype = resolve_dtype(cfg.model.dtype, device)
    temperature = cfg.sampler.temperature
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(
        cfg.model.path, cfg.model.gguf, cfg.model.architecture, cfg.model.gradient_checkpointing, seed=cfg.seed
    )
    model.to(device)
    export_dtype = checkpoint.source_dtype(cfg.model)  # the final model is saved in the dtype it came in
    task, train_records, train_prompts, eval_records, eval_prompts = load_splits(t, tokenizer, cfg.eval.n)
    cfg.rounds, cfg.samples = run_length(cfg, len(train_records))  # rounds is None with H=auto
    if distributed.is_main():
        write_run_files(run_dir, cfg, device, "meta_resume.json" if resume_from else "meta.json", world_size=world)
        (run_dir / "split.json").write_text(
            json.dumps(  # which problems trained, which were held out
                {"train": [record_id(r) for r in train_records], "eval": [record_id(r) for r in eval_records]}
            )
        )
    print0(config_summary(cfg, run_dir))
    with console.engine_start(log_file, verbose):  # the engine's C++ warnings to the log file
        sampler = make_sampler(
            cfg.sampler,
            model,
            tokenizer,
            compute_dtype,
            seed=derive_seed(cfg.seed, ENGINE_STREAM, rank) % 2**31,
            max_len_needed=sequence_budget(train_prompts + eval_prompts, t.max_new_tokens),
        )
    # the KL reference (GRPO's) is the initial policy: copied before a resume loads the checkpoint's weights
    initial = copy.deepcopy(model) if estimators.get(a.loss).reference(a) else None
    policy = CompletionLogprobs(model, temperature, share_prompt=not cfg.model.gradient_checkpointing)
    if world > 1 and cfg.train.parallel == "fsdp":  # parameters, gradients and optimizer state sharded
        distributed.shard_model(model)
    elif world > 1:
        policy = DistributedDataParallel(policy, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=o.lr, betas=tuple(o.betas), weight_decay=o.weight_decay, fused=True
    )  # one kernel for all parameters (2.8x faster step on CPU); after sharding: the shards' parameters
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(o.schedule, o.warmup_steps, cfg.samples // a.n_step * a.num_iterations)
    )
    stream = PromptStream(len(train_records), derive_seed(cfg.seed, PROMPT_STREAM))
    auto_h = adaptive_h.Settings.from_config(a.auto_h, a.n_step) if a.H == "auto" else None
    h_state = adaptive_h.initial_state(auto_h) if auto_h else None
    start_round, elapsed0, samples_done = 0, 0.0, 0
    if resume_from is not None:
        state = checkpoint.load(resume_from, model, optimizer, scheduler, stream, rank, world)
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
    reference = None  # a KL anchor (GRPO, Dr. GRPO with beta > 0): a frozen copy of the initial policy
    if estimator.reference(a):
        reference = CompletionLogprobs(
            initial.requires_grad_(False).eval(),
            temperature,
            share_prompt=not cfg.model.gradient_checkpointing,
        )

    skip_groups = skipped_groups(cfg)  # groups whose advantages are all 0 are not run
    spanning = a.n_step % (a.n_group * world) != 0  # a group spans ranks (rapid/policy.py)
    guard = StepGuard(o.max_nonfinite_steps, device)  # non-finite loss or gradient: step skipped

    loss_fn = functools.partial(
        minibatch_loss,
        a=a,
        estimator=estimator,
        reference=reference,
        max_new_tokens=t.max_new_tokens,
        device=device,
        compute_dtype=compute_dtype,
    )
    print0(
        self_test(task, train_records, cfg.reward.self_test, workers=cfg.reward.workers, timeout=cfg.reward.timeout_s)
    )
    sample = functools.partial(
        sample_and_score, cfg, sampler, task, train_records, train_prompts, stream, rank=rank, world=world
    )
    run_eval = functools.partial(
        eval_and_log, cfg, sampler, task, eval_records, eval_prompts, logger, rank=rank, world=world, device=device
    )
    t_start = time.perf_counter() - elapsed0
    if start_round == 0 and cfg.eval.at_start:
        run_eval(0, 0)
    buffer = ReplayBuffer()
    bar = tqdm(
        total=cfg.samples,
        initial=samples_done,
        unit="samples",
        disable=not distributed.is_main() or not cfg.logger.progress,
        dynamic_ncols=True,
    )
    every_samples = cfg.eval.get("every_samples") or cfg.samples + 1  # evaluate each time `samples` crosses it
    final = None
    # ---------------------------------------------------------------- Algorithm 1
    for round_ in itertools.count(start_round):
        if samples_done >= cfg.samples:
            break
        t0 = time.perf_counter()
        H = a.H if auto_h is None else adaptive_h.plan(h_state, cfg.samples - samples_done, a.n_step)
        n_prompts = H * a.n_step // a.n_group  # prompts per round, over all ranks
        clock = PhaseClock(device)
        # 1-3. prompts X_t (the round's n_inference / n_group), sampled with μ = π_θ and scored
        rollouts, failed = sample(round_, 0, n_prompts, clock)
        dropped, batches = None, 1
        if a.dynamic_sampling:  # DAPO: drop all-equal groups, sample more prompts until full
            more = lambda attempt: sample(round_, attempt, n_prompts, clock)  # DAPO's next prompts, same round
            target = len(range(rank, n_prompts, world)) * a.n_group  # this rank's records
            rollouts, failed, dropped, batches = dynamic_sampling(
                rollouts, failed, more, a.dynamic_sampling_tries, target, a.n_step // world, device, trim=not spanning
            )
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
                if estimator.iw and "records" in stats:  # the ESS of the w̄ of the records trained on, over all ranks
                    n = stats["records"]  # 0 for a DDP placeholder group
                    w1, w2, n = all_reduce_sum([stats["w_bar_mean"] * n, stats["w_bar_sq_mean"] * n, n], device)
                    if n > 0:
                        ess.append((len(steps) + 1, normalized_ess(w1 / n, w2 / n)))  # (step k, e_k)
                if auto_h and adaptive_h.stop_early(ess, auto_h):  # too stale: not applied, the round ends
                    optimizer.zero_grad(set_to_none=True)
                    break
                grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), o.grad_clip)
                stats["grad_norm"] = distributed.full_tensor(grad_norm).item()  # sharded: the global norm
                stats["lr"] = scheduler.get_last_lr()[0]
                if guard.ok(stats["loss"], stats["grad_norm"], step=scheduler.last_epoch):  # else skipped
                    optimizer.step()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                steps.append(stats)
        generated = H * a.n_step * batches  # DAPO's extra batches count: samples are what the engine generated
        for _ in range(generated // a.n_step * a.num_iterations - len(steps)):  # the lr schedule runs over
            scheduler.step()  # samples generated: steps not taken (an early stop, DAPO's trimming) advance it
        samples_done += generated
        # 6. the new weights go to the sampler, in place
        with clock.phase("sync"):
            sampler.sync_weights(model)
        round_s = time.perf_counter() - t0
        # 7. log (sums over ranks, then means; times and memory are rank 0's)
        row = round_row(
            {
                "progress/round": round_ + 1,
                "progress/samples": samples_done,
                "progress/epoch": stream.epoch + stream.pos / len(train_records),
                "time/wall_s": time.perf_counter() - t_start,
            },
            rollouts,
            steps,
            phases=clock.row(),
            round_s=round_s,
            world=world,
            device=device,
            failed=failed,
            mismatch=mismatch,
            nonfinite_steps=guard.take_count(),
            dropped=dropped,
            iw=estimator.iw,
        )
        if a.dynamic_sampling:
            row["train/sampling_batches"] = batches  # DAPO: batches of H * n_step prompts' samples generated
        if auto_h:  # the next round's H, from this round's weights and phase times (averaged over ranks)
            h_state, h_log = adaptive_h.end_round(h_state, auto_h, H, ess, len(steps), row, world, device)
            row |= h_log
        logger.log(row)
        if cfg.logger.rollouts:  # + per-token log π after the round's updates, for its first group (the token log w)
            logger.log_rollouts(
                round_ + 1,
                rollouts,
                token_logprobs(
                    policy, rollouts[: a.n_group], pad_id=sampler.pad_id, device=device, compute_dtype=compute_dtype
                ),
            )
        bar.update(generated)
        bar.set_postfix(**progress_fields(row, H))
        last = samples_done >= cfg.samples
        crossed = samples_done // every_samples > (samples_done - generated) // every_samples
        if (cfg.eval.every and (round_ + 1) % cfg.eval.every == 0) or crossed or last:
            final = run_eval(round_ + 1, samples_done)
        if (cfg.ckpt.every and (round_ + 1) % cfg.ckpt.every == 0) or last:
            gathered = checkpoint.gather(model, optimizer)  # sharded: whole tensors on rank 0 (every rank joins)
            rngs = checkpoint.gather_rng_states()
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
                    gathered=gathered,
                    rng_per_rank=rngs,
                )
                if last:  # the model to take away: <run_dir>/model, in its source's dtype
                    checkpoint.export_model(run_dir / "model", model, tokenizer, export_dtype, gathered)
    bar.close()
    # ---------------------------------------------------------------- final evaluation and summary
    if final is None:  # resumed a finished run: report, log nothing new
        final = run_eval(round_, samples_done, log=False)
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
    print0(run_dir_line(run_dir, finished=True))
    logger.close()
    sampler.close()  # the engine's memory back before another run of this process (Hydra multirun)
    return summary


if __name__ == "__main__":
    main()
