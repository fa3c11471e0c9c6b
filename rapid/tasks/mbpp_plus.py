"""MBPP+ (EvalPlus, v0.2.0 content, 378 tasks): write a Python function; graded by running it.

Split: the 378 tasks are shuffled with `split_seed` and cut once into 264 train / 114 eval
(`split_ids`; the training loop can write the ids into the run directory). `exclude` drops task
ids after the split (e.g. Mbpp/102, 459, 559, whose reference solutions are known to be wrong).
Data: `mbpp_plus/test.jsonl` (see `rapid.tasks.datasets`); the Hub's `evalplus/mbppplus@test`
must carry the EvalPlus fields (`base_input`, `plus_input`, `canonical_solution`, `atol`).

Grading, as EvalPlus does it: the code is the last ```python block of the completion (else the last
bare ``` block, else the text before a closing fence, else the raw text). It runs in the sandbox
(`rapid.tasks.sandbox`) on every `base_input` and `plus_input` (deserialised per task: tuples,
sets, complex). Expected outputs come from running `canonical_solution` the same way, cached on
disk under $RAPID_CACHE (default ~/.cache/rapid)/mbpp_plus. An output matches when it is equal;
floats (and lists/tuples of floats) may differ by `atol` (1e-6 when atol is 0) with rtol 1e-7, same
type and length required; set equality for the EvalPlus set-output entry points; "is not None"
for the regex tasks; the custom oracles of Mbpp/581 (a pyramid's surface area, rounded) and
Mbpp/558 (digit distance with zero padding) also accept their answer. Reward 1.0 only if every
test passes and the run ends cleanly; anything else (exception, timeout, crash) is 0.0.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import tempfile
import time
from pathlib import Path

import numpy as np

from rapid.config import ConfigError
from rapid.tasks import encode_prompts
from rapid.tasks.datasets import load_split
from rapid.tasks.sandbox import Limits, _driver_source, call_function, decode, encode

FILES = {"train": "mbpp_plus/test.jsonl", "test": "mbpp_plus/test.jsonl"}   # one file, split by task id
HUB = {"train": "evalplus/mbppplus@test", "test": "evalplus/mbppplus@test"}
N_TASKS, N_EVAL = 378, 114
CACHE_VERSION = 1                      # bump when the comparison inputs change (the driver is hashed too)

SET_EQUAL = {"similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly", "larg_nnum",
             "intersection_array", "find_dissimilar", "Diff"}
NOT_NONE = {"check_str", "text_match_three", "text_starta_endb"}


def split_ids(task_ids: list[str], split_seed: int = 0, n_eval: int = N_EVAL) -> dict[str, list[str]]:
    """{"train": [...], "test": [...]}: the sorted ids shuffled with `split_seed`, the first n_eval held out."""
    ids = sorted(task_ids, key=lambda t: int(t.split("/")[1]))
    random.Random(split_seed).shuffle(ids)
    return {"test": ids[:n_eval], "train": ids[n_eval:]}


def load(split: str, data_path: str | None = None, split_seed: int = 0, n_eval: int = N_EVAL,
         exclude: tuple[str, ...] = (), timeout_s: float = 10.0, memory_mb: int = 1024, **_) -> list[dict]:
    """Records (the EvalPlus fields plus "grading": {"timeout_s", "memory_mb"}) of 'train' or 'test'."""
    records = load_split("mbpp_plus", split, FILES, HUB, data_path)
    missing = {"task_id", "entry_point", "canonical_solution", "base_input", "plus_input"} - set(records[0])
    if missing:
        raise ConfigError(f"the MBPP+ records lack the EvalPlus fields {sorted(missing)}: use the EvalPlus "
                          "MbppPlus.jsonl format (task.data_path or RAPID_DATA_DIR)")
    by_id = {r["task_id"]: r for r in records}
    excluded = set(exclude)
    keep = [t for t in split_ids(list(by_id), split_seed, n_eval)[split] if t not in excluded]
    grading = {"timeout_s": timeout_s, "memory_mb": memory_mb}
    return [{**by_id[t], "grading": grading} for t in keep]


def build_prompts(records: list[dict], tokenizer, system: str = "", use_chat_template: bool = True,
                  **_) -> list[list[int]]:
    """The task text and its example assert, asking for the function in a ```python block."""
    texts = [f"{r['prompt'].strip().strip(chr(34)).strip()}\n\nWrite the Python function `{r['entry_point']}` "
             "in one ```python code block." for r in records]
    return encode_prompts(texts, tokenizer, system, use_chat_template, plain_format="{text}\n```python\n")


def extract_code(completion: str) -> str:
    """The last ```python block (an unclosed last block counts), else the last bare ``` block,
    else the text before a closing fence (the prompt opened it), else the whole text."""
    for pattern in (r"```(?:python3?|py)[ \t]*\n(.*?)(?:```|\Z)", r"```[ \t]*\n(.*?)```"):
        blocks = re.findall(pattern, completion, re.S)
        if blocks:
            return blocks[-1]
    return completion.split("```")[0]


def reward(completion: str, record: dict) -> float:
    """1.0 if the extracted function passes every base and plus test of the task, else 0.0."""
    expected, reference_s = expected_outputs(record)
    grading = record.get("grading", {})
    limits = Limits(timeout_s=max(grading.get("timeout_s", 10.0), 4 * reference_s),
                    memory_mb=grading.get("memory_mb", 1024))
    run = call_function(extract_code(completion), record["entry_point"], task_inputs(record), limits,
                        transform="bool_or_not_none" if record["entry_point"] in NOT_NONE else None)
    if run.status != "ok":
        return 0.0
    return float(all(kind == "ok" and exp[0] == "ok" and outputs_match(out, exp[1], args, record["entry_point"],
                                                                        record.get("atol", 0))
                     for (kind, out), exp, args in zip(run.outputs, expected, task_inputs(record))))


# --- expected outputs -----------------------------------------------------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get("RAPID_CACHE") or Path.home() / ".cache" / "rapid") / "mbpp_plus"


def expected_outputs(record: dict, timeout_s: float = 120.0) -> tuple[list, float]:
    """([("ok", value) | ("error", name)] per test, seconds the reference took), cached on disk."""
    inputs = task_inputs(record)
    key = hashlib.sha256(json.dumps([CACHE_VERSION, _driver_source(), record["canonical_solution"],
                                     record["entry_point"], encode(inputs)]).encode()).hexdigest()[:16]
    path = cache_dir() / f"{record['task_id'].replace('/', '_')}-{key}.json"
    if path.is_file():
        cached = json.loads(path.read_text())
        return [(kind, decode(v) if kind == "ok" else v) for kind, v in cached["outputs"]], cached["seconds"]
    start = time.monotonic()
    run = call_function(record["canonical_solution"], record["entry_point"], inputs, Limits(timeout_s=timeout_s),
                        transform="is_not_none" if record["entry_point"] in NOT_NONE else None)
    seconds = time.monotonic() - start
    errors = [v for kind, v in run.outputs or [] if kind == "error"]
    if run.status != "ok" or errors:
        raise ConfigError(f"the reference solution of {record['task_id']} cannot run within the sandbox limits "
                          f"({run.status}{', raised ' + errors[0] if errors else ''}): add it to task.exclude")
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    outputs = [(kind, encode(v) if kind == "ok" else v) for kind, v in run.outputs]
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as f:   # atomic: pools race here
        json.dump({"task_id": record["task_id"], "seconds": seconds, "outputs": outputs}, f)
    os.replace(f.name, path)
    return run.outputs, seconds


def task_inputs(record: dict) -> list[list]:
    """base_input + plus_input, with the JSON-unrepresentable types restored (data README §3)."""
    n = int(record["task_id"].split("/")[1])
    plus = record["plus_input"] if isinstance(record["plus_input"], list) else []    # Mbpp/793 has {}
    return [deserialize(n, list(args)) for args in record["base_input"] + plus]


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def deserialize(n: int, args: list) -> list:
    """One test's arguments for task Mbpp/n, as EvalPlus's mbpp_deserialize_inputs converts them."""
    def inner(arg):
        return [tuple(v) if isinstance(v, list) else v for v in arg]
    if n in {2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616, 630, 726, 740,
             744, 809}:
        return [tuple(a) for a in args]
    if n in {63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780}:
        return [inner(a) for a in args]
    if n in {75, 413, 444, 753}:
        return [inner(args[0]), *args[1:]]
    if n in {106, 750}:
        return [args[0], tuple(args[1]), *args[2:]]
    if n in {250, 307, 405, 446, 617, 720, 763, 808}:
        return [tuple(args[0]), *args[1:]]
    if n in {259, 401, 445}:
        return [tuple(tuple(v) for v in a) for a in args]
    if n == 278:
        return [tuple(inner(args[0])), *args[1:]]
    if n == 722:
        return [{k: tuple(v) for k, v in args[0].items()}, *args[1:]]
    if n in {580, 615, 791}:
        return [_tuples(a) for a in args]
    if n == 115:
        return [[set(v) for v in args[0]], *args[1:]]
    if n == 124:
        return [float(args[0]), complex(args[1])]
    if n == 252:
        return [complex(args[0])]
    return args


# --- comparison (outside the sandbox) ------------------------------------------------------------------
def outputs_match(out, exp, args: list, entry_point: str, atol: float) -> bool:
    """EvalPlus's verdict for one test: `out` from the candidate, `exp` from the reference."""
    try:
        exact = out == exp
        if entry_point == "surface_Area":                                    # Mbpp/581 custom oracle
            exact = exact or abs(out - _pyramid_surface(*args)) <= atol
        elif entry_point == "digit_distance_nums":                           # Mbpp/558 custom oracle
            exact = exact or out == _digit_distance(*args)
        elif entry_point in SET_EQUAL:
            exact = set(out) == set(exp)
        if atol == 0 and _is_floats(exp):
            atol = 1e-6
        if exact or atol == 0:
            return bool(exact)
        if type(out) is not type(exp) or (isinstance(exp, (list, tuple)) and len(out) != len(exp)):
            return False
        return bool(np.allclose(out, exp, rtol=1e-7, atol=atol))
    except Exception:  # e.g. set() of unhashable items, arithmetic on a string: the test fails
        return False


def _is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(v, float) for v in x)


def _pyramid_surface(base_edge, height):
    """Mbpp/581: a square pyramid's surface area with `height` perpendicular to the base, rounded."""
    slant = math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 2 * base_edge * slant)


def _digit_distance(a, b):
    """Mbpp/558: the sum of per-digit differences, the shorter number padded with leading zeros."""
    x, y = str(a), str(b)
    width = max(len(x), len(y))
    return sum(abs(int(p) - int(q)) for p, q in zip(x.zfill(width), y.zfill(width)))
