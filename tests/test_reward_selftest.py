"""The reward self-test at start-up: reference answers must score 1 and corrupted ones 0."""

import types

import pytest

from rapid.rewards import RewardSelfTestError, self_test
from rapid.tasks import arithmetic, gsm8k, multistep
from tests.test_train import REPO, assert_one_sentence_error, launch

RECORDS = arithmetic.load("train", low=0, high=9, n_eval=20, seed=0)


def test_references_by_hand():
    assert arithmetic.reference({"answer": "12"}) == ("The answer is \\boxed{12}.", "The answer is \\boxed{13}.")
    right, wrong = multistep.reference({"terms": [7, 3], "answer": "10"})
    assert right == "Step 1: the total so far is 7; add 3: 7 + 3 = 10.\nThe answer is \\boxed{10}."
    assert wrong == right.replace("\\boxed{10}", "\\boxed{11}")
    assert gsm8k.reference({"final_answer": "18"}) == ("The answer is \\boxed{18}.", "The answer is \\boxed{19}.")


@pytest.mark.parametrize("task", [arithmetic, multistep])
def test_real_tasks_pass(task):
    records = task.load("train") if task is multistep else RECORDS
    assert self_test(task, records, 4) == (
        "reward self-test passed: 4 reference answers scored 1, their corrupted twins 0"
    )


def fake_task(tmp_path, monkeypatch, name: str, reward: float):
    """A task module (importable by name, as reward workers need) with arithmetic's references and a
    reward that returns `reward` whatever it is given."""
    (tmp_path / f"{name}.py").write_text(
        f"from rapid.tasks.arithmetic import reference\n\ndef reward(completion, record):\n    return {reward}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return __import__(name)


def test_a_grader_that_accepts_nothing_or_everything_stops_the_run(tmp_path, monkeypatch):
    broken = fake_task(tmp_path, monkeypatch, "grades_nothing", 0.0)  # e.g. a checker that crashes on import
    with pytest.raises(
        RewardSelfTestError, match=r"training example 0 \('What is .*'\): its reference answer scored 0.0"
    ):
        self_test(broken, RECORDS, 3)
    lax = fake_task(tmp_path, monkeypatch, "grades_everything", 1.0)
    with pytest.raises(RewardSelfTestError, match="a wrong answer scored 1.0; .* reward.self_test=0"):
        self_test(lax, RECORDS, 3)
    assert self_test(broken, RECORDS, 0) == "reward self-test skipped (off)"
    no_reference = types.SimpleNamespace(reward=broken.reward)
    assert "no reference answers" in self_test(no_reference, RECORDS, 3)


BROKEN_TASK = """
from rapid.tasks.arithmetic import load, build_prompts, reference

def reward(completion, record):
    return 0.0          # a grader broken by the environment: everything scores 0
"""


@pytest.mark.slow
def test_a_run_with_a_broken_grader_stops_with_one_sentence(tmp_path):
    (tmp_path / "broken_task.py").write_text(BROKEN_TASK)
    proc = launch(
        ["+experiment=smoke", "task.module=broken_task", "task.name=broken", f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
        check=False,
        PYTHONPATH=f"{tmp_path}:{REPO}",
    )
    assert_one_sentence_error(proc.returncode, proc.stdout, ("self-test", "example 0", "scored 0.0"))
    assert not (tmp_path / "run" / "metrics.jsonl").exists()  # stopped before the first evaluation


DATA = REPO.parent / "shared" / "data"  # ../shared/data beside the checkout


@pytest.mark.parametrize("name, path", [("math", "math/train_12k.jsonl"), ("gsm8k", "gsm8k/train.jsonl")])
def test_real_datasets_pass_with_their_references(name, path):
    if not (DATA / path).exists():
        pytest.skip(f"benchmark data not found at {DATA / path} (the ../shared/data folder beside the checkout)")
    from rapid.tasks import get_task

    task = get_task(name)
    records = task.load("train", data_path=str(DATA / path))
    assert self_test(task, records, 4).startswith("reward self-test passed: 4")


RAISING_TASK = """
from rapid.tasks.arithmetic import reference

def reward(completion, record):
    return record["no_such_field"]      # a grader written for another record format
"""


def test_a_grader_that_raises_on_everything_is_named_with_its_error(tmp_path, monkeypatch):
    (tmp_path / "raises_always.py").write_text(RAISING_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    import raises_always

    with (
        pytest.warns(RuntimeWarning, match="every one of the 4 reward checks of task raises_always failed"),
        pytest.raises(RewardSelfTestError, match=r"scored 0.0 \(its check raised KeyError: 'no_such_field'\)"),
    ):
        self_test(raises_always, RECORDS, 2)
