"""Where records come from: task.data_path (file or folder), RAPID_DATA_DIR, else the Hub."""

import json
import sys
import types
from pathlib import Path

import pytest

from rapid.config import ConfigError
from rapid.tasks.datasets import load_split, parse_hub_spec, read_jsonl

DATA = Path(__file__).parents[2] / "shared" / "data"  # ../shared/data beside the checkout
FILES = {"train": "toy/train.jsonl", "test": "toy/test.jsonl"}
HUB = {"train": "someone/toy:main@train", "test": "someone/toy@test"}


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.delenv("RAPID_DATA_DIR", raising=False)
    (tmp_path / "toy").mkdir()
    for split, n in (("train", 3), ("test", 2)):
        (tmp_path / "toy" / f"{split}.jsonl").write_text(
            "".join(json.dumps({"i": i, "s": split}) + "\n" for i in range(n)) + "\n"
        )
    return tmp_path


def test_folder_file_and_env(folder, monkeypatch):
    assert [r["i"] for r in load_split("toy", "train", FILES, HUB, str(folder))] == [0, 1, 2]
    assert load_split("toy", "train", FILES, HUB, str(folder / "toy" / "test.jsonl"))[0]["s"] == "test"
    monkeypatch.setenv("RAPID_DATA_DIR", str(folder))
    assert len(load_split("toy", "test", FILES, HUB)) == 2
    assert len(load_split("toy", "train", FILES, HUB, str(folder / "toy" / "test.jsonl"))) == 2  # data_path wins


def test_missing_file_bad_split_and_bad_json_are_config_errors(folder):
    with pytest.raises(ConfigError, match="has no toy/train.jsonl"):
        load_split("toy", "train", FILES, HUB, str(folder / "nowhere"))
    with pytest.raises(ConfigError, match="unknown split 'valid'"):
        load_split("toy", "valid", FILES, HUB, str(folder))
    (folder / "toy" / "train.jsonl").write_text('{"a": 1}\n{oops\n')
    with pytest.raises(ConfigError, match="train.jsonl:2 is not valid JSON"):
        load_split("toy", "train", FILES, HUB, str(folder))


def test_hub_spec():
    assert parse_hub_spec("openai/gsm8k:main@test") == ("openai/gsm8k", "main", "test")
    assert parse_hub_spec("HuggingFaceH4/MATH-500@test") == ("HuggingFaceH4/MATH-500", None, "test")
    with pytest.raises(ConfigError, match="dataset_id"):
        parse_hub_spec("no-split")


def test_hub_without_datasets_or_offline_is_one_sentence(monkeypatch):
    monkeypatch.delenv("RAPID_DATA_DIR", raising=False)
    monkeypatch.setitem(sys.modules, "datasets", None)  # not installed
    with pytest.raises(ConfigError, match="not installed: set task.data_path") as err:
        load_split("toy", "test", FILES, HUB)
    assert "\n" not in str(err.value)

    def offline(*args, **kwargs):
        raise ConnectionError("no route to huggingface.co")

    calls = []
    monkeypatch.setitem(
        sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: calls.append((a, k)) or offline())
    )
    with pytest.raises(ConfigError, match=r"could not load someone/toy:main@train .*ConnectionError.*RAPID_DATA_DIR"):
        load_split("toy", "train", FILES, HUB)
    assert calls == [(("someone/toy", "main"), {"split": "train"})]
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=lambda *a, **k: [{"x": 1}]))
    assert load_split("toy", "test", FILES, HUB) == [{"x": 1}]


def test_shared_data_counts():
    if not DATA.is_dir():
        pytest.skip(f"benchmark data not found at {DATA} (the ../shared/data folder beside the checkout)")
    counts = {
        "math500/test.jsonl": 500,
        "gsm8k/test.jsonl": 1319,
        "mbpp_plus/test.jsonl": 378,
        "minif2f/valid.jsonl": 244,
        "minif2f/test.jsonl": 244,
    }
    assert {name: len(read_jsonl(DATA / name)) for name in counts} == counts
