import pytest

from rapid.tasks import arithmetic, get_task
from rapid.tasks.grading import boxed_number_reward, last_boxed, parse_number
from tests.helpers import tiny_model


@pytest.mark.parametrize(
    "text, want",
    [
        ("so \\boxed{7}", "7"),
        ("\\boxed{1} then \\boxed{2}", "2"),  # the last box counts
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),  # nested braces balanced
        ("\\fbox{3}", "3"),
        ("no box here", None),
        ("\\boxed{12", None),  # unbalanced: no answer
    ],
)
def test_last_boxed(text, want):
    assert last_boxed(text) == want


@pytest.mark.parametrize(
    "completion, answer, reward",
    [
        ("\\boxed{12}", "12", 1.0),
        ("\\boxed{ 12 }", "12", 1.0),
        ("\\boxed{12.0}", "12", 1.0),
        ("\\boxed{1,000}", "1000", 1.0),
        ("\\boxed{1{,}000}", "1000", 1.0),
        ("\\boxed{\\$5}", "5", 1.0),
        ("\\boxed{\\frac{6}{4}}", "1.5", 1.0),
        ("\\boxed{\\dfrac{3}{2}}", "3/2", 1.0),
        ("\\boxed{-3}", "-3", 1.0),
        ("\\boxed{13}", "12", 0.0),
        ("\\boxed{3}", "-3", 0.0),  # sign matters
        ("12", "12", 0.0),  # no box, no credit
        ("\\boxed{12} and later \\boxed{13}", "12", 0.0),  # only the last box counts
        ("\\boxed{x}", "12", 0.0),
        ("\\boxed{120}", "12", 0.0),
    ],
)
def test_boxed_number_reward(completion, answer, reward):
    assert boxed_number_reward(completion, answer) == reward


def test_parse_number_rejects_junk():
    assert parse_number("1/0") is None and parse_number("\\frac{1}{0}") is None and parse_number("") is None


def test_arithmetic_split_is_disjoint_deterministic_and_correct():
    cfg = dict(low=0, high=19, ops=["+", "-", "*"], n_eval=200, seed=5)
    train, test = arithmetic.load("train", **cfg), arithmetic.load("test", **cfg)
    assert len(train) + len(test) == 3 * 400 and len(test) == 200
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    assert test == arithmetic.load("test", **cfg)
    r = next(r for r in train if r["op"] == "-")
    assert int(r["answer"]) == r["a"] - r["b"]
    assert arithmetic.reward(f"\\boxed{{{r['answer']}}}", r) == 1.0
    with pytest.raises(ValueError, match="n_eval"):
        arithmetic.load("train", low=0, high=9, n_eval=100)
    with pytest.raises(ValueError, match="unknown task"):
        get_task("nope")


def test_prompts_use_chat_template_and_shots():
    _, tok = tiny_model()
    cfg = dict(low=0, high=9, n_eval=20, seed=0)
    test = arithmetic.load("test", **cfg)
    ids = arithmetic.build_prompts(test[:2], tok, system="Be brief.", n_shots=1, **cfg)
    text = tok.decode(ids[0])
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is ")
    assert text.endswith(f"{test[0]['question']}<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("\\boxed{") == 1  # one solved example
    plain = tok.decode(arithmetic.build_prompts(test[:1], tok, n_shots=0, use_chat_template=False, **cfg)[0])
    assert plain == f"Question: {test[0]['question']}\nAnswer:"
