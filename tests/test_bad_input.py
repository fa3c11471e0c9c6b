"""Bad input a user can give: each gets one `ConfigError` sentence naming what is wrong (exit code 2
from the entry points, before the run writes anything), and damaged run files are survived: a
truncated latest checkpoint is passed over for the one before it, a torn last metrics line dropped."""

import json
import os
import subprocess
import sys
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import save_file

from rapid import checkpoint
from rapid.config import ConfigError, register_resolvers, validate
from rapid.logger import MetricsLogger
from rapid.tasks import gsm8k, load_splits, mbpp_plus
from rapid.tasks import math as math_task
from rapid.tasks.datasets import read_jsonl
from tests.helpers import tiny_model
from tests.test_train import assert_one_sentence_error, command, env_for

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke():
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=["+experiment=smoke"])


@pytest.mark.parametrize(
    "key, value, words",
    [
        ("algorithm.eta", "abc", "algorithm.eta='abc' must be a number >= 1"),
        ("algorithm.n_group", 0, "algorithm.n_group=0 must be an integer >= 1"),
        ("algorithm.n_step", 0, "algorithm.n_step=0 must be an integer >= 1"),
        ("algorithm.H", 1.5, "algorithm.H=1.5 must be an integer >= 1"),
        ("train.micro_batch", 0, "train.micro_batch=0 must be an integer >= 1"),
        ("task.max_new_tokens", 0, "task.max_new_tokens=0 must be an integer >= 1"),
        ("optim.schedule", "cosin", "optim.schedule='cosin' must be one of constant, linear, cosine"),
        ("optim.lr", -1, "optim.lr=-1 must be a number > 0"),
        ("optim.lr", "abc", "optim.lr='abc' must be a number > 0"),
        ("eval.n", 0, "eval.n=0 must be an integer >= 1 (or null: the whole test split)"),
        ("eval.n_samples", 0, "eval.n_samples=0 must be an integer >= 1"),
        ("eval.ks", [0, 8], "eval.ks=[0, 8] must be a list of integers >= 1"),
        ("sampler.temperature", 0, "sampler.temperature=0 must be > 0 for RL"),
        ("sampler.temperature", "hot", "sampler.temperature='hot' must be a number"),
        ("reward.workers", -1, "reward.workers=-1 must be an integer >= 0"),
        ("rounds", 0, "rounds=0 must be an integer >= 1 (or null: epochs decide)"),
        ("seed", "x", "seed='x' must be an integer"),
        ("algorithm.n_group", True, "algorithm.n_group=True must be an integer >= 1"),
    ],
)
def test_bad_config_values_are_one_sentence(smoke, key, value, words):
    validate(smoke, 1)  # the smoke config itself passes
    cfg = smoke.copy()
    OmegaConf.update(cfg, key, value, merge=False)
    with pytest.raises(ConfigError) as e:
        validate(cfg, 1)
    assert str(e.value).startswith(words) and "\n" not in str(e.value)


@pytest.mark.slow  # a subprocess start of rapid.train (~10 s here); the refusal itself is checked in-process above
def test_entry_point_exits_2_before_writing_the_run(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "rapid.train", "+experiment=smoke", "algorithm.eta=abc", f"hydra.run.dir={run}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    out = proc.stdout + proc.stderr
    assert "Traceback" not in out and [line for line in out.splitlines() if line.startswith("rapid:")] == [
        "rapid: algorithm.eta='abc' must be a number >= 1 (or null: no truncation)"
    ]
    assert not run.exists()  # not even Hydra's .hydra/ and train.log: the directory is gone


@pytest.mark.parametrize(
    "content, words",
    [
        (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "is not UTF-8 text"),
        (b"", "holds no records"),
        (b"\n\n", "holds no records"),
        (b'{"question": "q"}\n[1, 2]\n', ":2 is not a JSON object"),
        (b'{"question": "q"}\n{"question": ', ":2 is not valid JSON"),
    ],
)
def test_bad_data_files_are_one_sentence(tmp_path, content, words):
    path = tmp_path / "data.jsonl"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=words):
        read_jsonl(path)


def test_later_records_missing_fields_are_one_sentence(tmp_path):
    path = tmp_path / "data.jsonl"
    path.write_text(
        json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\n" + json.dumps({"question": "2+2?"}) + "\n"
    )
    with pytest.raises(ConfigError, match="gsm8k record 2 lacks the field answer"):
        gsm8k.load("test", data_path=str(path))
    path.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n" + json.dumps({"answer": "2"}) + "\n")
    with pytest.raises(ConfigError, match="math record 2 lacks the field problem"):
        math_task.load("test", data_path=str(path))
    good = {"task_id": "Mbpp/1", "entry_point": "f", "canonical_solution": "", "base_input": [], "plus_input": []}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "task_id": "Mbpp/2", "base_input": None}) + "\n")
    with pytest.raises(ConfigError, match=r"MBPP\+ record 2 \(Mbpp/2\)"):
        mbpp_plus.load("test", data_path=str(path), sandbox="process")


def fake_checkpoint(root: Path, round_: int) -> Path:
    path = root / "checkpoints" / f"round_{round_:06d}"
    (path / "model").mkdir(parents=True)
    torch.save({"round": round_, "config": {"seed": 0}}, path / "state.pt")
    save_file({"w": torch.arange(1000, dtype=torch.float32)}, path / "model" / "model.safetensors")
    return path


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_resume_passes_over_a_damaged_latest_checkpoint(tmp_path, capsys):
    first, second, third = (fake_checkpoint(tmp_path, r) for r in (1, 2, 3))
    assert checkpoint.latest(tmp_path) == third
    truncate(third / "state.pt")  # killed while writing state.pt
    truncate(second / "model" / "model.safetensors", 0.9)  # a cut copy of the weights
    assert checkpoint.latest(tmp_path) == first
    out = capsys.readouterr().out
    assert (
        "round_000003 cannot be read (state.pt" in out
        and "round_000002 cannot be read (model.safetensors is truncated)" in out
    )
    with zipfile.ZipFile(first / "state.pt") as z:  # still a whole archive: untouched
        assert z.testzip() is None
    truncate(first / "state.pt", 0.99)
    assert checkpoint.latest(tmp_path) is None  # train.py: "holds no readable checkpoint"


def test_torn_last_metrics_line_is_dropped_on_resume(tmp_path, capsys):
    rows = [{"round": 1, "train/loss": 0.5}, {"round": 2, "train/loss": 0.4}, {"round": 3, "train/loss": 0.3}]
    text = "".join(json.dumps(r) + "\n" for r in rows)
    (tmp_path / "metrics.jsonl").write_text(text + '{"round": 4, "train/lo')
    logger = MetricsLogger(tmp_path, resume_round=2)
    assert logger.rows() == [{"progress/round": r["round"], "train/loss": r["train/loss"]} for r in rows[:2]]
    assert "dropping a damaged line" in capsys.readouterr().out


EMPTY_TRAIN_TASK = """
from rapid.tasks.arithmetic import build_prompts, reward

def load(split, **cfg):
    return [] if split == "train" else [{"question": "What is 1 + 1?", "answer": "2"}]
"""


def mbpp_file(path: Path, n: int) -> Path:
    record = {"entry_point": "f", "canonical_solution": "def f(x):\n    return x\n", "prompt": "Return x."}
    rows = [{**record, "task_id": f"Mbpp/{i}", "base_input": [[i]], "plus_input": []} for i in range(1, n + 1)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
def test_bad_starts_are_one_sentence_before_any_engine_or_run_directory(tmp_path):
    """Each is refused with exit status 2 and one `rapid:` sentence, no traceback, and leaves no run
    directory (Hydra's .hydra/ and train.log included); an earlier run's directory is left as it was."""
    (tmp_path / "empty_train_task.py").write_text(EMPTY_TRAIN_TASK)
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "metrics.jsonl").write_text('{"round": 1, "train/loss": 0.5}\n')
    (earlier / "config.yaml").write_text("seed: 0\n")
    before = {p.name: p.read_bytes() for p in earlier.iterdir()}
    smoke = ["+experiment=smoke"]
    cases = {
        "unknown key": (smoke + ["+algorithm.etaa=2"], ("unknown config key algorithm.etaa", "algorithm.eta?")),
        "misspelt key": (smoke + ["++optim.lrr=1e-5"], ("unknown config key optim.lrr", "optim.lr?")),
        "empty training split": (
            smoke + ["task.module=empty_train_task", "task.name=empty"],
            ("task empty's training split holds no records",),
        ),
        "empty training split of a file": (
            smoke
            + ["task=mbpp_plus", f"task.data_path={mbpp_file(tmp_path / 'two.jsonl', 2)}", "task.n_eval=2"]
            + ["task.sandbox=process", "task.max_new_tokens=8"],
            ("task mbpp_plus's training split holds no records", "task.n_eval"),
        ),
        "rerun into a run directory": (smoke, ("already holds a run", f"resume={earlier}")),
    }
    env = env_for(tmp_path, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    procs = {}
    for name, (args, _) in cases.items():
        run = earlier if name.startswith("rerun") else tmp_path / name.replace(" ", "_")
        procs[name] = (
            run,
            subprocess.Popen(
                command([*args, f"hydra.run.dir={run}"], tmp_path),
                cwd=REPO,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            ),
        )
    for name, (run, proc) in procs.items():
        out = proc.communicate(timeout=300)[0]
        assert proc.returncode == 2, f"{name}: exit status {proc.returncode}\n{out[-3000:]}"
        assert_one_sentence_error(proc.returncode, out, cases[name][1])
        if run == earlier:
            assert {p.name: p.read_bytes() for p in earlier.iterdir()} == before, name  # nothing appended or added
        else:
            assert not run.exists(), f"{name}: {sorted(p.name for p in run.rglob('*'))}"


def test_one_file_serving_both_splits_is_warned_about(tmp_path):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n" for i in range(5)))
    _, tokenizer = tiny_model()
    task_cfg = OmegaConf.create({"name": "gsm8k", "module": None, "data_path": str(data), "use_chat_template": False})
    with pytest.warns(UserWarning, match=r"^3 of the 3 held-out problems of task gsm8k are also training problems"):
        load_splits(task_cfg, tokenizer, n_eval=3)
    folder = tmp_path / "separate" / "gsm8k"
    folder.mkdir(parents=True)
    (folder / "train.jsonl").write_text(data.read_text())
    (folder / "test.jsonl").write_text(json.dumps({"question": "9 + 1?", "answer": "#### 10"}) + "\n")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # disjoint splits: no warning
        load_splits(OmegaConf.merge(task_cfg, {"data_path": str(folder.parent)}), tokenizer)


def test_a_group_of_one_is_warned_about(smoke):
    cfg = smoke.copy()
    OmegaConf.update(cfg, "algorithm.n_group", 1)
    with pytest.warns(UserWarning, match=r"^algorithm.n_group=1 gives every prompt a group of one completion"):
        validate(cfg, 1)
