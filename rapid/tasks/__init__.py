"""Tasks. A task is a module with three functions:

    load(split, **cfg) -> records                      split is "train" or "test"
    build_prompts(records, tokenizer, **cfg) -> token ids per record
    reward(completion, record) -> float                1.0 counts as correct

`cfg` is the run's `task` config (every key of it, so a task ignores what it does not use: give `load`
and `build_prompts` a `**cfg` parameter). `load` returns a list of dicts (any iterable of dicts is taken
as a list), `build_prompts` one list of token ids per record. A plugin that does not import, cannot be
called so, raises, or returns something else is refused in one sentence naming the function and the
file; so are records with an empty question and prompts that do not fit the model's context, while
duplicate records are warned about with their count. Records
carry what grading them needs (e.g. a `grading` dict with time limits), because `reward` sees only
the completion and the record. The built-in tasks live in this package; `task.module` names the
module of any other task, e.g. `python -m rapid.train task.module=my_package.my_task task.name=mine`
(it must be importable, also by reward worker processes).
"""

from __future__ import annotations

import importlib
import inspect
import json
import traceback
import warnings
from collections.abc import Iterable, Mapping
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
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise ConfigError(
                f"task.module={module} cannot be imported (no module named {e.name}): put its package "
                "on PYTHONPATH, or fix the name"
            ) from None
        raise ConfigError(
            f"task.module={module} imports {e.name}, which is not installed ({where(e)}): install it"
        ) from None
    except SyntaxError as e:
        reason = "it is not UTF-8 text" if "utf-8" in str(e.msg).lower() or "unicode" in str(e.msg).lower() else e.msg
        raise ConfigError(
            f"task.module={module} does not compile ({reason}, {e.filename}:{e.lineno}): fix the file"
        ) from None
    except Exception as e:  # whatever the module's top level raises
        raise ConfigError(
            f"task.module={module} raised {type(e).__name__} while it was imported ({one_line(e)}, {where(e)}): "
            "fix the module"
        ) from None
    missing = [f for f in TASK_FUNCTIONS if not callable(getattr(task, f, None))]
    if missing:
        raise ConfigError(
            f"task.module={module} lacks {', '.join(missing)}: a task module defines load(split, **cfg), "
            "build_prompts(records, tokenizer, **cfg) and reward(completion, record)"
        )
    return task


def one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__).rstrip(".")


def where(error: BaseException) -> str:
    """file:line of the innermost frame of `error` that lies outside Python's own import machinery."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "importlib" not in f.filename]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "at import"


def call_task(task: ModuleType, name: str, args: tuple, cfg: dict):
    """`task.<name>(*args, **cfg)`, with what can go wrong in one ConfigError sentence: a signature that
    cannot take the call, a file that cannot be read, and, for a plugin task, anything it raises."""
    fn = getattr(task, name)
    label = f"{task.__name__}.{name}"
    try:
        inspect.signature(fn).bind(*args, **cfg)
    except TypeError as e:
        raise ConfigError(
            f"{label} cannot be called as rapid calls it ({e}): a task's {SIGNATURES[name]} (every task.* key "
            "arrives as a keyword, so end the parameters with **cfg)"
        ) from None
    except ValueError:  # no signature to read (a builtin): call it and see
        pass
    try:
        return fn(*args, **cfg)
    except ConfigError:
        raise
    except OSError as e:
        raise ConfigError(
            f"{label} could not read {e.filename or cfg.get('data_path') or 'its data'} "
            f"({e.strerror or type(e).__name__}): check the path "
            "(task.data_path) and that this user may read it"
        ) from None
    except Exception as e:
        if task.__name__.startswith("rapid.tasks."):
            raise  # a built-in task's own error is a bug to see whole
        raise ConfigError(f"{label} raised {type(e).__name__} ({one_line(e)}, {where(e)}): fix the task") from None


SIGNATURES = {
    "load": "load(split, **cfg) returns a list of records (dicts)",
    "build_prompts": "build_prompts(records, tokenizer, **cfg) returns one list of token ids per record",
}


def checked_records(task: ModuleType, split: str, records) -> list[dict]:
    """`load`'s result as a list of dicts; anything else is one ConfigError sentence."""
    label = f"{task.__name__}.load('{split}')"
    if records is None or isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
        raise ConfigError(f"{label} returned {type(records).__name__}, not a list of records: {SIGNATURES['load']}")
    records = list(records)  # a generator or a tuple is read once, here
    bad = next((i for i, r in enumerate(records) if not isinstance(r, Mapping)), None)
    if bad is not None:
        raise ConfigError(
            f"{label}'s record {bad + 1} is a {type(records[bad]).__name__}, not a dict: {SIGNATURES['load']}"
        )
    return records


def checked_prompts(task: ModuleType, split: str, prompts, n: int) -> list[list[int]]:
    """`build_prompts`' result as one non-empty list of token ids per record; else one sentence."""
    label = f"{task.__name__}.build_prompts (the {split} split)"
    if prompts is None or isinstance(prompts, (str, bytes, Mapping)) or not isinstance(prompts, Iterable):
        raise ConfigError(f"{label} returned {type(prompts).__name__}: {SIGNATURES['build_prompts']}")
    prompts = [list(p) if isinstance(p, (list, tuple)) else p for p in prompts]
    if len(prompts) != n:
        raise ConfigError(f"{label} returned {len(prompts)} prompts for {n} records: it must return one per record")
    for i, p in enumerate(prompts):
        if not isinstance(p, list) or not p or not all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            what = "an empty list" if p == [] else f"a {type(p).__name__}"
            raise ConfigError(
                f"{label}'s prompt {i + 1} is {what}, not token ids: encode each prompt with the tokenizer "
                "(rapid.tasks.encode_prompts)"
            )
    return prompts


QUESTION_FIELDS = ("question", "problem", "prompt", "formal_statement", "text")


def check_records(task_name: str, split: str, records: list[dict]) -> None:
    """Records with an empty question are refused (the model would be graded on a problem it was never
    shown); duplicate records are warned about once, with their count."""
    empty = [
        i
        for i, r in enumerate(records)
        if (field := next((f for f in QUESTION_FIELDS if f in r), None))
        and isinstance(r[field], str)
        and not r[field].strip()
    ]
    if empty:
        raise ConfigError(
            f"{len(empty)} of the {len(records)} records of task {task_name}'s {split} split have an empty question "
            f"(the first: record {empty[0] + 1}): remove them from the data"
        )
    seen: set[str] = set()
    duplicates = 0
    for r in records:
        key = json.dumps(r, sort_keys=True, default=str)
        duplicates += key in seen
        seen.add(key)
    if duplicates:
        warnings.warn(
            f"{duplicates} of the {len(records)} records of task {task_name}'s {split} split are duplicates of "
            "earlier ones, so those problems weigh more: deduplicate the data",
            stacklevel=2,
        )


def check_context(task_name: str, split: str, prompts: list[list[int]], max_new_tokens: int, context) -> None:
    """Every prompt and its completion fit the model's context (max_position_embeddings); else one
    sentence with the count and the longest."""
    if not context or not prompts:
        return
    too_long = [len(p) for p in prompts if len(p) + max_new_tokens > context]
    if too_long:
        raise ConfigError(
            f"{len(too_long)} of the {len(prompts)} {split} prompts of task {task_name} do not fit the model's "
            f"context of {context} tokens with task.max_new_tokens={max_new_tokens} (the longest prompt has "
            f"{max(too_long)} tokens): lower task.max_new_tokens, shorten the prompts (task.n_shots, task.system), "
            "drop those problems, or use a model with a longer context"
        )


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


def load_splits(task_cfg, tokenizer, n_eval: int | None = None, context: int | None = None):
    """(task module, train records, train prompts, eval records, eval prompts) for a `task` config;
    the eval split is cut to its first `n_eval` records. An empty split, a record with an empty question,
    a prompt that with task.max_new_tokens does not fit the model's `context`, and a task function that
    fails or returns the wrong thing are each one ConfigError sentence; held-out records that are also
    training records, and duplicate records, are warned about."""
    task = get_task(task_cfg.name, task_cfg.module)
    warn_inherited_settings(task_cfg)
    cfg = dict(task_cfg)
    train_records = checked_records(task, "train", call_task(task, "load", ("train",), cfg))
    eval_records = checked_records(task, "test", call_task(task, "load", ("test",), cfg))[:n_eval]
    check_splits(task_cfg.name, train_records, eval_records)  # neither empty; a warning if they overlap
    splits = []
    for split, records in (("training", train_records), ("held-out", eval_records)):
        check_records(task_cfg.name, split, records)
        prompts = checked_prompts(
            task, split, call_task(task, "build_prompts", (records, tokenizer), cfg), len(records)
        )
        check_context(task_cfg.name, split, prompts, task_cfg.get("max_new_tokens") or 0, context)
        splits += [records, prompts]
    return (task, *splits)
