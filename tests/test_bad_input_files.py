"""Bad files a run meets: model folders, checkpoints (a full disk while saving, non-finite weights, a
checkpoint from another run or model, a broken saved config), resume overrides, data files and task
plugins. Each is one ConfigError (or, for a save that fails mid-run, RunStopped) sentence that names the
file, key or function and what to do; a failed save keeps the last good checkpoint."""

import json
import re
import resource
import shutil
import signal
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from safetensors.torch import load_file, save_file

from rapid import checkpoint
from rapid.config import ConfigError, RunStopped, register_resolvers
from rapid.data import PromptStream
from rapid.models import ModelLoadError, load_model_and_tokenizer
from rapid.tasks import check_context, check_records, load_splits
from tests.helpers import TINY, tiny_model

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke():
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        cfg = compose("config", overrides=["+experiment=smoke"])
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("models") / "good"
    model, tokenizer = load_model_and_tokenizer(architecture=TINY)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def broken_copy(folder: Path, tmp_path: Path, change) -> str:
    copy = tmp_path / "model"
    shutil.copytree(folder, copy)
    change(copy)
    return str(copy)


def set_model_type(folder: Path, name: str) -> None:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"model_type": name}))


@pytest.mark.parametrize(
    "change, words",
    [
        (lambda f: [p.unlink() for p in f.iterdir()], "is an empty folder: download the model again into it"),
        (lambda f: (f / "config.json").unlink(), "holds no config.json, so it is not a Hugging Face model folder"),
        (lambda f: (f / "model.safetensors").unlink(), "holds no weights (*.safetensors or pytorch_model*.bin)"),
        (lambda f: set_model_type(f, "llama9"), "names the architecture 'llama9', which transformers"),
        (
            lambda f: (f / "model.safetensors").write_bytes((f / "model.safetensors").read_bytes()[:-1000]),
            ": model.safetensors is truncated: download the model again",
        ),
        (
            lambda f: [p.unlink() for p in f.iterdir() if p.name.startswith("tokenizer")],
            "holds no tokenizer (tokenizer.json, tokenizer.model, ...)",
        ),
    ],
)
def test_broken_model_folders_are_one_sentence(model_folder, tmp_path, change, words):
    path = broken_copy(model_folder, tmp_path, change)
    with pytest.raises(ModelLoadError) as e:
        load_model_and_tokenizer(path)
    assert str(e.value).startswith(f"model.path={path}") and words in str(e.value)
    assert "not reachable" not in str(e.value)  # a local folder is never called unreachable


def test_missing_local_folder_and_a_good_one(model_folder, tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist: point model.path at a model folder or a Hub id"):
        load_model_and_tokenizer(str(tmp_path / "nowhere"))
    model, _ = load_model_and_tokenizer(str(model_folder))
    assert sum(p.numel() for p in model.parameters()) == 80512


# ----------------------------------------------------------------------------- checkpoints


def training_state(seed: int = 0):
    model, tokenizer = tiny_model(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.tensor([[3, 4, 5]])).logits.sum().backward()
    optimizer.step()  # moments to save
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    return model, tokenizer, optimizer, scheduler, PromptStream(10, 0)


def save(run_dir, round_, state, cfg, keep=2):
    model, tokenizer, optimizer, scheduler, stream = state
    return checkpoint.save(run_dir, round_, model, tokenizer, optimizer, scheduler, stream, cfg, 1.0, keep)


@contextmanager
def file_size_limit(n_bytes: int):
    """A real write limit (RLIMIT_FSIZE: a write past it fails with EFBIG), as a full disk would fail it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n_bytes, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_FSIZE and SIGXFSZ as on Linux")
def test_a_failed_save_keeps_the_last_good_checkpoint(smoke, tmp_path):
    state = training_state()
    first = save(tmp_path, 1, state, smoke)
    before = {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()}
    with file_size_limit(100_000), pytest.raises(RunStopped) as e:  # the weights file is ~320 kB
        save(tmp_path, 2, state, smoke)
    message = str(e.value)
    assert message.startswith("could not write the checkpoint of round 2 to") and "File too large" in message
    assert f"the earlier checkpoint round_000001 is kept, so make room and continue with resume={tmp_path}" in message
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["round_000001"]  # no .tmp left
    assert {p.relative_to(first): p.read_bytes() for p in first.rglob("*") if p.is_file()} == before
    assert checkpoint.latest(tmp_path) == first  # resumable
    with file_size_limit(100_000), pytest.raises(RunStopped):  # the same round again: the old copy stays
        save(tmp_path, 1, state, smoke)
    assert checkpoint.latest(tmp_path) == first and checkpoint.unreadable(first) == ""
    fresh = tmp_path / "fresh"
    with file_size_limit(100_000), pytest.raises(RunStopped, match="no earlier checkpoint exists"):
        save(fresh, 1, state, smoke)
    assert list((fresh / "checkpoints").iterdir()) == []


def test_a_checkpoint_with_non_finite_weights_is_passed_over(smoke, tmp_path, capsys):
    state = training_state()
    first, second = save(tmp_path, 1, state, smoke), save(tmp_path, 2, state, smoke)
    weights = load_file(second / "model" / "model.safetensors")
    name = sorted(weights)[0]
    weights[name][0] = float("nan")
    save_file(weights, second / "model" / "model.safetensors", metadata={"format": "pt"})
    assert checkpoint.latest(tmp_path) == first
    assert f"model.safetensors holds NaN or infinite values ({name})" in capsys.readouterr().out


def resumable_run(smoke, tmp_path, **changes) -> Path:
    run = tmp_path / "run"
    cfg = OmegaConf.merge(smoke, changes)
    run.mkdir(parents=True)
    OmegaConf.save(cfg, run / "config.yaml")
    save(run, 2, training_state(), cfg)
    return run


def test_resume_point_of_a_good_run(smoke, tmp_path):
    run = resumable_run(smoke, tmp_path)
    path, cfg = checkpoint.resume_point(run, ["logger.progress=true", "reward.self_test=0", "hydra.run.dir=x"])
    assert path.name == "round_000002" and cfg.algorithm.n_group == smoke.algorithm.n_group
    assert cfg.reward.self_test == 0 and cfg.logger.progress is True  # watched-and-graded overrides apply
    checkpoint.resume_point(run, [f"seed={smoke.seed}", f"algorithm.H={smoke.algorithm.H}"])  # same values: fine


@pytest.mark.parametrize(
    "overrides, words",
    [
        (["algorithm.n_group=8"], "so algorithm.n_group=8 (the run's algorithm.n_group is 4) does not apply"),
        (["algorithm=grpo"], "so algorithm=grpo (the run's algorithm.name is rapid) does not apply"),
        (["~optim.lr"], "so ~optim.lr (the run's optim.lr is"),
    ],
)
def test_resume_warns_once_of_overrides_that_would_change_the_run(smoke, tmp_path, overrides, words):
    run = resumable_run(smoke, tmp_path)
    with pytest.warns(UserWarning) as w:
        _, cfg = checkpoint.resume_point(run, overrides)
    assert len(w) == 1 and str(w[0].message).startswith(f"resume={run} continues that run with the config it")
    assert words in str(w[0].message), str(w[0].message)
    assert cfg.algorithm.n_group == smoke.algorithm.n_group and cfg.optim.lr == smoke.optim.lr  # not applied
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the run's own option again: no change, no warning
        checkpoint.resume_point(run, [f"algorithm={smoke.algorithm.name}", f"sampler={smoke.sampler.name}"])


def test_resume_refuses_a_checkpoint_from_another_run(smoke, tmp_path):
    run = resumable_run(smoke, tmp_path)
    OmegaConf.save(OmegaConf.merge(smoke, {"algorithm": {"n_group": 2}}), run / "config.yaml")  # this run's
    with pytest.raises(ConfigError, match=r"was written under another algorithm than .*config.yaml records, so"):
        checkpoint.resume_point(run)


def test_resume_refuses_a_broken_saved_config(smoke, tmp_path):
    run = resumable_run(smoke, tmp_path)
    state_pt = run / "checkpoints" / "round_000002" / "state.pt"
    state = torch.load(state_pt, weights_only=False)
    torch.save(state | {"config": state["config"] | {"train": {"skip_zero_advantage": "flase"}}}, state_pt)
    (run / "config.yaml").unlink()
    with pytest.raises(ConfigError, match=r"state.pt is not valid \(train.skip_zero_advantage='flase' must be"):
        checkpoint.resume_point(run)
    torch.save({k: v for k, v in state.items() if k != "config"}, state_pt)
    with pytest.raises(ConfigError, match=r"the config saved in .*state.pt cannot be read \(KeyError\)"):
        checkpoint.resume_point(run)
    with pytest.raises(ConfigError, match="is not a directory"):
        checkpoint.resume_point(tmp_path / "nowhere")
    (run / "config.yaml").write_text("seed: [\n")
    torch.save(state, state_pt)
    with pytest.raises(ConfigError, match=r"config.yaml cannot be read"):
        checkpoint.resume_point(run)


def test_a_checkpoint_of_another_model_is_one_sentence(smoke, tmp_path):
    run = resumable_run(smoke, tmp_path)
    model, _ = load_model_and_tokenizer(architecture={**TINY, "hidden_size": 96, "intermediate_size": 96})
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    with pytest.raises(ConfigError, match=r"holds the weights of another model than model.\* builds \(e.g. "):
        checkpoint.load(checkpoint.latest(run), model, optimizer, scheduler, PromptStream(10, 0))


# ----------------------------------------------------------------------------- data files


def test_duplicates_are_warned_about_once_with_their_count():
    records = [{"question": "1+1", "answer": "2"}] * 3 + [{"question": "2+2", "answer": "4"}]
    with pytest.warns(UserWarning, match=r"^2 of the 4 records of task t's training split are duplicates") as w:
        check_records("t", "training", records)
    assert len(w) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_records("t", "training", records[2:])


def test_empty_questions_and_prompts_beyond_the_context_are_refused():
    with pytest.raises(ConfigError, match=r"^2 of the 3 records of task t's held-out split have an empty question \("):
        check_records("t", "held-out", [{"question": "1+1"}, {"problem": "  "}, {"question": ""}])
    check_context("t", "training", [[1] * 500, [1] * 10], max_new_tokens=12, context=512)
    with pytest.raises(ConfigError, match=r"^1 of the 2 training prompts of task t do not fit the model's context of"):
        check_context("t", "training", [[1] * 501, [1] * 10], max_new_tokens=12, context=512)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="reads /proc/self/mem, which fails on read (Linux)")
def test_a_data_file_that_cannot_be_read_is_named():
    _, tokenizer = tiny_model()
    cfg = OmegaConf.create({"name": "gsm8k", "module": None, "data_path": "/proc/self/mem", "use_chat_template": False})
    with pytest.raises(
        ConfigError, match=r"^rapid.tasks.gsm8k.load could not read /proc/self/mem \(Input/output error\)"
    ):
        load_splits(cfg, tokenizer)


# ----------------------------------------------------------------------------- task plugins

PLUGINS = {
    "syntax": (
        "def load(split, **cfg)\n    return []\n",
        r"does not compile \(expected ':', .*syntax_task.py:\d+\): fix the file",
    ),
    "raises": ("import json\nraise RuntimeError('no data here')\n", r"raised RuntimeError while it was imported"),
    "needs": ("import not_installed_pkg_x\n", r"imports not_installed_pkg_x, which is not installed"),
    "signature": ("def load(split):\n    return [{'question': 'q'}]\n", r"load cannot be called as rapid calls it"),
    "none": ("def load(split, **cfg):\n    return None\n", r"load\('train'\) returned NoneType, not a list of records"),
    "string": ("def load(split, **cfg):\n    return 'q1'\n", r"load\('train'\) returned str, not a list"),
    "strings": (
        "def load(split, **cfg):\n    return ['q1', 'q2']\n",
        r"load\('train'\)'s record 1 is a str, not a dict",
    ),
    "failing": (
        "def load(split, **cfg):\n    return {}['x']\n",
        r"failing_task.load raised KeyError \('x', .*failing_task.py:\d+\): fix the task",
    ),
    "unreadable": (
        "def load(split, **cfg):\n    raise PermissionError(13, 'Permission denied', '/data/train.jsonl')\n",
        r"load could not read /data/train.jsonl \(Permission denied\)",
    ),
    "prompts_none": ("def build_prompts(records, tokenizer, **cfg):\n    return None\n", r"build_prompts .*returned"),
    "prompts_few": (
        "def build_prompts(records, tokenizer, **cfg):\n    return [[1, 2]]\n",
        r"build_prompts \(the training split\) returned 1 prompts for 3 records",
    ),
    "prompts_text": (
        "def build_prompts(records, tokenizer, **cfg):\n    return [r['question'] for r in records]\n",
        r"prompt 1 is a str, not token ids: encode each prompt with the tokenizer",
    ),
}
BASE = """
def load(split, **cfg):
    return [{"question": f"{i} + 1?", "answer": str(i + 1), "name": f"{split}{i}"} for i in range(3)]

def build_prompts(records, tokenizer, **cfg):
    return [tokenizer(r["question"])["input_ids"] for r in records]

def reward(completion, record):
    return float(record["answer"] in completion)
"""


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_bad_task_plugins_are_one_sentence(tmp_path, monkeypatch, name):
    code, words = PLUGINS[name]
    module = f"{name}_task"
    (tmp_path / f"{module}.py").write_text(BASE + "\n" + code)  # the later definition wins
    monkeypatch.syspath_prepend(str(tmp_path))
    _, tokenizer = tiny_model()
    task_cfg = OmegaConf.create({"name": name, "module": module, "max_new_tokens": 8})
    with pytest.raises(ConfigError) as e:
        load_splits(task_cfg, tokenizer)
    assert "\n" not in str(e.value) and re.search(words, str(e.value)), str(e.value)
    sys.modules.pop(module, None)


def test_a_plugin_that_is_not_utf8_and_one_returning_a_generator(tmp_path, monkeypatch):
    (tmp_path / "latin_task.py").write_bytes(b'SYSTEM = "caf\xe9"\n' + BASE.encode())
    (tmp_path / "gen_task.py").write_text(BASE.replace("return [{", "return ({").replace("range(3)]", "range(3))"))
    monkeypatch.syspath_prepend(str(tmp_path))
    _, tokenizer = tiny_model()
    cfg = OmegaConf.create({"name": "latin", "module": "latin_task", "max_new_tokens": 8})
    with pytest.raises(ConfigError, match=r"^task.module=latin_task does not compile \(it is not UTF-8 text, "):
        load_splits(cfg, tokenizer)
    _, train, prompts, test, _ = load_splits(OmegaConf.merge(cfg, {"module": "gen_task", "name": "gen"}), tokenizer)
    assert [r["name"] for r in train] == ["train0", "train1", "train2"] and len(prompts) == 3 and len(test) == 3
