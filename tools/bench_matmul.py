"""fp32 against bf16 matrix products on this CPU, natively and with oneDNN held to AVX2 (as on an AVX2-only
CPU), side by side, and writes experiments/results/bench_matmul_cpu.md with the CPU model and flags.

    python tools/bench_matmul.py
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

M, K, N, REPEATS = 2048, 576, 1536, 10  # a SmolLM2-135M MLP projection over 2,048 tokens


def measure() -> None:
    import torch

    a, w = torch.randn(M, K), torch.randn(K, N)
    for dtype in (torch.float32, torch.bfloat16):
        x, y = a.to(dtype), w.to(dtype)
        x @ y  # warm-up
        t = time.perf_counter()
        for _ in range(REPEATS):
            x @ y
        s = (time.perf_counter() - t) / REPEATS
        print(f"{str(dtype).removeprefix('torch.')} {s * 1e3:.1f} {2 * M * K * N / s / 1e9:.0f}")


def main() -> None:
    if sys.argv[1:] == ["--measure"]:
        return measure()
    from rapid.profiling import cpu_description

    rows = []
    for label, env in (
        ("native", {}),
        ("oneDNN held to AVX2 (ONEDNN_MAX_CPU_ISA=AVX2)", {"ONEDNN_MAX_CPU_ISA": "AVX2"}),
    ):
        out = subprocess.run(
            [sys.executable, __file__, "--measure"], env=os.environ | env, capture_output=True, text=True, check=True
        ).stdout
        rows += [(label, *line.split()) for line in out.splitlines()]
    lines = [
        f"# Matrix product, {M} x {K} x {N}, fp32 against bf16 (mean of {REPEATS} products)",
        "",
        f"`python tools/bench_matmul.py`; CPU: {cpu_description()}; torch threads: default.",
        "",
        "| oneDNN | dtype | ms | GFLOP/s |",
        "|---|---|---:|---:|",
        *[f"| {label} | {dtype} | {ms} | {gflops} |" for label, dtype, ms, gflops in rows],
    ]
    path = Path("experiments/results/bench_matmul_cpu.md")
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
