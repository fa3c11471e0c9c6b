"""The model a run leaves behind (<run_dir>/model, rapid.checkpoint.export_model): the trained weights in the
dtype the model came in, loadable by transformers and served by vLLM as they are."""

from __future__ import annotations

import json
import os

import pytest
import torch
from omegaconf import OmegaConf
from safetensors import safe_open
from transformers import AutoModelForCausalLM

from rapid.checkpoint import export_model, source_dtype
from rapid.models import load_model_and_tokenizer
from tests.helpers import TINY, encode, tiny_model
from tests.test_train import launch

PROMPT = "What is 2 + 3?"


def trained_tiny():
    """The tiny model with weights no bf16 number holds exactly (as after training), fp32 master weights."""
    model, tok = tiny_model()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 1e-3)
    return model, tok


def saved_tensors(folder) -> dict[str, torch.Tensor]:
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def test_export_writes_the_weights_in_the_dtype_asked_for(tmp_path):
    model, tok = trained_tiny()
    out = export_model(tmp_path / "model", model, tok, torch.bfloat16)
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"  # vLLM's dtype=auto reads this
    saved = saved_tensors(out)
    master = model.state_dict()
    assert "lm_head.weight" not in saved  # tied to the embedding: stored once, as the source was
    for name, t in saved.items():
        assert t.dtype == torch.bfloat16, name
        assert torch.equal(t, master[name].to(torch.bfloat16)), name  # the master weights, rounded once
    assert (out / "tokenizer.json").exists() and not (tmp_path / "model.tmp").exists()
    # the training model is untouched: still fp32 master weights
    assert all(p.dtype == torch.float32 for p in model.parameters())
    # half the bytes of the fp32 checkpoint the run keeps for resuming
    fp32 = export_model(tmp_path / "fp32", model, tok, torch.float32)
    size = lambda d: (d / "model.safetensors").stat().st_size  # noqa: E731
    assert size(out) < 0.55 * size(fp32)


def test_transformers_loads_the_exported_model_as_trained(tmp_path):
    model, tok = trained_tiny()
    out = export_model(tmp_path / "model", model, tok, torch.bfloat16)
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype="auto").eval()
    assert loaded.dtype == torch.bfloat16 and loaded.config.tie_word_embeddings
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    ids = torch.tensor(encode(tok, [PROMPT]))
    with torch.no_grad():
        want = torch.log_softmax(model(ids).logits.float(), -1)
        got = torch.log_softmax(loaded(ids).logits.float(), -1)
        other = torch.log_softmax(tiny_model(seed=1)[0](ids).logits.float(), -1)
    assert (got - want).abs().max() < 0.1  # bf16 rounding of weights and activations
    assert (other - want).abs().max() > 1.0  # what a model that is not the trained one gives


def test_source_dtype_is_the_one_the_model_came_in(tmp_path):
    model, tok = load_model_and_tokenizer(architecture=TINY)
    for dtype in (torch.bfloat16, torch.float32):
        folder = tmp_path / str(dtype)
        export_model(folder, model, tok, dtype)
        assert source_dtype(OmegaConf.create({"path": str(folder), "gguf": None, "architecture": None})) == dtype
        reloaded, _ = load_model_and_tokenizer(path=str(folder))
        assert reloaded.dtype == torch.float32  # training always holds fp32 master weights
    # a model built from a config has no source: its compute dtype
    built = {"path": None, "gguf": None, "architecture": dict(TINY)}
    assert source_dtype(OmegaConf.create(built | {"dtype": "bfloat16"})) == torch.bfloat16
    assert source_dtype(OmegaConf.create(built | {"dtype": "float32"})) == torch.float32


@pytest.mark.slow
def test_a_run_leaves_its_bf16_model_which_vllm_serves(tmp_path):
    """End to end: a run from a bf16 source writes <run_dir>/model in bf16, the final checkpoint's
    weights rounded once; vLLM's engine (dtype=auto) loads that folder as bf16 and its log-probs are the
    trained model's."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    model, tok = load_model_and_tokenizer(architecture=TINY)
    source = export_model(tmp_path / "source", model, tok, torch.bfloat16)
    run = tmp_path / "run"
    launch(
        ["+experiment=smoke", "model.architecture=null", f"model.path={source}", "rounds=2", f"hydra.run.dir={run}"],
        tmp_path,
        shaped=True,
    )
    out = run / "model"
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    saved = saved_tensors(out)
    master = saved_tensors(run / "checkpoints" / "round_000002" / "model")
    assert sorted(saved) == sorted(master)
    assert all(master[k].dtype == torch.float32 and torch.equal(saved[k], master[k].to(torch.bfloat16)) for k in saved)

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(out), dtype="auto", kv_cache_memory_bytes=64 * 2**20, enforce_eager=True, seed=0)
    try:
        assert llm.llm_engine.model_config.dtype == torch.bfloat16
        prompt = encode(tok, [PROMPT])[0]
        params = SamplingParams(temperature=0, max_tokens=6, logprobs=0, ignore_eos=True)
        done = llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)[0].outputs[0]
    finally:
        del llm
    tokens = list(done.token_ids)
    engine = torch.tensor([lp[t].logprob for lp, t in zip(done.logprobs, tokens)])
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = loaded(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
    trainer = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    assert (engine - trainer).abs().max() < 0.1  # bf16 engine vs the same weights in fp32
