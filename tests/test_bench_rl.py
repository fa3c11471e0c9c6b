"""tools/bench_rl.py: the table's arithmetic (medians, ratios against PG and TRL) on made-up runs, and the
floors replayed from a real run (vLLM engine, tiny model); plus the throughput mode's pieces: a random
model of a given architecture, and completions of exactly max_new_tokens."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
import torch
from omegaconf import OmegaConf

from rapid.models import load_model_and_tokenizer
from rapid.sampler import HFSampler
from tests.test_train import REPO, command, env_for
from tools import bench_rl
from tools.stats import bootstrap_accuracy, bootstrap_replicates, wilson_interval


def fake_row(method: str, seed: int, s_per_1k: float, accuracy: float) -> dict:
    return {
        "method": method,
        "seed": seed,
        "samples": 512,
        "wall_s": s_per_1k * 0.512,
        "s_per_1k": s_per_1k,
        "accuracy_before": 0.15,
        "accuracy_after": accuracy,
        **{f"{p}_s_per_1k": s_per_1k / 6 for p in bench_rl.PHASES},
        "peak_rss_mib": 1000.0,
        "peak_cuda_mib": 0.0,
    }


def test_report_takes_medians_and_ratios(tmp_path):
    rows = [
        fake_row("PG", 0, 300.0, 0.30),
        fake_row("PG", 1, 200.0, 0.20),
        fake_row("PG", 2, 260.0, 0.40),
        fake_row("RAPID H=8", 0, 100.0, 0.35),
        fake_row("RAPID H=8", 1, 130.0, 0.25),
        fake_row("RAPID H=8", 2, 120.0, 0.30),
        fake_row("TRL GRPOTrainer", 0, 400.0, 0.2),
        fake_row("TRL GRPOTrainer", 1, 500.0, 0.2),
        fake_row("TRL GRPOTrainer", 2, 480.0, 0.2),
    ]
    rows[3] |= {
        "generate_floor_s": 10.0,
        "train_floor_s": 20.0,
        "overhead": 1.10,
        "sync_share": 0.01,
        "padding_frac": 0.1,
        "generate_vs_floor": 1.2,
        "train_vs_floor": 1.05,
    }
    meta = {
        "device": "CPU",
        "samples": 512,
        "seeds": [0, 1, 2],
        "overrides": [],
        "git": "abc",
        "date": "d",
        "command": "python tools/bench_rl.py",
    }
    text = bench_rl.report(rows, meta, tmp_path)
    table = {r["method"]: r for r in csv.DictReader((tmp_path / "bench_rl.csv").open())}
    assert float(table["PG"]["s_per_1k"]) == 260.0 and float(table["RAPID H=8"]["s_per_1k"]) == 120.0
    assert float(table["TRL GRPOTrainer"]["s_per_1k"]) == 480.0
    assert float(table["RAPID H=8"]["vs_pg"]) == pytest.approx(120 / 260)
    assert float(table["RAPID H=8"]["vs_trl"]) == pytest.approx(120 / 480)
    assert float(table["PG"]["vs_pg"]) == 1.0 and float(table["RAPID H=8"]["accuracy_after"]) == 0.30
    assert (
        "| RAPID H=8 | 120.0 |" in text
        and "0.46 | 0.25 |" in text
        and "**1.100**" in text
        and "train phase 1.05x" in text
    )
    assert len(list(csv.DictReader((tmp_path / "runs.csv").open()))) == 9


@pytest.mark.slow
def test_floors_replay_the_runs_requests(tmp_path):
    run = tmp_path / "run"
    args = [
        "+experiment=smoke",
        "sampler=vllm",
        "logger.rollouts=true",
        "eval.every=0",
        "ckpt.every=0",
        f"hydra.run.dir={run}",
    ]
    env = env_for(tmp_path)
    proc = subprocess.run(command(args, tmp_path), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    proc = subprocess.run(
        [sys.executable, str(REPO / "tools" / "bench_rl.py"), "--floors", str(run)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
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
    small = {
        **arch,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
    }
    model, tokenizer = load_model_and_tokenizer(architecture=small)
    assert type(model).__name__ == "Qwen2ForCausalLM" and model.config.vocab_size == 151936
    assert model.model.layers[0].self_attn.q_proj.bias is not None  # Qwen2's qkv bias
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_ignore_eos_gives_fixed_length_completions():
    """With a logit bias that makes EOS ~99.5% likely, plain sampling stops after one token; with
    ignore_eos every completion runs to max_new_tokens (and keeps a log-prob per token)."""
    model, tokenizer = load_model_and_tokenizer(
        architecture={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 32,
        }
    )
    bias = torch.zeros(model.config.vocab_size)
    bias[tokenizer.eos_token_id] = 10.0
    model.lm_head.bias = torch.nn.Parameter(bias)
    prompts = [tokenizer("1 + 2 =")["input_ids"]] * 3
    stopped = HFSampler(model, tokenizer).generate(prompts, n=4, max_new_tokens=9, temperature=1.0, seeds=[0, 1, 2])
    assert all(c.token_ids == [tokenizer.eos_token_id] and c.finish_reason == "stop" for g in stopped for c in g)
    fixed = HFSampler(model, tokenizer, ignore_eos=True).generate(
        prompts, n=4, max_new_tokens=9, temperature=1.0, seeds=[0, 1, 2]
    )
    assert all(len(c.token_ids) == len(c.logprobs) == 9 and c.finish_reason == "length" for g in fixed for c in g)


def test_reuse_reads_finished_runs_into_the_table(tmp_path):
    """`--reuse` takes the runs already in --out (here made-up summaries) instead of running them again."""
    for key, rounds_s in (("rapid_h1_s0", 100.0), ("rapid_h8_s0", 60.0)):
        (tmp_path / "runs" / key).mkdir(parents=True)
        (tmp_path / "runs" / key / "summary.json").write_text(
            json.dumps(
                {
                    "samples": 512,
                    "time/rounds_s_total": rounds_s,
                    "time/total_s": 999.0,
                    "time/train_s_total": rounds_s / 2,
                    "eval/accuracy_before": 0.15,
                    "eval/accuracy_after": 0.4,
                    "mem/train_rss_mib_max": 1234.0,
                }
            )
        )
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "bench_rl.py"),
            "--h",
            "1",
            "8",
            "--no-grpo",
            "--no-trl",
            "--no-floors",
            "--reuse",
            "--out",
            str(tmp_path),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = {r["method"]: r for r in csv.DictReader((tmp_path / "bench_rl.csv").open())}
    assert float(table["PG"]["s_per_1k"]) == pytest.approx(100 / 0.512)
    assert float(table["RAPID H=8"]["s_per_1k"]) == pytest.approx(60 / 0.512)
    assert float(table["RAPID H=8"]["train_s_per_1k"]) == pytest.approx(30 / 0.512)
    assert float(table["RAPID H=8"]["vs_pg"]) == pytest.approx(0.6) and float(table["PG"]["peak_rss_mib"]) == 1234.0


# ------------------------------------------------------------------ spread, confidence intervals, predictions


def test_bootstrap_degenerate_cases_by_hand():
    assert bootstrap_accuracy([[1, 1, 1], [1, 1, 1]]) == (1.0, 1.0, 1.0)  # nothing to resample
    assert bootstrap_accuracy([[0, 1, 0, 1]] * 3, n_boot=10)[0] == 0.5
    # one seed always right, one always wrong: a replicate is (number of draws of the first) / 2, i.e. 0, 0.5
    # or 1 with probabilities 1/4, 1/2, 1/4: the 2.5 and 97.5 percentiles are 0 and 1
    mean, low, high = bootstrap_accuracy([[1] * 5, [0] * 5])
    assert (mean, low, high) == (0.5, 0.0, 1.0)
    stats = bootstrap_replicates([[1] * 5, [0] * 5], n_boot=20_000)
    assert set(stats.tolist()) == {0.0, 0.5, 1.0} and abs((stats == 0.5).mean() - 0.5) < 0.02


def test_bootstrap_of_one_seed_is_the_binomial():
    """One seed, 10 of 20 right: a replicate is Binomial(20, 1/2) / 20. P(X <= 5) = 0.021 and P(X <= 6) = 0.058,
    so the 2.5th percentile is 6/20; P(X <= 13) = 0.942 and P(X <= 14) = 0.979, so the 97.5th is 14/20."""
    assert bootstrap_accuracy([[1] * 10 + [0] * 10]) == pytest.approx((0.5, 0.30, 0.70))


@pytest.mark.parametrize("sizes", [(10, 10, 10), (10, 20, 40)])
def test_bootstrap_variance_counts_seeds_and_problems(sizes):
    """A replicate is the mean of S iid draws X: pick a seed uniformly, then the mean of its N_s problems drawn
    with replacement. So Var = (Var_s(p_s) + mean_s(p_s (1 - p_s) / N_s)) / S (Var_s over the S seeds, 1/S).
    With p = 0.4, 0.5, 0.6 and N = 10: (0.006667 + 0.024333) / 3 = 0.010333, sd 0.1017 (over seeds alone
    it would be 0.047, over problems alone 0.090)."""
    import numpy as np

    p = [0.4, 0.5, 0.6]
    per_seed = [[1] * round(q * n) + [0] * (n - round(q * n)) for q, n in zip(p, sizes)]
    pa, na = np.array(p), np.array(sizes)
    expected_sd = np.sqrt((pa.var() + (pa * (1 - pa) / na).mean()) / 3)
    n_boot = 20_000 if len(set(sizes)) == 1 else 4_000
    stats = bootstrap_replicates(per_seed, n_boot=n_boot, seed=1)
    assert stats.std() == pytest.approx(expected_sd, rel=0.03 if n_boot == 20_000 else 0.05)
    assert stats.mean() == pytest.approx(0.5, abs=3 * expected_sd / np.sqrt(n_boot))
    if len(set(sizes)) == 1:
        assert expected_sd == pytest.approx(0.1017, abs=1e-4)


def test_wilson_interval_by_hand():
    # 8 of 10: center (0.8 + 1.96^2 / 20) / (1 + 1.96^2 / 10) = 0.99208 / 1.38415 = 0.71674,
    # half 1.96 * sqrt(0.016 + 0.009604) / 1.38415 = 0.22658  ->  (0.4902, 0.9433)
    assert wilson_interval(8, 10) == pytest.approx((0.4902, 0.9433), abs=1e-4)
    assert wilson_interval(0, 10)[0] == pytest.approx(0.0) and wilson_interval(10, 10)[1] == pytest.approx(1.0)


def test_accuracy_interval_says_how_it_was_made():
    with_outcomes = [{"accuracy_after": 1.0, "eval_correct": [1] * 5}, {"accuracy_after": 0.0, "eval_correct": [0] * 5}]
    assert bench_rl.accuracy_interval(with_outcomes) == {
        "accuracy_mean": 0.5,
        "accuracy_ci_low": 0.0,
        "accuracy_ci_high": 1.0,
        "accuracy_ci": "bootstrap over seeds and problems",
    }
    # 50 + 70 of 200 pooled: p = 0.6, center 0.60960 / 1.01921 = 0.59812, half 1.96 * sqrt(0.0012 + 0.000024) / 1.01921
    # = 0.06728  ->  (0.5308, 0.6654)
    pooled = bench_rl.accuracy_interval(
        [{"accuracy_after": 0.5, "eval_n": 100}, {"accuracy_after": 0.7, "eval_n": 100}]
    )
    assert pooled["accuracy_ci"] == "binomial (Wilson), seeds pooled" and pooled["accuracy_mean"] == pytest.approx(0.6)
    assert (pooled["accuracy_ci_low"], pooled["accuracy_ci_high"]) == pytest.approx((0.5308, 0.6654), abs=1e-4)
    seeds_only = bench_rl.accuracy_interval([{"accuracy_after": 0.5}, {"accuracy_after": 0.5}])
    assert seeds_only["accuracy_ci"] == "bootstrap over seeds" and seeds_only["accuracy_ci_low"] == 0.5


def test_report_shows_spread_interval_and_prediction(tmp_path):
    rows = [
        fake_row("PG", s, w, 0.3)
        | {"eval_correct": [1, 0, 1, 0], "predicted_s_per_1k": 240.0, "predicted_generate_s_per_1k": 100.0}
        for s, w in ((0, 300.0), (1, 200.0), (2, 260.0))
    ]
    rows += [fake_row("TRL GRPOTrainer", 0, 400.0, 0.2) | {"eval_n": 100}]
    meta = {
        "device": "CPU",
        "samples": 512,
        "seeds": [0, 1, 2],
        "overrides": [],
        "git": "abc",
        "date": "d",
        "command": "python tools/bench_rl.py",
        "machine": {"cpu_model": "Test CPU", "cpu_cores": 2, "vector_extensions": ["avx2", "fma"]},
    }
    text = bench_rl.report(rows, meta, tmp_path)
    # median 260, spread 200-300, predicted 240: error 240 / 260 - 1 = -8%
    assert "| PG | 260.0 | 200.0-300.0 | 240.0 | -8% |" in text
    assert "| 0.300 | 0.500 [" in text and "0.200 [0.133, 0.289] b |" in text  # Wilson(20, 100) = (0.1333, 0.2888)
    assert "| PG | 100.0 / 43.3 |" in text  # the per-phase comparison
    assert "CPU Test CPU (2 cores; vector extensions: avx2 fma)" in text
    saved = json.loads((tmp_path / "bench_rl_meta.json").read_text())
    assert saved["machine"]["vector_extensions"] == ["avx2", "fma"]
    assert saved["accuracy_interval"]["TRL GRPOTrainer"] == "binomial (Wilson), seeds pooled"
    table = {r["method"]: r for r in csv.DictReader((tmp_path / "bench_rl.csv").open())}
    assert float(table["PG"]["s_per_1k_min"]) == 200.0 and float(table["PG"]["s_per_1k_std"]) == pytest.approx(
        50.332, abs=1e-3
    )
    assert float(table["PG"]["prediction_error"]) == pytest.approx(240 / 260 - 1)
    assert "eval_correct" not in next(csv.DictReader((tmp_path / "runs.csv").open()))


def test_predicted_time_of_a_run_from_its_config(tmp_path):
    """A run of H = 2, n_step 4, n_group 4 with 3-token completions, against the hand-computed cost model of
    tests/test_cost_model.py: 0.132 s per sample, 132 s per 1k."""
    from tests.test_cost_model import made_up

    run = tmp_path / "rapid_h2_s0"
    run.mkdir()
    cfg = bench_rl.composed(["algorithm=rapid", "algorithm.H=2", "algorithm.n_step=4", "algorithm.n_group=4"])
    OmegaConf.save(cfg, run / "config.yaml", resolve=True)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps({"round": r, "train/completion_len": 3.0}) for r in (1, 2)))
    (run / "eval_outcomes.jsonl").write_text('{"round": 0, "correct": [0, 0, 0]}\n{"round": 2, "correct": [1, 0, 1]}\n')
    facts = bench_rl.run_facts(run, {"samples": 16})
    assert facts["completion_len"] == 3.0 and facts["eval_correct"] == [1, 0, 1] and facts["eval_n"] == 3
    rows = [{"method": "RAPID H=2", **facts}, {"method": "TRL GRPOTrainer", "run_dir": str(tmp_path / "trl")}]
    bench_rl.predict_runs(rows, made_up())
    assert rows[0]["predicted_s_per_1k"] == pytest.approx(132.0)
    assert rows[0]["predicted_generate_s_per_1k"] == pytest.approx(75.0) and "predicted_s_per_1k" not in rows[1]
    OmegaConf.save(
        bench_rl.composed(["algorithm=grpo", "algorithm.n_step=4", "algorithm.n_group=4", "algorithm.H=2"]),
        run / "config.yaml",
        resolve=True,
    )
    bench_rl.predict_runs(rows, made_up())  # GRPO: plus the reference forward, 9.5 s per 1k
    assert rows[0]["predicted_train_s_per_1k"] == pytest.approx(36.0 + 9.5)


def test_predictions_draw_lengths_from_another_runs_rollouts(tmp_path):
    """--lengths-from: a run without rollouts is predicted with another run's groups of lengths, rescaled to its
    own mean. With the made-up cost model of tests/test_cost_model.py and one group of lengths 2, 2, 2, 10 (mean 4,
    the run's mean too): a call costs 1.8 s, the micro-batch padded to 10 costs 0.17 + 0.03 for the step, the sync
    0.16, a reward 0.001 -> (1.8 + 0.2 + 0.16) / 4 + 0.001 = 0.541 s per sample; at fixed lengths of 4 it would be
    (first 0.8 + 3 steps of 0.2 + 0.05 + 0.04 + 0.002 * 4 * 4 + 0.03 + 0.16) / 4 + 0.001 = 0.429."""
    from tests.test_cost_model import made_up

    run, donor = tmp_path / "rapid_h1_s0", tmp_path / "donor"
    run.mkdir()
    donor.mkdir()
    OmegaConf.save(
        bench_rl.composed(["algorithm=rapid", "algorithm.H=1", "algorithm.n_step=4", "algorithm.n_group=4"]),
        run / "config.yaml",
        resolve=True,
    )
    (run / "metrics.jsonl").write_text(json.dumps({"round": 1, "train/completion_len": 4.0}))
    (donor / "rollouts.jsonl").write_text(
        "\n".join(json.dumps({"round": 1, "group": 0, "completion_ids": [7] * n}) for n in (2, 2, 10, 2))
    )
    rows = [{"method": "PG", **bench_rl.run_facts(run, {"samples": 4})}]
    bench_rl.predict_runs(rows, made_up())
    assert rows[0]["predicted_s_per_1k"] == pytest.approx(429.0)
    bench_rl.predict_runs(rows, made_up(), lengths_from=donor)
    assert rows[0]["predicted_s_per_1k"] == pytest.approx(541.0)
    assert bench_rl.shared_length_groups([], {"length_groups": [[3] * 4]}) == [[3] * 4]


def test_peak_and_mfu_by_hand():
    assert bench_rl.peak_bf16_flops("NVIDIA H200") == 989e12
    assert bench_rl.peak_bf16_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert bench_rl.peak_bf16_flops("NVIDIA H100 PCIe") == 756e12  # not the SXM part's
    assert bench_rl.peak_bf16_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert bench_rl.peak_bf16_flops(None) is None and bench_rl.peak_bf16_flops("Tesla K80") is None
    # 494M parameters, 32 x 540 tokens trained in 2 s: 6 * 494e6 * 17280 / 2 / 989e12 = 0.025894
    assert bench_rl.mfu(494_000_000, 32 * 540, 3, 2.0, 989e12) == pytest.approx(6 * 494e6 * 17280 / 2 / 989e12)
    assert bench_rl.mfu(494_000_000, 32 * 540, 3, 2.0, 989e12) == pytest.approx(0.025894, abs=1e-6)
    assert bench_rl.mfu(10, 10, 3, 1.0, None) is None and bench_rl.mfu(10, 10, 3, 0.0, 1e12) is None


def test_mfu_per_round_from_a_runs_metrics(tmp_path):
    """Round 1 trains 32 records of 28 + 512 tokens, all of them, in 2 s, its recompute 0.25 s; round 2
    trains half of its 32 records (trained_frac 0.5) in 1 s, no recompute."""
    rows = [
        {"round": 0, "eval/accuracy": 0.0},
        {
            "round": 1,
            "samples": 32,
            "train/prompt_len": 28.0,
            "train/completion_len": 512.0,
            "train/trained_frac": 1.0,
            "time/train_s": 2.0,
            "time/recompute_s": 0.25,
        },
        {
            "round": 2,
            "samples": 64,
            "train/prompt_len": 28.0,
            "train/completion_len": 512.0,
            "train/trained_frac": 0.5,
            "time/train_s": 1.0,
            "time/recompute_s": 0.0,
        },
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "meta.json").write_text(json.dumps({"parameters": 1_000_000, "gpu": "NVIDIA H200"}))
    (tmp_path / "config.yaml").write_text("algorithm:\n  num_iterations: 1\n")
    facts = bench_rl.run_facts(tmp_path, {"samples": 64})
    r1, r2 = facts["mfu_rounds"]
    tokens = 32 * 540
    assert r1["train_tokens"] == tokens and r2["train_tokens"] == tokens / 2
    assert r1["train_mfu"] == pytest.approx(6e6 * tokens / 2.0 / 989e12)
    assert r1["recompute_mfu"] == pytest.approx(2e6 * tokens / 0.25 / 989e12)
    assert r2["train_mfu"] == pytest.approx(6e6 * tokens / 2 / 1.0 / 989e12) and r2["recompute_mfu"] is None
    assert facts["train_mfu"] == pytest.approx((r1["train_mfu"] + r2["train_mfu"]) / 2)
    (tmp_path / "meta.json").write_text(json.dumps({"parameters": 1_000_000, "gpu": None}))  # a CPU run
    assert bench_rl.run_facts(tmp_path, {"samples": 64})["train_mfu"] is None


def test_throughput_only_trains_on_every_group():
    """Random weights score 0 everywhere: with train.skip_zero_advantage every group would be skipped
    (the first GPU run trained on 0% of its records). The throughput mode turns skipping off, and a run
    that trained on less than everything stops the benchmark."""
    from rapid.config import skipped_groups

    cfg = bench_rl.composed(bench_rl.throughput_overrides(["algorithm=rapid", "algorithm.H=8"]))
    assert skipped_groups(cfg) is None and cfg.model.name == "Qwen2.5-0.5B-random"
    tiny = bench_rl.composed(bench_rl.throughput_overrides(["model=tiny"]))  # the user's model replaces it
    assert tiny.model.name == "tiny-llama" and skipped_groups(tiny) is None
    assert skipped_groups(bench_rl.composed(["algorithm=rapid"])) is not None  # the default skips
    bench_rl.check_trained_everything({"method": "PG", "trained_frac": 1.0})
    with pytest.raises(SystemExit, match="trained on 0.0% of its records"):
        bench_rl.check_trained_everything({"method": "PG", "trained_frac": 0.0})
