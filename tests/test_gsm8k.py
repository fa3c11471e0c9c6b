"""GSM8K grading: the one number of the last \\boxed{} or else of the last `####` line, against the reference
(the adversarial cases by class are in tests/test_numeric_grading.py)."""

from pathlib import Path

import pytest

from rapid.tasks import gsm8k

DATA = Path(__file__).parents[2] / "shared" / "data"  # ../shared/data beside the checkout


QUESTION = "Janet's ducks lay 16 eggs a day. She sells each for $2. How many eggs does she sell, in total?"


@pytest.mark.parametrize(
    "completion, final, reward",
    [
        ("She makes 9 * 2 = $18 every day.\n#### 18", "18", 1.0),  # the dataset's convention
        ("so \\boxed{18}", "18", 1.0),
        ("\\boxed{\\$18.00}", "18", 1.0),  # dollars, trailing zeros
        ("#### 1,234", "1234", 1.0),  # thousands commas
        ("\\boxed{1,234}", "1234", 1.0),
        ("#### -3", "-3", 1.0),
        ("\\boxed{18 eggs}", "18", 1.0),  # the unit the question asks for
        ("\\boxed{18 \\text{ eggs total}}", "18", 1.0),
        ("The total is 1,234 apples.", "1234", 0.0),  # a number in the prose is no final answer
        ("-3 degrees", "-3", 0.0),
        ("\\boxed{18 hens}", "18", 0.0),  # a unit the question does not ask for
        ("first 12, then 18", "12", 0.0),
        ("\\boxed{12} so maybe 18", "18", 0.0),  # a box beats a later bare number
        ("\\boxed{12}\n#### 18", "18", 0.0),  # ... and a later #### line
        ("\\boxed{18.5}", "18", 0.0),
        ("no number here", "18", 0.0),
        ("\\boxed{}", "18", 0.0),
        ("\\boxed{3}", "-3", 0.0),
    ],
)
def test_reward(completion, final, reward):
    assert gsm8k.reward(completion, {"final_answer": final, "question": QUESTION}) == reward


def test_load_and_reference_solutions_score(monkeypatch, tmp_path):
    if not (DATA / "gsm8k" / "test.jsonl").is_file():
        pytest.skip(f"benchmark data not found at {DATA} (the ../shared/data folder beside the checkout)")
    monkeypatch.setenv("RAPID_DATA_DIR", str(DATA))
    train, test = gsm8k.load("train"), gsm8k.load("test", unused=1)
    assert (len(train), len(test)) == (7473, 1319)
    assert all(gsm8k.reward(r["answer"], r) == 1.0 for r in test)  # the worked solution ends "#### N"
    # A source without `final_answer` (the Hub's) gets it derived from "#### N".
    (tmp_path / "hub.jsonl").write_text('{"question": "q", "answer": "1+1=2\\n#### 1,002"}\n')
    assert gsm8k.load("test", data_path=str(tmp_path / "hub.jsonl"))[0]["final_answer"] == "1002"
