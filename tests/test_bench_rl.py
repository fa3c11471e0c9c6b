"""tools/bench_rl.py: the table's arithmetic (medians, ratios against PG and TRL) on made-up runs, and the
floors replayed from a real run (vLLM engine, tiny model); plus the throughput mode's pieces: a random
model of a given architecture, and completions of exactly max_new_tokens."""
from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from rapid.models import load_model_and_tokenizer
from rapid.sampler import HFSampler
from tests.test_train import REPO, command, env_for

spec = importlib.util.spec_from_file_location("bench_rl", REPO / "tools" / "bench_rl.py")
bench_rl = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench_rl)


def fake_row(method: str, seed: int, s_per_1k: float, accuracy: float) -> dict:
    return {"method": method, "seed": seed, "samples": 512, "wall_s": s_per_1k * 0.512, "s_per_1k": s_per_1k,
            "accuracy_before": 0.15, "accuracy_after": accuracy,
            **{f"{p}_s_per_1k": s_per_1k / 6 for p in bench_rl.PHASES}, "peak_rss_mib": 1000.0, "peak_cuda_mib": 0.0}


def test_report_takes_medians_and_ratios(tmp_path):
    rows = [fake_row("PG", 0, 300.0, 0.30), fake_row("PG", 1, 200.0, 0.20), fake_row("PG", 2, 260.0, 0.40),
            fake_row("RAPID H=8", 0, 100.0, 0.35), fake_row("RAPID H=8", 1, 130.0, 0.25), fake_row("RAPID H=8", 2, 120.0, 0.30),
            fake_row("TRL GRPOTrainer", 0, 400.0, 0.2), fake_row("TRL GRPOTrainer", 1, 500.0, 0.2),
            fake_row("TRL GRPOTrainer", 2, 480.0, 0.2)]
    rows[3] |= {"generate_floor_s": 10.0, "train_floor_s": 20.0, "overhead": 1.10, "sync_share": 0.01, "padding_frac": 0.1,
                "generate_vs_floor": 1.2, "train_vs_floor": 1.05}
    meta = {"device": "CPU", "samples": 512, "seeds": [0, 1, 2], "overrides": [], "git": "abc", "date": "d",
            "command": "python tools/bench_rl.py"}
    text = bench_rl.report(rows, meta, tmp_path)
    table = {r["method"]: r for r in csv.DictReader((tmp_path / "bench_rl.csv").open())}
    assert float(table["PG"]["s_per_1k"]) == 260.0 and float(table["RAPID H=8"]["s_per_1k"]) == 120.0
    assert float(table["TRL GRPOTrainer"]["s_per_1k"]) == 480.0
    assert float(table["RAPID H=8"]["vs_pg"]) == pytest.approx(120 / 260)
    assert float(table["RAPID H=8"]["vs_trl"]) == pytest.approx(120 / 480)
    assert float(table["PG"]["vs_pg"]) == 1.0 and float(table["RAPID H=8"]["accuracy_after"]) == 0.30
    assert "| RAPID H=8 | 120.0 |" in text and "0.46 | 0.25 |" in text and "**1.100**" in text and "train phase 1.05x" in text
    assert len(list(csv.DictReader((tmp_path / "runs.csv").open()))) == 9


@pytest.mark.slow
def test_floors_replay_the_runs_requests(tmp_path):
    run = tmp_path / "run"
    args = ["+experiment=smoke", "sampler=vllm", "logger.rollouts=true", "eval.every=0", "ckpt.every=0",
            f"hydra.run.dir={run}"]
    env = env_for(tmp_path)
    proc = subprocess.run(command(args, tmp_path), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_rl.py"), "--floors", str(run)], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    floors = json.loads((run / "floors.json").read_text())
    rounds = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rounds = [r for r in rounds if "time/round_s" in r]
    assert floors["rounds"] == len(floors["per_round"]) == 3
    assert all(r["generate_floor_s"] > 0 and r["train_floor_s"] > 0 for r in floors["per_round"])
    mean_round = sum(r["time/round_s"] for r in rounds) / 3
    assert floors["overhead"] == pytest.approx(mean_round / (floors["generate_floor_s"] + floors["train_floor_s"]))
    assert floors["sync_share"] == pytest.approx(sum(r["time/sync_s"] for r in rounds) / (3 * mean_round))
    assert 0.0 <= floors["padding_frac"] < 1.0


def test_random_architecture_has_the_configured_shape():
    arch = dict(OmegaConf.load(REPO / "conf" / "model" / "qwen2.5_0.5b_random.yaml").architecture)
    assert (arch["num_hidden_layers"], arch["hidden_size"], arch["vocab_size"]) == (24, 896, 151936)
    small = {**arch, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2,
             "num_key_value_heads": 1}
    model, tokenizer = load_model_and_tokenizer(architecture=small)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.vocab_size == 151936
    assert model.model.layers[0].self_attn.q_proj.bias is not None                  # Qwen2's qkv bias
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_ignore_eos_gives_fixed_length_completions():
    """With a logit bias that makes EOS ~99.5% likely, plain sampling stops after one token; with
    ignore_eos every completion runs to max_new_tokens (and keeps a log-prob per token)."""
    model, tokenizer = load_model_and_tokenizer(architecture={"hidden_size": 64, "intermediate_size": 128,
                                                              "num_hidden_layers": 1, "num_attention_heads": 2,
                                                              "num_key_value_heads": 1, "head_dim": 32})
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 10.0
    model.lm_head.bias = torch.nn.Parameter(bias)
    prompts = [tokenizer("1 + 2 =")["input_ids"]] * 3
    stopped = HFSampler(model, tokenizer).generate(prompts, n=4, max_new_tokens=9, temperature=1.0, seeds=[0, 1, 2])
    assert all(c.token_ids == [tokenizer.eos_token_id] and c.finish_reason == "stop" for g in stopped for c in g)
    fixed = HFSampler(model, tokenizer, ignore_eos=True).generate(prompts, n=4, max_new_tokens=9, temperature=1.0,
                                                                 seeds=[0, 1, 2])
    assert all(len(c.token_ids) == len(c.logprobs) == 9 and c.finish_reason == "length" for g in fixed for c in g)


def test_reuse_reads_finished_runs_into_the_table(tmp_path):
    """`--reuse` takes the runs already in --out (here made-up summaries) instead of running them again."""
    for key, rounds_s in (("rapid_h1_s0", 100.0), ("rapid_h8_s0", 60.0)):
        (tmp_path / "runs" / key).mkdir(parents=True)
        (tmp_path / "runs" / key / "summary.json").write_text(json.dumps(
            {"samples": 512, "time/rounds_s_total": rounds_s, "time/total_s": 999.0, "time/train_s_total": rounds_s / 2,
             "eval/accuracy_before": 0.15, "eval/accuracy_after": 0.4, "mem/train_rss_mib_max": 1234.0}))
    proc = subprocess.run([sys.executable, str(REPO / "tools" / "bench_rl.py"), "--h", "1", "8", "--no-grpo", "--no-trl",
                           "--no-floors", "--reuse", "--out", str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = {r["method"]: r for r in csv.DictReader((tmp_path / "bench_rl.csv").open())}
    assert float(table["PG"]["s_per_1k"]) == pytest.approx(100 / 0.512)
    assert float(table["RAPID H=8"]["s_per_1k"]) == pytest.approx(60 / 0.512)
    assert float(table["RAPID H=8"]["train_s_per_1k"]) == pytest.approx(30 / 0.512)
    assert float(table["RAPID H=8"]["vs_pg"]) == pytest.approx(0.6) and float(table["PG"]["peak_rss_mib"]) == 1234.0
