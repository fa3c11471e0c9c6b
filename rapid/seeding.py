"""Explicit randomness: one run seed, everything else derived from it.

`derive_seed(seed, *keys)` gives an independent 63-bit seed for any tuple of integers, e.g.
(seed, round, prompt, sample) for one completion, so that what is sampled does not depend on
batch composition, on the number of ranks, or on where a resumed run restarted.
"""
from __future__ import annotations

import random

import numpy as np
import torch


def derive_seed(*keys: int) -> int:
    return int(np.random.SeedSequence([int(k) & 0xFFFFFFFF for k in keys]).generate_state(2, np.uint64)[0] >> 1)


def rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
