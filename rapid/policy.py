"""The policy side: log π_θ of completion tokens, and gradient accumulation over micro-batches.

Log-probs are taken at the sampling temperature, log softmax(logits / T), so that π_θ and the
behaviour policy μ recorded by the sampler are the same kind of distribution. Only the logits
of completion positions are computed (`logits_to_keep`): with the [prompt | completion] layout
of `rapid.buffer.collate`, these are the last C + 1 positions of every row.

A minibatch of `n_step` records is processed in micro-batches of whole groups; each
micro-batch's loss is normalised by the full minibatch size, so the accumulated gradient is
exactly the full-minibatch gradient. Under DDP, gradients are all-reduced once, on the last
micro-batch.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from rapid.buffer import Batch, Rollout, collate

# loss_fn(token_logp [B, C], batch, normalizer) -> (loss, stats)
LossFn = Callable[[torch.Tensor, Batch, int], tuple[torch.Tensor, dict]]


def completion_logprobs(model: torch.nn.Module, batch: Batch, temperature: float) -> torch.Tensor:
    """log π_θ(y_t | x, y_<t) / at temperature T for every completion token: [B, C], 0 on padding."""
    C = batch.completion_mask.shape[1]
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids, logits_to_keep=C + 1, use_cache=False).logits
    logits = logits[:, :-1].float() / temperature                     # [B, C, V], row t predicts token t
    targets = batch.input_ids[:, -C:].unsqueeze(-1)                   # [B, C, 1]
    logp = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return logp.masked_fill(~batch.completion_mask, 0.0)


def autocast(device: torch.device, dtype: torch.dtype):
    """bf16 autocast (fp32 master weights) when asked for, nothing in fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def accumulate_gradients(model: torch.nn.Module, records: list[Rollout], loss_fn: LossFn, *,
                         micro_batch: int, pad_id: int, temperature: float, device: torch.device,
                         compute_dtype: torch.dtype) -> dict[str, float]:
    """Backward of one minibatch in micro-batches of `micro_batch` records (whole groups, as the
    buffer keeps groups contiguous). Returns the minibatch's stats (record-weighted means)."""
    B = len(records)
    chunks = [records[i:i + micro_batch] for i in range(0, B, micro_batch)]
    totals: dict[str, float] = {}
    for k, chunk in enumerate(chunks):
        batch = collate(chunk, pad_id).to(device)
        last = k == len(chunks) - 1
        no_sync = model.no_sync() if isinstance(model, DistributedDataParallel) and not last \
            else contextlib.nullcontext()
        with no_sync:
            with autocast(device, compute_dtype):
                token_logp = completion_logprobs(model, batch, temperature)
            loss, stats = loss_fn(token_logp, batch, B)
            loss.backward()
        stats["loss"] = loss.item() * B / len(chunk)   # per-chunk normalised, re-weighted below
        for key, value in stats.items():
            if key.endswith("_max"):
                totals[key] = max(totals.get(key, value), value)
            else:
                totals[key] = totals.get(key, 0.0) + value * len(chunk) / B
    return totals
