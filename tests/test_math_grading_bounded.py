"""Grading is bounded: adversarial answers take linear time, numbers too long for int() or too large to
write out are a failed check (never an exception), and the sympy checker has an address-space limit."""

import time
from pathlib import Path

import pytest

from rapid.tasks import arithmetic, gsm8k, multistep
from rapid.tasks import math as task
from rapid.tasks.grading import (
    MEMORY_LIMIT_BYTES,
    SYMBOLIC,
    GradingError,
    boxed_number_reward,
    last_boxed,
    parse_number,
)

N = 100_000
# Long answers of several shapes; each was chosen to make some pattern backtrack (the first took
# 11.5 s in the former normaliser on its own).
SHAPES = {
    "text units": "\\text{ a}" * (N // 9) + "x",
    "text unit then spaces": "\\text{ a}" + " " * N + "x",
    "unit words": "5" + " cm" * (N // 3) + " x",
    "spaces after a power": "1^" + " " * N + "x",
    "open degree groups": "^ {" * (N // 3),
    "thousands groups": "1" + ",000" * (N // 4) + ",00",
    "thousand marks": "1,\\!" * (N // 4),
    "comma then spaces": "1," + " " * N + "x",
    "open braces": "\\frac" + "{" * N,
    "open brackets": "(" * N,
    "equals": "x=" * (N // 2),
    "plus-minus": "1\\pm" * (N // 4),
    "juxtaposed numbers": "1 " * (N // 2),
    "letters": "a" * N,
    "decimals": ".1" * (N // 2),
    "digits": "9" * N,
    "connectives": "or and maybe " * (N // 13),
    "mixed numbers": "1\\frac{1}{2}" * (N // 11),
}


@pytest.fixture(scope="module", autouse=True)
def warm_checker():
    SYMBOLIC.equal("1", "1", 120.0)  # start the checker now: its start-up is not grading time


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_long_adversarial_answers_are_graded_in_bounded_time(shape):
    answer = SHAPES[shape]
    start = time.perf_counter()
    task.normalize(answer)
    task.read_values(task.normalize(answer))
    assert task.reward(f"\\boxed{{{answer}}}", {"answer": "5", "grading": {"timeout_s": 5.0}}) == 0.0
    task.is_equiv(answer[: task.MAX_ANSWER_CHARS], "5", 5.0)  # under the cap: every rule runs
    parse_number(answer)
    assert time.perf_counter() - start < 2.0


def test_an_answer_over_the_cap_scores_zero_unread():
    padded = "5" + "\\," * task.MAX_ANSWER_CHARS  # 5 followed by spacing: correct, but too long
    assert task.reward(f"\\boxed{{{padded}}}", {"answer": "5"}) == 0.0
    assert task.reward("\\boxed{5\\,\\,}", {"answer": "5"}) == 1.0


BIG = "9" * 5000  # over Python's 4,300-digit limit for int()
HUGE = [
    f"\\frac{{{BIG}}}{{3}}",
    f"\\frac{{1}}{{{BIG}}}",
    f"\\dfrac{{{BIG}}}{{{BIG}}}",
    f"-\\frac{{{BIG}}}{{7}}",
    BIG,
    f"0.{BIG}",
    f"{BIG}/7",
    "1" + ",000" * 2000,
    f"2\\frac{{{BIG}}}{{3}}",
    f"2^{{{BIG}}}",
    "10^{10^{10}}",
    "9^{99999}",
    f"\\text{{{BIG}}}",
]


@pytest.mark.parametrize("i", range(len(HUGE)))
def test_numbers_too_large_are_a_failed_check_for_every_numeric_task(i):
    answer = HUGE[i]
    completion = f"The answer is \\boxed{{{answer}}}."
    start = time.perf_counter()
    assert parse_number(answer) is None
    assert task.exact_number(answer) is None
    assert boxed_number_reward(completion, "5") == 0.0
    assert arithmetic.reward(completion, {"answer": "5"}) == 0.0
    assert multistep.reward(completion, {"answer": "5"}) == 0.0
    assert gsm8k.reward(completion, {"final_answer": "5"}) == 0.0
    assert gsm8k.reward(f"so it is {answer}", {"final_answer": "5"}) == 0.0
    assert time.perf_counter() - start < 2.0


def test_math_reward_on_huge_numbers_is_a_verdict_not_an_exception():
    for answer in HUGE[:8]:  # exact numbers beyond int(): no sympy call, no exception
        assert task.reward(f"\\boxed{{{answer}}}", {"answer": "5", "grading": {"timeout_s": 5.0}}) == 0.0
    assert task.exact_number("2^{10}") == 1024 and task.exact_number("-2^{3}") == -8
    assert task.exact_number("2^{99999}") is None  # over 10,000 bits: not written out in the parent


def test_parsers_take_any_input():
    for junk in (None, 5, b"5", ["5"], "", "}", "\\boxed{", "\\frac{1}{0}", "1/0", "\\frac{}{}", "--5", "1e999999999"):
        assert boxed_number_reward(junk, "5") == 0.0
        assert gsm8k.reward(junk, {"final_answer": "5"}) == 0.0
        assert task.reward(junk, {"answer": "5"}) == 0.0
        assert parse_number(junk) is None
    assert last_boxed("\\boxed 7.") == "7" and last_boxed("\\boxed{1} \\boxed 2") == "2"


@pytest.mark.parametrize(
    "text, want",
    [
        ("12", 12),
        (" 1,234 ", 1234),
        ("1{,}234.5", 2469 / 2),
        ("1,\\!000,\\!000", 10**6),
        ("\\$5", 5),
        ("\\frac{6}{4}", 1.5),
        ("1 2", None),  # two numbers, not 12
        ("1, 000", None),  # a list of two, not 1000
        ("12,34", None),  # not whole groups of three
        ("1234,567", None),
        ("1,0000", None),
    ],
)
def test_parse_number_reads_thousands_only_in_whole_groups(text, want):
    assert parse_number(text) == want


def test_gsm8k_box_with_several_numbers_holds_no_answer():
    assert gsm8k.reward("\\boxed{12 or 18}", {"final_answer": "18"}) == 0.0
    assert gsm8k.reward("\\boxed{18, 12}", {"final_answer": "18"}) == 0.0
    assert gsm8k.reward("\\boxed{1, 000}", {"final_answer": "1000"}) == 0.0
    assert gsm8k.reward("\\boxed{18 eggs}", {"final_answer": "18"}) == 1.0
    assert gsm8k.reward("\\boxed{\\$1,000}", {"final_answer": "1000"}) == 1.0


def test_the_symbolic_checker_has_an_address_space_limit():
    assert SYMBOLIC.equal("\\frac{1}{\\sqrt{2}}", "\\frac{\\sqrt{2}}{2}", 60.0)
    limits = Path(f"/proc/{SYMBOLIC._proc.pid}/limits").read_text()
    line = next(row for row in limits.splitlines() if row.startswith("Max address space"))
    assert line.split()[3:5] == [str(MEMORY_LIMIT_BYTES)] * 2  # soft and hard limit


@pytest.mark.slow
def test_one_grade_shares_its_time_limit_among_its_values():
    """Eight values that each take sympy about a second (here) are one grade of at most `timeout_s`,
    not eight: the whole grade raises GradingError once the time is spent."""
    pred = ", ".join(f"(x+{k})^{{300}}" for k in range(1, 9))
    gold = ", ".join(f"x+{k}" for k in range(1, 9))
    start = time.monotonic()
    with pytest.raises(GradingError, match="math-verify took over 1 s"):
        task.is_equiv(pred, gold, 1.0, "Find all the roots.")
    assert time.monotonic() - start < 4.0  # 1 s, and killing the checker (the values one by one: ~8 s)
