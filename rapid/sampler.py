"""Samplers: generate completions with their behaviour log-probs, and take new weights.

Every sampler exposes the same two calls:

    generate(prompts, n, max_new_tokens, temperature, seeds) -> [[Completion] * n] * len(prompts)
    sync_weights(model)                                       -> push π_θ into the engine

`prompts` are token-id lists (the trainer and the engine see the same tokens). Each
`Completion` carries its token ids, text, one log-prob per sampled token — log μ, taken at the
sampling temperature (log softmax(logits / T)) — and a finish reason ("stop" / "length").

`HFSampler` generates with transformers `generate` on the training model itself, so
`sync_weights` has nothing to copy. Sampling is exact temperature sampling done by the
Gumbel-max trick with one `torch.Generator` per completion, seeded from (round, prompt,
sample): a completion does not depend on the batch it was generated in, on the number of
ranks, or on where a resumed run restarted. `temperature=0` is greedy decoding.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from rapid.config import ConfigError
from rapid.seeding import derive_seed


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    logprobs: list[float]     # log μ of each sampled token at the sampling temperature
    finish_reason: str        # "stop" (EOS produced) or "length" (max_new_tokens reached)


class Sampler(Protocol):
    name: str

    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int,
                 temperature: float, seeds: list[int] | None = None) -> list[list[Completion]]: ...

    def sync_weights(self, model: torch.nn.Module) -> None: ...


class _SampleAndRecord(LogitsProcessor):
    """Turns greedy decoding into temperature sampling (Gumbel-max with a generator per row) and
    records log softmax(logits / T) of the token that will be chosen."""

    def __init__(self, generators: list[torch.Generator] | None, temperature: float):
        self.generators, self.temperature = generators, temperature
        self.logprobs: list[torch.Tensor] = []   # one [B] tensor per step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.float()
        if self.generators is None:                          # greedy: log-probs at T = 1
            logp = torch.log_softmax(scores, dim=-1)
            chosen = scores
        else:
            logp = torch.log_softmax(scores / self.temperature, dim=-1)
            # argmax(log p - log E), E ~ Exp(1) iid, is an exact sample from p.
            noise = torch.stack([torch.empty(scores.shape[-1]).exponential_(generator=g)
                                 for g in self.generators]).to(scores.device)
            chosen = logp - noise.log()
        self.logprobs.append(logp.gather(-1, chosen.argmax(-1, keepdim=True)).squeeze(-1))
        return chosen


class HFSampler:
    """transformers `generate` on the training model (the fallback and the test sampler)."""

    name = "hf"

    def __init__(self, model: torch.nn.Module, tokenizer, batch_size: int = 64,
                 autocast_dtype: torch.dtype | None = None):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.autocast_dtype = autocast_dtype
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        self.eos_ids = sorted({tokenizer.eos_token_id, *_as_list(model_eos)} - {None})

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Nothing to copy: this sampler generates with the training model's own parameters."""

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], n: int, max_new_tokens: int,
                 temperature: float, seeds: list[int] | None = None) -> list[list[Completion]]:
        if temperature > 0 and seeds is None:
            seeds = [int(torch.randint(0, 2**62, ()).item()) for _ in prompts]
        per_call = max(1, self.batch_size // n)            # prompts per generate call (whole groups)
        out: list[list[Completion]] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(prompts), per_call):
                chunk = range(start, min(start + per_call, len(prompts)))
                gens = None
                if temperature > 0:
                    gens = [torch.Generator().manual_seed(derive_seed(seeds[i], j)) for i in chunk for j in range(n)]
                flat = self._generate_groups([prompts[i] for i in chunk], n, max_new_tokens, temperature, gens)
                out += [flat[k * n:(k + 1) * n] for k in range(len(chunk))]
        finally:
            self.model.train(was_training)
        return out

    def _generate_groups(self, prompts, n, max_new_tokens, temperature, generators) -> list[Completion]:
        """n completions of each prompt. The prompts (but their last token) are run once and their
        KV cache is repeated n times, so a group pays for its prompt once."""
        device = next(self.model.parameters()).device
        P = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), P), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for r, p in enumerate(prompts):
            input_ids[r, P - len(p):] = torch.tensor(p)
            attention_mask[r, P - len(p):] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        recorder = _SampleAndRecord(generators, temperature)
        config = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, num_beams=1,
                                  eos_token_id=self.eos_ids, pad_token_id=self.pad_id)
        with _autocast(device, self.autocast_dtype):
            cache = None
            if n > 1 and P > 1:
                prefix_mask = attention_mask[:, :-1]
                cache = self.model(input_ids=input_ids[:, :-1], attention_mask=prefix_mask,
                                   position_ids=(prefix_mask.cumsum(-1) - 1).clamp(min=0),
                                   use_cache=True).past_key_values
                cache.batch_repeat_interleave(n)
            seqs = self.model.generate(input_ids=input_ids.repeat_interleave(n, 0),
                                       attention_mask=attention_mask.repeat_interleave(n, 0),
                                       past_key_values=cache, generation_config=config,
                                       logits_processor=LogitsProcessorList([recorder]))
        new = seqs[:, P:].cpu()
        logps = torch.stack(recorder.logprobs, dim=1).cpu() if recorder.logprobs else torch.zeros(len(new), 0)
        completions = []
        for r in range(len(new)):
            ids = new[r].tolist()
            stop = next((t for t, tok in enumerate(ids) if tok in self.eos_ids), None)
            length = len(ids) if stop is None else stop + 1
            ids = ids[:length]
            completions.append(Completion(
                token_ids=ids,
                text=self.tokenizer.decode(ids, skip_special_tokens=True),
                logprobs=logps[r, :length].tolist(),
                finish_reason="length" if stop is None else "stop"))
        return completions


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


def _autocast(device: torch.device, dtype: torch.dtype | None):
    if dtype is None or dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def make_sampler(name: str, model: torch.nn.Module, tokenizer, batch_size: int,
                 autocast_dtype: torch.dtype | None) -> Sampler:
    if name == "hf":
        return HFSampler(model, tokenizer, batch_size=batch_size, autocast_dtype=autocast_dtype)
    raise ConfigError(f"unknown sampler '{name}': choose sampler=hf")
