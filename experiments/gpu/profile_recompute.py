"""Where the log mu recompute's time goes (`algorithm.behavior_logprobs=recompute`,
rapid.policy.recompute_behavior_logprobs): torch.profiler over one round's recompute, grouped by operator,
with the operator count per micro-batch (on a GPU each is at least one kernel launch) and the arithmetic
floor (2 N FLOPs a token, N the parameters).

    python experiments/gpu/profile_recompute.py                                  # SmolLM2-135M's shape, CPU
    python experiments/gpu/profile_recompute.py --model qwen2.5_0.5b_random --device cuda --dtype bfloat16
    python experiments/gpu/profile_recompute.py --out experiments/results/recompute_profile_cpu

Records: `--records` completions of `--completion` tokens (ignore_eos-like, random ids) in groups of 4 behind
`--prompt`-token prompts, in micro-batches of `--micro-batch`, random weights of the model's architecture.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def main(argv: list[str] | None = None) -> dict:
    from rapid.buffer import Rollout
    from rapid.models import load_model_and_tokenizer
    from rapid.policy import CompletionLogprobs, recompute_behavior_logprobs
    from rapid.profiling import cpu_description
    from tools.iw_bf16 import composed

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2_135m")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--records", type=int, default=32)
    p.add_argument("--prompt", type=int, default=28)
    p.add_argument("--completion", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)

    cfg = composed([f"model={args.model}"])
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    model, tok = load_model_and_tokenizer(cfg.model.path, cfg.model.gguf, cfg.model.architecture, seed=0)
    model.to(device)
    N = sum(p.numel() for p in model.parameters())
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(0)
    records = []
    for k in range(args.records // 4):
        prompt = torch.randint(10, V, (args.prompt,), generator=g).tolist()
        for _ in range(4):
            completion = torch.randint(10, V, (args.completion,), generator=g).tolist()
            records.append(Rollout(prompt, completion, [0.0] * args.completion, 0.0, k, False))
    policy = CompletionLogprobs(model, 1.0)
    run = lambda: recompute_behavior_logprobs(  # noqa: E731
        policy, [records], micro_batch=args.micro_batch, pad_id=0, device=device, compute_dtype=dtype
    )
    run()  # warm-up
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    t0 = time.perf_counter()
    run()
    sync()
    wall = time.perf_counter() - t0
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if device.type == "cuda" else []
    )
    with torch.profiler.profile(activities=activities) as prof:
        run()
        sync()
    events = prof.key_averages()
    # operators that do work (no child operator, not a view or an allocation): on a GPU each is a kernel launch
    metadata = {
        "aten::view",
        "aten::as_strided",
        "aten::t",
        "aten::transpose",
        "aten::expand",
        "aten::slice",
        "aten::select",
        "aten::unsqueeze",
        "aten::reshape",
        "aten::empty",
        "aten::empty_strided",
        "aten::_unsafe_view",
        "aten::alias",
        "aten::detach",
        "aten::lift_fresh",
        "aten::resolve_conj",
        "aten::resolve_neg",
        "aten::squeeze",
        "aten::permute",
        "aten::_reshape_alias",
        "aten::unbind",
        "aten::split",
        "aten::chunk",
        "aten::narrow",
        "aten::contiguous",
        "aten::result_type",
        "aten::is_nonzero",
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::size",
        "aten::stride",
    }
    leaves = [e for e in prof.events() if e.name.startswith("aten::") and not e.cpu_children and e.name not in metadata]
    key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events) or 1.0
    top = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:15]
    micro_batches = -(-args.records // args.micro_batch)
    tokens = args.records * (args.prompt + args.completion)
    # share_prompt: each group's prompt runs once, its completions on top
    computed = args.records // 4 * args.prompt + args.records * args.completion
    result = {
        "machine": cpu_description() if device.type == "cpu" else torch.cuda.get_device_name(device),
        "torch": torch.__version__,
        "model": cfg.model.name,
        "parameters": N,
        "vocab": V,
        "dtype": args.dtype,
        "records": args.records,
        "prompt_tokens": args.prompt,
        "completion_tokens": args.completion,
        "micro_batch": args.micro_batch,
        "wall_s": wall,
        "tokens": tokens,
        "tokens_computed": computed,
        "floor_gflop": 2 * N * computed / 1e9,
        "achieved_gflop_per_s": 2 * N * computed / wall / 1e9,
        "operators_per_micro_batch": sum(e.count for e in events) / micro_batches,
        "working_operators_per_micro_batch": len(leaves) / micro_batches,
        "top_operators": [
            {"name": e.key, "share": getattr(e, key) / total, "calls": e.count, "self_ms": getattr(e, key) / 1e3}
            for e in top
        ],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profile.json").write_text(text + "\n")
    return result


if __name__ == "__main__":
    main()
