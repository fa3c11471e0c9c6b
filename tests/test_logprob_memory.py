"""rapid.policy.selected_token_logprobs: the selected-token log-softmax at temperature T, computed in
chunks of rows so that no fp32 [batch, tokens, vocab] tensor exists, forward or backward."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import rapid.policy
from rapid.policy import selected_token_logprobs

T = 0.7


def plain(logits, targets, temperature):
    """The computation it replaces: the whole [B, C, V] in fp32."""
    x = logits.float() / temperature
    return x.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(x, dim=-1)


class LargestFp32Tensor(TorchDispatchMode):
    """Records the largest fp32 tensor any op creates while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-6)])
def test_equals_the_plain_computation_values_and_gradients(dtype, tol, monkeypatch):
    monkeypatch.setattr(rapid.policy, "LOGPROB_CHUNK_BYTES", 4 * 50 * 3)  # 3 rows a chunk: 2x5 rows, ragged
    g = torch.Generator().manual_seed(0)
    base = (torch.randn(2, 5, 50, generator=g) * 3).to(dtype)
    targets = torch.randint(0, 50, (2, 5), generator=g)
    upstream = torch.randn(2, 5, generator=g)  # a loss's weights on each token
    a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
    ours, ref = selected_token_logprobs(a, targets, T), plain(b, targets, T)
    assert ours.dtype == ref.dtype == torch.float32
    torch.testing.assert_close(ours, ref, rtol=0, atol=tol)
    (ours * upstream).sum().backward()
    (ref * upstream).sum().backward()
    assert a.grad.dtype == dtype
    # bf16 gradients: both are fp32 values rounded to bf16 once, so they agree to bf16 rounding
    torch.testing.assert_close(a.grad, b.grad, rtol=0 if dtype == torch.float32 else 8e-3, atol=tol)
    # and the gradient is the textbook one: (onehot - softmax(x / T)) / T times the upstream weight
    p = torch.softmax(base.float() / T, -1)
    expected = (torch.nn.functional.one_hot(targets, 50) - p) / T * upstream.unsqueeze(-1)
    torch.testing.assert_close(a.grad.float(), expected, rtol=1e-2 if dtype == torch.bfloat16 else 1e-5, atol=1e-5)


def test_no_fp32_batch_by_vocab_tensor_is_made():
    """A micro-batch of 4 x 64 tokens over a 32k vocabulary, measured by the largest fp32 tensor any
    op makes: the plain path makes the whole [4, 64, 32000] (32.8 MB); the chunked one nothing larger
    than its chunk (16 rows here, by a small budget)."""
    B, C, V = 4, 64, 32000
    logits = torch.randn(B, C, V, dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, V, (B, C))
    with LargestFp32Tensor() as plain_mode:
        plain(logits, targets, T).sum().backward()
    assert plain_mode.largest >= B * C * V  # the measurement sees the full tensor where it exists
    logits.grad = None
    budget_rows = 16
    old = rapid.policy.LOGPROB_CHUNK_BYTES
    rapid.policy.LOGPROB_CHUNK_BYTES = 4 * V * budget_rows
    try:
        with LargestFp32Tensor() as chunked:
            selected_token_logprobs(logits, targets, T).sum().backward()
    finally:
        rapid.policy.LOGPROB_CHUNK_BYTES = old
    assert chunked.largest <= budget_rows * V, (chunked.largest, B * C * V)
    assert logits.grad is not None and logits.grad.dtype == torch.bfloat16
