"""tools/memory_estimate.py: its arithmetic on a case computed by hand, its parameter counts against
transformers' own, and the paper configs fitting a 48 GB GPU."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tools.memory_estimate import ARCHITECTURES, Architecture, GiB, Run, estimate, paper_runs

# vocab 100, hidden 8, MLP 16, 2 layers, 2 query heads and 1 kv head of 4, tied embeddings
TINY = Architecture(vocab=100, hidden=8, intermediate=16, layers=2, heads=2, kv_heads=1, head_dim=4)


def test_arithmetic_of_a_known_case():
    # parameters: embedding 100*8 = 800; a layer: q 8*8 = 64, k and v 2*(8*4) = 64, o 8*8 = 64,
    # MLP 3*8*16 = 384, two norms 16 -> 592; two layers 1184; final norm 8 -> 1992
    assert TINY.parameters() == 1992
    # activations a token and layer: 2*(4*8 + 2*8 + 2*4 + 4*16) = 240 bf16 bytes + 4*(2*8) = 64 fp32 -> 304
    assert TINY.activation_bytes_per_token_layer() == 304
    assert TINY.kv_bytes_per_token() == 2 * 2 * 1 * 4 * 2  # K and V, 2 layers, 1 kv head of 4, bf16: 32
    run = Run("t", TINY, micro_batch=2, prompt_len=3, completion_len=5, gradient_checkpointing=False,
              sleep_during_train=False, gpu_memory_utilization=0.25)  # fmt: skip
    e = estimate(run, 1 * GiB)
    assert e["states"] == 16 * 1992 == 31872
    assert e["activations"] == 2 * (3 + 5) * 2 * 304 == 9728  # 16 tokens, 2 layers
    assert e["logits"] == 2 * 5 * 100 * 4 + 2**29  # 4000 bytes of bf16 logits + gradient, and two 256 MiB chunks
    assert e["engine"] == GiB / 4
    context = GiB / 2
    assert e["generation_peak"] == 31872 + context + GiB / 4
    assert e["training_peak"] == 31872 + context + 9728 + 4000 + 2**29 + GiB / 4
    assert e["peak"] == e["training_peak"]
    assert e["kv_cache_sequences"] == pytest.approx((GiB / 4 - 2 * 1992) / 32 / 8)
    # checkpointing keeps each layer's fp32 input (16 tokens * 2 layers * 4*8) plus one layer: 1024 + 16*304
    ckpt = estimate(Run(**{**run.__dict__, "gradient_checkpointing": True}), GiB)
    assert ckpt["activations"] == 1024 + 4864
    # asleep during training, the engine's share is not in the training phase
    asleep = estimate(Run(**{**run.__dict__, "sleep_during_train": True}), GiB)
    assert asleep["training_peak"] == 31872 + context + 9728 + 4000 + 2**29
    # train.parallel=fsdp over 4 ranks: states 16 P / 4 = 7968; training adds the whole fp32 weights and
    # gradients, 8 P = 15936; generation holds only the shards
    fsdp = estimate(Run(**{**run.__dict__, "shards": 4}), GiB)
    assert fsdp["states"] == 7968 and fsdp["gathered"] == 15936
    assert fsdp["generation_peak"] == 7968 + context + GiB / 4
    assert fsdp["training_peak"] == 7968 + 15936 + context + 9728 + 4000 + 2**29 + GiB / 4


@pytest.mark.parametrize("name", ARCHITECTURES)
def test_parameter_counts_equal_transformers(name):
    a = ARCHITECTURES[name]
    model_type = "qwen2" if name.startswith("Qwen") else "llama" if name.startswith("Llama") else "gemma3_text"
    config = AutoConfig.for_model(
        model_type,
        vocab_size=a.vocab,
        hidden_size=a.hidden,
        intermediate_size=a.intermediate,
        num_hidden_layers=a.layers,
        num_attention_heads=a.heads,
        num_key_value_heads=a.kv_heads,
        head_dim=a.head_dim,
        tie_word_embeddings=a.tied,
    )
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    assert a.parameters() == sum(p.numel() for p in model.parameters())


def test_every_paper_config_fits_48_gb():
    runs = paper_runs(prompt_len=512)
    assert {r.name.split()[0] for r in runs} == {"math_h8", "mbpp_h8", "minif2f_h8"}
    for run in runs:
        assert estimate(run, 48 * GiB)["peak"] <= 48 * GiB, run.name
