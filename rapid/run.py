"""A training run's parts: what rapid.train builds before the first round of Algorithm 1, and the run's end.

`start(cfg)` reads the config (earlier key names as today's, every key known, every value checked; with
`resume=<run dir>` the run's own saved config), then builds, in this order, the model and tokenizer, the
task's splits, the run files (config.yaml, meta.json, split.json), the sampler (the vLLM engine), the policy
(DDP or FSDP across ranks), AdamW and its learning-rate schedule, the prompt stream, the H=auto controller,
the metrics logger, the loss (rapid/estimators.py) with its frozen reference where it has a KL term, and
restores a checkpoint's state where resuming. `Run` holds them; the round's helpers in rapid/train.py take
it. `finish` writes summary.json and gives the engine's memory back.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.nn.parallel import DistributedDataParallel

from rapid import adaptive_h, checkpoint, console, distributed, estimators
from rapid.config import (
    check_known_keys,
    check_new_run_dir,
    resolve_dtype,
    run_length,
    skipped_groups,
    validate,
)
from rapid.data import PromptStream
from rapid.distributed import print0
from rapid.iw_grpg import masked_mean
from rapid.logger import MetricsLogger, config_summary, run_dir_line, summarize, write_run_files
from rapid.mismatch import scale_gradient, truncated_is_factors
from rapid.models import load_model_and_tokenizer
from rapid.nonfinite import StepGuard
from rapid.policy import CompletionLogprobs, autocast, completion_logprobs, token_mean_stats
from rapid.profiling import calibrate
from rapid.rewards import self_test
from rapid.sampler import make_sampler, sequence_budget
from rapid.seeding import ENGINE_STREAM, PROMPT_STREAM, derive_seed
from rapid.tasks import load_splits, record_id


@dataclass
class Run:
    """Everything a run holds across rounds. `round` and `samples` say where it is (rounds done, samples
    generated); `h_state` is the H=auto controller's state (None with a fixed H)."""

    cfg: DictConfig
    run_dir: Path
    rank: int
    world: int
    device: torch.device
    compute_dtype: torch.dtype
    model: torch.nn.Module  # the transformers model: fp32 master weights
    tokenizer: Any
    policy: torch.nn.Module  # log π_θ of completions (rapid.policy.CompletionLogprobs; DDP under torchrun)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    sampler: Any  # rapid.sampler: generate, sync_weights, sleep, pad_id
    task: Any
    train_records: list[dict]
    train_prompts: list[list[int]]
    eval_records: list[dict]
    eval_prompts: list[list[int]]
    stream: PromptStream
    logger: MetricsLogger
    estimator: estimators.Estimator
    loss_fn: Any  # minibatch_loss bound to this run: rapid.policy.accumulate_gradients calls it
    guard: StepGuard
    skip_groups: str | None  # zero-advantage groups left out of the forward/backward (the loss declares which)
    token_stats: Any  # name -> whether a loss statistic is a mean over tokens (combined by tokens, not records)
    spanning: bool  # a group's records are spread over ranks (n_step / world_size < n_group)
    auto_h: adaptive_h.Settings | None
    h_state: adaptive_h.State | None
    export_dtype: torch.dtype  # the dtype the final model is saved in: the one it came in
    round: int = 0
    samples: int = 0
    t_start: float = 0.0


def lr_lambda(schedule: str, warmup: int, total: int):
    """The learning-rate factor of step `step`: linear warm-up over `warmup` steps, then `schedule`
    (constant, linear or cosine decay) over the run's `total` steps."""

    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))  # a last round may overshoot `total`
        return {"constant": 1.0, "linear": 1.0 - progress, "cosine": 0.5 * (1 + math.cos(math.pi * progress))}[schedule]

    return f


def read_config(cfg: DictConfig) -> tuple[DictConfig, Path, Path | None]:
    """(the run's config, its directory, the checkpoint it resumes from or None). A new run's earlier key
    names are read as today's (one line each) and every key must be one conf/ defines; a resumed run
    continues with the config it started with."""
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if not cfg.resume:
        with open_dict(cfg):
            for notice in estimators.upgrade_settings(cfg.algorithm):
                print0(notice)
        check_known_keys(cfg)
        return cfg, run_dir, None
    run_dir = Path(cfg.resume)  # the run continues with the config it started with (rapid/checkpoint.py)
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("resume=")]
    resume_from, cfg = checkpoint.resume_point(run_dir, overrides)
    return cfg, run_dir, resume_from


def start(cfg: DictConfig) -> Run:
    """Everything a run needs before its first round (module docstring), in the order that keeps a run
    reproducible: the global seed before the model, the reference copied before a resume loads weights."""
    cfg, run_dir, resume_from = read_config(cfg)
    rank, world, device = distributed.init(cfg.device)
    if resume_from is None and distributed.is_main():
        check_new_run_dir(run_dir)  # never appends to an earlier run's files
    validate(cfg, world)
    log_file, verbose = console.log_file_of(run_dir), cfg.logger.get("verbose", False)
    console.quiet_libraries(log_file, verbose)  # the libraries' warnings to <run_dir>/train.log (rapid/console.py)
    print0(run_dir_line(run_dir))
    a, t, o = cfg.algorithm, cfg.task, cfg.optim
    compute_dtype = resolve_dtype(cfg.model.dtype, device)
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(
        cfg.model.path, cfg.model.gguf, cfg.model.architecture, cfg.model.gradient_checkpointing, seed=cfg.seed
    )
    model.to(device)
    export_dtype = checkpoint.source_dtype(cfg.model)  # the final model is saved in the dtype it came in
    context = getattr(model.config, "max_position_embeddings", None)  # prompts + completions must fit
    task, train_records, train_prompts, eval_records, eval_prompts = load_splits(t, tokenizer, cfg.eval.n, context)
    cfg.rounds, cfg.samples = run_length(cfg, len(train_records))  # rounds is None with H=auto
    if distributed.is_main():
        gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None  # tools/bench_rl.py's MFU
        parameters = sum(p.numel() for p in model.parameters())
        meta = "meta_resume.json" if resume_from else "meta.json"
        write_run_files(run_dir, cfg, device, meta, world_size=world, parameters=parameters, gpu=gpu)
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
    estimator = estimators.get(a.loss)  # the loss and what it needs (rapid/estimators.py)
    # the KL reference (GRPO's) is the initial policy: copied before a resume loads the checkpoint's weights
    initial = copy.deepcopy(model) if estimator.reference(a) else None
    share_prompt = not cfg.model.gradient_checkpointing
    policy = CompletionLogprobs(model, cfg.sampler.temperature, share_prompt=share_prompt)
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
    reference = None  # a KL anchor (GRPO, Dr. GRPO with beta > 0): a frozen copy of the initial policy
    if initial is not None:
        reference = CompletionLogprobs(initial.requires_grad_(False).eval(), cfg.sampler.temperature, share_prompt)
    loss_fn = functools.partial(
        minibatch_loss,
        a=a,
        estimator=estimator,
        reference=reference,
        max_new_tokens=t.max_new_tokens,
        device=device,
        compute_dtype=compute_dtype,
    )
    run = Run(
        cfg=cfg,
        run_dir=run_dir,
        rank=rank,
        world=world,
        device=device,
        compute_dtype=compute_dtype,
        model=model,
        tokenizer=tokenizer,
        policy=policy,
        optimizer=optimizer,
        scheduler=scheduler,
        sampler=sampler,
        task=task,
        train_records=train_records,
        train_prompts=train_prompts,
        eval_records=eval_records,
        eval_prompts=eval_prompts,
        stream=stream,
        logger=logger,
        estimator=estimator,
        loss_fn=loss_fn,
        guard=StepGuard(o.max_nonfinite_steps, device),  # non-finite loss or gradient: step skipped
        skip_groups=skipped_groups(cfg),  # groups whose advantages are all 0 are not run
        token_stats=token_mean_stats(estimator.level, a.engine_correction),  # combined over tokens, not records
        spanning=a.n_step % (a.n_group * world) != 0,  # a group spans ranks (rapid/policy.py)
        auto_h=auto_h,
        h_state=h_state,
        export_dtype=export_dtype,
        round=start_round,
        samples=samples_done,
    )
    r = cfg.reward
    print0(self_test(task, train_records, r.self_test, workers=r.workers, timeout=r.timeout_s))
    run.t_start = time.perf_counter() - elapsed0
    return run


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


def finish(run: Run, final: dict, rounds: int) -> dict:
    """The run's summary.json (and on the console), from its logged rows and the `final` evaluation; then the
    engine's memory is given back (before another run of this process, e.g. a Hydra multirun)."""
    summary = {
        "rounds": rounds,
        "samples": run.samples,
        "sampler": run.sampler.name,
        "algorithm": run.cfg.algorithm.name,
        "time/total_s": time.perf_counter() - run.t_start,
        **summarize(run.logger.rows() if distributed.is_main() else [], final),
        "calibration": calibrate(),  # the machine's speed at the end (meta.json: at the start)
    }
    if distributed.is_main():
        (run.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        print0(json.dumps(summary, indent=2))
    print0(run_dir_line(run.run_dir, finished=True))
    run.logger.close()
    run.sampler.close()
    return summary
