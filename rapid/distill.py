"""python -m rapid.distill — the data of the paper's SFT baseline: a teacher's correct generations.

For every training prompt x the teacher samples `distill.n_samples` completions y (paper: 5) at
`distill.temperature` (paper: 0.7); a completion is kept iff the task's reward accepts it,
R(x, y) == 1.0. Kept completions go to <run_dir>/distill.jsonl, one JSON object a line:

    {"record": {"index", "id", "question"}, "prompt_ids", "completion_ids", "text", "finish_reason"}

with `index` the position of the problem in the task's training split, ids in the teacher's tokens
(the completion ends with EOS when it stopped). The counts (prompts, generated, kept, acceptance
rate) are printed and written to <run_dir>/distill_summary.json. `python -m rapid.sft` trains on
the file.

Sampling is at `distill.temperature` with nucleus truncation `distill.top_p` (paper: 0.7 and 0.95).
Sampling seeds derive from (seed, prompt index), so with
sampler=hf the file depends neither on distill.chunk nor on the batch size; vLLM on CPU seeds the
engine once instead.

    python -m rapid.distill                                        # SmolLM2-135M-Instruct teaches itself, arithmetic
    python -m rapid.distill distill.teacher=qwen2.5_1.5b model=qwen2.5_0.5b task=math
    python -m rapid.distill distill.teacher=outputs/<rl run>/checkpoints/round_000012/model
    python -m rapid.sft distill.data=outputs/<distill run>/distill.jsonl
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from tqdm import tqdm

from rapid import distributed
from rapid.config import ConfigError, exit_on_config_error, resolve_dtype
from rapid.logger import write_run_files
from rapid.models import load_model_and_tokenizer
from rapid.rewards import score
from rapid.sampler import make_sampler, sequence_budget
from rapid.seeding import DISTILL_ENGINE_STREAM, DISTILL_SAMPLE_STREAM, derive_seed
from rapid.tasks import get_task, record_id

CONF = Path(__file__).resolve().parents[1] / "conf"


def question(record: dict) -> str:
    return record.get("question") or record.get("problem") or record.get("prompt") or record.get("formal_statement", "")


def teacher_config(teacher: str | None, model_cfg: DictConfig) -> DictConfig:
    """The teacher's model config: model.* when null, conf/model/<teacher>.yaml for a group entry,
    else a local folder or Hub id (with the student's compute dtype)."""
    if teacher is None:
        return model_cfg
    entry = CONF / "model" / f"{teacher}.yaml"
    if entry.exists():
        return OmegaConf.load(entry)
    return OmegaConf.create(
        {"name": str(teacher), "path": str(teacher), "gguf": None, "architecture": None, "dtype": model_cfg.dtype}
    )


@hydra.main(config_path="../conf", config_name="sft", version_base=None)
@exit_on_config_error
def main(cfg: DictConfig) -> dict | None:
    return distill(cfg)


def distill(cfg: DictConfig, run_dir: Path | None = None) -> dict:
    """Writes <run_dir>/distill.jsonl and distill_summary.json (run_dir: Hydra's run folder by default)."""
    run_dir = Path(run_dir or HydraConfig.get().runtime.output_dir)
    _, world, device = distributed.init(cfg.device)
    if world > 1:
        raise ConfigError("rapid.distill runs in one process: launch it with python -m, not torchrun")
    d, t = cfg.distill, cfg.task
    if d.n_samples < 1 or d.temperature <= 0:
        raise ConfigError(f"distill.n_samples={d.n_samples} must be >= 1 and distill.temperature={d.temperature} > 0")
    teacher_cfg = teacher_config(d.teacher, cfg.model)
    teacher, tokenizer = load_model_and_tokenizer(
        teacher_cfg.path, teacher_cfg.gguf, teacher_cfg.architecture, seed=cfg.seed
    )
    teacher.to(device).eval()
    task = get_task(t.name, t.module)
    records = task.load("train", **t)[: d.n_prompts]
    prompts = task.build_prompts(records, tokenizer, **t)
    write_run_files(run_dir, cfg, device)
    print(OmegaConf.to_yaml(cfg, resolve=True))
    sampler = make_sampler(
        cfg.sampler,
        teacher,
        tokenizer,
        resolve_dtype(teacher_cfg.dtype, device),
        seed=derive_seed(cfg.seed, DISTILL_ENGINE_STREAM) % 2**31,
        max_len_needed=sequence_budget(prompts, t.max_new_tokens),
    )

    t_start = time.perf_counter()
    counts = {"generated": 0, "kept": 0, "prompts_with_kept": 0, "reward_failures": 0}
    clock = {"generate": 0.0, "reward": 0.0}
    with (run_dir / "distill.jsonl").open("w") as out:
        for start in tqdm(range(0, len(records), d.chunk), disable=not cfg.logger.progress, dynamic_ncols=True):
            chunk = range(start, min(start + d.chunk, len(records)))
            t0 = time.perf_counter()
            seeds = [derive_seed(cfg.seed, DISTILL_SAMPLE_STREAM, i) for i in chunk]  # per prompt, whatever the chunk
            groups = sampler.generate(
                [prompts[i] for i in chunk],
                n=d.n_samples,
                max_new_tokens=t.max_new_tokens,
                temperature=d.temperature,
                seeds=seeds,
                top_p=d.top_p,
            )
            t1 = time.perf_counter()
            flat = [(i, c) for i, group in zip(chunk, groups) for c in group]
            rewards, failed = score(
                task,
                [c.text for _, c in flat],
                [records[i] for i, _ in flat],
                workers=cfg.reward.workers,
                timeout=cfg.reward.timeout_s,
            )
            clock["generate"] += t1 - t0
            clock["reward"] += time.perf_counter() - t1
            kept = [(i, c) for (i, c), r in zip(flat, rewards) if r == 1.0]
            for i, c in kept:
                record = {"index": i, "id": record_id(records[i]), "question": question(records[i])}
                out.write(
                    json.dumps(
                        {
                            "record": record,
                            "prompt_ids": prompts[i],
                            "completion_ids": c.token_ids,
                            "text": c.text,
                            "finish_reason": c.finish_reason,
                        }
                    )
                    + "\n"
                )
            counts["generated"] += len(flat)
            counts["kept"] += len(kept)
            counts["prompts_with_kept"] += len({i for i, _ in kept})
            counts["reward_failures"] += failed
    summary = {
        "prompts": len(records),
        **counts,
        "acceptance_rate": counts["kept"] / max(counts["generated"], 1),
        "teacher": teacher_cfg.name,
        "task": t.name,
        "n_samples": d.n_samples,
        "temperature": d.temperature,
        "top_p": d.top_p,
        "sampler": sampler.name,
        "time/generate_s": clock["generate"],
        "time/reward_s": clock["reward"],
        "time/total_s": time.perf_counter() - t_start,
    }
    sampler.close()  # the teacher's engine goes before the student's starts (algorithm=sft)
    (run_dir / "distill_summary.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    print(
        f"kept {counts['kept']} of {counts['generated']} completions ({summary['acceptance_rate']:.1%}) "
        f"-> {run_dir / 'distill.jsonl'}"
    )
    return summary


if __name__ == "__main__":
    main()
