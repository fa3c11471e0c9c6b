"""MATH (Hendrycks et al.): train on the 12,000-problem split, evaluate on MATH-500.

Data (see `rapid.tasks.datasets` for the order of sources): `math/train_12k.jsonl` (the 7,500
train problems plus the 4,500 test problems outside MATH-500, as in PRM800K) and
`math500/test.jsonl`; on the Hub `zzy1123/MATH_train_test_split@train` (the same 12k split) and
`HuggingFaceH4/MATH-500@test`. Records whose answer is empty are dropped (two in the 12k split);
the count is printed and kept in `DROPPED`.

Grading: the answer is the content of the LAST `\\boxed{...}` of the completion (balanced braces);
no box, no credit. It is equal to the reference answer when
1. their normalised strings are equal (`normalize`: `\\text{}` wrappers, trailing units, `\\%`,
   `\\$`, `^\\circ`, an `x =` prefix, thousands separators, `\\dfrac`/`\\tfrac`, `\\left`/`\\right`
   and spaces removed), or
2. both are plain numbers (integers, decimals, fractions) with the same exact value, or
3. math-verify (sympy) proves them equal: surds, tuples, intervals with their brackets,
   expressions. This check runs in a separate process; after `grading.timeout_s` seconds it
   raises `GradingError` (scored 0 and counted in train/reward_failures by `rapid.rewards.score`).
"""

from __future__ import annotations

import importlib.util
import re

from rapid.config import ConfigError
from rapid.tasks import encode_prompts
from rapid.tasks.datasets import load_split, require_fields
from rapid.tasks.grading import SYMBOLIC, last_boxed, parse_number

FILES = {"train": "math/train_12k.jsonl", "test": "math500/test.jsonl"}
# nlile/hendrycks-MATH-benchmark: the 12,000-problem train split of "Let's Verify Step by Step" (MATH minus
# MATH-500), fields problem, solution, answer, subject, level, unique_id, as HuggingFaceH4/MATH-500's
HUB = {"train": "nlile/hendrycks-MATH-benchmark@train", "test": "HuggingFaceH4/MATH-500@test"}
DROPPED: dict[str, int] = {}  # split -> records dropped for an empty answer, by the last load
MAX_SYMBOLIC_CHARS = 400  # longer answers are not sent to sympy (string compare only)


def load(split: str, data_path: str | None = None, grading_timeout_s: float = 5.0, **_) -> list[dict]:
    """Records {"problem", "answer", "solution", ..., "grading": {"timeout_s"}} of 'train' or 'test'."""
    if importlib.util.find_spec("math_verify") is None:
        raise ConfigError("grading MATH needs math-verify: pip install math-verify")
    records = []
    loaded = load_split("math", split, FILES, HUB, data_path)
    require_fields(loaded, ("problem",), "math")
    for r in loaded:
        answer = r.get("answer")
        if answer is None:  # sources without the field: derive it
            answer = last_boxed(str(r.get("solution", ""))) or ""
        answer = answer if isinstance(answer, str) else str(answer)
        records.append({**r, "answer": answer, "grading": {"timeout_s": grading_timeout_s}})
    kept = [r for r in records if r["answer"].strip()]
    DROPPED[split] = len(records) - len(kept)
    if DROPPED[split]:
        print(f"math: dropped {DROPPED[split]} of {len(records)} {split} records with an empty answer")
    return kept


def build_prompts(
    records: list[dict], tokenizer, system: str = "", use_chat_template: bool = True, **_
) -> list[list[int]]:
    """The problem as the user turn (or 'Problem: ...\\nSolution:' without a chat template)."""
    return encode_prompts(
        [r["problem"] for r in records], tokenizer, system, use_chat_template, plain_format="Problem: {text}\nSolution:"
    )


def reward(completion: str, record: dict) -> float:
    """1.0 if the last \\boxed{} of `completion` is equivalent to the record's answer, else 0.0."""
    pred = last_boxed(completion)
    if pred is None:
        return 0.0
    return float(is_equiv(pred, record["answer"], record.get("grading", {}).get("timeout_s", 5.0)))


def is_equiv(pred: str, gold: str, timeout_s: float = 5.0) -> bool:
    """Whether two answers are the same: normalised strings, exact numbers, then sympy (bounded)."""
    p, g = normalize(pred), normalize(gold)
    if not p or not g:
        return False
    if p.replace(" ", "") == g.replace(" ", ""):
        return True
    p_num, g_num = parse_number(p), parse_number(g)
    if p_num is not None and g_num is not None:
        return p_num == g_num
    if max(len(p), len(g)) > MAX_SYMBOLIC_CHARS:
        return False
    return SYMBOLIC.equal(g, p, timeout_s)


_UNITS = (
    r"(?:units?|sq(?:uare)?|cubic|cm|centimeters?|mm|km|m|meters?|kilometers?|in|inch(?:es)?|ft|feet|foot|"
    r"yards?|miles?|mph|degrees?|dollars?|cents?|seconds?|minutes?|hours?|days?|weeks?|months?|years?|"
    r"pounds?|ounces?|people|students|ways)"
)


def normalize(answer: str) -> str:
    """A canonical spelling of a LaTeX answer for string comparison (spaces kept single)."""
    s = answer.strip().replace("\n", " ").replace("\\!", "")
    s = re.sub(r"\\[dt]frac", r"\\frac", s)
    s = re.sub(r"\\(left|right)(?![a-zA-Z])", "", s).replace("\\displaystyle", "")
    s = re.sub(r"(?<!\\)\\(,|;|:| |quad|qquad)(?![a-zA-Z])", " ", s)  # spacing commands
    s = re.sub(r"\^(?:\s*\{)?\s*\\circ\s*\}?", "", s).replace("\\circ", "")  # degrees (linear: one \s* run)
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"(\\(?:text|mbox|mathrm)\{\s[^{}]*\}\s*)+$", "", s)  # units: \text{ cm} at the end
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{([^{}]*)\}", r"\1", s)  # other \text{...} wrappers
    s = re.sub(rf"(?<=[\d}}])\s*(?:{_UNITS}\b\s*)+(\^\s*\{{?[23]\}}?)?\.?$", "", s)  # 5 cm, 3 square feet
    var = re.fullmatch(r"\s*[a-zA-Z](?:_\{?\w+\}?)?\s*=\s*([^=]+)", s)  # x = 5, y_1 = 2
    if var:
        s = var.group(1)
    s = re.sub(r"\s+", " ", s).strip().rstrip(".").strip()
    compact = s.replace(" ", "").replace("{,}", ",")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d*)?", compact):  # 1,000 / 1,\!000 / 1{,}000
        s = compact.replace(",", "")
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)  # \frac12
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\sqrt(\d|[a-zA-Z](?![a-zA-Z]))", r"\\sqrt{\1}", s)  # \sqrt2
    s = re.sub(r"(?<![\d}])\.(\d)", r"0.\1", s)  # .5
    return s


def reference(record: dict) -> tuple[str, str]:
    """(the reference solution, which must score 1; the same ending in a box no answer equals, which must score 0)."""
    return record.get("solution") or f"\\boxed{{{record['answer']}}}", "The answer is \\boxed{\\text{none of these}}."
