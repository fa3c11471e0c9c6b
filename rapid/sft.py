"""python -m rapid.sft — the paper's SFT baseline: cross-entropy on a teacher's correct generations.

The data is the distill.jsonl written by `python -m rapid.distill`. The loss of a batch is the
mean negative log-likelihood of its completion tokens, at temperature 1:

    loss = −(1 / Σ_n |y_n|) Σ_n Σ_t log π_θ(y_n,t | x_n, y_n,<t)

Prompt tokens are context only: they have no term in the sum (`CompletionLogprobs` computes the
completion positions alone). AdamW at a constant `sft.lr` (2e-5) for `sft.epochs` (paper: 3)
passes over the data, in a seeded shuffled order per epoch. Held-out accuracy (rapid.evaluate)
before and after; metrics.jsonl, summary.json and a final checkpoint
(<run_dir>/checkpoints/round_<epochs>/, loadable by `rapid.evaluate eval.checkpoint=...`).

Completions keep the teacher's token ids when the student builds the same prompt ids for the
record (same tokenizer and prompt settings); otherwise the completion text is re-encoded with the
student's tokenizer (plus EOS where the teacher stopped) after the student's own prompt.

    python -m rapid.distill                                    # writes outputs/<distill run>/distill.jsonl
    python -m rapid.sft distill.data=outputs/<distill run>/distill.jsonl
    python -m rapid.sft distill.data=outputs/<distill run> model=qwen2.5_0.5b task=math sft.batch_size=32
    python -m rapid.train +experiment=math_h8 algorithm=sft algorithm.distill.teacher=qwen2.5_1.5b   # both
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rapid import checkpoint, distributed
from rapid.buffer import Rollout
from rapid.config import ConfigError, exit_on_config_error, resolve_dtype
from rapid.data import PromptStream
from rapid.distill import distill
from rapid.evaluate import evaluate
from rapid.logger import MetricsLogger, write_run_files
from rapid.models import load_model_and_tokenizer
from rapid.policy import CompletionLogprobs, accumulate_gradients
from rapid.sampler import make_sampler, sequence_budget
from rapid.seeding import SFT_DATA_STREAM, SFT_ENGINE_STREAM, SFT_EVAL_STREAM, derive_seed
from rapid.tasks import load_splits, record_id

SHARED_KEYS = ("seed", "device", "task", "model", "sampler", "reward", "logger")  # rapid.train config -> sft config


def sft_loss(token_logp: torch.Tensor, mask: torch.Tensor, normalizer: int | None = None) -> tuple[torch.Tensor, dict]:
    """Mean negative log-likelihood of the completion tokens.
    token_logp [B, C]: log π_θ of each completion token; mask [B, C]: True on completion tokens (False
    on padding); normalizer: the number of completion tokens to divide by (default mask.sum(); the whole
    minibatch's count when a micro-batch is one part of it)."""
    n = mask.sum() if normalizer is None else normalizer
    loss = -(token_logp * mask).sum() / n
    return loss, {}


def load_examples(
    path: Path, train_records: list[dict], train_prompts: list[list[int]], tokenizer, task_name: str
) -> tuple[list[Rollout], int]:
    """The distilled completions as Rollouts (one group each) in the student's tokens, and how many
    of them had to be re-encoded from their text."""
    examples, reencoded = [], 0
    for line_no, line in enumerate(path.read_text().splitlines(), 1):
        row = json.loads(line)
        i = row["record"]["index"]
        if i >= len(train_records) or record_id(train_records[i]) != row["record"]["id"]:
            raise ConfigError(
                f"{path}:{line_no} is training problem {i} '{row['record']['id']}', which task {task_name} "
                "with these settings does not have there: use the task settings of the distill run"
            )
        prompt, completion = train_prompts[i], row["completion_ids"]
        if row["prompt_ids"] != prompt:  # another tokenizer or prompt format: the student's tokens
            completion = tokenizer(row["text"], add_special_tokens=False)["input_ids"]
            completion += [tokenizer.eos_token_id] if row["finish_reason"] == "stop" else []
            reencoded += 1
        examples.append(
            Rollout(
                prompt_ids=prompt,
                completion_ids=completion,
                logp_mu=[0.0] * len(completion),
                reward=1.0,
                group_id=line_no,
                truncated=row["finish_reason"] == "length",
                text=row["text"],
            )
        )
    if not examples:
        raise ConfigError(f"{path} holds no accepted completion: distil more prompts or use a stronger teacher")
    return examples, reencoded


@hydra.main(config_path="../conf", config_name="sft", version_base=None)
@exit_on_config_error
def main(cfg: DictConfig) -> dict | None:
    return sft(cfg)


def sft(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    # ---------------------------------------------------------------- setup
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    _, world, device = distributed.init(cfg.device)
    if world > 1:
        raise ConfigError("rapid.sft runs in one process: launch it with python -m, not torchrun")
    s, t = cfg.sft, cfg.task
    if not cfg.distill.data:
        raise ConfigError("set distill.data=<run_dir>/distill.jsonl, the file written by python -m rapid.distill")
    data = Path(cfg.distill.data)
    data = data / "distill.jsonl" if data.is_dir() else data
    if not data.is_file():
        raise ConfigError(f"distill.data={cfg.distill.data}: no such file; run python -m rapid.distill first")
    compute_dtype = resolve_dtype(cfg.model.dtype, device)
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(
        cfg.model.path, cfg.model.gguf, cfg.model.architecture, cfg.model.gradient_checkpointing, seed=cfg.seed
    )
    model.to(device)
    task, train_records, train_prompts, eval_records, eval_prompts = load_splits(t, tokenizer, cfg.eval.n)
    examples, reencoded = load_examples(data, train_records, train_prompts, tokenizer, t.name)
    if reencoded:
        print(
            f"{reencoded} of {len(examples)} completions re-encoded from their text (the teacher's prompt ids differ)"
        )
    write_run_files(run_dir, cfg, device, data=str(data), examples=len(examples), reencoded=reencoded)
    print(OmegaConf.to_yaml(cfg, resolve=True))
    sampler = make_sampler(
        cfg.sampler,
        model,
        tokenizer,
        compute_dtype,
        seed=derive_seed(cfg.seed, SFT_ENGINE_STREAM) % 2**31,
        max_len_needed=sequence_budget(eval_prompts, t.max_new_tokens),
    )
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=s.lr, betas=tuple(s.betas), weight_decay=s.weight_decay, fused=True
    )  # one kernel for all parameters (2.8x faster step on CPU)
    scheduler = torch.optim.lr_scheduler.ConstantLR(optimizer, factor=1.0, total_iters=0)  # checkpointed like train's
    policy = CompletionLogprobs(model, temperature=1.0, share_prompt=not cfg.model.gradient_checkpointing)
    stream = PromptStream(len(examples), derive_seed(cfg.seed, SFT_DATA_STREAM))  # one seeded permutation per epoch
    logger = MetricsLogger(
        run_dir,
        wandb_cfg={"enabled": cfg.logger.wandb, "project": cfg.logger.project, "name": run_dir.name},
        config=OmegaConf.to_container(cfg, resolve=True),
        x_axis="progress/step",
    )

    def loss_fn(token_logp, batch, n_records, n_tokens):
        return sft_loss(token_logp, batch.completion_mask, normalizer=n_tokens)

    def run_eval(epoch: int) -> dict:
        t0 = time.perf_counter()
        row = evaluate(
            sampler,
            task,
            eval_records,
            eval_prompts,
            max_new_tokens=t.max_new_tokens,
            temperature=cfg.eval.temperature,
            n_samples=cfg.eval.n_samples,
            sample_temperature=cfg.sampler.temperature,
            ks=tuple(cfg.eval.ks),
            device=device,
            seed=derive_seed(cfg.seed, SFT_EVAL_STREAM) % 2**31,
        )
        row = {
            "progress/epoch": epoch,
            "progress/step": epoch * steps_per_epoch,
            **row,
            "time/eval_s": time.perf_counter() - t0,
        }
        logger.log(row)
        print(f"eval @ epoch {epoch}: accuracy {row['eval/accuracy']:.3f} on {row['eval/n']} problems")
        return row

    t_start = time.perf_counter()
    steps_per_epoch = -(-len(examples) // s.batch_size)
    first = final = run_eval(0)
    sampler.sleep()
    bar = tqdm(total=s.epochs * steps_per_epoch, disable=not cfg.logger.progress, dynamic_ncols=True)
    # ---------------------------------------------------------------- epochs over the distilled completions
    step = 0
    for epoch in range(s.epochs):
        order = stream.take(len(examples))  # exactly this epoch's permutation
        window = {"nll": 0.0, "tokens": 0, "t0": time.perf_counter()}
        for start in range(0, len(order), s.batch_size):
            batch = [examples[i] for i in order[start : start + s.batch_size]]
            stats = accumulate_gradients(
                policy,
                batch,
                loss_fn,
                micro_batch=s.micro_batch,
                pad_id=tokenizer.pad_token_id,
                device=device,
                compute_dtype=compute_dtype,
            )
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip).item()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            step += 1
            n_tokens = sum(len(r.completion_ids) for r in batch)
            window["nll"] += stats["loss"] * n_tokens  # the batch's token mean, re-weighted by its tokens
            window["tokens"] += n_tokens
            bar.update()
            bar.set_postfix(epoch=epoch + 1, loss=f"{stats['loss']:.3f}")
            if (s.log_every and step % s.log_every == 0) or start + s.batch_size >= len(order):
                logger.log(
                    {
                        "progress/step": step,
                        "progress/epoch": step / steps_per_epoch,
                        "train/loss": window["nll"] / window["tokens"],
                        "train/tokens": window["tokens"],
                        "train/grad_norm": grad_norm,
                        "train/lr": scheduler.get_last_lr()[0],
                        "time/train_s": time.perf_counter() - window["t0"],
                        "time/wall_s": time.perf_counter() - t_start,
                    }
                )
                window = {"nll": 0.0, "tokens": 0, "t0": time.perf_counter()}
        last = epoch + 1 == s.epochs
        if (cfg.eval.every and (epoch + 1) % cfg.eval.every == 0) or last:
            sampler.sync_weights(model)  # the new weights go to the sampler (vLLM), in place; it wakes the engine
            final = run_eval(epoch + 1)
            sampler.sleep()
    bar.close()
    # ---------------------------------------------------------------- checkpoint and summary
    checkpoint.save(
        run_dir,
        s.epochs,
        model,
        tokenizer,
        optimizer,
        scheduler,
        stream,
        cfg,
        elapsed_s=time.perf_counter() - t_start,
        keep=1,
    )
    train_rows = [r for r in logger.rows() if "train/loss" in r]
    summary = {
        "eval/accuracy_before": first["eval/accuracy"],
        "eval/accuracy_after": final["eval/accuracy"],
        "epochs": s.epochs,
        "steps": step,
        "examples": len(examples),
        "sampler": sampler.name,
        "algorithm": "sft",
        "time/total_s": time.perf_counter() - t_start,
        "time/train_s_total": sum(r["time/train_s"] for r in train_rows),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    logger.close()
    sampler.close()  # the engine's memory back before another run of this process
    return summary


def pair_config(cfg: DictConfig) -> DictConfig:
    """The rapid.distill / rapid.sft config of a `rapid.train algorithm=sft` run: the run's seed, device,
    task, model, sampler, reward, logger and evaluation settings, and the algorithm's distill: and sft:
    groups (conf/stage/)."""
    pair = OmegaConf.merge(
        {k: cfg[k] for k in SHARED_KEYS},
        {"distill": cfg.algorithm.distill, "sft": cfg.algorithm.sft},
        {"eval": {**{k: cfg.eval[k] for k in ("n", "temperature", "n_samples", "ks")}, "every": 0}},
    )
    OmegaConf.set_struct(pair, True)
    return pair


def distill_and_sft(cfg: DictConfig, run_dir: Path) -> dict:
    """`python -m rapid.train algorithm=sft`: the SFT baseline in one run, rapid.distill in <run_dir>/distill
    and rapid.sft on its output in <run_dir>/sft; <run_dir>/summary.json holds both."""
    if cfg.resume:
        raise ConfigError("algorithm=sft cannot resume; rerun it (distillation and 3 SFT epochs are short)")
    pair = pair_config(cfg)
    counts = distill(pair, run_dir / "distill")
    pair.distill.data = str(run_dir / "distill" / "distill.jsonl")
    summary = sft(pair, run_dir / "sft")
    summary = {
        **summary,
        "distill": {
            k: counts[k] for k in ("prompts", "generated", "kept", "acceptance_rate", "teacher", "time/total_s")
        },
        "time/total_s": counts["time/total_s"] + summary["time/total_s"],
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
