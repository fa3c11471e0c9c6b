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
