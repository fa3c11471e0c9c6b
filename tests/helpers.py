"""Small builders shared by the tests: a tiny real Llama and its character tokenizer."""

from __future__ import annotations

import torch

from rapid.models import load_model_and_tokenizer

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=1,
    head_dim=32,
    max_position_embeddings=256,
    tie_word_embeddings=True,
)


def tiny_model(seed: int = 0):
    model, tokenizer = load_model_and_tokenizer(architecture=TINY, seed=seed)
    # Random init is nearly uniform over the vocabulary; sharpen it so that log-probs differ.
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
    return model.eval(), tokenizer


def encode(tokenizer, texts: list[str]) -> list[list[int]]:
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def own_groups(model, tokenizer, questions: list[str], lengths, rewards, pad_id: int = 0) -> list[list]:
    """One group of Rollouts per question, completions of the given lengths drawn at random (seed 0) with
    the given rewards, and log μ the model's own log-probs (θ = μ at the first step)."""
    from rapid.buffer import Rollout, collate
    from rapid.policy import CompletionLogprobs, completion_logprobs

    g = torch.Generator().manual_seed(0)
    prompts = encode(tokenizer, questions)
    groups = []
    for k, (group_lengths, group_rewards) in enumerate(zip(lengths, rewards)):
        group = [
            Rollout(
                prompt_ids=prompts[k],
                completion_ids=torch.randint(3, len(tokenizer), (n,), generator=g).tolist(),
                logp_mu=[0.0] * n,
                reward=r,
                group_id=k,
                truncated=False,
            )
            for n, r in zip(group_lengths, group_rewards)
        ]
        with torch.no_grad():
            own = completion_logprobs(CompletionLogprobs(model, 1.0), collate(group, pad_id))
        for i, r in enumerate(group):
            r.logp_mu = own[i, : len(r.completion_ids)].tolist()
        groups.append(group)
    return groups
