#!/usr/bin/env bash
# The GPU issues' checks on one lent GPU machine, in a few long commands (each well inside a device call's
# 10 minutes). Set up first (experiments/gpu/wheels.sh here, experiments/gpu/setup.sh there), then:
#
#   source experiments/gpu/setup.sh env; RESULTS=$OUT bash experiments/gpu_check.sh engine memory
#   MODEL=tiny MODELS=tiny TOKENS=16 PY=.venv/bin/python RESULTS=/tmp/gc bash experiments/gpu_check.sh engine memory  # a CPU dry run
#
# Each section writes at most a few files under $RESULTS/<section>/ (a device call brings back 8 files
# two folders deep), always with the GPU, driver and versions (machine.txt):
#   tests       the test suite (make test's selection) on the GPU machine: tests.log with what passed,
#               failed and was skipped, and why
#   engine      vLLM on CUDA: in-place sync after AdamW steps (fp32, engine vs trainer log-probs per
#               token after 3 syncs), sleep / wake memory, CUDA graphs against eager (tools/engine_check.py)
#   iw          bf16 importance weights at θ = μ, 512-token completions, behavior_logprobs sampler vs
#               recompute (tools/iw_bf16.py)
#   memory      peak memory per phase, Qwen2.5 0.5B and 1.5B architectures (random weights), 2048-token
#               completions, the engine asleep and awake during training, beside tools/memory_estimate.py
#   throughput  PG, RAPID H = 2..16, GRPO: samples/s, phases, floors (experiments/bench_rl_gpu.sh
#               THROUGHPUT_ONLY=1; random Qwen2.5-0.5B weights, 512 tokens)
#   learning    SmolLM2-135M-Instruct (the packaged GGUF) on multistep: PG vs RAPID H = 8 and 4, one seed
#               per call (SEED=0, 1, 2), accuracy against wall time
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
RESULTS=${RESULTS:-experiments/results}
SEED=${SEED:-0}
MODEL=${MODEL:-qwen2.5_0.5b_random}                            # engine, iw
MODELS=${MODELS:-qwen2.5_0.5b_random qwen2.5_1.5b_random}      # memory
TOKENS=${TOKENS:-2048}                                         # memory

machine() {
  mkdir -p "$1"
  {
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null || echo "no nvidia-smi"
    "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda, "transformers", transformers.__version__)'
    "$PY" -c 'import vllm; print("vllm", vllm.__version__)' 2> /dev/null || echo "vllm: not importable"
    grep -m1 "model name" /proc/cpuinfo
    echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)"
  } > "$1/machine.txt"
}

for section in "$@"; do
  out="$RESULTS/gpu_$section"
  machine "$out"
  case "$section" in
  tests)
    "$PY" -m pytest -q -m "not slow" -rs -p no:cacheprovider > "$out/tests.log" 2>&1
    tail -5 "$out/tests.log"
    ;;
  engine)
    "$PY" tools/engine_check.py --dtype float32 --syncs 3 --tokens 128 --out "$out/fp32" model=$MODEL
    "$PY" tools/engine_check.py --dtype bfloat16 --syncs 3 --tokens 512 --graphs-compare --out "$out/bf16" \
      model=$MODEL
    ;;
  iw)
    "$PY" tools/iw_bf16.py --lengths 512 --prompts 32 --device cuda --out "$out" model=$MODEL
    ;;
  memory)
    # one round of the math_h8 settings at 2048 tokens; mem/* per phase in each run's metrics.jsonl
    for model in $MODELS; do
      for sleep in true false; do
        run="/tmp/rapid-memory/$model-sleep_$sleep" && mkdir -p /tmp/rapid-memory
        rm -rf "$run"
        "$PY" -m rapid.train +experiment=math_h8 task=arithmetic model=$model sampler.ignore_eos=true \
          task.max_new_tokens=$TOKENS sampler.sleep_during_train=$sleep rounds=1 algorithm.H=2 eval.every=0 \
          eval.at_start=false ckpt.every=0 logger.progress=false "hydra.run.dir=$run" > "$run.log" 2>&1 ||
          echo "$model sleep=$sleep failed: $(tail -1 "$run.log")"
      done
    done
    "$PY" - "$out/memory.md" << 'EOF'
import json, sys
from pathlib import Path
lines = ["| run | phase | torch allocated peak (MiB) | torch reserved peak (MiB) | device in use at phase end (MiB) | host RSS peak (MiB) |",
         "|---|---|---:|---:|---:|---:|"]
for metrics in sorted(Path("/tmp/rapid-memory").glob("*/metrics.jsonl")):
    row = next((json.loads(x) for x in metrics.read_text().splitlines() if "train/loss" in x), None)
    if row is None:
        lines.append(f"| {metrics.parent.name} | (no training row: see its log) | | | | |")
        continue
    for phase in ("generate", "reward", "recompute", "sync", "train"):
        get = lambda key: f"{row[f'mem/{phase}_{key}']:.0f}" if f"mem/{phase}_{key}" in row else "–"
        if f"mem/{phase}_rss_mib" in row or f"mem/{phase}_cuda_alloc_mib" in row:
            lines.append(f"| {metrics.parent.name} | {phase} | {get('cuda_alloc_mib')} | {get('cuda_reserved_mib')} | "
                         f"{get('cuda_device_used_mib')} | {get('rss_mib')} |")
Path(sys.argv[1]).write_text("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
    "$PY" tools/memory_estimate.py --gpu-gib 80 > "$out/estimate.md"
    ;;
  throughput)
    THROUGHPUT_ONLY=1 PY=$PY bash experiments/bench_rl_gpu.sh
    cp experiments/results/bench_rl_gpu_1x_throughput/*.md "$out/" 2> /dev/null
    ;;
  learning)
    for h in 1 4 8; do
      alg=$([ "$h" = 1 ] && echo pg || echo rapid)
      run="/tmp/rapid-learning/${alg}_h${h}_seed$SEED" && mkdir -p /tmp/rapid-learning
      rm -rf "$run"
      "$PY" -m rapid.train task=multistep algorithm=$alg algorithm.H=$h seed="$SEED" samples=2048 \
        eval.every_samples=256 logger.progress=false "hydra.run.dir=$run" > "$run.log" 2>&1 ||
        echo "$alg H=$h failed: $(tail -1 "$run.log")"
      cp "$run/metrics.jsonl" "$out/${alg}_h${h}_seed$SEED.jsonl" 2> /dev/null
    done
    ;;
  *)
    echo "unknown section $section: tests engine iw memory throughput learning"
    exit 2
    ;;
  esac
done
