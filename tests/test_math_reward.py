"""MATH grading: the last \\boxed{} answer against the reference, by a hand-written table."""
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from rapid.config import ConfigError
from rapid.rewards import score
from rapid.tasks import math as task

DATA = Path(__file__).parents[2] / "shared" / "data"      # ../shared/data beside the checkout


def need_data():
    if not (DATA / "math" / "train_12k.jsonl").is_file():
        pytest.skip(f"benchmark data not found at {DATA} (the ../shared/data folder beside the checkout)")


# (model's boxed answer, reference answer, equal?) — each normalisation and each symbolic case.
TABLE = [
    ("12", "12", True),
    ("13", "12", False),
    ("\\text{(C)}", "\\text{(C)}", True),                        # multiple choice
    ("(C)", "\\text{(C)}", True),                                # \text{} wrapper
    ("(B)", "\\text{(C)}", False),
    ("10", "10\\text{ inches}", True),                            # units
    ("864", "864 \\mbox{ inches}^2", True),
    ("5.4", "5.4 \\text{ cents}", True),
    ("50\\%", "50", True),                                       # percent
    ("\\$18.90", "18.90", True),                                 # dollars
    ("18.9", "\\$18.90", True),                                   # trailing zero: exact decimal
    ("90^\\circ", "90", True),                                   # degrees
    ("90^{\\circ}", "91", False),
    ("x = 5", "5", True),                                        # variable prefix
    ("y = 2x + 3", "y=2x+3", True),
    ("10080", "10,\\!080", True),                                 # thousands separators
    ("1{,}000", "1000", True),
    ("1,001", "1000", False),
    ("\\dfrac{1}{2}", "\\frac12", True),                          # \dfrac, \frac12 shorthand
    ("\\tfrac{3}{4}", "\\frac{3}{4}", True),
    ("0.5", "\\frac{1}{2}", True),                                # fraction = exact decimal
    ("0.25", "\\frac14", True),
    ("0.333", "\\frac{1}{3}", False),                             # not exactly equal
    (".5", "\\frac{1}{2}", True),
    ("\\left( 3, \\frac{\\pi}{2} \\right)", "(3,\\frac{\\pi}{2})", True),   # \left \right and spaces
    ("(3, \\frac{\\pi}{2})", "(\\frac{\\pi}{2}, 3)", False),      # tuple order matters
    ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}", True),        # surds (symbolic)
    ("2\\sqrt{3}", "\\sqrt{12}", True),
    ("\\sqrt{3}", "\\sqrt{2}", False),
    ("11\\sqrt2", "11\\sqrt{2}", True),
    ("[1, 2)", "[1,2)", True),                                   # intervals keep their brackets
    ("[1, 2]", "[1,2)", False),
    ("(-\\infty, 3]", "(-\\infty,3]", True),
    ("(-\\infty, 3)", "(-\\infty,3]", False),
    ("x^2+2x+1", "(x+1)^2", True),                               # expressions
    ("x^2+2x", "(x+1)^2", False),
    ("\\frac{4}{6}", "\\frac{2}{3}", True),
    ("-\\frac{1}{2}", "\\frac{1}{2}", False),                     # sign matters
    ("\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}", "\\begin{pmatrix} -1/3 \\\\ 2/3 \\end{pmatrix}", True),
    ("\\text{Evelyn}", "\\text{Evelyn}", True),
    ("Navin", "\\text{Evelyn}", False),
    ("", "5", False),
]


@pytest.mark.parametrize("pred, gold, equal", TABLE)
def test_answer_table(pred, gold, equal):
    assert task.reward(f"so the answer is \\boxed{{{pred}}}.", {"answer": gold}) == float(equal)


def test_table_is_big_and_balanced():
    assert len(TABLE) >= 30 and sum(e for *_, e in TABLE) >= 12 and sum(not e for *_, e in TABLE) >= 12


def test_only_the_last_box_counts_and_no_box_no_credit():
    assert task.reward("\\boxed{5} no wait \\boxed{6}", {"answer": "6"}) == 1.0
    assert task.reward("\\boxed{5} no wait \\boxed{6}", {"answer": "5"}) == 0.0
    assert task.reward("the answer is 5", {"answer": "5"}) == 0.0
    assert task.reward("\\boxed{5", {"answer": "5"}) == 0.0                    # unbalanced


def test_pathological_expression_times_out_to_zero():
    start = time.monotonic()
    record = {"answer": "1", "grading": {"timeout_s": 1.0}}
    assert task.reward("\\boxed{9^{9^{9^{9}}}}", record) == 0.0
    assert time.monotonic() - start < 8.0                  # 1 s limit + killing and (re)starting the checker
    assert task.reward("\\boxed{\\frac{\\sqrt{2}}{2}}", {"answer": "\\frac{1}{\\sqrt{2}}"}) == 1.0  # recovered


def test_symbolic_check_is_safe_in_threads():
    cases = [row for row in TABLE if "sqrt" in row[0] or "x^2" in row[0]] * 3
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(lambda row: task.is_equiv(row[0], row[1]), cases))
    assert got == [row[2] for row in cases]


def test_load_12k_train_and_math500(monkeypatch, capsys):
    need_data()
    monkeypatch.setenv("RAPID_DATA_DIR", str(DATA))
    train, test = task.load("train"), task.load("test", grading_timeout_s=3.0)
    assert len(train) == 11998 and task.DROPPED["train"] == 2         # two empty \boxed{} answers dropped
    assert "dropped 2 of 12000 train records" in capsys.readouterr().out
    assert len(test) == 500 and test[0]["grading"] == {"timeout_s": 3.0}
    assert not {r["unique_id"] for r in train} & {r["unique_id"] for r in test}
    # Every reference solution earns full reward (string path, no sympy needed).
    assert all(task.reward(r["solution"], r) == 1.0 for r in test[:100])


def test_load_from_a_single_file_derives_missing_answers(tmp_path):
    path = tmp_path / "mine.jsonl"
    rows = [{"problem": "1+1?", "solution": "It is \\boxed{2}."}, {"problem": "?", "solution": "\\boxed{}"}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    records = task.load("test", data_path=str(path), unknown_key=1)
    assert [r["answer"] for r in records] == ["2"] and task.DROPPED["test"] == 1


def test_offline_hub_is_one_config_error(monkeypatch):
    monkeypatch.delenv("RAPID_DATA_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)          # as on CI: not installed (never download)
    with pytest.raises(ConfigError, match="RAPID_DATA_DIR"):
        task.load("test")


class PlainTokenizer:
    """A tokenizer without a chat template that remembers the texts it was given."""
    chat_template = None

    def __call__(self, texts, add_special_tokens):
        self.texts = texts
        return {"input_ids": [[0]] * len(texts)}


def test_prompts_plain_template():
    tok = PlainTokenizer()
    task.build_prompts([{"problem": "What is 1+1?"}], tok, system="Box it.", use_chat_template=True)
    assert tok.texts == ["Box it.\n\nProblem: What is 1+1?\nSolution:"]


# --- rewards in parallel (rapid.rewards.score) --------------------------------------------------------
def flaky_reward(completion: str, record: dict) -> float:
    """A checker that hangs, crashes its process, raises, or answers, as the completion says."""
    if completion == "hang":
        time.sleep(600)
    if completion == "die":
        os._exit(3)
    if completion == "raise":
        raise ValueError("broken checker")
    return float(completion == record["answer"])


def test_score_counts_crashes_and_timeouts_as_zero():
    completions = ["1", "hang", "2", "die", "raise", "x", "3", "die", "3"]
    records = [{"answer": a} for a in ["1", "1", "2", "1", "1", "1", "3", "1", "4"]]
    start = time.monotonic()
    rewards, failed = score(flaky_reward, completions, records, workers=2, timeout=2.0)
    assert rewards == [1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0] and failed == 4
    # The pool survives (replaced workers) and is reused for the next call.
    rewards, failed = score(flaky_reward, ["5", "raise"], [{"answer": "5"}] * 2, workers=2, timeout=2.0)
    assert (rewards, failed) == ([1.0, 0.0], 1)
    assert time.monotonic() - start < 60


def test_score_inline_and_with_a_task_module():
    rewards, failed = score(flaky_reward, ["1", "raise"], [{"answer": "1"}] * 2, workers=0)
    assert (rewards, failed) == ([1.0, 0.0], 1)
    records = [{"answer": "\\frac{1}{\\sqrt{2}}"}, {"answer": "1", "grading": {"timeout_s": 1.0}}]
    completions = ["\\boxed{\\frac{\\sqrt{2}}{2}}", "\\boxed{9^{9^{9^{9}}}}"]
    assert score(task, completions, records, workers=2, timeout=30.0) == ([1.0, 0.0], 0)
