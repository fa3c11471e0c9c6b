"""Token-mean losses under DDP: two gloo ranks with completions of different lengths give the
single-process gradient.

GRPO with `aggregation=token_mean` and DAPO divide the summed token objective by the minibatch's
completion-token count. DDP averages the ranks' gradients, so each rank must divide by its share of
the *global* count (global / world); dividing by its own count over-weights the rank with the
shorter completions (here 6 and 23 tokens: per-token weights 2.4x and 0.63x the single-process ones).
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel

from rapid.buffer import Rollout, collate
from rapid.losses import dapo_loss, group_normalized_advantages, grpo_loss
from rapid.policy import CompletionLogprobs, accumulate_gradients, completion_logprobs
from tests.helpers import encode, tiny_model

CPU = torch.device("cpu")
PAD = 0  # the character tokenizer's <pad>
LENGTHS = ([1, 2, 1, 2], [5, 6, 7, 5])  # rank 0's group: 6 tokens, rank 1's: 23
NAMES = ("grpo", "dapo")  # GRPO with aggregation=token_mean; DAPO


def records(tokenizer) -> list[Rollout]:
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
        r.logp_mu = (own[i, :c] + 0.3 * torch.randn(c, generator=g)).tolist()
    return out


def make_loss_fn(name: str):
    def loss_fn(token_logp, batch, n_records, n_tokens):
        adv = group_normalized_advantages(batch.rewards, batch.group_ids)
        if name == "grpo":
            return grpo_loss(
                token_logp,
                batch.logp_mu,
                None,
                adv,
                batch.completion_mask,
                clip_eps=0.2,
                kl_coef=0.0,
                aggregation="token_mean",
                normalizer=n_tokens,
            )
        return dapo_loss(
            token_logp, batch.logp_mu, adv, batch.completion_mask, clip_low=0.2, clip_high=0.28, normalizer=n_tokens
        )

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
            mine = [r for r in records(tok) if r.group_id == rank]
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
    for name in NAMES:
        model, tok = tiny_model()
        rollouts = records(tok)
        assert [sum(len(r.completion_ids) for r in rollouts if r.group_id == k) for k in (0, 1)] == [6, 23]
        single = gradient(CompletionLogprobs(model, 1.0), model, rollouts, name)
        assert single.abs().max() > 1e-4  # not vacuous
        torch.testing.assert_close(ddp[name], single, rtol=1e-4, atol=1e-7, msg=name)
