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
The loop in `train` is this list, one line or one named helper per step: each variant sits in the helper
of its step (DAPO's dynamic sampling in `sample_round`, groups spanning ranks in `fill_buffer`, the exact
log μ in `recompute_log_mu`, H=auto's early stop in `gradient_steps`) or is declared on its loss
(rapid/estimators.py); what a run builds before its first round, and its summary, are in rapid/run.py.
PG is the same loop with H = 1 (`algorithm=pg`). With `algorithm.H=auto` each round's H is chosen from
the previous rounds' importance weights and phase times (rapid/adaptive_h.py), and the run ends when
its sample budget (`samples`) is spent.

    python -m rapid.train                                   # the offline default run (CPU, ~6.5 min)
    python -m rapid.train +experiment=smoke                 # tiny random model, < 2 min
    python -m rapid.train -m algorithm.H=1,2,4,8 seed=0,1   # a sweep, one directory per run
    python -m rapid.train algorithm.H=auto samples=3072     # H chosen every round, 3072 samples in all
    torchrun --nproc_per_node=2 -m rapid.train ...          # DDP: each rank samples its share of prompts
    python -m rapid.train resume=outputs/<run>              # continue from the latest checkpoint
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig
from tqdm import tqdm

from rapid import adaptive_h, checkpoint, distributed, estimators, preflight
from rapid.buffer import (
    ReplayBuffer,
    Rollout,
    dynamic_sampling,
    rank_share,
    schedule_positions,
    set_schedule_position,
    trim_to_minibatches,
)
from rapid.config import exit_on_config_error, register_resolvers
from rapid.distributed import all_reduce_sum, gather_round
from rapid.evaluate import evaluate_config
from rapid.iw_grpg import normalized_ess
from rapid.logger import progress_fields, round_row
from rapid.losses import overlong_penalty
from rapid.policy import accumulate_gradients, recompute_behavior_logprobs, token_logprobs
from rapid.profiling import PhaseClock
from rapid.rewards import score
from rapid.run import Run, finish, lr_lambda, start  # noqa: F401  (lr_lambda: the schedule, imported from here too)
from rapid.seeding import BUFFER_STREAM, EVAL_STREAM, SAMPLE_STREAM, derive_seed

register_resolvers()


@preflight.checked("config")  # every job's config, before Hydra makes a directory (rapid/preflight.py)
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
    run = start(cfg)  # model, data, sampler, optimizer, logger; resumed where asked (rapid/run.py)
    cfg, a = run.cfg, run.cfg.algorithm
    if run.round == 0 and cfg.eval.at_start:
        evaluate(run, 0)
    buffer, final = ReplayBuffer(), None
    bar = tqdm(total=cfg.samples, initial=run.samples, unit="samples", dynamic_ncols=True,
               disable=not distributed.is_main() or not cfg.logger.progress)  # fmt: skip
    # ---------------------------------------------------------------- Algorithm 1
    for round_ in itertools.count(run.round):
        if run.samples >= cfg.samples:
            break
        t0, clock = time.perf_counter(), PhaseClock(run.device)
        H = a.H if run.auto_h is None else adaptive_h.plan(run.h_state, cfg.samples - run.samples, a.n_step)
        # 1-3. the round's n_inference / n_group prompts X_t, n_group completions each from μ = π_θ, scored
        rollouts, failed, dropped, batches, generated = sample_round(run, round_, H, clock)
        # 4. Z_t in the buffer, served as minibatches of n_step records (whole groups), once per pass
        rollouts, passes = fill_buffer(run, buffer, rollouts, round_, H, last=run.samples + generated >= cfg.samples)
        mismatch = recompute_log_mu(run, passes[0], clock)  # None unless behavior_logprobs=recompute
        with clock.phase("sync"):
            run.sampler.sleep()
        # 5. H gradient steps of the registered loss (IW-GRPG: Eq. 3-5), num_iterations passes
        with clock.phase("train"):
            steps, ess = gradient_steps(run, passes, generated)
        run.samples += generated  # DAPO's extra draws count: samples are what the engine generated
        # 6. the new weights go to the sampler, in place
        with clock.phase("sync"):
            run.sampler.sync_weights(run.model)
        round_s = time.perf_counter() - t0
        # 7. log; evaluate and checkpoint when due
        row = log_round(run, round_, H, rollouts, steps, ess, clock, round_s,
                        failed=failed, mismatch=mismatch, dropped=dropped, batches=batches)  # fmt: skip
        bar.update(generated)
        bar.set_postfix(**progress_fields(row, H))
        last = run.samples >= cfg.samples
        if last or every(cfg.eval.every, round_ + 1) or crossed(cfg.eval.get("every_samples"), run.samples, generated):
            final = evaluate(run, round_ + 1)
        if last or every(cfg.ckpt.every, round_ + 1):
            save(run, round_ + 1, last)
    bar.close()
    if final is None:  # resumed a finished run: report, log nothing new
        final = evaluate(run, round_, log=False)
    return finish(run, final, round_)


def every(n: int, round_: int) -> bool:
    """Whether `round_` is a multiple of `n` (0: never)."""
    return bool(n) and round_ % n == 0


def crossed(n: int | None, samples: int, generated: int) -> bool:
    """Whether the round that generated `generated` samples, ending at `samples`, crossed a multiple of `n`."""
    return bool(n) and samples // n > (samples - generated) // n


def sample_round(run: Run, round_: int, H: int, clock: PhaseClock) -> tuple[list[Rollout], int, int | None, int, int]:
    """Algorithm 1's steps 1-3 on this rank: the round's H * n_step / n_group prompts (over all ranks),
    sampled and scored (`sample_and_score`); with DAPO's dynamic sampling (`algorithm.dynamic_sampling`)
    the groups of equal rewards are dropped and more prompts drawn until every rank is full or the run's
    sample budget is spent. Returns the rollouts, the reward failures, the groups dropped (None without
    dynamic sampling), the draws made and the samples generated over all ranks."""
    a = run.cfg.algorithm
    n_prompts = H * a.n_step // a.n_group  # prompts per round, over all ranks
    rollouts, failed = sample_and_score(run, round_, 0, n_prompts, clock)
    if not a.dynamic_sampling:
        return rollouts, failed, None, 1, H * a.n_step
    more = lambda attempt, k: sample_and_score(run, round_, attempt, n_prompts, clock, take=k)  # noqa: E731
    target = len(range(run.rank, n_prompts, run.world)) * a.n_group  # this rank's records
    return dynamic_sampling(
        rollouts, failed, more, a.dynamic_sampling_tries, target, a.n_step // run.world, run.device,
        draw=n_prompts, n_group=a.n_group, budget=run.cfg.samples - run.samples, world=run.world,
        trim=not run.spanning,
    )  # fmt: skip


def sample_and_score(
    run: Run, round_: int, attempt: int, n_prompts: int, clock: PhaseClock, take: int | None = None
) -> tuple[list[Rollout], int]:
    """The stream's next `n_prompts` training problems (over all ranks; this rank takes every world-th),
    n_group completions each with μ = π_θ, seeds from (round, prompt, sample), scored (a crashed or
    timed-out checker scores 0 and is counted). Returns the rollouts, with DAPO's overlong penalty in
    their reward, and the failures. `attempt` > 0: DAPO's dynamic sampling drawing more prompts for the
    same round (their positions follow the first's), `take` of them where fewer than `n_prompts` (the
    run's last samples)."""
    cfg, a, t = run.cfg, run.cfg.algorithm, run.cfg.task
    taken = run.stream.take(take or n_prompts)
    positions = list(range(run.rank, take or n_prompts, run.world))
    indices = [taken[p] for p in positions]
    positions = [attempt * n_prompts + p for p in positions]
    seeds = [derive_seed(cfg.seed, SAMPLE_STREAM, round_, p) for p in positions]
    with clock.phase("generate"):
        groups = run.sampler.generate(
            [run.train_prompts[i] for i in indices],
            n=a.n_group,
            max_new_tokens=t.max_new_tokens,
            temperature=cfg.sampler.temperature,
            seeds=seeds,
        )
    flat = [(p, i, c) for p, i, group in zip(positions, indices, groups) for c in group]
    with clock.phase("reward"):
        rewards, failed = score(
            run.task,
            [c.text for _, _, c in flat],
            [run.train_records[i] for _, i, _ in flat],
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
            prompt_ids=run.train_prompts[i],
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


def fill_buffer(
    run: Run, buffer: ReplayBuffer, rollouts: list[Rollout], round_: int, H: int, last: bool = False
) -> tuple[list[Rollout], list[list[list[Rollout]]]]:
    """Algorithm 1's step 4: Z_t in the buffer, and its minibatches for each of the num_iterations passes
    (n_step records over all ranks, whole groups, shuffled by a generator seeded from the round). Where a
    group spans ranks every rank holds the whole round and trains its slice of each minibatch. Returns
    this rank's rollouts (DAPO's trimming of a gathered round keeps this rank's share; in the `last` round
    of the budget it may keep none) and the passes."""
    a, rank, world = run.cfg.algorithm, run.rank, run.world
    buffer.clear()
    if run.spanning:  # groups span ranks: every rank holds the whole round (group ids are prompt positions)
        every_record = gather_round(rollouts, world)
        if a.dynamic_sampling:
            n_prompts = H * a.n_step // a.n_group
            every_record = trim_to_minibatches(every_record, a.n_step, n_prompts * a.n_group, run.device, last)
            rollouts = [r for r in every_record if r.group_id % n_prompts % world == rank]  # this rank's, kept
        buffer.add(every_record)
    else:
        buffer.add(rollouts)
    shuffle = torch.Generator().manual_seed(derive_seed(run.cfg.seed, BUFFER_STREAM, round_))
    size = a.n_step // (1 if run.spanning else world)
    passes = [buffer.minibatches(size, shuffle) for _ in range(a.num_iterations)]
    if run.spanning:  # every rank holds the round; each trains its slice of every minibatch
        passes = [rank_share(minibatches, rank, world) for minibatches in passes]
    return rollouts, passes


def recompute_log_mu(run: Run, minibatches: list[list[Rollout]], clock: PhaseClock) -> float | None:
    """With `algorithm.behavior_logprobs=recompute`, the exact log μ: the trainer's forward at θ = μ over the
    first pass's micro-batches, replacing the engine's (returns their mean gap); else None."""
    if run.cfg.algorithm.behavior_logprobs != "recompute":
        return None
    with clock.phase("recompute"):
        return recompute_behavior_logprobs(
            run.policy,
            minibatches,
            micro_batch=run.cfg.train.micro_batch,
            pad_id=run.sampler.pad_id,
            device=run.device,
            compute_dtype=run.compute_dtype,
        )


def gradient_steps(
    run: Run, passes: list[list[list[Rollout]]], generated: int
) -> tuple[list[dict], list[tuple[int, float]]]:
    """Algorithm 1's step 5: one optimizer step per minibatch (gradient accumulated over micro-batches,
    clipped; a non-finite loss or gradient skips the step, rapid/nonfinite.py), the learning-rate schedule
    moved along by the `generated` samples the round's steps share. A loss that reports its importance
    weights (`iw` on its estimator) gives each step's normalised ESS over all ranks, from which H=auto ends
    a round early when its samples have gone stale (the schedule then still moves to the round's end).
    Returns the steps' statistics and the (step, ESS) pairs."""
    cfg, o, a = run.cfg, run.cfg.optim, run.cfg.algorithm
    steps, ess = [], []
    todo = [mb for minibatches in passes for mb in minibatches]
    # the lr schedule follows the samples generated: this round's share spread over the steps it takes
    positions = schedule_positions(run.samples, generated, len(todo), a.n_step, a.num_iterations)
    for minibatch in todo:
        stats = accumulate_gradients(
            run.policy,
            minibatch,
            run.loss_fn,
            micro_batch=cfg.train.micro_batch,
            pad_id=run.sampler.pad_id,
            device=run.device,
            compute_dtype=run.compute_dtype,
            skip_groups=run.skip_groups,
            spanning=run.spanning,
            token_stats=run.token_stats,
        )
        if run.estimator.iw and "records" in stats:  # the ESS of the w̄ of the records trained on, over all ranks
            n = stats["records"]  # 0 for a DDP placeholder group
            w1, w2, n = all_reduce_sum([stats["w_bar_mean"] * n, stats["w_bar_sq_mean"] * n, n], run.device)
            if n > 0:
                ess.append((len(steps) + 1, normalized_ess(w1 / n, w2 / n)))  # (step k, e_k)
        if run.auto_h and adaptive_h.stop_early(ess, run.auto_h):  # too stale: not applied, the round ends
            run.optimizer.zero_grad(set_to_none=True)
            break
        grad_norm = torch.nn.utils.clip_grad_norm_(run.model.parameters(), o.grad_clip)
        stats["grad_norm"] = distributed.full_tensor(grad_norm).item()  # sharded: the global norm
        stats["lr"] = run.scheduler.get_last_lr()[0]
        if run.guard.ok(stats["loss"], stats["grad_norm"], step=run.scheduler.last_epoch):  # else skipped
            run.optimizer.step()
        set_schedule_position(run.scheduler, positions[len(steps) + 1])
        run.optimizer.zero_grad(set_to_none=True)
        steps.append(stats)
    if run.scheduler.last_epoch != positions[-1]:  # an early stop (H=auto): the round's samples are spent
        set_schedule_position(run.scheduler, positions[-1])
    return steps, ess


def log_round(
    run: Run,
    round_: int,
    H: int,
    rollouts: list[Rollout],
    steps: list[dict],
    ess: list[tuple[int, float]],
    clock: PhaseClock,
    round_s: float,
    *,
    failed: int,
    mismatch: float | None,
    dropped: int | None,
    batches: int,
) -> dict:
    """The round's row of metrics.jsonl (rapid.logger.round_row: sums over ranks, then means; times and memory
    are rank 0's), with DAPO's batches and H=auto's next H (which it decides here, from this round's weights
    and phase times), logged; with `logger.rollouts` also the round's samples. Returns the row."""
    cfg, a = run.cfg, run.cfg.algorithm
    where = {
        "progress/round": round_ + 1,
        "progress/samples": run.samples,
        "progress/epoch": run.stream.epoch + run.stream.pos / len(run.train_records),
        "time/wall_s": time.perf_counter() - run.t_start,
    }
    row = round_row(
        where, rollouts, steps, phases=clock.row(), round_s=round_s, world=run.world, device=run.device,
        failed=failed, mismatch=mismatch, nonfinite_steps=run.guard.take_count(), dropped=dropped,
        iw=run.estimator.iw, token_stats=run.token_stats,
    )  # fmt: skip
    row["train/prompt_len"] = sum(len(r.prompt_ids) for r in rollouts) / max(len(rollouts), 1)  # rank 0's
    if a.dynamic_sampling:
        row["train/sampling_batches"] = batches  # DAPO: draws of (at most) H * n_step prompts' samples
    row["train/optimizer_steps"] = len(steps)  # with `samples`, the two budgets a comparison can count
    if run.auto_h:  # the next round's H, from this round's weights and phase times (averaged over ranks)
        run.h_state, h_log = adaptive_h.end_round(
            run.h_state, run.auto_h, H, ess, len(steps), row, run.world, run.device
        )
        row |= h_log
    run.logger.log(row)
    if cfg.logger.rollouts:  # + per-token log π after the round's updates, for its first group (the token log w)
        logp_pi = token_logprobs(
            run.policy, rollouts[: a.n_group], pad_id=run.sampler.pad_id, device=run.device,
            compute_dtype=run.compute_dtype,
        )  # fmt: skip
        run.logger.log_rollouts(round_ + 1, rollouts, logp_pi)
    return row


def evaluate(run: Run, round_: int, log: bool = True) -> dict:
    """The held-out evaluation (rapid/evaluate.py) after `round_` rounds: its row, logged with the
    per-problem verdicts unless `log` is false, and a console line."""
    t0 = time.perf_counter()
    correct = []
    row = evaluate_config(
        run.cfg,
        run.sampler,
        run.task,
        run.eval_records,
        run.eval_prompts,
        seed=derive_seed(run.cfg.seed, EVAL_STREAM) % 2**31,
        rank=run.rank,
        world=run.world,
        device=run.device,
        outcomes=correct,
    )
    row = {"progress/round": round_, "progress/samples": run.samples, **row, "time/eval_s": time.perf_counter() - t0}
    if log:
        run.logger.log(row)
        run.logger.log_eval_outcomes(round_, correct)
    if distributed.is_main():  # above the progress bar, not inside it
        tqdm.write(f"eval @ round {round_}: accuracy {row['eval/accuracy']:.3f} on {row['eval/n']} problems")
    return row


def save(run: Run, round_: int, last: bool) -> None:
    """A checkpoint after `round_` rounds (every rank joins the gathering of a sharded model; rank 0 writes);
    after the last round also the model to take away, <run_dir>/model, in the dtype it came in."""
    gathered = checkpoint.gather(run.model, run.optimizer)  # sharded: whole tensors on rank 0 (every rank joins)
    rngs = checkpoint.gather_rng_states()
    if not distributed.is_main():
        return
    checkpoint.save(
        run.run_dir,
        round_,
        run.model,
        run.tokenizer,
        run.optimizer,
        run.scheduler,
        run.stream,
        run.cfg,
        elapsed_s=time.perf_counter() - run.t_start,
        keep=run.cfg.ckpt.keep,
        extra={"samples": run.samples, "auto_h": run.h_state and run.h_state.state_dict()},
        gathered=gathered,
        rng_per_rank=rngs,
    )
    if last:
        checkpoint.export_model(run.run_dir / "model", run.model, run.tokenizer, run.export_dtype, gathered)


if __name__ == "__main__":
    main()
