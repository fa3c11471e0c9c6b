"""The SFT baseline: `sft_loss` against hand computations, and `python -m rapid.distill` followed by
`python -m rapid.sft` run end to end as subprocesses on the tiny random model (sampler=hf, so that
every completion is reproducible from its seed).

A random model never writes a right `\\boxed{}` answer, so the end-to-end runs go through a launcher
that swaps the arithmetic reward for "1 if the completion contains a digit" (as tests/test_train.py's
SHAPED_LAUNCHER does): about half of the teacher's completions are accepted, half rejected.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rapid.buffer import Rollout, collate
from rapid.config import ConfigError
from rapid.models import char_tokenizer, load_model_and_tokenizer
from rapid.policy import CompletionLogprobs
from rapid.sampler import HFSampler
from rapid.seeding import DISTILL_SAMPLE_STREAM, derive_seed
from rapid.sft import load_examples, sft_loss
from rapid.tasks import arithmetic
from tests.helpers import encode, tiny_model
from tests.test_train import REPO, TIMEOUT_S, assert_one_sentence_error, env_for, read_rows

# `python LAUNCHER <module> <overrides>` is `python -m <module> <overrides>` with a reward a random model earns.
SHAPED_LAUNCHER = """\
import runpy, sys
import rapid.tasks.arithmetic as arithmetic

def contains_digit(completion, record):
    return float(any(ch.isdigit() for ch in completion))

arithmetic.reward = contains_digit   # distill scores through the task module
runpy.run_module(sys.argv.pop(1), run_name="__main__", alter_sys=True)
"""
SMOKE = ["+experiment=smoke_sft", "sampler=hf", "device=cpu", "distill.n_prompts=24", "distill.chunk=8"]


def contains_digit(completion: str, record: dict) -> float:
    return float(any(ch.isdigit() for ch in completion))


def launch(module: str, args: list[str], tmp: Path, check: bool = True) -> subprocess.CompletedProcess:
    launcher = tmp / "shaped_launcher.py"
    launcher.write_text(SHAPED_LAUNCHER)
    proc = subprocess.run(
        [sys.executable, str(launcher), module, *args],
        cwd=REPO,
        env=env_for(tmp),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=TIMEOUT_S,
    )
    if check and proc.returncode != 0:
        pytest.fail(f"{module} {' '.join(args)} exited with {proc.returncode}:\n{proc.stdout[-6000:]}")
    return proc


# ----------------------------------------------------------------------------- the loss


def two_records():
    """The tiny model, and two records of different prompt and completion lengths, collated."""
    model, tokenizer = tiny_model()
    prompts = encode(tokenizer, ["What is 2 + 3?", "Hi"])
    completions = encode(tokenizer, ["\\boxed{5}", "ok!"])
    records = [
        Rollout(prompt_ids=p, completion_ids=c, logp_mu=[0.0] * len(c), reward=1.0, group_id=k, truncated=False)
        for k, (p, c) in enumerate(zip(prompts, completions))
    ]
    return model, tokenizer, prompts, completions, collate(records, tokenizer.pad_token_id)


def test_sft_loss_is_mean_nll_of_masked_tokens():
    token_logp = torch.tensor([[-1.0, -2.0, -9.0], [-0.5, -7.0, -3.0]], requires_grad=True)
    mask = torch.tensor([[True, True, False], [True, False, False]])
    loss, _ = sft_loss(token_logp, mask)
    assert loss.item() == pytest.approx((1.0 + 2.0 + 0.5) / 3)  # 3 completion tokens
    loss.backward()
    torch.testing.assert_close(token_logp.grad, -mask.float() / 3)  # padding gets no gradient
    garbage = token_logp.detach().masked_fill(~mask, -123.0)
    assert sft_loss(garbage, mask)[0].item() == pytest.approx(3.5 / 3)
    # a micro-batch divides by the whole minibatch's token count
    assert sft_loss(token_logp.detach(), mask, normalizer=7)[0].item() == pytest.approx(3.5 / 7)


@pytest.mark.parametrize("share_prompt", [True, False])
def test_sft_loss_counts_completion_tokens_only(share_prompt):
    """The training path (collate -> CompletionLogprobs at T = 1 -> sft_loss) on two records with
    different prompt and completion lengths equals (a) log-softmax over each unpadded sequence at the
    completion positions only and (b) transformers' cross-entropy with the prompt labels ignored (-100);
    it differs from the cross-entropy that also counts prompt tokens."""
    model, tokenizer, prompts, completions, batch = two_records()
    policy = CompletionLogprobs(model, temperature=1.0, share_prompt=share_prompt)
    loss, _ = sft_loss(
        policy(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask), batch.completion_mask
    )

    n_tokens = sum(len(c) for c in completions)  # 9 + 3
    by_hand, hf_completion_only, hf_all_tokens = 0.0, 0.0, 0.0
    with torch.no_grad():
        for p, c in zip(prompts, completions):
            ids = torch.tensor([p + c])
            logp = torch.log_softmax(model(input_ids=ids).logits[0].double(), -1)
            # position t predicts token t + 1: the completion tokens are predicted from P - 1 .. P + C - 2
            by_hand -= sum(logp[len(p) - 1 + t, tok].item() for t, tok in enumerate(c))
            labels = ids.clone()
            labels[0, : len(p)] = -100
            hf_completion_only += model(input_ids=ids, labels=labels).loss.item() * len(c)
            hf_all_tokens += model(input_ids=ids, labels=ids).loss.item() * (len(p) + len(c) - 1)
    assert loss.item() == pytest.approx(by_hand / n_tokens, abs=1e-5)
    assert loss.item() == pytest.approx(hf_completion_only / n_tokens, abs=1e-5)
    all_tokens = hf_all_tokens / sum(len(p) + len(c) - 1 for p, c in zip(prompts, completions))
    assert abs(loss.item() - all_tokens) > 1e-2


def test_prompt_positions_get_no_gradient():
    """Changing the logits at prompt positions cannot change the loss: the gradient reaching the
    final hidden states there is exactly 0. Only the last prompt position (it predicts the first
    completion token) and the completion positions but the last get one."""
    model, tokenizer, prompts, completions, batch = two_records()
    hidden = {}
    model.model.norm.register_forward_hook(lambda module, args, out: hidden.setdefault("h", out).retain_grad())
    policy = CompletionLogprobs(model, temperature=1.0, share_prompt=False)  # one forward over [prompt | completion]
    loss, _ = sft_loss(
        policy(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask), batch.completion_mask
    )
    loss.backward()
    grad_norm = hidden["h"].grad.norm(dim=-1)  # [B, P + C]
    P = batch.prompt_ids.shape[1]
    for row, c in enumerate(completions):
        predicting = set(range(P - 1, P + len(c) - 1))  # positions whose logits predict a completion token
        for pos in range(grad_norm.shape[1]):
            assert (grad_norm[row, pos] > 0) == (pos in predicting), (row, pos)


def test_load_examples_keeps_teacher_ids_or_reencodes(tmp_path):
    tokenizer = char_tokenizer()
    records = arithmetic.load("train", low=0, high=3, n_eval=4)
    prompts = arithmetic.build_prompts(records, tokenizer, n_shots=0, low=0, high=3, n_eval=4)
    text = "\\boxed{3}"
    teacher_ids = [7, 8, 9]  # whatever the teacher's tokenizer made of it
    rows = [
        {
            "record": {"index": 2, "id": records[2]["question"]},
            "prompt_ids": prompts[2],
            "completion_ids": teacher_ids,
            "text": text,
            "finish_reason": "stop",
        },
        {
            "record": {"index": 5, "id": records[5]["question"]},
            "prompt_ids": [1, 2, 3],  # another prompt format
            "completion_ids": teacher_ids,
            "text": text,
            "finish_reason": "stop",
        },
    ]
    path = tmp_path / "distill.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples, reencoded = load_examples(path, records, prompts, tokenizer, "arithmetic")
    assert reencoded == 1
    assert examples[0].prompt_ids == prompts[2] and examples[0].completion_ids == teacher_ids
    assert examples[1].prompt_ids == prompts[5]
    assert examples[1].completion_ids == encode(tokenizer, [text])[0] + [tokenizer.eos_token_id]
    assert [e.group_id for e in examples] == [1, 2]  # one group per completion

    rows[0]["record"]["index"] = 3  # names a problem that is not there
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ConfigError, match="task settings of the distill run"):
        load_examples(path, records, prompts, tokenizer, "arithmetic")


# ----------------------------------------------------------------------------- end to end


@pytest.mark.slow
def test_distill_then_sft_end_to_end(tmp_path):
    teacher_dir, student_dir = tmp_path / "distill", tmp_path / "sft"
    launch("rapid.distill", [*SMOKE, f"hydra.run.dir={teacher_dir}"], tmp_path)

    # distill.jsonl holds exactly the accepted completions: regenerate all of them here, same seeds
    cfg = yaml.safe_load((teacher_dir / "config.yaml").read_text())
    t = cfg["task"]
    model, tokenizer = load_model_and_tokenizer(architecture=cfg["model"]["architecture"], seed=cfg["seed"])
    records = arithmetic.load("train", **t)[:24]
    prompts = arithmetic.build_prompts(records, tokenizer, **t)
    groups = HFSampler(model.eval(), tokenizer).generate(
        prompts,
        n=5,
        max_new_tokens=t["max_new_tokens"],
        temperature=0.7,
        top_p=cfg["distill"]["top_p"],
        seeds=[derive_seed(cfg["seed"], DISTILL_SAMPLE_STREAM, i) for i in range(len(prompts))],
    )
    accepted = [
        (i, c.token_ids) for i, group in enumerate(groups) for c in group if contains_digit(c.text, records[i]) == 1.0
    ]
    rows = [json.loads(line) for line in (teacher_dir / "distill.jsonl").read_text().splitlines()]
    assert [(r["record"]["index"], r["completion_ids"]) for r in rows] == accepted
    for r in rows:
        assert contains_digit(r["text"], None) == 1.0
        assert tokenizer.decode(r["completion_ids"], skip_special_tokens=True) == r["text"]
        i = r["record"]["index"]
        assert r["prompt_ids"] == prompts[i] and r["record"]["question"] == records[i]["question"]

    summary = json.loads((teacher_dir / "distill_summary.json").read_text())
    assert summary["prompts"] == 24 and summary["generated"] == 24 * 5
    assert summary["kept"] == len(rows) and 0 < len(rows) < 24 * 5  # some accepted, some rejected
    assert summary["acceptance_rate"] == pytest.approx(len(rows) / 120)
    assert summary["prompts_with_kept"] == len({r["record"]["index"] for r in rows})
    assert summary["reward_failures"] == 0 and summary["teacher"] == "tiny-llama"

    launch(
        "rapid.sft",
        [*SMOKE, f"distill.data={teacher_dir}", "sft.lr=1e-3", "seed=1", f"hydra.run.dir={student_dir}"],
        tmp_path,
    )
    metrics = read_rows(student_dir)
    trains = [r for r in metrics if "train/loss" in r]
    evals = [r for r in metrics if "eval/accuracy" in r]
    steps_per_epoch = -(-len(rows) // 8)  # sft.batch_size = 8
    assert [r["progress/epoch"] for r in trains] == [1.0, 2.0, 3.0]
    assert [r["progress/step"] for r in trains] == [steps_per_epoch * e for e in (1, 2, 3)]
    assert all(r["train/tokens"] == sum(len(x["completion_ids"]) for x in rows) for r in trains)
    losses = [r["train/loss"] for r in trains]
    assert losses[0] - losses[1] > 0.02 and losses[1] - losses[2] > 0.02, losses
    assert all(r["time/train_s"] > 0 and r["train/lr"] == pytest.approx(1e-3) for r in trains)
    assert [r["progress/epoch"] for r in evals] == [0, 3] and all(r["eval/n"] == 16 for r in evals)

    summary = json.loads((student_dir / "summary.json").read_text())
    assert summary["eval/accuracy_before"] == evals[0]["eval/accuracy"]
    assert summary["eval/accuracy_after"] == evals[1]["eval/accuracy"]
    assert summary["epochs"] == 3 and summary["examples"] == len(rows) and summary["time/total_s"] > 0
    ckpt = student_dir / "checkpoints" / "round_000003"
    assert (ckpt / "model" / "model.safetensors").exists()
    state = torch.load(ckpt / "state.pt", weights_only=False)
    assert state["config"]["sft"]["epochs"] == 3 and state["config"]["distill"]["data"] == str(teacher_dir)


@pytest.mark.slow
def test_sft_without_data_says_how_to_make_it(tmp_path):
    proc = launch("rapid.sft", [*SMOKE, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path, check=False)
    assert_one_sentence_error(proc.returncode, proc.stdout, ("distill.data", "rapid.distill"))


@pytest.mark.slow
def test_algorithm_sft_runs_the_pair_through_train(tmp_path):
    """`python -m rapid.train +experiment=smoke algorithm=sft` runs rapid.distill then rapid.sft in one run
    with the experiment's task, model and seed, and the algorithm's distill/sft overrides."""
    run = tmp_path / "run"
    launch(
        "rapid.train",
        [
            "+experiment=smoke",
            "algorithm=sft",
            "sampler=hf",
            "device=cpu",
            "algorithm.distill.n_prompts=24",
            "algorithm.distill.chunk=8",
            "algorithm.sft.epochs=2",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    rows = [json.loads(line) for line in (run / "distill" / "distill.jsonl").read_text().splitlines()]
    distilled = json.loads((run / "distill" / "distill_summary.json").read_text())
    assert distilled["prompts"] == 24 and distilled["generated"] == 120 and distilled["kept"] == len(rows) > 0
    assert all(contains_digit(r["text"], None) == 1.0 for r in rows)
    pair = yaml.safe_load((run / "sft" / "config.yaml").read_text())
    assert pair["task"]["max_new_tokens"] == 8 and pair["model"]["name"] == "tiny-llama"  # from +experiment=smoke
    assert pair["sft"]["epochs"] == 2 and pair["sft"]["lr"] == 2e-5 and pair["distill"]["n_samples"] == 5
    assert pair["distill"]["data"] == str(run / "distill" / "distill.jsonl")
    trains = [r for r in read_rows(run / "sft") if "train/loss" in r]
    assert [r["progress/epoch"] for r in trains] == [1.0, 2.0]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["algorithm"] == "sft" and summary["examples"] == len(rows) and summary["epochs"] == 2
    assert summary["distill"]["kept"] == len(rows)
    assert (
        summary["eval/accuracy_after"] == json.loads((run / "sft" / "summary.json").read_text())["eval/accuracy_after"]
    )


@pytest.mark.slow
def test_algorithm_sft_rejects_an_unknown_key(tmp_path):
    proc = launch(
        "rapid.train",
        [
            "+experiment=smoke",
            "algorithm=sft",
            "sampler=hf",
            "device=cpu",
            "algorithm.sft.epoch=2",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        tmp_path,
        check=False,
    )
    assert proc.returncode != 0 and "algorithm.sft.epoch" in proc.stdout and "Traceback" not in proc.stdout
