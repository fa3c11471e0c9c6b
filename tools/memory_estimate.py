"""GPU memory of the paper's runs, estimated per config and GPU size, before any GPU is rented.

One colocated rank holds, in bytes (P parameters, L layers, hidden h, MLP width I, q / kv heads of
size d, vocabulary V; a micro-batch of m records with prompts of p tokens and completions of c):

  states       16 P           fp32 master weights (4), fp32 gradients (4), AdamW's two moments (8);
                              sharded over N ranks (train.parallel=fsdp, --shards N): 16 P / N
  gathered      8 P           fsdp only, training phase: the whole fp32 weights (gathered at the first
                              forward and kept for the backward, reshard_after_forward=False) and the
                              whole fp32 gradients accumulated before their reduce-scatter
  reference     4 P           GRPO's frozen fp32 copy of the initial policy (beta > 0 only)
  activations  m (p + c) L a  saved for the backward under bf16 autocast, a = 2 (4h + 2 nq d + 2 nkv d + 4I)
                              + 4 (2h) bytes a token and layer (the matmul inputs and outputs in bf16, the fp32
                              residual stream and norm inputs); with gradient checkpointing only each layer's
                              fp32 input, m (p + c) L 4h, plus one layer's a while it is recomputed
  logits       m c V (2 + 2)  the completion positions' bf16 logits and their gradient, + 2 x 256 MiB of
                              fp32 chunks (rapid.policy.selected_token_logprobs; the plain fp32 path added
                              m c V (4 + 4))
  engine       u G            vLLM's share of the GPU (sampler.gpu_memory_utilization u of G bytes: its bf16
                              weights 2 P, then the KV cache, 2 L nkv d 2 bytes a token); asleep during the
                              training phase (sampler.sleep_during_train) it holds none of it
  context      0.5 GiB        the CUDA context and allocator slack, a rule of thumb

The peak is the larger of the generation phase (states + reference + engine + context) and the
training phase (states + gathered + reference + activations + logits + context, + engine when it stays
awake).
These are estimates from the architecture, to be checked by the first GPU run (torch.cuda.max_memory_
allocated per phase, which rapid logs as mem/*); they ignore fragmentation.

    python tools/memory_estimate.py                          # the paper configs on 24, 48 and 80 GB
    python tools/memory_estimate.py --gpu-gib 48 --out experiments/results/memory_estimate
    python tools/memory_estimate.py --shards 4                # the same under train.parallel=fsdp on 4 GPUs
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GiB = 2**30
CONTEXT_BYTES = GiB // 2
LOGPROB_CHUNKS_BYTES = 2 * 2**28  # forward and backward chunk of rapid.policy.selected_token_logprobs


@dataclass(frozen=True)
class Architecture:
    """The numbers of a transformers config that memory depends on."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied: bool = True
    qkv_bias: bool = False  # Qwen2.5
    extra_norms: bool = False  # Gemma-3: pre/post-feedforward norms and q/k norms

    def parameters(self) -> int:
        h, d = self.hidden, self.head_dim
        q, kv = self.heads * d, self.kv_heads * d
        attention = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.qkv_bias else 0)
        norms = 2 * h + (2 * h + 2 * d if self.extra_norms else 0)
        layer = attention + 3 * h * self.intermediate + norms
        embed = self.vocab * h * (1 if self.tied else 2)
        return embed + self.layers * layer + h

    def activation_bytes_per_token_layer(self) -> int:
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        return 2 * (4 * h + 2 * q + 2 * kv + 4 * self.intermediate) + 4 * 2 * h

    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2  # K and V, bf16


# From each model's config.json on the Hugging Face Hub (conf/model/<name>.yaml's path).
ARCHITECTURES = {
    "Qwen2.5-0.5B-Instruct": Architecture(151936, 896, 4864, 24, 14, 2, 64, qkv_bias=True),
    "Qwen2.5-1.5B-Instruct": Architecture(151936, 1536, 8960, 28, 12, 2, 128, qkv_bias=True),
    "Llama-3.2-1B-Instruct": Architecture(128256, 2048, 8192, 16, 32, 8, 64),
    "gemma-3-1b-it": Architecture(262144, 1152, 6912, 26, 4, 1, 256, extra_norms=True),
}


@dataclass(frozen=True)
class Run:
    """What memory depends on in a run's config."""

    name: str
    arch: Architecture
    micro_batch: int
    prompt_len: int
    completion_len: int
    gradient_checkpointing: bool
    sleep_during_train: bool
    gpu_memory_utilization: float
    reference: bool = False
    shards: int = 1  # ranks the states are sharded over (train.parallel=fsdp); 1: a full replica (ddp)


def estimate(run: Run, gpu_bytes: int) -> dict[str, float]:
    """Bytes of each part and of the two phases' peaks (see the module docstring)."""
    a, P = run.arch, run.arch.parameters()
    tokens = run.micro_batch * (run.prompt_len + run.completion_len)
    per_token_layer = a.activation_bytes_per_token_layer()
    if run.gradient_checkpointing:
        activations = tokens * a.layers * 4 * a.hidden + tokens * per_token_layer
    else:
        activations = tokens * a.layers * per_token_layer
    parts = {
        "states": 16 * P / run.shards,
        "gathered": 8 * P if run.shards > 1 else 0,
        "reference": 4 * P if run.reference else 0,
        "activations": activations,
        "logits": run.micro_batch * run.completion_len * a.vocab * 4 + LOGPROB_CHUNKS_BYTES,
        "engine": run.gpu_memory_utilization * gpu_bytes,
        "context": CONTEXT_BYTES,
    }
    fixed = parts["states"] + parts["reference"] + parts["context"]
    generation = fixed + parts["engine"]
    training = fixed + parts["gathered"] + parts["activations"] + parts["logits"]
    training += 0 if run.sleep_during_train else parts["engine"]
    kv_tokens = (parts["engine"] - 2 * P) / a.kv_bytes_per_token()
    return {
        **parts,
        "parameters": P,
        "generation_peak": generation,
        "training_peak": training,
        "peak": max(generation, training),
        "kv_cache_sequences": kv_tokens / (run.prompt_len + run.completion_len),
    }


def paper_runs(prompt_len: int, shards: int = 1) -> list[Run]:
    """The paper configs (conf/experiment/*_h8.yaml; Table 2's families on MBPP+), composed by Hydra."""
    from hydra import compose, initialize_config_dir

    from rapid import estimators
    from rapid.config import register_resolvers

    register_resolvers()
    names = {
        "math_h8": [],
        "mbpp_h8": [],
        "minif2f_h8": [],
        "mbpp_h8 model=qwen2.5_1.5b": ["model=qwen2.5_1.5b"],
        "mbpp_h8 model=llama3.2_1b": ["model=llama3.2_1b"],
        "mbpp_h8 model=gemma3_1b": ["model=gemma3_1b"],
        "math_h8 algorithm=grpo": ["algorithm=grpo"],
    }
    runs = []
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        for name, extra in names.items():
            cfg = compose("config", overrides=[f"+experiment={name.split()[0]}", *extra])
            runs.append(
                Run(
                    name=name,
                    arch=ARCHITECTURES[cfg.model.name],
                    micro_batch=cfg.train.micro_batch,
                    prompt_len=prompt_len,
                    completion_len=cfg.task.max_new_tokens,
                    gradient_checkpointing=cfg.model.gradient_checkpointing,
                    sleep_during_train=cfg.sampler.sleep_during_train,
                    gpu_memory_utilization=cfg.sampler.gpu_memory_utilization,
                    reference=estimators.get(cfg.algorithm.loss).reference(cfg.algorithm),
                    shards=shards,
                )
            )
    return runs


def table(runs: list[Run], gpus_gib: list[int]) -> str:
    gib = lambda x: f"{x / GiB:.1f}"  # noqa: E731
    head = (
        "| run | model | params | micro-batch x tokens | ckpt | sleep | states | gathered | ref | activations | logits | "
        + " | ".join(f"engine / peak / fits {g} GB" for g in gpus_gib)
        + " |"
    )
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for run in runs:
        cells = []
        for g in gpus_gib:
            e = estimate(run, g * GiB)
            cells.append(f"{gib(e['engine'])} / {gib(e['peak'])} / {'yes' if e['peak'] <= g * GiB else 'NO'}")
        e = estimate(run, gpus_gib[0] * GiB)
        name = next(k for k, v in ARCHITECTURES.items() if v == run.arch)
        lines.append(
            f"| {run.name} | {name} | {e['parameters'] / 1e9:.2f}B | {run.micro_batch} x "
            f"{run.prompt_len}+{run.completion_len} | {'yes' if run.gradient_checkpointing else 'no'} | "
            f"{'yes' if run.sleep_during_train else 'no'} | {gib(e['states'])} | {gib(e['gathered'])} | {gib(e['reference'])} | "
            f"{gib(e['activations'])} | {gib(e['logits'])} | " + " | ".join(cells) + " |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu-gib", type=int, nargs="+", default=[24, 48, 80], help="GPU sizes (GiB)")
    parser.add_argument("--prompt-len", type=int, default=512, help="tokens of the longest prompt (assumed)")
    parser.add_argument("--shards", type=int, default=1, help="train.parallel=fsdp over this many GPUs (1: ddp)")
    parser.add_argument("--out", type=Path, help="write table.md into this folder")
    args = parser.parse_args(argv)
    text = (
        f"GiB per rank, estimated by tools/memory_estimate.py (prompts of {args.prompt_len} tokens assumed; "
        "'engine' is vLLM's gpu_memory_utilization share of each GPU, 'peak' the larger of the generation "
        "and training phases"
        + (f"; states sharded over {args.shards} GPUs by train.parallel=fsdp" if args.shards > 1 else "")
        + ").\n\n"
        + table(paper_runs(args.prompt_len, args.shards), args.gpu_gib)
        + "\n"
    )
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / ("table.md" if args.shards == 1 else f"table_fsdp{args.shards}.md")).write_text(
            f"<!-- python tools/memory_estimate.py {' '.join(sys.argv[1:] if argv is None else argv)} -->\n" + text
        )


if __name__ == "__main__":
    main()
