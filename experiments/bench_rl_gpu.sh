#!/usr/bin/env bash
# tools/bench_rl.py on GPUs with Qwen2.5-0.5B-Instruct (a model of the paper), bf16, the paper's n_group 4.
#   experiments/bench_rl_gpu.sh            # 1 GPU, MATH (needs the weights and RAPID_DATA_DIR or the Hub)
#   NPROC=4 experiments/bench_rl_gpu.sh    # 4 GPUs: every rapid run under torchrun (one engine per rank)
#   THROUGHPUT_ONLY=1 experiments/bench_rl_gpu.sh   # no download: random Qwen2.5-0.5B weights, every group trained,
#                                          # arithmetic prompts, every completion exactly 512 tokens
# Results go to experiments/results/bench_rl_gpu_<nproc>x[_throughput]/ (name the GPU when committing).
# Extra arguments are passed to tools/bench_rl.py (e.g. --seeds 0 1 2, or Hydra overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
NPROC=${NPROC:-1}
common=(algorithm.n_group=4 algorithm.n_step=32 sampler.temperature=1.0 model.dtype=bfloat16
        sampler.gpu_memory_utilization=0.3 train.micro_batch=8 optim.lr=1.0e-6 reward.workers=8)
if [[ "${THROUGHPUT_ONLY:-0}" == 1 ]]; then
    out=experiments/results/bench_rl_gpu_${NPROC}x_throughput
    exec $PY tools/bench_rl.py --throughput-only --nproc "$NPROC" --samples 2048 --out "$out" \
        "${common[@]}" task=arithmetic task.max_new_tokens=512 "$@"
fi
out=experiments/results/bench_rl_gpu_${NPROC}x
exec $PY tools/bench_rl.py --nproc "$NPROC" --samples 2048 --out "$out" \
    "${common[@]}" model=qwen2.5_0.5b task=math task.max_new_tokens=1024 eval.n=500 "$@"
