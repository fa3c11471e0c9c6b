"""rapid's GRPO run through Hugging Face TRL's GRPOTrainer: the peer rapid is benchmarked against.

    python experiments/baselines/trl_grpo.py --out DIR [Hydra overrides of conf/config.yaml ...]
    python experiments/baselines/trl_grpo.py --out /tmp/trl algorithm=grpo rounds=4 sampler=vllm
    python experiments/baselines/trl_grpo.py --out /tmp/trl +experiment=smoke algorithm=grpo sampler=hf   # tiny random model
    torchrun --nproc_per_node=2 experiments/baselines/trl_grpo.py --out DIR algorithm=grpo ...   # one process per GPU (gloo on CPU)

Needs TRL (`pip install -e '.[bench]'`). rapid's own config is composed with the same overrides and
everything is taken from it, so this is the run `python -m rapid.train <overrides>` makes, with TRL
generating and training:

- model, tokenizer, task, splits and reward (`rapid.rewards.score`) are rapid's;
- the prompts are rapid's, in rapid's order (the run's `PromptStream`, n_inference / n_group per round,
  TRL's shuffling off), given to TRL as text that its tokenizer call turns back into exactly rapid's
  token ids (checked for every prompt);
- each round is one generation of n_inference = H * n_step completions, n_group per prompt, then H
  optimizer steps of n_step completions (`steps_per_generation = H`) repeated `num_iterations` times;
- the loss is GRPO's: per-token PPO clip ε, k3 KL to the initial policy with weight β (the KL term not
  importance-weighted, as in rapid), advantages normalised by the group's std; algorithm.aggregation
  picks TRL's loss_type;
- AdamW (torch), lr, betas, weight decay, gradient clipping, lr schedule and warmup, seed, dtype.

Where TRL differs by design: on CPU it samples with transformers `generate` on the training model
(rapid's sampler=vllm uses its vLLM engine), with the global torch RNG; on a GPU with sampler=vllm it
samples with its own colocated vLLM engine (`generation_backend`); its forwards run every row in full
(rapid's run a group's shared prompt once); it shuffles a generation batch before splitting it into
minibatches (rapid keeps every group whole in one minibatch); its warmup ramps from 0 (rapid's from
1 / warmup_steps); its weight decay skips biases and norms. With the defaults (no warmup, no weight
decay) only the first three differ. `sampler.ignore_eos` becomes min_new_tokens = max_new_tokens.
Under torchrun each rank evaluates the whole held-out split (the same result on every rank) and rank 0
writes the outputs.

After training, the model is evaluated on the held-out split exactly as rapid does it (`rapid.evaluate`
with a sampler from `sampler.*`, built only then, so that no vLLM engine sits beside TRL's training).

Outputs in --out: summary.json (rapid's summary keys, the GRPOConfig options, the TRL version, the peak
memory of training) and metrics.jsonl (TRL's log row of every optimizer step). The wall time of
`trainer.train()` is split by clocks around TRL's own methods into rapid's phases:
  generate   `_generate_and_score_completions` without the reward and log-prob forwards: sampling
             (`_generate`, also reported alone) and TRL's batch preparation;
  reward     `_calculate_rewards`;
  recompute  the old-policy log-prob forward made there (`_get_per_token_logps_and_entropies`, H > 1);
  train      the rest, plus the reference forward (rapid computes it inside the loss): loss forwards
             and backwards, optimizer steps, TRL's bookkeeping.
Evaluation is timed apart (time/eval_s).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import resource
import tempfile
import time
import warnings
from collections import defaultdict
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from rapid.config import DTYPES, ConfigError, exit_on_config_error, register_resolvers, validate
from rapid.data import PromptStream
from rapid.evaluate import evaluate_config
from rapid.models import load_model_and_tokenizer, unwrap
from rapid.rewards import score
from rapid.sampler import make_sampler, sequence_budget
from rapid.seeding import ENGINE_STREAM, EVAL_STREAM, PROMPT_STREAM, derive_seed
from rapid.tasks import load_splits

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
LOSS_TYPES = {"seq_mean_token_mean": "grpo", "token_mean": "bnpo", "constant": "dr_grpo"}  # algorithm.aggregation
SCHEDULES = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine"}  # optim.schedule
MIB = 2**20


def compose_config(overrides: list[str]) -> DictConfig:
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return compose("config", overrides=overrides)


def prompt_texts(tokenizer, prompts: list[list[int]]) -> list[str]:
    """rapid's prompt token ids as the text TRL is given; raises ConfigError unless TRL's tokenizer call
    (GRPOTrainer._tokenize_prompts for plain-text prompts, TRL 1.16: `processing_class(text=prompts)`)
    gives back exactly the same ids for every prompt."""
    texts = [tokenizer.decode(p, skip_special_tokens=False) for p in prompts]
    again = tokenizer(text=texts)["input_ids"]
    bad = [i for i, (a, b) in enumerate(zip(again, prompts)) if list(a) != list(b)]
    if bad:
        raise ConfigError(
            f"{len(bad)} of {len(prompts)} prompts do not survive decode + TRL's re-tokenization "
            f"(first: prompt {bad[0]}, {len(prompts[bad[0]])} ids -> {len(again[bad[0]])}), so TRL would "
            "train on other tokens than rapid: use a tokenizer that adds no special tokens and "
            "round-trips its own output"
        )
    return texts


def generation_backend(sampler: DictConfig, use_cpu: bool, vllm_installed: bool) -> dict:
    """How TRL generates: on a GPU with sampler=vllm, as TRL's users run it there, a vLLM engine colocated
    with training (vllm_mode="colocate"), sized and put to sleep as rapid's engine is, with TRL's own
    correction of the engine's log-probs (its default); otherwise transformers `generate` on the policy
    (TRL's colocate engine needs CUDA)."""
    if use_cpu or sampler.name != "vllm" or not vllm_installed:
        return {"use_vllm": False, "vllm_importance_sampling_correction": False}  # the correction needs vLLM
    return {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": sampler.gpu_memory_utilization,
        "vllm_enable_sleep_mode": bool(sampler.get("sleep_during_train", False)),
        "vllm_importance_sampling_correction": True,
    }


def grpo_options(cfg: DictConfig, world: int, use_cpu: bool, out: Path) -> dict:
    """GRPOConfig options of the run `cfg` describes (field names of TRL 1.16)."""
    a, o = cfg.algorithm, cfg.optim
    iterations = a.get("num_iterations", 1)
    return dict(
        # a generation of n_inference = H * n_step completions, then H steps of n_step, `iterations` times
        num_generations=a.n_group,
        per_device_train_batch_size=a.n_step // world,
        gradient_accumulation_steps=1,
        steps_per_generation=a.H,
        num_iterations=iterations,
        max_steps=cfg.rounds * a.H * iterations,
        shuffle_dataset=False,  # the dataset is already rapid's prompt order
        # sampling: plain temperature sampling with transformers generate
        max_completion_length=cfg.task.max_new_tokens,
        temperature=cfg.sampler.temperature,
        top_p=1.0,
        top_k=0,
        min_p=None,
        repetition_penalty=1.0,
        generation_kwargs={"min_new_tokens": cfg.task.max_new_tokens} if cfg.sampler.get("ignore_eos") else None,
        **generation_backend(cfg.sampler, use_cpu, importlib.util.find_spec("vllm") is not None),
        # the loss
        loss_type=LOSS_TYPES[a.aggregation],
        beta=a.get("beta", 0.0),
        epsilon=a.get("eps_low", 0.2),
        epsilon_high=a.get("eps_high", 0.2),
        scale_rewards="group",
        importance_sampling_level="token",
        use_bias_correction_kl=False,
        mask_truncated_completions=False,
        top_entropy_quantile=1.0,
        entropy_coef=0.0,
        # the optimizer
        optim="adamw_torch_fused",
        learning_rate=o.lr,  # fused, as rapid's
        adam_beta1=o.betas[0],
        adam_beta2=o.betas[1],
        adam_epsilon=1e-8,
        weight_decay=o.weight_decay,
        max_grad_norm=o.grad_clip,
        lr_scheduler_type=SCHEDULES[o.schedule],
        warmup_steps=o.warmup_steps,
        # precision and memory: fp32 master weights, bf16 autocast when model.dtype=bfloat16
        bf16=cfg.model.dtype == "bfloat16",
        fp16=False,
        gradient_checkpointing=cfg.model.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False},
        use_cpu=use_cpu,
        ddp_find_unused_parameters=False,  # under torchrun, as rapid's DDP (every parameter is used)
        # plumbing: log every step, no checkpoints, no evaluation inside TRL
        seed=cfg.seed,
        output_dir=str(out),
        report_to="none",
        save_strategy="no",
        eval_strategy="no",
        logging_strategy="steps",
        logging_steps=1,
        log_completions=False,
        dataloader_num_workers=0,
        remove_unused_columns=False,
        disable_tqdm=not cfg.logger.progress,
    )


def timed(trainer_class):
    """`trainer_class` (TRL's GRPOTrainer) with wall clocks (seconds, in `.clock`) around the methods that
    generate and score a batch; CUDA work is synchronised at each clock's ends."""

    class TimedGRPOTrainer(trainer_class):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.clock, self._scoring = defaultdict(float), False

        @contextlib.contextmanager
        def _timed(self, name: str):
            cuda = self.accelerator.device.type == "cuda"
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            try:
                yield
            finally:
                if cuda:
                    torch.cuda.synchronize()
                self.clock[name] += time.perf_counter() - t0

        def _generate_and_score_completions(self, inputs):
            self._scoring = True
            try:
                with self._timed("generate_and_score"):
                    return super()._generate_and_score_completions(inputs)
            finally:
                self._scoring = False

        def _generate(self, prompts):
            with self._timed("sampling"):
                return super()._generate(prompts)

        def _calculate_rewards(self, *args, **kwargs):
            with self._timed("reward"):
                return super()._calculate_rewards(*args, **kwargs)

        def _get_per_token_logps_and_entropies(self, model, *args, **kwargs):
            if not self._scoring:  # the loss forward of a training step
                return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)
            with self._timed("ref_logprob" if model is self.ref_model else "old_logprob"):
                return super()._get_per_token_logps_and_entropies(model, *args, **kwargs)

    return TimedGRPOTrainer


@exit_on_config_error
def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="directory for summary.json and metrics.jsonl")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides of rapid's conf/config.yaml")
    args = parser.parse_args(argv)
    cfg = compose_config(args.overrides)
    world, is_main = int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0)) == 0
    validate(cfg, world)
    a = cfg.algorithm
    if a.loss != "grpo":
        raise ConfigError(f"algorithm={a.name} (loss {a.loss}) has no TRL GRPOTrainer equivalent: use algorithm=grpo")
    if a.aggregation not in LOSS_TYPES:
        raise ConfigError(f"algorithm.aggregation={a.aggregation} must be one of {', '.join(LOSS_TYPES)}")
    try:
        with warnings.catch_warnings():  # TRL warns about the vLLM version; its vLLM path is not used here
            warnings.filterwarnings("ignore", message="TRL currently supports vLLM")
            import trl
            from datasets import Dataset
            from trl import GRPOConfig, GRPOTrainer
    except ImportError:
        raise ConfigError("TRL is not installed: run `pip install -e '.[bench]'`") from None
    torch.manual_seed(cfg.seed)
    model, tokenizer = load_model_and_tokenizer(
        cfg.model.path, cfg.model.gguf, cfg.model.architecture, cfg.model.gradient_checkpointing, seed=cfg.seed
    )
    task, train_records, train_prompts, eval_records, eval_prompts = load_splits(cfg.task, tokenizer, cfg.eval.n)
    n_prompts = a.n_inference // a.n_group
    if cfg.rounds is None:  # whole epochs over the training set, as rapid.train
        cfg.rounds = math.ceil(cfg.epochs * len(train_records) / n_prompts)
    # rapid's prompt order: the run's stream, n_prompts per round
    stream = PromptStream(len(train_records), derive_seed(cfg.seed, PROMPT_STREAM))
    order = [i for _ in range(cfg.rounds) for i in stream.take(n_prompts)]
    texts = prompt_texts(tokenizer, train_prompts)
    dataset = Dataset.from_dict({"prompt": [texts[i] for i in order], "record": order})

    def task_reward(completions: list[str], record: list[int], log_metric, **_) -> list[float]:
        rewards, failed = score(
            task,
            completions,
            [train_records[i] for i in record],
            workers=cfg.reward.workers,
            timeout=cfg.reward.timeout_s,
        )
        log_metric("train/reward_failures", failed)  # crashed or timed-out checks, scored 0 (as in rapid)
        return rewards

    use_cpu = cfg.device == "cpu" or not torch.cuda.is_available()
    options = grpo_options(cfg, world, use_cpu, args.out)
    if is_main:
        print(f"TRL {trl.__version__} GRPOConfig options:")
        for key, value in options.items():
            print(f"  {key} = {value!r}")
        if not options["use_vllm"]:
            print("  (vllm_importance_sampling_correction applies only to vLLM generation, use_vllm=True; off here)")

    with tempfile.TemporaryDirectory(prefix="trl-grpo-reference-") as reference_dir:
        if options["beta"] > 0 and not model.name_or_path:
            # TRL loads its reference model from the policy's `name_or_path`; a random model has none
            model.save_pretrained(reference_dir)
            model.config._name_or_path = reference_dir
        trainer = timed(GRPOTrainer)(
            model=model,
            reward_funcs=task_reward,
            args=GRPOConfig(**options),
            train_dataset=dataset,
            processing_class=tokenizer,
        )
    device = trainer.accelerator.device
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()

    t0 = time.perf_counter()
    trainer.train()
    total_s = time.perf_counter() - t0
    clock = trainer.clock
    memory = {"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}  # Linux: KiB
    if device.type == "cuda":
        memory |= {
            "mem/cuda_alloc_mib_max": torch.cuda.max_memory_allocated() / MIB,
            "mem/cuda_reserved_mib_max": torch.cuda.max_memory_reserved() / MIB,
        }
        torch.cuda.empty_cache()  # hand cached blocks back before a vLLM engine sizes itself

    # held-out evaluation as rapid.train's, with a sampler built now
    policy = unwrap(trainer.model)
    t1 = time.perf_counter()
    sampler = make_sampler(
        cfg.sampler,
        policy,
        tokenizer,
        DTYPES[cfg.model.dtype],
        seed=derive_seed(cfg.seed, ENGINE_STREAM, 0) % 2**31,  # rank 0's seed in rapid, on every rank
        max_len_needed=sequence_budget(eval_prompts, cfg.task.max_new_tokens),
    )
    final = evaluate_config(  # graded with rapid's pool and timeout (reward.*), as rapid.train grades
        cfg, sampler, task, eval_records, eval_prompts, seed=derive_seed(cfg.seed, EVAL_STREAM) % 2**31, device=device
    )
    eval_s = time.perf_counter() - t1

    summary = {
        "eval/accuracy_after": final["eval/accuracy"],
        "eval/n": final["eval/n"],
        "rounds": cfg.rounds,
        "samples": cfg.rounds * a.n_inference,
        "optimizer_steps": trainer.state.global_step,
        "algorithm": "trl_grpo",
        "sampler": "trl-hf-generate",
        "eval_sampler": sampler.name,
        "time/total_s": total_s,
        "time/rounds_s_total": total_s,  # rapid's name for the training loop
        # rapid's phases: its reference forward is part of "train", its old-policy forward "recompute"
        "time/generate_s_total": clock["generate_and_score"]
        - clock["reward"]
        - clock["old_logprob"]
        - clock["ref_logprob"],
        "time/reward_s_total": clock["reward"],
        "time/recompute_s_total": clock["old_logprob"],
        "time/train_s_total": total_s - clock["generate_and_score"] + clock["ref_logprob"],
        "time/generate_sampling_s_total": clock["sampling"],
        "time/generate_old_logprob_s_total": clock["old_logprob"],
        "time/generate_ref_logprob_s_total": clock["ref_logprob"],
        "time/eval_s": eval_s,
        **memory,
        "device": str(device),
        "world_size": world,
        "trl_version": trl.__version__,
        "options": options,
    }
    if is_main:
        args.out.mkdir(parents=True, exist_ok=True)
        steps = [row for row in trainer.state.log_history if "train_runtime" not in row]  # not the final summary
        (args.out / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in steps))
        (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary, indent=2))
    return summary


if __name__ == "__main__":
    main()
