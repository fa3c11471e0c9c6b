"""The ablation configurations reach the losses the way their names say, in the real training loop.

`python -m rapid.train` runs on the tiny random model with the shaped reward of tests/test_train.py
("1 if the completion contains a digit", so that advantages and gradients are non-zero), through a
launcher that also wraps the loss functions and the sampler to write what they were given to a trace
file (one JSON object a line). The tests then read the trace:

- `algorithm=grpo_multistep` (= `algorithm=grpo algorithm.H=<H>`): one generation of H x n_step
  samples per round, then H minibatch steps whose PPO ratio is taken against the log-probs that the
  round's sampler μ recorded, on the later minibatches too (where θ has moved away from μ);
- the IW-GRPG switches (eta, leave_one_out, iw_baseline, iw_gradient) arrive in `iw_grpg_loss`.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from rapid.losses import group_normalized_advantages
from tests.test_train import REPO, TIMEOUT_S, env_for, read_rows, train_rows

TRACING_LAUNCHER = """\
import json, os, runpy
import rapid.iw_grpg, rapid.losses, rapid.sampler
import rapid.tasks.arithmetic as arithmetic

TRACE = open(os.environ["RAPID_TEST_TRACE"], "a")

def contains_digit(completion, record):
    return float(any(ch.isdigit() for ch in completion))

arithmetic.reward = contains_digit

generate = rapid.sampler.HFSampler.generate
def traced_generate(self, prompts, n, *args, **kwargs):
    groups = generate(self, prompts, n, *args, **kwargs)
    TRACE.write(json.dumps({"kind": "generate", "n": n, "logprobs": [c.logprobs for g in groups for c in g]}) + "\\n")
    return groups
rapid.sampler.HFSampler.generate = traced_generate

grpo_loss = rapid.losses.grpo_loss
def traced_grpo_loss(logp, logp_old, logp_ref, advantages, mask, **kwargs):
    keep = mask.bool()
    TRACE.write(json.dumps({"kind": "grpo_loss", "clip_eps": kwargs["clip_eps"],
        "logp": [row[k].tolist() for row, k in zip(logp.detach().float(), keep)],
        "logp_old": [row[k].tolist() for row, k in zip(logp_old.float(), keep)],
        "advantages": advantages.tolist()}) + "\\n")
    return grpo_loss(logp, logp_old, logp_ref, advantages, mask, **kwargs)
rapid.losses.grpo_loss = traced_grpo_loss

iw_grpg_loss = rapid.iw_grpg.iw_grpg_loss
def traced_iw_grpg_loss(logp, logp_mu, rewards, group_ids, **kwargs):
    TRACE.write(json.dumps({"kind": "iw_grpg_loss", **{k: kwargs[k] for k in
        ("eta", "leave_one_out", "iw_baseline", "iw_gradient")}}) + "\\n")
    return iw_grpg_loss(logp, logp_mu, rewards, group_ids, **kwargs)
rapid.iw_grpg.iw_grpg_loss = traced_iw_grpg_loss

runpy.run_module("rapid.train", run_name="__main__", alter_sys=True)
"""

ROUNDS, H, N_STEP, N_GROUP = 2, 3, 8, 4


def traced_run(tmp_path, args: list[str]) -> tuple[list[dict], list[dict]]:
    """Run rapid.train through TRACING_LAUNCHER: (trace events, metrics rows)."""
    launcher, run, trace = tmp_path / "tracing_launcher.py", tmp_path / "run", tmp_path / "trace.jsonl"
    launcher.write_text(TRACING_LAUNCHER)
    argv = [
        sys.executable,
        str(launcher),
        "+experiment=smoke",
        "sampler=hf",
        f"rounds={ROUNDS}",
        f"algorithm.H={H}",
        f"algorithm.n_step={N_STEP}",
        f"algorithm.n_group={N_GROUP}",
        "train.micro_batch=8",
        "eval.every=0",
        "ckpt.every=0",
        "optim.lr=1e-3",
        "sampler.temperature=1.0",
        "reward.self_test=0",  # the digit reward
        f"hydra.run.dir={run}",
        *args,
    ]  # fails it, by design
    proc = subprocess.run(
        argv,
        cwd=REPO,
        env=env_for(tmp_path, RAPID_TEST_TRACE=str(trace)),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=TIMEOUT_S,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    return events, read_rows(run)


@pytest.mark.slow
def test_grpo_at_equal_h_clips_the_ratio_against_the_rounds_sampler(tmp_path):
    events, rows = traced_run(tmp_path, ["algorithm=grpo_multistep"])
    rounds, current = [], None
    for e in events:
        if e["kind"] == "generate" and e["n"] == N_GROUP:  # a round's generation (evaluation uses n=1)
            current = {"samples": e["logprobs"], "steps": []}
            rounds.append(current)
        elif e["kind"] == "grpo_loss":
            current["steps"].append(e)
    assert len(rounds) == ROUNDS
    moved = []
    for r in rounds:
        # one generation of n_inference = H x n_step samples, then H minibatch steps
        assert len(r["samples"]) == H * N_STEP and len(r["steps"]) == H
        samples = {tuple(lp) for lp in r["samples"]}
        for k, step in enumerate(r["steps"]):
            assert step["clip_eps"] == 0.2 and len(step["logp_old"]) == N_STEP
            # the ratio's denominator is, record by record, the log μ the round's sampler recorded
            # (not the policy of the previous minibatch, nor the current one)
            assert {tuple(lp) for lp in step["logp_old"]} <= samples
            gap = max(abs(p - q) for lp, lq in zip(step["logp"], step["logp_old"]) for p, q in zip(lp, lq))
            if k == 0:
                assert gap < 1e-4  # θ = μ on the round's first minibatch: every ratio is 1
            else:
                moved.append(gap)
            # group-normalised advantages: groups of N_GROUP consecutive records, mean 0, unbiased std 1
            adv = torch.tensor(step["advantages"]).view(-1, N_GROUP)
            torch.testing.assert_close(adv.mean(1), torch.zeros(len(adv)), rtol=0, atol=1e-5)
            informative = adv.abs().sum(1) > 0
            assert informative.any()
            torch.testing.assert_close(adv[informative].std(1), torch.ones(int(informative.sum())), rtol=0, atol=1e-3)
    assert min(moved) > 1e-3  # on the later minibatches θ has moved: the ratios really leave 1
    # the logged clip fraction is, round by round, the mean over its steps of the fraction of the step's
    # completion tokens whose ratio r = exp(log π − log μ) the clip holds (A < 0 and r < 0.8, or A > 0 and
    # r > 1.2), recomputed here from what each step's loss was given
    want = []
    for r in rounds:
        fractions = []
        for step in r["steps"]:
            tokens = [
                (math.exp(p - q), a) for lp, lq, a in zip(step["logp"], step["logp_old"], step["advantages"])
                for p, q in zip(lp, lq)
            ]  # fmt: skip
            fractions.append(sum((a < 0 and x < 0.8) or (a > 0 and x > 1.2) for x, a in tokens) / len(tokens))
        want.append(sum(fractions) / len(fractions))
    got = [r["loss/clip_frac"] for r in train_rows(rows)]  # a ratio clip: loss/, not iw/
    assert not any("iw/clip_frac" in r for r in train_rows(rows))
    assert got == pytest.approx(want, abs=1e-6)
    assert max(want) > 0  # not vacuous: some token is clipped


def test_group_normalisation_used_by_the_trace_check():
    # the check above (mean 0, unbiased std 1 per group) is what group_normalized_advantages gives
    adv = group_normalized_advantages(
        torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    )
    # group 0: mean 0.5, std sqrt((4·0.25)/3) = 0.57735 -> ±0.866; group 1: mean 0.75, std 0.5 -> 0.5, 0.5, -1.5, 0.5
    torch.testing.assert_close(
        adv, torch.tensor([0.8660, -0.8660, -0.8660, 0.8660, 0.5, 0.5, -1.5, 0.5]), rtol=0, atol=1e-3
    )


@pytest.mark.slow
def test_iw_grpg_switches_reach_the_loss(tmp_path):
    events, rows = traced_run(
        tmp_path,
        [
            "algorithm.eta=null",
            "algorithm.leave_one_out=true",
            "algorithm.iw_baseline=false",
            "algorithm.iw_gradient=false",
        ],
    )
    calls = [e for e in events if e["kind"] == "iw_grpg_loss"]
    assert len(calls) == ROUNDS * H
    assert all(
        (c["eta"], c["leave_one_out"], c["iw_baseline"], c["iw_gradient"]) == (None, True, False, False) for c in calls
    )
    for r in train_rows(rows):
        assert r["iw/clip_frac"] == 0.0 and r["iw/clipped_mass"] == 0.0  # η = ∞: nothing is clipped
