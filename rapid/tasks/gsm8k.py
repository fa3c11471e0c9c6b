"""GSM8K grade-school word problems (7,473 train / 1,319 test), graded on the final number.

Data: `gsm8k/{train,test}.jsonl` (see `rapid.tasks.datasets`), on the Hub `openai/gsm8k:main`.
The reference is `final_answer`: the number after `####` in the worked solution, commas removed
(derived the same way when a source lacks the field).

Grading: the model's answer is the number in the last `\\boxed{}` if there is one (a box holding
several numbers, `12 or 18`, `1, 000`, holds no answer), else the last number in the completion;
thousands commas in whole groups of three (`1,234`) and `$` are ignored. Reward 1.0 if it equals the
reference exactly (as a fraction: `18`, `18.0` and `18.00` are equal), else 0.0.
"""

from __future__ import annotations

import re
from fractions import Fraction

from rapid.tasks import encode_prompts
from rapid.tasks.datasets import load_split, require_fields
from rapid.tasks.grading import last_boxed, parse_number

FILES = {"train": "gsm8k/train.jsonl", "test": "gsm8k/test.jsonl"}
HUB = {"train": "openai/gsm8k:main@train", "test": "openai/gsm8k:main@test"}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


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


def extract_answer(completion: str) -> Fraction | None:
    """The number in the last \\boxed{} (the only number in it, when it holds words too: `18 eggs`; a box
    with several numbers, `12 or 18`, gives none), else the last number of the text. Never raises."""
    if not isinstance(completion, str):
        return None
    boxed = last_boxed(completion)
    if boxed is not None:
        value = parse_number(boxed)
        if value is not None:
            return value
        numbers = _NUMBER.findall(boxed)
        return parse_number(numbers[0].rstrip(",")) if len(numbers) == 1 else None
    numbers = _NUMBER.findall(completion)
    return parse_number(numbers[-1].rstrip(",")) if numbers else None


def reward(completion: str, record: dict) -> float:
    """1.0 if the extracted answer equals the reference final answer, else 0.0."""
    got, want = extract_answer(completion), parse_number(record["final_answer"])
    return float(got is not None and want is not None and got == want)


def reference(record: dict) -> tuple[str, str]:
    """(the reference answer boxed, which must score 1; a different number boxed, which must score 0)."""
    wrong = parse_number(record["final_answer"]) + 1 if parse_number(record["final_answer"]) is not None else 1
    return f"The answer is \\boxed{{{record['final_answer']}}}.", f"The answer is \\boxed{{{wrong}}}."
