"""No non-finite update reaches the weights or a checkpoint.

What rapid does:
- a reward that is not a finite number is a failed check: it scores 0, is counted in
  train/reward_failures and warned about once naming the task (`rapid.rewards`), so a NaN never
  reaches the advantages;
- an optimizer step whose loss or global gradient norm (the one `clip_grad_norm_` returns, which is
  the same on every rank after DDP's all-reduce) is NaN or infinite is skipped: the gradient is
  dropped, the weights and the optimizer's moments stay as they were, the lr schedule moves on (it
  runs over samples generated), and the step is counted in `train/nonfinite_steps`;
- `optim.max_nonfinite_steps` skipped steps in a row (default 3) stop the run with one sentence
  (`RunStopped`, exit status 3): by then the weights themselves produce NaN (a diverging learning
  rate does this within a step), and more rounds would only spend compute;
- `rapid.checkpoint.save` refuses to write weights that hold a NaN or an infinity (`RunStopped`),
  so that `ckpt.keep` never replaces the last good checkpoint by a poisoned one.
The exit status says how the run ended: 0 finished, 2 refused at start (`ConfigError`), 3 stopped
by this guard, 1 anything else (a traceback).

Why this and not something else, from what the peers do (read 2026-11):
- DeepSpeed skips the optimizer step when it finds an overflow in the gradients (always with fp16
  loss scaling; for bf16 when `check_grad_overflow` is on, added so that a bad step does not pollute
  a checkpoint) and goes on; fp16 `torch.amp.GradScaler` does the same and lowers its scale. Neither
  stops a run that never recovers.
- transformers' Trainer (under TRL and accelerate) takes the step whatever the loss: its
  `logging_nan_inf_filter` only keeps NaN/inf out of the logged average, so the weights become NaN
  and every later checkpoint holds them.
- Callbacks such as Keras' TerminateOnNaN and Lightning's old `terminate_on_nan` stop at the first NaN.
rapid takes DeepSpeed's skip (a single bad minibatch, e.g. an overflow in one group's importance
weights, should not end a long run) and adds the stop that skipping alone lacks (a run whose weights
are already broken ends at once, in one sentence, with a non-zero exit status), and the checkpoint
check that makes the guarantee hold whatever path a NaN took.
"""

from __future__ import annotations

import math

import torch

from rapid.config import RunStopped
from rapid.distributed import all_reduce_max


class StepGuard:
    """`ok(loss, grad_norm)` before each optimizer step: False to skip it; raises RunStopped after
    `limit` skipped steps in a row. `take_count()` returns the steps skipped since the last call."""

    def __init__(self, limit: int, device: torch.device):
        self.limit, self.device = limit, device
        self.in_a_row, self.skipped = 0, 0

    def ok(self, loss: float, grad_norm: float, step: int) -> bool:
        finite = math.isfinite(loss) and math.isfinite(grad_norm)
        finite = all_reduce_max(0.0 if finite else 1.0, self.device) == 0.0  # every rank decides alike
        if finite:
            self.in_a_row = 0
            return True
        self.in_a_row += 1
        self.skipped += 1
        print(f"step {step}: loss {loss}, gradient norm {grad_norm}: step skipped", flush=True)
        if self.in_a_row >= self.limit:
            raise RunStopped(
                f"the last {self.in_a_row} optimizer steps (up to step {step}) had a non-finite loss or gradient "
                f"norm, so the weights no longer give finite values: lower optim.lr or check the reward and the "
                f"data (the latest checkpoint predates this; optim.max_nonfinite_steps={self.limit} sets this limit)"
            )
        return False

    def take_count(self) -> int:
        n, self.skipped = self.skipped, 0
        return n


def nonfinite_parameters(model: torch.nn.Module) -> list[str]:
    """Names of the parameters holding a NaN or an infinity."""
    return [name for name, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
