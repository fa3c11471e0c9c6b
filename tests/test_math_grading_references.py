"""Every reference solution of MATH (the 12k training split and MATH-500) scores 1 through the full
reward path, its corrupted twin scores 0, and the list answers of problems asking for all solutions
score 1 in reverse order too, and the grammar reads every reference value but a few written shapes.
The sweep takes a few seconds (no reference needs sympy), so it runs with the fast tests."""

import json
import time
from pathlib import Path

import pytest

from rapid.tasks import math as task

DATA = Path(__file__).parents[2] / "shared" / "data"  # ../shared/data beside the checkout
FILES = ("math/train_12k.jsonl", "math500/test.jsonl")


@pytest.fixture(scope="module")
def records():
    if not all((DATA / f).is_file() for f in FILES):
        pytest.skip(f"benchmark data not found at {DATA} (the ../shared/data folder beside the checkout)")
    rows = [json.loads(line) for f in FILES for line in (DATA / f).read_text().splitlines()]
    rows = [{**r, "grading": {"timeout_s": 60.0}} for r in rows if r["answer"].strip()]
    assert len(rows) == 12_498  # 12,000 + 500, less the two empty answers of the 12k split
    return rows


def test_every_reference_solution_scores_and_its_corrupted_twin_does_not(records):
    start = time.monotonic()
    wrong = [r["unique_id"] for r in records if task.reward(r["solution"], r) != 1.0]
    assert wrong == []
    assert time.monotonic() - start < 60.0
    twin = task.reference(records[0])[1]
    assert all(task.reward(twin, r) == 0.0 for r in records)


def test_every_reference_answer_scores_in_another_spelling(records):
    """\\frac as \\dfrac, and the values of an unordered list answer in reverse order."""
    dfrac = [r for r in records if "\\frac" in r["answer"]]
    assert len(dfrac) > 1900
    wrong = [
        r["unique_id"]
        for r in dfrac
        if task.reward("\\boxed{" + r["answer"].replace("\\frac", "\\dfrac") + "}", r) != 1
    ]
    assert wrong == []
    reversed_lists = []
    for r in records:
        values, _ = task._gold_values(task.normalize(r["answer"]), r["problem"])
        items = [v.text + (f"\\text{{ {v.unit}}}" if v.unit else "") for v in values]
        if len(items) > 1 and task._UNORDERED.search(r["problem"]) and not task._ORDERED.search(r["problem"]):
            reversed_lists.append((r, ", ".join(reversed(items))))
    assert len(reversed_lists) > 100
    wrong = [r["unique_id"] for r, answer in reversed_lists if task.reward(f"\\boxed{{{answer}}}", r) != 1.0]
    assert wrong == []


def test_the_grammar_reads_every_reference_answer_outside_a_few_written_shapes(records):
    """Each reference value is read by the grammar into a tree that equals itself, except answers in
    words, numerals in a base and `\\approx` statements (compared by their own rules) and five answers
    the grammar does not read (matched by spelling only)."""
    unread, read = set(), 0
    for r in records:
        gold = task.normalize(r["answer"])
        if task._is_text_answer(gold) or "\\approx" in gold:
            continue
        values, _ = task._gold_values(gold, r["problem"])
        for v in values:
            if task._NUMERAL.fullmatch(task.unwrap_text(v.text).replace(" ", "")):
                continue
            tree = task.parse(list(v.tokens))
            if tree is None:
                unread.add(r["answer"])
                continue
            read += 1
            assert task._tree_equal(tree, tree, 60.0, r["problem"]), r["unique_id"]
    assert read > 12_000
    assert unread == {
        "\\begin{pmatrix} 1 & -1 \\\\ 1 & \\phantom -1 \\end{pmatrix}",  # \phantom
        "\\text{1:03 PM}",  # dates and times written inside \\text
        "\\text{4:30 p.m.}",
        "\\text{June 20}",
        "\\text{October 30}",
    }
