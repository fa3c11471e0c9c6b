"""experiments/baselines/trl_grpo.py, rapid's GRPO run through TRL's GRPOTrainer: the prompt round trip that makes TRL
train on rapid's token ids, and an end-to-end run on the tiny random model in a subprocess (as
tests/test_train.py runs rapid.train), checked through the files it writes."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys

import pytest

from rapid.config import ConfigError
from rapid.data import PromptStream
from rapid.models import char_tokenizer
from rapid.seeding import PROMPT_STREAM, derive_seed
from rapid.tasks import load_splits
from tests.test_train import REPO, TIMEOUT_S, env_for

TOOL_PATH = REPO / "experiments" / "baselines" / "trl_grpo.py"
SUMMARY_KEYS = (
    "eval/accuracy_after",
    "samples",
    "rounds",
    "algorithm",
    "sampler",
    "time/total_s",
    "time/generate_s_total",
    "time/reward_s_total",
    "time/train_s_total",
    "time/eval_s",
    "time/generate_sampling_s_total",
    "time/generate_old_logprob_s_total",
    "time/generate_ref_logprob_s_total",
    "trl_version",
    "options",
    "peak_rss_mib",
)


SHAPED_TRL = """\
import runpy, sys
import rapid.tasks.arithmetic as arithmetic

def contains_digit(completion, record):
    return float(any(ch.isdigit() for ch in completion))

arithmetic.reward = contains_digit  # rapid.rewards.score calls task.reward through the module
sys.argv = [{tool!r}, *sys.argv[1:]]
runpy.run_path({tool!r}, run_name="__main__")
"""


def load_tool():
    spec = importlib.util.spec_from_file_location("trl_grpo", TOOL_PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


tool = load_tool()


@pytest.mark.parametrize("overrides, n_train", [(["model=tiny"], 400 - 200), (["+experiment=smoke"], 400 - 16)])
def test_arithmetic_prompts_round_trip_through_trl_tokenization(overrides, n_train):
    cfg = tool.compose_config(overrides)
    tokenizer = char_tokenizer()
    _, records, prompts, _, _ = load_splits(cfg.task, tokenizer, cfg.eval.n)
    texts = tool.prompt_texts(tokenizer, prompts)
    assert len(texts) == len(records) == n_train
    for text, record in zip(texts, records):
        # the chat template's rendering, special tokens included, ending in the assistant header
        assert text.endswith(f"<|im_start|>user\n{record['question']}<|im_end|>\n<|im_start|>assistant\n")
        assert text.startswith("<|im_start|>" + ("system\n" + cfg.task.system if cfg.task.system else "user\n"))


def test_prompt_ids_that_do_not_round_trip_are_refused():
    tokenizer = char_tokenizer()
    plain = tokenizer("What is 1 + 2?", add_special_tokens=False)["input_ids"]
    # the special token <|im_start|> spelled one character at a time decodes to text that re-encodes as one token
    spelled = tokenizer.convert_tokens_to_ids(list("<|im_start|>user"))
    with pytest.raises(ConfigError, match="1 of 2 prompts"):
        tool.prompt_texts(tokenizer, [plain, spelled])


@pytest.mark.slow
def test_smoke_run_through_trl_writes_summary_metrics_and_times(tmp_path):
    pytest.importorskip("trl")
    out = tmp_path / "trl"
    args = ["+experiment=smoke", "algorithm=grpo", "sampler=hf", "device=cpu", "rounds=2", "reward.self_test=0"]
    launcher = tmp_path / "shaped_trl.py"  # the digit reward of tests/test_train.py: the random model earns some
    launcher.write_text(SHAPED_TRL.format(tool=str(TOOL_PATH)))
    proc = subprocess.run(
        [sys.executable, str(launcher), "--out", str(out), *args],
        cwd=REPO,
        env=env_for(tmp_path),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-6000:]
    for option in (
        "num_generations = 4",
        "steps_per_generation = 2",
        "loss_type = 'grpo'",
        "beta = 0.04",
        "vllm_importance_sampling_correction = False",
    ):
        assert option in proc.stdout, option

    summary = json.loads((out / "summary.json").read_text())
    assert set(SUMMARY_KEYS) <= set(summary), set(SUMMARY_KEYS) - set(summary)
    # smoke: H = 2 steps of n_step = 8 per round, n_group = 4 -> n_inference = 16 samples per round
    assert summary["rounds"] == 2 and summary["samples"] == 2 * 16 and summary["optimizer_steps"] == 2 * 2
    assert (summary["algorithm"], summary["sampler"], summary["eval_sampler"]) == ("trl_grpo", "trl-hf-generate", "hf")
    assert 0.0 <= summary["eval/accuracy_after"] <= 1.0 and summary["eval/n"] == 16
    options = summary["options"]
    assert (
        options["num_generations"],
        options["per_device_train_batch_size"],
        options["steps_per_generation"],
        options["max_steps"],
        options["max_completion_length"],
    ) == (4, 8, 2, 4, 8)
    assert options["shuffle_dataset"] is False and options["use_vllm"] is False

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]  # rounds * H optimizer steps
    assert [r["step"] for r in rows if "reward" in r] == [1, 3]  # one generation per round
    for r in rows:
        # cosine decay of lr 2e-5 over 4 steps; a row reports the lr its step used (rapid's lr_lambda)
        assert r["learning_rate"] == pytest.approx(2e-5 * 0.5 * (1 + math.cos(math.pi * (r["step"] - 1) / 4)))
        assert r.get("completions/max_length", 8) <= 8
    # The digit reward gives some groups mixed rewards, so steps move the weights. The reference model is
    # the initial policy: the KL is exactly 0 on the first step (a mismatched reference would show here) and
    # above 0 on every step after the weights first moved (a reference that followed the policy would not).
    assert any(r.get("reward", 0.0) > 0 for r in rows)
    assert rows[0]["kl"] == 0.0
    first = next(i for i, r in enumerate(rows) if r["grad_norm"] > 0)
    assert first + 1 < len(rows) and all(r["kl"] > 0 for r in rows[first + 1 :]), rows

    # TRL counts prompt + completion tokens: each round's prompt tokens are those of rapid's prompts for
    # that round (n_inference / n_group = 4 of them, n_group = 4 completions each), in rapid's order
    _, _, prompts, _, _ = load_splits(tool.compose_config(args).task, char_tokenizer(), 16)
    stream = PromptStream(len(prompts), derive_seed(0, PROMPT_STREAM))
    seen = 0
    for r in rows[0], rows[2]:
        prompt_tokens = r["num_tokens"] - seen - r["completions/mean_length"] * 16
        assert prompt_tokens == 4 * sum(len(prompts[i]) for i in stream.take(4))
        seen = r["num_tokens"]

    t = {k.removeprefix("time/").removesuffix("_s_total"): v for k, v in summary.items() if k.startswith("time/")}
    assert all(v > 0 for v in t.values()), t  # every hook fired
    assert t["generate"] + t["reward"] + t["recompute"] + t["train"] == pytest.approx(t["total_s"], rel=1e-6)
    assert t["recompute"] == t["generate_old_logprob"] and t["train"] > t["generate_ref_logprob"]
    assert t["generate"] >= t["generate_sampling"]
    assert summary["peak_rss_mib"] > 100
