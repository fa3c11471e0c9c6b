"""Tasks. Each module exposes `load(split, **cfg) -> records`, `build_prompts(records, tokenizer,
**cfg) -> token ids per record` and `reward(completion, record) -> float`.

Records carry what grading them needs (e.g. a `grading` dict with time limits), because
`reward` sees only the completion and the record."""
from __future__ import annotations

import importlib
from types import ModuleType

from rapid.config import ConfigError

TASKS = ("arithmetic", "multistep", "math", "gsm8k", "mbpp_plus", "minif2f")


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise ConfigError(f"unknown task '{name}': choose one of {', '.join(TASKS)}")
    return importlib.import_module(f"rapid.tasks.{name}")


def encode_prompts(user_texts: list[str], tokenizer, system: str = "", use_chat_template: bool = True,
                   plain_format: str = "{text}") -> list[list[int]]:
    """Token ids of one single-turn prompt per text: the tokenizer's chat template (optional system
    message, then the user turn) when asked for and available, else the plain text
    `system + "\\n\\n" + plain_format.format(text=text)` (e.g. "Question: {text}\\nAnswer:")."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        head = [{"role": "system", "content": system}] if system else []
        texts = [tokenizer.apply_chat_template(head + [{"role": "user", "content": t}], tokenize=False,
                                               add_generation_prompt=True) for t in user_texts]
    else:
        texts = [(system + "\n\n" if system else "") + plain_format.format(text=t) for t in user_texts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def load_splits(task_cfg, tokenizer, n_eval: int | None = None):
    """(task module, train records, train prompts, eval records, eval prompts) for a `task` config;
    the eval split is cut to its first `n_eval` records."""
    task = get_task(task_cfg.name)
    train_records = task.load("train", **task_cfg)
    eval_records = task.load("test", **task_cfg)[:n_eval]
    return (task, train_records, task.build_prompts(train_records, tokenizer, **task_cfg),
            eval_records, task.build_prompts(eval_records, tokenizer, **task_cfg))
