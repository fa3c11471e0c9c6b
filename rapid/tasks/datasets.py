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

import ast
import json
import os
import re
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


# --- MBPP+ as the Hub's evalplus/mbppplus stores it ---------------------------------------------------
# The Hub copy (evalplus/mbppplus, built by EvalPlus's tools/mbpp/to_original_fmt.py) keeps the original
# MBPP fields (task_id as a number, code = the reference solution, prompt = the task text, source_file,
# test_imports, test_list = MBPP's three asserts) and puts the tests in `test`, Python source:
#     <imports> <assertion helpers> inputs = [...] results = [...]
#     for i, (inp, exp) in enumerate(zip(inputs, results)): assertion(candidate(*inp), exp, <atol>)
# (three tasks with very large outputs compare against a `ref_func` instead of `results`). The inputs are
# the base inputs followed by the plus inputs, deduplicated; MBPP's own asserts are the base tests, so
# the first len(test_list) inputs are taken as base_input and the rest as plus_input.
MBPPPLUS_HUB_FIELDS = ("task_id", "code", "prompt", "test_list", "test")
_NAMED_CONSTANTS = {"inf": float("inf"), "nan": float("nan")}


def is_mbppplus_hub_record(record: dict) -> bool:
    return all(k in record for k in MBPPPLUS_HUB_FIELDS) and "base_input" not in record


def mbppplus_from_hub(record: dict) -> dict:
    """One evalplus/mbppplus (Hub) record in the EvalPlus release's fields: task_id "Mbpp/<n>",
    prompt, entry_point, canonical_solution, base_input, plus_input, atol."""
    n = int(record["task_id"])
    where = f"evalplus/mbppplus task {n}"
    try:
        tree = ast.parse(record["test"])
    except SyntaxError:
        raise ConfigError(f"{where}: its `test` field is not Python source: {_HOW}") from None
    inputs, atol = None, None
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["inputs"]:
            inputs = _literal(node.value, where)
        for call in ast.walk(node):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "assertion" and len(call.args) == 3:
                atol = _literal(call.args[2], where)
    if not isinstance(inputs, list) or atol is None:
        raise ConfigError(f"{where}: its `test` code has no `inputs = [...]` list or assertion(..., atol) call: {_HOW}")
    inputs = [_as_json(list(args)) for args in inputs]
    n_base = len(record["test_list"])
    text = record["prompt"].strip()
    return {
        "task_id": f"Mbpp/{n}",
        "prompt": f'"""\n{text}\n{record["test_list"][0]}\n"""\n',
        "entry_point": _entry_point(record["code"], record["test_list"], where),
        "canonical_solution": record["code"],
        "base_input": inputs[:n_base],
        "plus_input": inputs[n_base:],
        "atol": atol,
    }


def _literal(node: ast.AST, where: str):
    """A Python literal, where `inf` and `nan` may appear as names (EvalPlus writes repr() of its inputs)."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and sub.id not in _NAMED_CONSTANTS:
            raise ConfigError(f"{where}: its test inputs use the name `{sub.id}`, which is not a literal: {_HOW}")
        if not isinstance(
            sub,
            (ast.Constant, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.UnaryOp, ast.BinOp, ast.Name, ast.Load)
            + (ast.USub, ast.UAdd, ast.Add, ast.Sub),
        ):
            raise ConfigError(f"{where}: its test inputs hold {type(sub).__name__}, not a literal: {_HOW}")
    return eval(compile(ast.Expression(node), "<mbppplus test>", "eval"), {"__builtins__": {}}, dict(_NAMED_CONSTANTS))


def _as_json(x):
    """Tuples and sets as lists, recursively: the form of EvalPlus's JSON release, which
    rapid.tasks.mbpp_plus.deserialize turns back into each task's types."""
    if isinstance(x, (list, tuple, set, frozenset)):
        return [_as_json(v) for v in x]
    if isinstance(x, dict):
        return {k: _as_json(v) for k, v in x.items()}
    return x


def _entry_point(code: str, test_list: list[str], where: str) -> str:
    """The function the tests call: among the reference's top-level functions, the one named in the
    first MBPP assert (the only one when there is one)."""
    try:
        names = [f.name for f in ast.parse(code).body if isinstance(f, ast.FunctionDef)]
    except SyntaxError:
        names = []
    called = [name for name in names if re.search(rf"\b{re.escape(name)}\s*\(", test_list[0] if test_list else "")]
    if called or len(names) == 1:
        return (called or names)[0]
    raise ConfigError(f"{where}: cannot tell which function of its reference solution the tests call: {_HOW}")
