"""GSM8K and the numeric tasks read the final answer into exactly one number or into nothing: wrong
answers by class score 0, correct spellings of the same number score 1 (docs/grading.md)."""

import json
from pathlib import Path

import pytest

from rapid.tasks import arithmetic, grading, gsm8k, multistep

DATA = Path(__file__).parents[2] / "shared" / "data"  # ../shared/data beside the checkout
EGGS = "Janet's ducks lay 16 eggs per day and she sells them at $2 each. How many eggs does she sell every day?"
INCHES = "A board is cut into 4 pieces. How long is each piece in inches?"
SHARE = "Of 40 students, 10% walk. What percentage of the students ride a bus?"
MONEY = "Tom has $3 and earns 75 cents an hour. How many dollars does he have after 4 hours?"


def grade(answer: str, gold: str = "5", question: str = EGGS) -> float:
    return gsm8k.reward(answer, {"final_answer": gold, "question": question})


# (completion, gold, question) triples that must score 0; all but two (`#### 4-5`, `\boxed{\boxed{4} or 5}`)
# scored 1 under the grader that took "the one number in the box, else the last number of the text"
WRONG = {
    "magnitudes": [
        ("\\boxed{5 million}", "5", EGGS),
        ("\\boxed{5 \\text{ million}}", "5", EGGS),
        ("\\boxed{5\\text{ thousand eggs}}", "5", EGGS),
        ("\\boxed{5k}", "5", EGGS),
        ("\\boxed{5 K}", "5", EGGS),
        ("\\boxed{5 dozen}", "5", EGGS),
        ("\\boxed{5 \\text{ dozen eggs}}", "5", EGGS),
        ("\\boxed{5 hundred}", "5", EGGS),
        ("\\boxed{5 bn}", "5", EGGS),
        ("\\boxed{5 grand}", "5", MONEY),
        ("\\boxed{5 squared}", "5", EGGS),
        ("\\boxed{5 tenths}", "5", EGGS),
        ("\\boxed{5 \\text{ halves}}", "5", EGGS),
        ("\\boxed{5 \\text{ dozen}}", "5", "How many dozen eggs does she sell?"),  # even where asked
        ("#### 5 million", "5", EGGS),
    ],
    "hedges": [
        ("\\boxed{5 \\text{ or more}}", "5", EGGS),
        ("\\boxed{5 or fewer}", "5", EGGS),
        ("\\boxed{at least 5}", "5", EGGS),
        ("\\boxed{about 5}", "5", EGGS),
        ("\\boxed{\\text{approximately } 5}", "5", EGGS),
        ("\\boxed{~5}", "5", EGGS),
        ("\\boxed{\\$~5}", "5", MONEY),
        ("\\boxed{\\approx 5}", "5", EGGS),
        ("\\boxed{\\sim 5}", "5", EGGS),
        ("\\boxed{5+}", "5", EGGS),
        ("\\boxed{>5}", "5", EGGS),
        ("\\boxed{\\ge 5}", "5", EGGS),
        ("\\boxed{5?}", "5", EGGS),
        ("\\boxed{maybe 5}", "5", EGGS),
        ("\\boxed{5 \\text{ roughly}}", "5", EGGS),
        ("\\boxed{5ish}", "5", EGGS),
        ("\\boxed{up to 5}", "5", EGGS),
        ("#### 4 or 5", "5", EGGS),
        ("#### 4 to 5", "5", EGGS),
        ("#### 4-5", "5", EGGS),
        ("#### about 5", "5", EGGS),
    ],
    "equations and other variables": [
        ("\\boxed{x = 5}", "5", EGGS),
        ("\\boxed{n=5}", "5", EGGS),
        ("\\boxed{5 = e}", "5", EGGS),
        ("\\boxed{5x}", "5", EGGS),
        ("\\boxed{x_5}", "5", EGGS),
        ("\\boxed{5!}", "5", EGGS),
        ("\\boxed{-(-5)}", "-5", EGGS),
        ("\\boxed{\\sqrt{5}}", "5", EGGS),
        ("\\boxed{5 \\%}", "5", EGGS),  # a percentage where a count is asked
        ("#### x = 5", "5", EGGS),
    ],
    "other units": [
        ("\\boxed{5 \\text{ feet}}", "5", INCHES),
        ("\\boxed{5 ft}", "5", INCHES),
        ("\\boxed{5 \\text{ cents}}", "5", MONEY),
        ("\\boxed{5\\%}", "5", MONEY),
        ("\\boxed{5\\%}", "5", "20% of the eggs break. How many eggs are left?"),  # % in the question, not asked
        ("\\boxed{5 hours}", "5", EGGS),
        ("\\boxed{5 \\text{ eggs per week}}", "5", EGGS),
    ],
    "answers outside a final box or #### line": [
        ("I'm not sure: 4, or maybe 5.", "5", EGGS),
        ("So she sells 5 eggs.", "5", EGGS),
        ("\\boxed{4 \\text{ or } \\boxed{5}}", "5", EGGS),  # a box inside a box
        ("\\boxed{\\boxed{4} or 5}", "5", EGGS),
        ("#### 4\n#### 4 or 5", "5", EGGS),
    ],
}

# spellings of the right number that must score 1
RIGHT = [
    ("\\boxed{5}", "5", EGGS),
    ("\\boxed{ 5. }", "5", EGGS),
    ("$\\boxed{5}$", "5", EGGS),
    ("\\boxed{5.00}", "5", EGGS),
    ("\\boxed{\\text{5}}", "5", EGGS),
    ("\\boxed{5 eggs}", "5", EGGS),
    ("\\boxed{5 \\text{ eggs}}", "5", EGGS),
    ("\\boxed{5~\\text{eggs}}", "5", EGGS),
    ("\\boxed{5 \\text{ eggs every day}}", "5", EGGS),
    ("\\boxed{\\$5}", "5", MONEY),
    ("\\boxed{\\$5.00}", "5", MONEY),
    ("\\boxed{5 dollars}", "5", MONEY),
    ("\\boxed{5 \\text{ inches}}", "5", INCHES),
    ("\\boxed{5 in}", "5", INCHES),
    ("\\boxed{25\\%}", "25", SHARE),
    ("\\boxed{25 \\text{ percent}}", "25", SHARE),
    ("\\boxed{25\\%}", "25", "Of 40 students, 10 walk. Give the share who ride a bus, in percent."),
    ("\\boxed{-\\$5}", "-5", MONEY),
    ("\\boxed{\\$-5}", "-5", MONEY),
    ("\\boxed{1,234}", "1234", EGGS),
    ("\\boxed{1{,}234}", "1234", EGGS),
    ("\\boxed{1,234,567 \\text{ eggs}}", "1234567", EGGS),
    ("\\boxed{10\\,000}", "10000", EGGS),
    ("\\boxed{1,\\!234.50}", "1234.5", EGGS),
    ("\\boxed{\\frac{3}{4}}", "0.75", EGGS),
    ("\\boxed{\\dfrac{3}{4} \\text{ eggs}}", "0.75", EGGS),
    ("\\boxed{3/4}", "0.75", EGGS),
    ("\\boxed{.5}", "0.5", EGGS),
    ("\\boxed 5", "5", EGGS),
    ("\\boxed{4} and then \\boxed{5}", "5", EGGS),  # the last box counts
    ("She sells 16 - 3 - 4 = 9 eggs.\n#### 5", "5", EGGS),
    ("#### 5 eggs\n\nQuestion: how many hens?", "5", EGGS),  # only the #### line is read
    ("#### 1,234", "1234", EGGS),
]


@pytest.mark.parametrize("cls", sorted(WRONG))
def test_wrong_answers_score_zero_by_class(cls):
    scored = [case for case in WRONG[cls] if grade(case[0], case[1], case[2]) != 0.0]
    assert scored == []


@pytest.mark.parametrize("completion, gold, question", RIGHT)
def test_correct_spellings_score_one(completion, gold, question):
    assert grade(completion, gold, question) == 1.0


def test_a_wrong_number_scores_zero_in_every_correct_spelling():
    for completion, gold, question in RIGHT:
        assert grade(completion, str(float(gold) + 1), question) == 0.0, completion


def test_units_come_from_the_question():
    assert grade("\\boxed{5 eggs}", question="") == 0.0  # no question: no unit
    assert grade("\\boxed{5}", question="") == 1.0
    assert grade("\\boxed{\\$5}", question="") == 1.0  # a dollar sign changes no number
    assert gsm8k.asked_units(EGGS) >= {"egg", "dollar"} and "percent" not in gsm8k.asked_units(MONEY)
    assert "percent" in gsm8k.asked_units(SHARE) and "cent" not in gsm8k.asked_units(MONEY)
    assert "cent" in gsm8k.asked_units("How many cents does he save?")


def test_arithmetic_and_multistep_take_one_number_and_nothing_else():
    for reward, record in (
        (arithmetic.reward, {"answer": "12"}),
        (multistep.reward, {"answer": "12", "terms": [5, 7]}),
    ):
        assert reward("\\boxed{12}", record) == 1.0 and reward("\\boxed{\\$12.0}", record) == 1.0
        for wrong in (
            "\\boxed{11 \\text{ or } \\boxed{12}}",
            "\\boxed{\\boxed{11}, 12}",
            "\\boxed{12 million}",
            "\\boxed{12 \\text{ apples}}",
            "\\boxed{~12}",
            "\\boxed{x = 12}",
            "\\boxed{12+}",
            "12",
            "#### 12",
        ):
            assert reward(wrong, record) == 0.0, wrong
    assert grading.boxed_number_reward("\\boxed{11 \\text{ or } \\boxed{12}}", "12") == 0.0


@pytest.mark.parametrize(
    "text, want",
    [
        ("12", (12, "")),
        ("-\\$1,234.5 dollars", (-2469 / 2, "dollars")),
        ("\\frac{-6}{4}", (-1.5, "")),
        ("5 \\text{ or more}", (5, "or more")),  # the unit is returned for the caller to judge
        ("5\\%", (5, "percent")),
        ("5 6", None),
        ("5 or 6", None),
        ("5, 6", None),
        ("1,23", None),
        ("01,234", None),
        ("1,234,5678", None),
        ("1.5,000", None),
        ("1 , 234", None),
        ("\\frac{1}{2.5}", None),
        ("1.5/2", None),
        ("5 \\text{eggs, 6}", None),
        ("\\$\\$5", None),
        ("--5", None),
        ("5\u200b", None),
        ("\uff15", None),
    ],
)
def test_read_number(text, want):
    got = grading.read_number(text)
    assert (got if got is None else (float(got[0]), got[1])) == want


def gsm8k_records(split):
    path = DATA / "gsm8k" / f"{split}.jsonl"
    if not path.is_file():
        pytest.skip(f"benchmark data not found at {path} (the ../shared/data folder beside the checkout)")
    return [json.loads(line) for line in path.read_text().splitlines()]


def attacks(gold: str) -> list[str]:
    """Wrong answers built around a gold number: each is it with a magnitude, a hedge, another number,
    an equation or a nested box."""
    g, other = gold, str(int(gold) + 1) if gold.lstrip("-").isdigit() else gold + "1"
    return [
        f"\\boxed{{{g} million}}",
        f"\\boxed{{{g}\\text{{ thousand}}}}",
        f"\\boxed{{{g}k}}",
        f"\\boxed{{{g} dozen}}",
        f"\\boxed{{{g} \\text{{ or more}}}}",
        f"\\boxed{{at least {g}}}",
        f"\\boxed{{~{g}}}",
        f"\\boxed{{\\approx {g}}}",
        f"\\boxed{{{g}+}}",
        f"\\boxed{{x = {g}}}",
        f"\\boxed{{{g}x}}",
        f"\\boxed{{{other} \\text{{ or }} \\boxed{{{g}}}}}",
        f"The answer is {other}, or maybe {g}.",
        f"#### {other} or {g}",
        f"#### {other}-{g}",
        f"#### about {g}",
    ]


@pytest.mark.parametrize("split, n", [("train", 7473), ("test", 1319)])
def test_every_reference_scores_one_and_attacks_on_it_zero(split, n):
    records = gsm8k_records(split)
    assert len(records) == n
    paid = []
    for r in records:
        assert gsm8k.reward(r["answer"], r) == 1.0, r["answer"]  # the worked solution, ending "#### N"
        right, wrong = gsm8k.reference(r)
        assert gsm8k.reward(right, r) == 1.0 and gsm8k.reward(wrong, r) == 0.0
    for r in records if split == "test" else records[::10]:  # 16 attacks on each test gold, on every 10th train one
        paid += [a for a in attacks(r["final_answer"]) if gsm8k.reward(a, r) != 0.0]
    assert paid == []


@pytest.mark.parametrize(
    "word", ["k", "grand", "bn", "couple", "twice", "squared", "tenths", "halves", "ish", "approx", "around", "plus"]
)
def test_words_that_change_or_hedge_a_number_are_no_unit_even_where_the_question_holds_them(word):
    question = f"How many {word} eggs does she sell every day?"
    assert grade(f"\\boxed{{5 {word}}}", question=question) == 0.0
    assert grade(f"\\boxed{{5 \\text{{ {word} eggs}}}}", question=question) == 0.0
    assert grade("\\boxed{5 eggs}", question=question) == 1.0
