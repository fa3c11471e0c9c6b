"""Procedurally generated arithmetic, graded on the last \\boxed{} (not inside another box), which must
hold exactly the right number and nothing else but a leading `\\$` (`rapid.tasks.grading.boxed_number_reward`).
Needs no download: the offline default task.

The problem set is every expression `a op b` with operands in [low, high] and op in `ops`. It
is shuffled with `seed` and split once: the first `n_eval` problems are held out for
evaluation, the rest form the training set, and the few-shot examples of the prompt are taken
from the training set.
"""

from __future__ import annotations

import itertools
import random

from rapid.config import ConfigError
from rapid.tasks.grading import boxed_number_reward

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def load(
    split: str, low: int = 0, high: int = 9, ops: tuple[str, ...] = ("+",), n_eval: int = 256, seed: int = 1234, **_
) -> list[dict]:
    """Records {"question", "answer", "a", "b", "op"} of the 'train' or 'test' split."""
    if split not in ("train", "test"):
        raise ConfigError(f"unknown split '{split}' for task arithmetic: use 'train' or 'test'")
    unknown = set(ops) - set(_OPS)
    if unknown:
        raise ConfigError(f"unknown operators {sorted(unknown)} in task.ops: choose from {sorted(_OPS)}")
    problems = [(a, op, b) for op in ops for a, b in itertools.product(range(low, high + 1), repeat=2)]
    if n_eval >= len(problems):
        raise ConfigError(
            f"task.n_eval={n_eval} leaves no training problems out of {len(problems)}: "
            "widen task.low/task.high or lower task.n_eval"
        )
    random.Random(seed).shuffle(problems)
    chosen = problems[:n_eval] if split == "test" else problems[n_eval:]
    return [
        {"question": f"What is {a} {op} {b}?", "answer": str(_OPS[op](a, b)), "a": a, "b": b, "op": op}
        for a, op, b in chosen
    ]


def build_prompts(
    records: list[dict],
    tokenizer,
    system: str = "",
    n_shots: int = 1,
    shots_seed: int = 0,
    use_chat_template: bool = True,
    **cfg,
) -> list[list[int]]:
    """Token ids of each record's prompt: optional system message, `n_shots` solved training
    examples (the same for every prompt), then the question."""
    shots = random.Random(shots_seed).sample(load("train", **cfg), n_shots) if n_shots else []
    chat = use_chat_template and tokenizer.chat_template
    texts = []
    for record in records:
        if chat:
            messages = [{"role": "system", "content": system}] if system else []
            for s in shots:
                messages += [
                    {"role": "user", "content": s["question"]},
                    {"role": "assistant", "content": f"\\boxed{{{s['answer']}}}"},
                ]
            messages.append({"role": "user", "content": record["question"]})
            texts.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
        else:
            text = (system + "\n\n" if system else "") + "".join(
                f"Question: {s['question']}\nAnswer: \\boxed{{{s['answer']}}}\n\n" for s in shots
            )
            texts.append(text + f"Question: {record['question']}\nAnswer:")
    return tokenizer(texts, add_special_tokens=False)["input_ids"]


def reward(completion: str, record: dict) -> float:
    return boxed_number_reward(completion, record["answer"])


def reference(record: dict) -> tuple[str, str]:
    """(a completion that must score 1, one that must score 0) for the reward self-test."""
    return f"The answer is \\boxed{{{record['answer']}}}.", f"The answer is \\boxed{{{int(record['answer']) + 1}}}."
