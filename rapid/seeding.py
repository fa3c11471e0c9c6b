"""Explicit randomness: one run seed, everything else derived from it.

`derive_seed(seed, *keys)` gives an independent 63-bit seed for any tuple of integers, e.g.
(seed, round, prompt, sample) for one completion, so that what is sampled does not depend on
batch composition, on the number of ranks, or on where a resumed run restarted.
"""

from __future__ import annotations

import random

import numpy as np
import torch

# The tags of the derived seed streams, all in one place so that no two share a tag. rapid.train:
SAMPLE_STREAM = 0  # (seed, SAMPLE_STREAM, round, prompt position): one group's completions
BUFFER_STREAM = 1  # (seed, BUFFER_STREAM, round): the order of a round's minibatches
PROMPT_STREAM = 2  # (seed, PROMPT_STREAM): the shuffled passes over the training prompts
EVAL_STREAM = 3  # (seed, EVAL_STREAM): evaluation's sampled completions (pass@k)
ENGINE_STREAM = 4  # (seed, ENGINE_STREAM, rank): the engine's own seed
# rapid.distill (the SFT baseline's teacher generations) and rapid.sft:
DISTILL_SAMPLE_STREAM, DISTILL_ENGINE_STREAM = 10, 11
SFT_DATA_STREAM, SFT_EVAL_STREAM, SFT_ENGINE_STREAM = 20, 21, 22


def derive_seed(*keys: int) -> int:
    return int(np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys]).generate_state(2, np.uint64)[0] >> 1)


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
