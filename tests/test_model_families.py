"""The paper's model families (Qwen2.5, Llama-3.2, Gemma-3) through the real vLLM CPU engine: a tiny
random model of each architecture is built from its config, sampled, trained one step, synced in
place and sampled again; the engine's log-probs must equal the trainer's every time. One engine at a
time, each shut down before the next (as a Hydra multirun over model=... does)."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from rapid.models import ModelLoadError, load_model_and_tokenizer  # noqa: E402
from rapid.policy import CompletionLogprobs, completion_logprobs  # noqa: E402
from rapid.sampler import VLLMSampler  # noqa: E402
from tests.helpers import TINY, encode  # noqa: E402
from tests.test_vllm_sampler import trainer_vs_engine  # noqa: E402

T = 0.7
SHAPE = TINY  # tests/helpers.py's tiny shape; head_dim 32: the CPU attention backend's smallest
FAMILIES = {
    "qwen2.5": dict(model_type="qwen2"),  # Qwen2.5-0.5B/1.5B-Instruct
    "llama-3.2": dict(
        model_type="llama",
        rope_scaling={
            "rope_type": "llama3",
            "factor": 32.0,
            "original_max_position_embeddings": 64,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "rope_theta": 500000.0,
        },
    ),  # fmt: skip
    # Gemma-3-1B-it: the text-only model (gemma3_text), alternating sliding-window and global layers
    "gemma-3": dict(model_type="gemma3_text", sliding_window=16, layer_types=["sliding_attention", "full_attention"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_family_samples_and_syncs_in_place_on_the_engine(family):
    model, tok = load_model_and_tokenizer(architecture={**SHAPE, **FAMILIES[family]}, seed=0)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(4.0)  # sharpen the near-uniform random init
    sampler = VLLMSampler(
        model,
        tok,
        dtype=torch.float32,
        seed=0,
        max_model_len="auto",
        max_len_needed=128,
        kv_cache_memory_bytes=32 * 2**20,
        gpu_memory_utilization=0.3,
        enable_prefix_caching=True,
        sleep_during_train=False,
        block_size=32,
    )
    try:
        prompts = encode(tok, ["What is 2 + 3?", "A prompt longer than the sliding window of the tiny Gemma"])
        for step in range(2):
            groups = sampler.generate(prompts, n=2, max_new_tokens=24, temperature=T)
            trainer, batch = trainer_vs_engine(model, tok, groups, prompts)
            mask = batch.completion_mask
            assert mask.sum() > 0
            assert (trainer - batch.logp_mu).abs()[mask].max() < 1e-4, (family, step)
            loss = completion_logprobs(CompletionLogprobs(model, T), batch).sum()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= 0.5 * p.grad
                    p.grad = None
            sampler.sync_weights(model)
    finally:
        sampler.close()


@pytest.mark.slow
@pytest.mark.parametrize("path", ["meta-llama/Llama-3.2-1B-Instruct", "google/gemma-3-1b-it"])
def test_a_gated_model_that_cannot_be_loaded_says_how_to_get_access(path, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # no cached copy
    with pytest.raises(ModelLoadError, match=rf"gated .*accept its licence on https://huggingface.co/{path}.*log in"):
        load_model_and_tokenizer(path=path)
