"""The long-completion task: problems, split, prompts with worked examples, and the exact reward."""

import pytest

from rapid.tasks import get_task, multistep
from tests.helpers import tiny_model

CFG = dict(terms=4, low=1, high=9, n_train=300, n_eval=50, seed=3)


def test_split_is_disjoint_deterministic_and_answers_are_sums():
    train, test = multistep.load("train", **CFG), multistep.load("test", **CFG)
    assert (len(train), len(test)) == (300, 50)
    questions = [r["question"] for r in train + test]
    assert len(set(questions)) == 350  # distinct problems, no overlap
    assert test == multistep.load("test", **CFG) and train == multistep.load("train", **CFG)
    assert test != multistep.load("test", **{**CFG, "seed": 4})
    for r in train[:20] + test[:20]:
        assert len(r["terms"]) == 4 and all(1 <= x <= 9 for x in r["terms"])
        assert r["question"] == "Add: " + " + ".join(str(x) for x in r["terms"])
        assert int(r["answer"]) == sum(r["terms"])
    assert get_task("multistep") is multistep


def test_working_writes_each_running_total():
    # 7 + 3 = 10, 10 + 9 = 19, 19 + 4 = 23, by hand
    assert multistep.working([7, 3, 9, 4]) == (
        "Step 1: the total so far is 7; add 3: 7 + 3 = 10.\n"
        "Step 2: the total so far is 10; add 9: 10 + 9 = 19.\n"
        "Step 3: the total so far is 19; add 4: 19 + 4 = 23.\n"
        "The answer is \\boxed{23}."
    )


@pytest.mark.parametrize(
    "completion, reward",
    [
        (multistep.working([7, 3, 9, 4]), 1.0),
        ("Step 1: 7 + 3 = 10 ... The answer is \\boxed{23}.", 1.0),  # only the final answer is graded
        ("The answer is \\boxed{22}.", 0.0),  # off by one
        ("7 + 3 + 9 + 4 = 23", 0.0),  # no box
        ("\\boxed{23} but then \\boxed{19}", 0.0),  # the last box counts
    ],
)
def test_reward_is_exact_on_the_final_answer(completion, reward):
    record = {"question": "Add: 7 + 3 + 9 + 4", "answer": "23", "terms": [7, 3, 9, 4]}
    assert multistep.reward(completion, record) == reward


def test_prompts_show_worked_training_examples():
    _, tok = tiny_model()
    test = multistep.load("test", **CFG)
    ids = multistep.build_prompts(test[:2], tok, system="Add.", n_shots=2, **CFG)
    text = tok.decode(ids[1])
    assert text.startswith("<|im_start|>system\nAdd.<|im_end|>\n<|im_start|>user\nAdd: ")
    assert text.endswith(f"{test[1]['question']}<|im_end|>\n<|im_start|>assistant\n")
    assert text.count("\\boxed{") == 2 and text.count("Step 1: the total so far is") == 2
    train_questions = {r["question"] for r in multistep.load("train", **CFG)}
    shown = [line.removesuffix("<|im_end|>") for line in text.split("\n") if line.startswith("Add: ")][:-1]
    assert len(shown) == 2 and set(shown) <= train_questions  # the shots come from training
    plain = tok.decode(multistep.build_prompts(test[:1], tok, n_shots=1, use_chat_template=False, **CFG)[0])
    assert plain.startswith("Question: Add: ") and plain.endswith(f"Question: {test[0]['question']}\nAnswer:")
    assert plain.count("\\boxed{") == 1


def test_bad_settings_say_what_to_change():
    with pytest.raises(ValueError, match="widen task.low"):
        multistep.load("train", terms=2, low=1, high=3, n_train=10, n_eval=10)
    with pytest.raises(ValueError, match="at least 2 terms"):
        multistep.load("train", terms=1)
    with pytest.raises(ValueError, match="unknown split"):
        multistep.load("dev")
