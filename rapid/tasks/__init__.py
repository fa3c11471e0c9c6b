"""Tasks. Each module exposes `load(split, **cfg) -> records`, `build_prompts(records, tokenizer,
**cfg) -> token ids per record` and `reward(completion, record) -> float`."""
from __future__ import annotations

import importlib
from types import ModuleType

from rapid.config import ConfigError

TASKS = ("arithmetic",)


def get_task(name: str) -> ModuleType:
    if name not in TASKS:
        raise ConfigError(f"unknown task '{name}': choose one of {', '.join(TASKS)}")
    return importlib.import_module(f"rapid.tasks.{name}")
