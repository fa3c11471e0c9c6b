"""Tasks as plugins: `task.module=<any importable module>` with load, build_prompts and reward."""

import json

import pytest

from rapid.config import ConfigError
from rapid.tasks import arithmetic, get_task
from tests.test_train import REPO, eval_rows, launch, read_rows, train_rows

# A task defined here, not in rapid: "say a digit". Its problems are named so that split.json shows
# they were used, and its reward is one a random model earns about half the time, so the run's
# logged rewards show that this reward (and not arithmetic's, which it never earns) graded it.
DIGIT_TASK = """
from rapid.tasks import encode_prompts

def load(split, n_eval=16, **cfg):
    n = n_eval if split == "test" else 64
    return [{"name": f"digit-{split}-{i}", "question": f"Say a digit ({i})."} for i in range(n)]

def build_prompts(records, tokenizer, **cfg):
    return encode_prompts([r["question"] for r in records], tokenizer, use_chat_template=False)

def reward(completion, record):
    return float(any(ch.isdigit() for ch in completion))
"""


def test_get_task_by_module_and_its_errors(tmp_path, monkeypatch):
    assert get_task("arithmetic") is arithmetic and get_task("arithmetic", "rapid.tasks.arithmetic") is arithmetic
    with pytest.raises(ConfigError, match="task.name=math does not match task.module=rapid.tasks.arithmetic"):
        get_task("math", "rapid.tasks.arithmetic")  # a built-in module keeps its own name
    (tmp_path / "half_task.py").write_text("def load(split, **cfg):\n    return []\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ConfigError, match="half_task lacks build_prompts, reward"):
        get_task("half", "half_task")
    with pytest.raises(ConfigError, match="cannot be imported"):
        get_task("x", "no_such_module_anywhere")
    with pytest.raises(ConfigError, match="set task.module"):
        get_task("nope")


@pytest.mark.slow
def test_a_run_trains_on_a_task_defined_outside_rapid(tmp_path):
    (tmp_path / "digit_task.py").write_text(DIGIT_TASK)
    run = tmp_path / "run"
    launch(
        [
            "+experiment=smoke",
            "task.module=digit_task",
            "task.name=digit",
            "rounds=2",
            "reward.workers=1",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
        PYTHONPATH=f"{tmp_path}:{REPO}",
    )
    split = json.loads((run / "split.json").read_text())
    assert split["train"] == [f"digit-train-{i}" for i in range(64)]
    assert split["eval"] == [f"digit-test-{i}" for i in range(16)]
    rewards = [r["train/reward_mean"] for r in train_rows(read_rows(run))]
    assert len(rewards) == 2 and 0.0 < sum(rewards) < 2.0  # the plugin's reward, in a worker process
    assert all(0.0 <= r["eval/accuracy"] <= 1.0 for r in eval_rows(read_rows(run)))
