"""A plugin task given by `task.module=` alone runs with the default task's settings (conf/task/arithmetic.yaml:
max_new_tokens 12, n_eval 200, ...): load_splits says so in one warning; a plugin with its own task YAML on
Hydra's search path, or a built-in task, gets none."""

from __future__ import annotations

import warnings

import pytest
from hydra import compose, initialize_config_dir

from rapid.config import register_resolvers
from rapid.models import char_tokenizer
from rapid.tasks import inherited_settings, load_splits
from tests.test_task_plugin import DIGIT_TASK
from tests.test_train import REPO


def task_config(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=list(overrides)).task


@pytest.fixture
def digit_task(tmp_path, monkeypatch):
    (tmp_path / "digit_task.py").write_text(DIGIT_TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_plugin_given_only_its_module_is_warned_about_the_default_tasks_settings(digit_task):
    cfg = task_config("task.module=digit_task", "task.name=digit")
    name, same = inherited_settings(cfg)
    assert name == "arithmetic" and same["max_new_tokens"] == 12 and same["n_eval"] == 200
    with pytest.warns(
        UserWarning,
        match=r"task.module=digit_task runs with conf/task/arithmetic.yaml's settings \(task.max_new_tokens=12, ",
    ) as record:
        load_splits(cfg, char_tokenizer(), 4)
    assert len([w for w in record if "conf/task/" in str(w.message)]) == 1
    # overriding the length it needs leaves the rest inherited, and the warning no longer names it
    name, same = inherited_settings(task_config("task.module=digit_task", "task.max_new_tokens=4"))
    assert name == "arithmetic" and "max_new_tokens" not in same and same["ops"] == ["+"]


def test_plugin_with_its_own_yaml_and_builtin_tasks_are_not_warned(digit_task):
    folder = digit_task / "my_configs" / "task"
    folder.mkdir(parents=True)
    (folder / "digits.yaml").write_text("name: digits\nmodule: digit_task\nmax_new_tokens: 4\n")
    cfg = task_config(f"hydra.searchpath=[file://{digit_task / 'my_configs'}]", "task=digits")
    assert set(cfg) == {"name", "module", "max_new_tokens"} and inherited_settings(cfg) is None
    for task in (cfg, task_config(), task_config("task=multistep")):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # any warning fails
            load_splits(task, char_tokenizer(), 4)
