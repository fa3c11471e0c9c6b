"""Where a task's records come from: a local JSON Lines file or folder, else the Hugging Face Hub.

The order of precedence for a split (`train`/`test`):

1. `task.data_path`: a `.jsonl` file (serves every split; use a folder for separate splits) or a
   folder holding `files[split]`, e.g. `math/train_12k.jsonl` (the layout of `../shared/data`).
2. the environment variable `RAPID_DATA_DIR`: a folder with that same layout.
3. the Hub dataset `hub[split]`, written `"dataset_id[:config]@hub_split"`
   (e.g. `"openai/gsm8k:main@test"`), read with the `datasets` package if it is installed.

Every failure a user can fix (missing file, offline machine, no `datasets`) is one `ConfigError`
sentence that says to set `task.data_path` or `RAPID_DATA_DIR`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from rapid.config import ConfigError

DATA_DIR_ENV = "RAPID_DATA_DIR"
_HOW = (
    f"set task.data_path to a local JSON Lines file or folder, or {DATA_DIR_ENV} to a folder laid out like "
    "../shared/data"
)


def read_jsonl(path: str | Path) -> list[dict]:
    """One dict per non-empty line of a JSON Lines file; one ConfigError sentence for a file that is
    not UTF-8 text, a line that is not a JSON object, or a file with no records."""
    records = []
    try:
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        records.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ConfigError(f"{path}:{n} is not valid JSON ({e.msg}): fix or replace the file") from None
                    if not isinstance(records[-1], dict):
                        raise ConfigError(
                            f"{path}:{n} is not a JSON object (one record per line): fix or replace the file"
                        )
    except UnicodeDecodeError:
        raise ConfigError(f"{path} is not UTF-8 text (a binary file?): point the task at a JSON Lines file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path} is a folder, not a JSON Lines file: point the task at the .jsonl file") from None
    if not records:
        raise ConfigError(f"{path} holds no records: point the task at a non-empty JSON Lines file")
    return records


def require_fields(records: list[dict], fields: tuple[str, ...], task: str) -> None:
    """One ConfigError sentence naming the first record that lacks one of `fields` (or holds null)."""
    for n, r in enumerate(records, 1):
        missing = [k for k in fields if r.get(k) is None]
        if missing:
            raise ConfigError(
                f"{task} record {n} lacks the field{'s' if len(missing) > 1 else ''} "
                f"{', '.join(missing)}: every record needs {', '.join(fields)} ({_HOW})"
            )


def load_split(
    task: str, split: str, files: Mapping[str, str], hub: Mapping[str, str], data_path: str | None = None
) -> list[dict]:
    """Records of `split` for `task`, from `data_path`, else $RAPID_DATA_DIR, else the Hub."""
    if split not in files:
        raise ConfigError(f"unknown split '{split}' for task {task}: use one of {', '.join(files)}")
    if data_path:
        root = Path(data_path).expanduser()
        if root.is_file():
            return read_jsonl(root)
        where = f"task.data_path={data_path}"
    elif os.environ.get(DATA_DIR_ENV):
        root, where = Path(os.environ[DATA_DIR_ENV]).expanduser(), f"{DATA_DIR_ENV}={os.environ[DATA_DIR_ENV]}"
    else:
        return load_hub(task, hub.get(split, ""))
    path = root / files[split]
    if not path.is_file():
        raise ConfigError(
            f"{where} has no {files[split]} for the {split} split of task {task}: point it at "
            "a folder laid out like ../shared/data or at the .jsonl file itself"
        )
    return read_jsonl(path)


def parse_hub_spec(spec: str) -> tuple[str, str | None, str]:
    """'dataset_id[:config]@split' -> (dataset_id, config or None, split)."""
    name, _, split = spec.partition("@")
    dataset_id, _, config = name.partition(":")
    if not dataset_id or not split:
        raise ConfigError(f"hub source '{spec}' must read 'dataset_id[:config]@split', e.g. 'openai/gsm8k:main@test'")
    return dataset_id, config or None, split


def load_hub(task: str, spec: str) -> list[dict]:
    """Records of a Hub dataset split; any failure is one ConfigError sentence."""
    if not spec:
        raise ConfigError(f"task {task} has no Hub source for this split: {_HOW}")
    dataset_id, config, split = parse_hub_spec(spec)
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"cannot read {spec} from the Hugging Face Hub because the `datasets` package is not "
            f"installed: {_HOW} (or pip install datasets)"
        ) from None
    try:
        return [dict(r) for r in datasets.load_dataset(dataset_id, config, split=split)]
    except Exception as e:  # network, auth, missing split: all end the same way for the user
        raise ConfigError(
            f"could not load {spec} from the Hugging Face Hub ({type(e).__name__}; offline?): {_HOW}"
        ) from None
