"""GSM8K grade-school word problems (7,473 train / 1,319 test), graded on the final number.

Data: `gsm8k/{train,test}.jsonl` (see `rapid.tasks.datasets`), on the Hub `openai/gsm8k:main`.
The reference is `final_answer`: the number after `####` in the worked solution, commas removed
(derived the same way when a source lacks the field).

Grading reads the final answer into exactly one number, or into nothing (docs/grading.md, "GSM8K and
the numeric tasks"):

1. The final answer is the content of the completion's last `\\boxed{}` (MATH's rule: not a box inside
   another box); in a completion with no box, the rest of the line after its last `####` (the
   dataset's own convention). A completion with neither, or with a box that does not close, has none:
   a number left in the prose is not an answer (`5 eggs, or 6 if ...` would otherwise pay 6).
2. The final answer must be one number (`rapid.tasks.grading.read_number`): an integer, a decimal, a
   number with thousands commas in whole groups of three (`1,234`; `1, 234` is two numbers), a fraction
   (`\\frac{3}{4}`, `3/4`), optionally negative, optionally after a dollar sign. Anything else scores 0:
   a second number (`5 or 6`, `5-6`), an operator or relation (`x = 5`, `5+`, `\\approx 5`), a tilde
   before the number (`~5`), scientific notation.
3. Words after the number are allowed only as the unit the question asks for: the words after its "how
   many" / "how much" and of an "in ..." phrase (MATH's `_asked_units`), `dollars` where the question
   uses dollars, `percent` / `%` only where it asks for a percentage ("what ... percent", "in percent"),
   `cents` only where it asks in cents. Never a magnitude (`million`, `dozen`, `k`), a fraction or power
   word (`half`, `tenths`, `squared`) or a hedge (`or more`, `about`, `at least`), even where the question
   holds that word (`5 dozen` for "how many dozen" scores 0).
4. Reward 1.0 if the number equals the reference exactly (as a fraction: `18`, `18.0`, `\\$18.00` are
   equal), else 0.0.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rapid.tasks import encode_prompts
from rapid.tasks.datasets import load_split, require_fields
from rapid.tasks.grading import parse_number, read_number
from rapid.tasks.math import _NOT_UNITS, _asked_units, _unit_key
from rapid.tasks.math import final_answer as final_box

FILES = {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}
HUB = {"train": "openai/gsm8k:main@train", "test": "openai/gsm8k:main@test"}

# words that change a number or hedge it, never a unit, whatever the question says (beyond MATH's
# _NOT_UNITS), spelled as `_unit_key` spells a unit (`plus` as `plu`, `tenths` as `tenth`)
NOT_UNITS = _NOT_UNITS | frozenset(
    key
    for word in (
        "k mn mil mill bn grand lakh crore score gross couple few several some ish approx around circa plus minus "
        "odd point twice thrice double triple halves third quarter fourth fifth sixth seventh eighth ninth tenth "
        "hundredth thousandth millionth squared cubed power percentage cent"
    ).split()
    for key in _unit_key(word, False)
)
_ASKS_PERCENT = re.compile(r"\b(?:what|which|how (?:many|much))\b[^.?!]{0,60}?\bpercent|\b(?:in|as an?) percent", re.I)
_ASKS_CENTS = re.compile(r"\bhow (?:many|much)\b[^.?!]{0,30}?\bcents\b|\bin cents\b", re.I)


def load(split: str, data_path: str | None = None, **_) -> list[dict]:
    """Records {"question", "answer" (worked solution), "final_answer"} of 'train' or 'test'."""
    records = load_split("gsm8k", split, FILES, HUB, data_path)
    require_fields(records, ("question", "answer"), "gsm8k")
    for r in records:
        if "final_answer" not in r:
            found = re.search(r"#### (-?[0-9.,]+)", r["answer"])
            r["final_answer"] = found.group(1).strip().replace(",", "") if found else ""
    return records


def build_prompts(
    records: list[dict], tokenizer, system: str = "", use_chat_template: bool = True, **_
) -> list[list[int]]:
    """The question as the user turn (or 'Question: ...\\nAnswer:' without a chat template)."""
    return encode_prompts(
        [r["question"] for r in records], tokenizer, system, use_chat_template, plain_format="Question: {text}\nAnswer:"
    )


def final_answer(completion: str) -> str | None:
    """The text of the final answer (rule 1): the last box, else the rest of the last `####` line, else None."""
    if not isinstance(completion, str):
        return None
    if re.search(r"\\(?:boxed|fbox)(?![a-zA-Z])", completion):
        return final_box(completion)
    at = completion.rfind("####")
    return None if at < 0 else completion[at + 4 :].split("\n", 1)[0]


def asked_units(question: str) -> set[str]:
    """The unit words (as `_unit_key` spells them) an answer to `question` may carry (rule 3)."""
    asked = _asked_units(question)
    units = asked - NOT_UNITS | asked & {"degree"}
    if re.search(r"\$|\bdollars?\b", question, re.I):
        units.add("dollar")
    if _ASKS_PERCENT.search(question):
        units.add("percent")
    if _ASKS_CENTS.search(question):
        units.add("cent")
    return units


def extract_answer(completion: str, question: str = "") -> Fraction | None:
    """The one number of the final answer (rules 1-3), or None. Never raises."""
    text = final_answer(completion)
    read = read_number(text) if text is not None else None
    if read is None:
        return None
    value, unit = read
    if unit and not set(_unit_key(unit, False)) <= asked_units(question):
        return None
    return value


def reward(completion: str, record: dict) -> float:
    """1.0 if the extracted answer equals the reference final answer, else 0.0."""
    got = extract_answer(completion, str(record.get("question") or ""))
    want = parse_number(str(record["final_answer"]))
    return float(got is not None and want is not None and got == want)


def reference(record: dict) -> tuple[str, str]:
    """(the reference answer boxed, which must score 1; a different number boxed, which must score 0)."""
    wrong = parse_number(record["final_answer"]) + 1 if parse_number(record["final_answer"]) is not None else 1
    return f"The answer is \\boxed{{{record['final_answer']}}}.", f"The answer is \\boxed{{{wrong}}}."
