"""Tasks. A task is a module with three functions:

    load(split, **cfg) -> records                      split is "train" or "test"
    build_prompts(records, tokenizer, **cfg) -> token ids per record
    reward(completion, record) -> float                1.0 counts as correct

`cfg` is the run's `task` config (every key of it, so a task ignores what it does not use). Records
carry what grading them needs (e.g. a `grading` dict with time limits), because `reward` sees only
the completion and the record. The built-in tasks live in this package; `task.module` names the
module of any other task, e.g. `python -m rapid.train task.module=my_package.my_task task.name=mine`
(it must be importable, also by reward worker processes).
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType

from omegaconf import OmegaConf

from rapid.config import CONF, ConfigError, check_splits

TASKS = ("arithmetic", "multistep", "math", "gsm8k", "mbpp_plus", "minif2f")
TASK_FUNCTIONS = ("load", "build_prompts", "reward")


def get_task(name: str, module: str | None = None) -> ModuleType:
    """The module of a built-in task by `name`, or the module named by `module` (a plugin task)."""
    if module is not None and module.startswith("rapid.tasks.") and module != f"rapid.tasks.{name}":
        raise ConfigError(
            f"task.name={name} does not match task.module={module}: choose a built-in task with "
            f"task=<name> ({', '.join(TASKS)}), or point task.module at your own task's module"
        )
    if module is None:
        if name not in TASKS:
            raise ConfigError(
                f"unknown task '{name}': choose one of {', '.join(TASKS)}, or set task.module to "
                "the module of your own task"
            )
        module = f"rapid.tasks.{name}"
    try:
        task = importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"task.module={module} cannot be imported ({e}): put its package on PYTHONPATH") from e
    missing = [f for f in TASK_FUNCTIONS if not callable(getattr(task, f, None))]
    if missing:
        raise ConfigError(
            f"task.module={module} lacks {', '.join(missing)}: a task module defines load(split, **cfg), "
            "build_prompts(records, tokenizer, **cfg) and reward(completion, record)"
        )
    return task


def inherited_settings(task_cfg) -> tuple[str, dict] | None:
    """For a plugin task (task.module outside rapid.tasks): the built-in task whose conf/task/<name>.yaml
    settings its config still holds (every key but name and module present, as when only task.module= was
    given on the command line) and those of them at that file's values; None for a built-in task, or
    a plugin with its own task YAML."""
    module = str(task_cfg.get("module") or "")
    if not module or module.startswith("rapid.tasks."):
        return None
    mine = OmegaConf.to_container(task_cfg, resolve=False)
    for path in sorted((CONF / "task").glob("*.yaml")):
        theirs = {k: v for k, v in OmegaConf.to_container(OmegaConf.load(path)).items() if k not in ("name", "module")}
        if theirs and theirs.keys() <= mine.keys():
            same = {k: v for k, v in theirs.items() if mine[k] == v}
            if same:
                return path.stem, same
    return None


def warn_inherited_settings(task_cfg) -> None:
    """One warning when a plugin task runs with a built-in task's settings (e.g. max_new_tokens: 12 from
    conf/task/arithmetic.yaml, the task group's default) that it never chose."""
    found = inherited_settings(task_cfg)
    if found is None:
        return
    name, same = found
    shown = ", ".join(f"task.{k}={v}" for k, v in sorted(same.items(), key=lambda kv: kv[0] != "max_new_tokens"))
    warnings.warn(
        f"task.module={task_cfg.module} runs with conf/task/{name}.yaml's settings ({shown}), which it inherits "
        "because the task group still selects that file: give your task its own YAML (task=<yours>, from "
        "conf/task/ or a folder on hydra.searchpath, docs/configuration.md) or override the settings it "
        "needs (e.g. task.max_new_tokens=256)",
        stacklevel=2,
    )


def encode_prompts(
    user_texts: list[str], tokenizer, system: str = "", use_chat_template: bool = True, plain_format: str = "{text}"
) -> list[list[int]]:
    """Token ids of one single-turn prompt per text: the tokenizer's chat template (optional system
    message, then the user turn) when asked for and available, else the plain text
    `system + "\\n\\n" + plain_format.format(text=text)` (e.g. "Question: {text}\\nAnswer:")."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        head = [{"role": "system", "content": system}] if system else []
        texts = [
            tokenizer.apply_chat_template(
                head + [{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True
            )
            for t in user_texts
        ]
    else:
        texts = [(system + "\n\n" if system else "") + plain_format.format(text=t) for t in user_texts]
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def record_id(record: dict) -> str:
    """A record's name in its dataset (arithmetic and multistep problems are named by their question)."""
    return str(record.get("task_id") or record.get("unique_id") or record.get("name") or record.get("question"))


def load_splits(task_cfg, tokenizer, n_eval: int | None = None):
    """(task module, train records, train prompts, eval records, eval prompts) for a `task` config;
    the eval split is cut to its first `n_eval` records. An empty split is one ConfigError sentence;
    held-out records that are also training records are warned about."""
    task = get_task(task_cfg.name, task_cfg.module)
    warn_inherited_settings(task_cfg)
    train_records = task.load("train", **task_cfg)
    eval_records = task.load("test", **task_cfg)[:n_eval]
    check_splits(task_cfg.name, train_records, eval_records)  # neither empty; a warning if they overlap
    return (
        task,
        train_records,
        task.build_prompts(train_records, tokenizer, **task_cfg),
        eval_records,
        task.build_prompts(eval_records, tokenizer, **task_cfg),
    )
