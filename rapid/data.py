"""The order in which training prompts are visited: seeded shuffled epochs, resumable.

`PromptStream.take(k)` returns the next k record indices, walking a fresh permutation of the
training set each epoch (Algorithm 1 iterates over the shuffled set). Its state (epoch,
position) goes into checkpoints, and the permutation of an epoch depends only on (seed, epoch).
"""

from __future__ import annotations

import torch

from rapid.seeding import derive_seed


class PromptStream:
    def __init__(self, n_records: int, seed: int):
        self.n_records, self.seed = n_records, seed
        self.epoch, self.pos = 0, 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
        return torch.randperm(self.n_records, generator=g).tolist()

    def take(self, k: int) -> list[int]:
        out = []
        while len(out) < k:
            if self.pos == self.n_records:
                self.epoch, self.pos = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
            n = min(k - len(out), self.n_records - self.pos)
            out += self._perm[self.pos : self.pos + n]
            self.pos += n
        return out

    @property
    def samples_epochs(self) -> float:
        return self.epoch + self.pos / self.n_records

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos = state["epoch"], state["pos"]
        self._perm = self._permutation(self.epoch)
