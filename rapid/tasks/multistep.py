"""Multi-step addition with the working written out: a task with long completions that needs no
download (the speed-up benchmark's task: tools/bench_rl.py --preset long).

A problem is a list of `terms` numbers drawn from [low, high]; the question is "Add: 7 + 3 + 9 + 4".
The solved examples in the prompt show the working one step a line, carrying a running total,

    Step 1: the total so far is 7; add 3: 7 + 3 = 10.
    Step 2: the total so far is 10; add 9: 10 + 9 = 19.
    Step 3: the total so far is 19; add 4: 19 + 4 = 23.
    The answer is \\boxed{23}.

so a completion that follows them is ~20 tokens a step. Only the final answer is graded: 1 if the
last \\boxed{} holds exactly the sum, else 0 (`rapid.tasks.grading.boxed_number_reward`). A weak model drops,
merges or repeats terms, or adds wrongly; RL has to make it keep count. Measured with the offline
SmolLM2-135M-Instruct and conf/task/multistep.yaml (five terms from 1-9, one solved example), on 64
held-out problems: greedy accuracy 0.27 with ~120-token completions, 0.09 sampled at T = 0.7; with four
terms 0.72 and 0.25 (~90 tokens), with six 0.06.

The problem set is `n_train + n_eval` distinct term lists drawn with `seed`; the first `n_eval` are
held out, the rest train, and the prompt's solved examples come from the training split.
"""

from __future__ import annotations

import random

from rapid.config import ConfigError
from rapid.tasks import encode_prompts
from rapid.tasks.grading import boxed_number_reward


def load(
    split: str,
    terms: int = 4,
    low: int = 1,
    high: int = 9,
    n_train: int = 2000,
    n_eval: int = 200,
    seed: int = 1234,
    **_,
) -> list[dict]:
    """Records {"question", "answer", "terms"} of the 'train' or 'test' split."""
    if split not in ("train", "test"):
        raise ConfigError(f"unknown split '{split}' for task multistep: use 'train' or 'test'")
    if terms < 2 or low > high:
        raise ConfigError(
            f"task.terms={terms}, task.low={low}, task.high={high}: a problem needs at least 2 "
            "terms drawn from a non-empty range low <= high"
        )
    space = (high - low + 1) ** terms
    if n_train + n_eval > space // 2:
        raise ConfigError(
            f"task.n_train + task.n_eval = {n_train + n_eval} is more than half of the {space} "
            "possible problems: widen task.low/task.high, add task.terms or ask for fewer problems"
        )
    rng, seen, problems = random.Random(seed), set(), []
    while len(problems) < n_train + n_eval:
        xs = tuple(rng.randint(low, high) for _ in range(terms))
        if xs not in seen:
            seen.add(xs)
            problems.append(xs)
    chosen = problems[:n_eval] if split == "test" else problems[n_eval:]
    return [
        {"question": "Add: " + " + ".join(map(str, xs)), "answer": str(sum(xs)), "terms": list(xs)} for xs in chosen
    ]


def working(terms: list[int]) -> str:
    """The written solution of one problem: one step a line, then the boxed sum."""
    lines, total = [], terms[0]
    for i, x in enumerate(terms[1:], 1):
        lines.append(f"Step {i}: the total so far is {total}; add {x}: {total} + {x} = {total + x}.")
        total += x
    return "\n".join(lines) + f"\nThe answer is \\boxed{{{total}}}."


def build_prompts(
    records: list[dict],
    tokenizer,
    system: str = "",
    n_shots: int = 1,
    shots_seed: int = 0,
    use_chat_template: bool = True,
    **cfg,
) -> list[list[int]]:
    """Token ids of each record's prompt: optional system message, `n_shots` solved training problems
    (the same for every prompt) as earlier turns, then the question."""
    shots = random.Random(shots_seed).sample(load("train", **cfg), n_shots) if n_shots else []
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        head = [{"role": "system", "content": system}] if system else []
        for s in shots:
            head += [{"role": "user", "content": s["question"]}, {"role": "assistant", "content": working(s["terms"])}]
        texts = [
            tokenizer.apply_chat_template(
                head + [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
            )
            for r in records
        ]
        return tokenizer(texts, add_special_tokens=False)["input_ids"]
    solved = "".join(f"Question: {s['question']}\nAnswer: {working(s['terms'])}\n\n" for s in shots)
    return encode_prompts(
        [r["question"] for r in records],
        tokenizer,
        system,
        use_chat_template=False,
        plain_format=solved.replace("{", "{{").replace("}", "}}") + "Question: {text}\nAnswer:",
    )


def reward(completion: str, record: dict) -> float:
    return boxed_number_reward(completion, record["answer"])


def reference(record: dict) -> tuple[str, str]:
    """(the written solution, which must score 1; the same with the last step off by one, which must score 0)."""
    right = working(record["terms"])
    return right, right.replace(f"\\boxed{{{record['answer']}}}", f"\\boxed{{{int(record['answer']) + 1}}}")
