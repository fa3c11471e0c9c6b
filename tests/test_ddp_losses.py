"""The registered losses under DDP: two gloo ranks with completions of different lengths give the
single-process gradient, each loss called through the registry (rapid.estimators) as rapid.train calls it.

GRPO with `aggregation=token_mean`, DAPO and CISPO divide the summed token objective by the minibatch's
completion-token count. DDP averages the ranks' gradients, so each rank must divide by its share of
the *global* count (global / world); dividing by its own count over-weights the rank with the
shorter completions (here 6 and 23 tokens: per-token weights 2.4x and 0.63x the single-process ones).
Dr. GRPO (B · max tokens) and GSPO (records) divide by record counts, which the ranks share equally.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from rapid import estimators
from rapid.buffer import Rollout, collate
from rapid.policy import CompletionLogprobs, accumulate_gradients, completion_logprobs
from tests.helpers import encode, tiny_model

CPU = torch.device("cpu")
PAD = 0  # the character tokenizer's <pad>
LENGTHS = ([1, 2, 1, 2], [5, 6, 7, 5])  # rank 0's group: 6 tokens, rank 1's: 23
SETTINGS = {  # registered loss: its settings (GRPO with the token-mean aggregation, no KL reference)
    "grpo": {"eps_low": 0.2, "eps_high": None, "beta": 0.0, "aggregation": "token_mean"},
    "dapo": {"eps_low": 0.2, "eps_high": 0.28},
    "cispo": {"eps_high": 0.3, "eps_low": None},  # a cap that some tokens reach
    "dr_grpo": {"eps_low": 0.2, "eps_high": None, "beta": 0.0},
    "gspo": {"eps_low": 3e-4, "eps_high": 4e-4},
}
NAMES = tuple(SETTINGS)
NOISE = {"gspo": 1e-3}  # log μ = log π + noise per token: GSPO's ±4e-4 range needs some sequences inside it


def records(tokenizer, noise: float = 0.3) -> list[Rollout]:
    """Two groups of 4 (one per rank); log μ near the model's own, so ratios spread around 1."""
    model, _ = tiny_model()
    g = torch.Generator().manual_seed(0)
    prompts = encode(tokenizer, ["What is 2 + 3?", "Hi there"])
    out = []
    for k, lengths in enumerate(LENGTHS):
        for j, length in enumerate(lengths):
            out.append(
                Rollout(
                    prompt_ids=prompts[k],
                    completion_ids=torch.randint(3, len(tokenizer), (length,), generator=g).tolist(),
                    logp_mu=[0.0] * length,
                    reward=float((j + k) % 2),
                    group_id=k,
                    truncated=False,
                )
            )
    with torch.no_grad():
        own = completion_logprobs(CompletionLogprobs(model, 1.0), collate(out, tokenizer.pad_token_id))
    for i, r in enumerate(out):
        c = len(r.completion_ids)
        r.logp_mu = (own[i, :c] + noise * torch.randn(c, generator=g)).tolist()
    return out


def make_loss_fn(name: str):
    """The registered loss `name` on a micro-batch, with the minibatch's normalisers (rapid.train's)."""

    def loss_fn(token_logp, batch, n_records, n_tokens):
        x = estimators.LossInputs(
            token_logp,
            batch.logp_mu,
            batch.completion_mask,
            batch.rewards,
            batch.group_ids,
            None,
            n_records,
            n_tokens,
            8,  # max_new_tokens (Dr. GRPO's constant)
        )
        return estimators.compute(name, x, SETTINGS[name])

    return loss_fn


def gradient(policy, model, rollouts, name) -> torch.Tensor:
    accumulate_gradients(
        policy, rollouts, make_loss_fn(name), micro_batch=4, pad_id=PAD, device=CPU, compute_dtype=torch.float32
    )
    return torch.cat([p.grad.flatten() for p in model.parameters()])


def rank_main(rank: int, world: int, init_file: str, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        grads = {}
        for name in NAMES:
            model, tok = tiny_model()
            mine = [r for r in records(tok, NOISE.get(name, 0.3)) if r.group_id == rank]
            grads[name] = gradient(DistributedDataParallel(CompletionLogprobs(model, 1.0)), model, mine, name)
        if rank == 0:
            torch.save(grads, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_token_mean_losses_on_two_ranks_equal_single_process(tmp_path):
    out = tmp_path / "grads.pt"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(rank_main, args=(2, str(tmp_path / "store"), str(out)), nprocs=2, join=True)
    ddp = torch.load(out)
    wrong = []
    for name in NAMES:
        model, tok = tiny_model()
        rollouts = records(tok, NOISE.get(name, 0.3))
        assert [sum(len(r.completion_ids) for r in rollouts if r.group_id == k) for k in (0, 1)] == [6, 23]
        single = gradient(CompletionLogprobs(model, 1.0), model, rollouts, name)
        assert single.abs().max() > 1e-4, name  # not vacuous
        if not torch.allclose(ddp[name], single, rtol=1e-4, atol=1e-7):
            wrong.append(f"{name}: max |DDP - single| {(ddp[name] - single).abs().max().item():.3g}")
    assert not wrong, wrong
