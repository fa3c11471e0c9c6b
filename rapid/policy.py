"""The policy side: log π_θ of completion tokens, and gradient accumulation over micro-batches.

Log-probs are taken at the sampling temperature, log softmax(logits / T), so that π_θ and the
behaviour policy μ recorded by the sampler are the same kind of distribution. Only the logits
of completion positions are computed (`logits_to_keep`), and by default each group's shared
prompt is run once for its n completions (`CompletionLogprobs`).

A minibatch of `n_step` records is processed in micro-batches of whole groups; each
micro-batch's loss is normalised by the full minibatch's size (records or completion tokens),
so the accumulated gradient is exactly the full-minibatch gradient. Under DDP, gradients are all-reduced once, on the last
micro-batch, and token counts are global (each rank divides by its share of the count over all ranks).

A group may span ranks (n_step = 4 records of one group of 4 over 4 ranks, as in the paper): each rank
then holds a slice of one group, run as one micro-batch, and after its forward every rank's rewards and
detached sequence log-probs are gathered (`gather_peers`) so that the loss's group baseline is the
whole group's, before any backward (IW-GRPG's w̄ change every step).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from torch.nn.parallel import DistributedDataParallel

from rapid.buffer import Batch, Rollout, collate, group_has_gradient, groups_with_gradient
from rapid.distributed import all_reduce_max, is_sharded, reshard
from rapid.estimators import Peers
from rapid.iw_grpg import sequence_logprobs

# loss_fn(token_logp [B, C], batch, minibatch records, minibatch completion tokens[, peers]) -> (loss, stats);
# the fifth argument (rapid.estimators.Peers) is passed only when groups span ranks
LossFn = Callable[..., tuple[torch.Tensor, dict]]


class CompletionLogprobs(torch.nn.Module):
    """Wraps a causal LM: forward(batch tensors) -> log π_θ(y_t | x, y_<t) at temperature T for
    every completion token, [B, C], 0 on padding. DDP wraps this module, so that the two model
    calls of the shared-prompt path form one forward.

    share_prompt=True runs each group's prompt once, repeats its KV cache over the n members and
    runs only the completions on top (exact: the same attention, fewer FLOPs by about
    (P + n·C) / (n·(P + C))). share_prompt=False runs every [prompt | completion] row in full
    (needed with gradient checkpointing, which disables the KV cache in training)."""

    def __init__(self, model: torch.nn.Module, temperature: float, share_prompt: bool = True):
        super().__init__()
        self.model, self.temperature, self.share_prompt = model, temperature, share_prompt

    def forward(self, prompt_ids, prompt_mask, completion_ids, completion_mask) -> torch.Tensor:
        n = completion_ids.shape[0] // prompt_ids.shape[0]
        C = completion_ids.shape[1]
        if self.share_prompt:
            prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
            out = self.model(
                input_ids=prompt_ids,
                attention_mask=prompt_mask,
                position_ids=prompt_pos,
                use_cache=True,
                logits_to_keep=1,
            )
            cache = out.past_key_values
            cache.batch_repeat_interleave(n)  # [G, ...] -> [G*n, ...]
            mask = torch.cat([prompt_mask.repeat_interleave(n, 0), completion_mask.long()], 1)
            pos = prompt_mask.sum(-1, keepdim=True).repeat_interleave(n, 0) + torch.arange(C, device=mask.device)
            rest = self.model(
                input_ids=completion_ids,
                attention_mask=mask,
                position_ids=pos,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=C,
            ).logits[:, :-1]
            logits = torch.cat([out.logits[:, -1:].repeat_interleave(n, 0), rest], 1)  # [B, C, V]
        else:
            ids = torch.cat([prompt_ids.repeat_interleave(n, 0), completion_ids], 1)
            mask = torch.cat([prompt_mask.repeat_interleave(n, 0), completion_mask.long()], 1)
            pos = (mask.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(
                input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=False, logits_to_keep=C + 1
            ).logits[:, :-1]  # row t predicts token t
        logp = selected_token_logprobs(logits, completion_ids, self.temperature)
        return logp.masked_fill(~completion_mask, 0.0)


LOGPROB_CHUNK_BYTES = 2**28  # fp32 working memory of one chunk of rows of selected_token_logprobs (256 MiB)


class _SelectedTokenLogprobs(torch.autograd.Function):
    """log softmax(logits / T)[target] in fp32, in chunks of rows: neither the forward nor the
    backward holds more than one chunk of [rows, vocab] in fp32. Saved for the backward: the logits
    as they came (bf16 under autocast) and one log-sum-exp per row."""

    @staticmethod
    def forward(ctx, logits, targets, temperature, chunk_rows):
        flat, idx = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1)
        logp = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(logp)
        for i in range(0, flat.shape[0], chunk_rows):
            x = flat[i : i + chunk_rows].float() / temperature
            lse[i : i + chunk_rows] = torch.logsumexp(x, dim=-1)
            logp[i : i + chunk_rows] = x.gather(-1, idx[i : i + chunk_rows]).squeeze(-1) - lse[i : i + chunk_rows]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        return logp.view(targets.shape)

    @staticmethod
    def backward(ctx, grad_logp):
        # d logp_r / d logits_rv = (1[v = target_r] - softmax(logits_r / T)_v) / T
        logits, targets, lse = ctx.saved_tensors
        flat, idx, g = logits.reshape(-1, logits.shape[-1]), targets.reshape(-1, 1), grad_logp.reshape(-1, 1).float()
        grad = torch.empty_like(flat)
        for i in range(0, flat.shape[0], ctx.chunk_rows):
            rows = slice(i, i + ctx.chunk_rows)
            p = torch.exp(flat[rows].float() / ctx.temperature - lse[rows, None])
            chunk = (-g[rows] * p).scatter_add_(-1, idx[rows], g[rows])
            grad[rows] = chunk / ctx.temperature
        return grad.view_as(logits), None, None, None


def selected_token_logprobs(logits: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """[..., V] logits, [...] target ids -> [...] log softmax(logits / T) of the targets, in fp32,
    without materialising the fp32 [..., V] tensor (a [4, 2048, 151936] micro-batch of Qwen2.5 logits
    is 5 GB in fp32; the plain `logits.float()` path held it twice)."""
    chunk_rows = max(1, LOGPROB_CHUNK_BYTES // (4 * logits.shape[-1]))
    return _SelectedTokenLogprobs.apply(logits, targets, temperature, chunk_rows)


def completion_logprobs(policy: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """[B, C] token log-probs of the batch's completions under `policy` (a CompletionLogprobs,
    possibly inside DDP)."""
    return policy(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)


def autocast(device: torch.device, dtype: torch.dtype):
    """bf16 autocast (fp32 master weights) when asked for, nothing in fp32."""
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def accumulate_gradients(
    policy: torch.nn.Module,
    records: list[Rollout],
    loss_fn: LossFn,
    *,
    micro_batch: int,
    pad_id: int,
    device: torch.device,
    compute_dtype: torch.dtype,
    skip_groups: str | None = None,
    spanning: bool = False,
    token_stats: Callable[[str], bool] = lambda key: key == "token_logp_gap",
) -> dict[str, float]:
    """Backward of one minibatch in micro-batches of `micro_batch` records (whole groups, as the
    buffer keeps groups contiguous). Returns the minibatch's stats: over the records run, the
    token-weighted mean of the micro-batches' values for the statistics that are means over completion
    tokens (`token_stats(name)`, e.g. `token_mean_stats`: a token-level loss's clip fractions, ratio and
    KL means), the record-weighted mean for the others, `*_max` their maximum, and `trained_frac` (the
    records run, as a share of the minibatch), `records` and `tokens` (those run).

    `skip_groups` ("equal_rewards" | "zero_rewards" | None): groups whose advantages are all 0 under
    the loss are not run (`rapid.buffer.groups_with_gradient`); the loss keeps the whole minibatch's
    normalisers (its records and tokens), so the gradient is the same. When no group is left the
    gradient is exactly 0: it is set to zeros without a forward (the optimizer step still runs, as it
    would on the computed zeros: AdamW's moments and weight decay move on), and the stats are
    `trained_frac` 0 and `loss` 0. Under DDP the first group runs instead, so that every rank joins
    the gradient's all-reduce; its stats then describe no record (`records` 0, `trained_frac` 0), so that its
    weights stay out of the ESS and the `iw/*` statistics, which rapid.train weights by `records`.
    Sharded (FSDP2), every forward and backward is a collective, so every rank runs as many micro-batches
    as the rank with the most: the others repeat their first with the loss times 0.

    `spanning`: this rank's records are its slice of a minibatch whose groups span ranks (DDP only;
    at most one group's worth, one micro-batch): the loss gets the gathered whole groups (`gather_peers`),
    and whether a group is skipped is decided on its gathered rewards (it runs anyway: the rank has
    nothing else to join the all-reduce with)."""
    B = len(records)
    sharded = is_sharded(policy)
    ddp = isinstance(policy, DistributedDataParallel) or sharded  # ranks reduce their gradients
    n_tokens = sum(len(r.completion_ids) for r in records)
    if ddp:
        n_tokens = global_token_share(n_tokens, policy)
    if spanning:
        return _accumulate_spanning(policy, records, loss_fn, pad_id, device, compute_dtype, skip_groups, n_tokens)
    run = groups_with_gradient(records, skip_groups) if skip_groups else records
    placeholder = not run and ddp
    if placeholder:
        run = [r for r in records if r.group_id == records[0].group_id]
    if not run:
        for p in policy.parameters():
            if p.requires_grad:
                p.grad = torch.zeros_like(p) if p.grad is None else p.grad.zero_()
        return {"trained_frac": 0.0, "loss": 0.0}
    chunks = [run[i : i + micro_batch] for i in range(0, len(run), micro_batch)]
    run_tokens = max(sum(len(r.completion_ids) for r in run), 1)
    totals: dict[str, float] = {"trained_frac": 0.0 if placeholder else len(run) / B}
    passes = int(all_reduce_max(len(chunks), device)) if sharded else len(chunks)
    for k in range(passes):
        chunk = chunks[k] if k < len(chunks) else chunks[0]  # k >= len(chunks): a pass that adds 0
        batch = collate(chunk, pad_id).to(device)
        last = k == passes - 1
        if sharded:  # gradients reduce-scatter after the last micro-batch only
            policy.model.set_requires_gradient_sync(last)
        no_sync = (
            policy.no_sync() if isinstance(policy, DistributedDataParallel) and not last else contextlib.nullcontext()
        )
        with no_sync:
            with autocast(device, compute_dtype):
                token_logp = completion_logprobs(policy, batch)
            loss, stats = loss_fn(token_logp, batch, B, n_tokens)
            (loss if k < len(chunks) else loss * 0.0).backward()
        if k >= len(chunks):
            continue
        stats["loss"] = loss.item() * len(run) / len(chunk)  # the chunk's share of the loss, re-weighted below
        tokens = sum(len(r.completion_ids) for r in chunk)
        for key, value in stats.items():
            if key.endswith("_max"):
                totals[key] = max(totals.get(key, value), value)
            else:  # a token mean over the chunk's tokens weighs by them, any other mean by its records
                share = tokens / run_tokens if token_stats(key) and key != "loss" else len(chunk) / len(run)
                totals[key] = totals.get(key, 0.0) + value * share
    totals["records"] = 0 if placeholder else len(run)
    totals["tokens"] = 0 if placeholder else sum(len(r.completion_ids) for r in run)
    return totals


def token_mean_stats(level: str, engine_correction: str = "none") -> Callable[[str], bool]:
    """Which statistics of rapid.train's minibatch loss are means over completion tokens: every statistic
    of a loss registered at level "token" (GRPO, DAPO, Dr. GRPO, CISPO: clip fractions, ratio and KL
    means; rapid/losses.py), the sampler/trainer gap `token_logp_gap`, and the engine correction's
    (`correction_*`) when it is per token. The others (a sequence-level loss's, the loss) are per record."""

    def is_token_mean(key: str) -> bool:
        if key == "token_logp_gap":
            return True
        if key.startswith("correction_"):
            return engine_correction == "token"
        return level == "token" and key not in ("loss", "trained_frac", "records", "tokens")

    return is_token_mean


def _accumulate_spanning(policy, records, loss_fn, pad_id, device, compute_dtype, skip_groups, n_tokens) -> dict:
    """`accumulate_gradients` of a rank's slice of groups that span ranks: one forward, the gather, the
    loss over whole groups, one backward (the gradient all-reduce)."""
    if not (isinstance(policy, DistributedDataParallel) or is_sharded(policy)):
        raise ValueError("spanning=True is for a policy under DDP or FSDP (a group split over ranks)")
    B = len(records)
    batch = collate(records, pad_id).to(device)
    with autocast(device, compute_dtype):
        token_logp = completion_logprobs(policy, batch)
    peers = gather_peers(batch, token_logp, getattr(policy, "process_group", None))  # FSDP: the default group
    loss, stats = loss_fn(token_logp, batch, B, n_tokens, peers)
    loss.backward()
    trained = B
    if skip_groups:  # the group's fate from all its members' rewards
        own = peers.group_ids[peers.index]
        kept = [group_has_gradient(peers.rewards[peers.group_ids == g].tolist(), skip_groups) for g in own.tolist()]
        trained = sum(kept)
    tokens = sum(len(r.completion_ids) for r in records) if trained else 0  # a skipped group's stats do not count
    return stats | {"loss": loss.item(), "trained_frac": trained / B, "records": trained, "tokens": tokens}


def gather_peers(batch: Batch, token_logp: torch.Tensor, group) -> Peers:
    """Every rank's (reward, group id, sequence log π_θ, sequence log μ) of one minibatch, detached, in rank
    order (ranks hold equal shares): the numbers a group baseline needs when its group spans ranks."""
    mine = torch.stack(
        [
            batch.rewards.double(),
            batch.group_ids.double(),
            sequence_logprobs(token_logp.detach().float(), batch.completion_mask).double(),
            sequence_logprobs(batch.logp_mu, batch.completion_mask).double(),
        ]
    )  # [4, B]; float32 values and ids < 2**53 survive float64 exactly
    parts = [torch.empty_like(mine) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(parts, mine.contiguous(), group=group)
    every = torch.cat(parts, 1)  # [4, world * B]
    rank, B = torch.distributed.get_rank(group), mine.shape[1]
    return Peers(
        rewards=every[0].to(batch.rewards.dtype),
        group_ids=every[1].long(),
        logp=every[2].float(),
        logp_old=every[3].float(),
        index=torch.arange(rank * B, (rank + 1) * B, device=mine.device),
    )


def global_token_share(n_tokens: int, policy: torch.nn.Module) -> float:
    """The normaliser of a token-mean loss on this rank: (completion tokens over all ranks) / world.
    DDP averages the ranks' gradients, so Σ_rank (1/world) Σ_tokens ∇o / (N / world) = Σ_all ∇o / N,
    the single-process token mean; a rank's own count would over-weight ranks with short completions."""
    device = next(policy.parameters()).device
    total = torch.tensor([float(n_tokens)], dtype=torch.float64, device=device)
    group = getattr(policy, "process_group", None)  # DDP's, else (FSDP) the default group
    torch.distributed.all_reduce(total, group=group)
    return total.item() / torch.distributed.get_world_size(group)


@torch.no_grad()
def recompute_behavior_logprobs(
    policy: torch.nn.Module,
    minibatches: list[list[Rollout]],
    *,
    micro_batch: int,
    pad_id: int,
    device: torch.device,
    compute_dtype: torch.dtype,
) -> float:
    """Replace each record's log μ by the trainer's own log-probs (θ = μ at the start of a round),
    keeping the sampler's in `logp_engine`. Returns the mean |trainer − sampler| per completion
    token that this replaced.

    The forward runs in exactly the micro-batches `accumulate_gradients` will use for these
    minibatches (pass the round's first pass): in bf16 a record's log-probs depend on the shapes
    of the batch it is computed in, so only the same micro-batches give w = 1 exactly at θ = μ."""
    module = policy.module if isinstance(policy, DistributedDataParallel) else policy  # a forward, no gradient sync
    gap, n_tokens = 0.0, 0
    for records in minibatches:
        for i in range(0, len(records), micro_batch):
            chunk = records[i : i + micro_batch]
            batch = collate(chunk, pad_id).to(device)
            with autocast(device, compute_dtype):
                token_logp = completion_logprobs(module, batch).float()
            gap += ((token_logp - batch.logp_mu).abs() * batch.completion_mask).sum().item()
            n_tokens += int(batch.completion_mask.sum())
            for r, row in zip(chunk, token_logp.cpu()):
                r.logp_engine = r.logp_mu
                r.logp_mu = row[: len(r.completion_ids)].tolist()
    if is_sharded(module):
        reshard(module)
    return gap / max(n_tokens, 1)


@torch.no_grad()
def token_logprobs(
    policy: torch.nn.Module, records: list[Rollout], *, pad_id: int, device: torch.device, compute_dtype: torch.dtype
) -> list[list[float]]:
    """Per-token log π_θ of each record's completion under the current parameters (the log importance
    weight along a generation is this minus the record's log μ). Runs the unwrapped module, so that it
    may be called on one rank alone under DDP (sharded, every rank calls it: its forward is a collective)."""
    if not records:
        return []
    module = policy.module if isinstance(policy, DistributedDataParallel) else policy
    batch = collate(records, pad_id).to(device)
    with autocast(device, compute_dtype):
        logp = completion_logprobs(module, batch).float().cpu()
    if is_sharded(module):
        reshard(module)
    return [row[: len(r.completion_ids)].tolist() for r, row in zip(records, logp)]
