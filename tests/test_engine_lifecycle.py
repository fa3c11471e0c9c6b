"""Several vLLM engines in one process, one after the other: a Hydra multirun runs its jobs in one
process, and `algorithm=sft` distils with the teacher's engine and then trains with the student's.
Each engine is shut down and its memory freed before the next starts (rapid.sampler.VLLMSampler.close)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.test_train import REPO, command, env_for


@pytest.mark.slow
def test_two_runs_in_one_process_each_free_their_engine(tmp_path):
    """Before engines were shut down, the second job of this multirun peaked ~1 GiB (the first engine's
    KV cache, sampler.kv_cache_memory_bytes) above the first: 1729 -> 2768 MiB RSS."""
    sweep = tmp_path / "multirun"
    args = ["-m", "+experiment=smoke", "sampler=vllm", "model.dtype=float32", "seed=0,1", f"hydra.sweep.dir={sweep}"]
    proc = subprocess.run(
        command(args, tmp_path), cwd=REPO, env=env_for(tmp_path), capture_output=True, text=True, timeout=900
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    jobs = sorted(sweep.glob("*seed=*"))
    assert [j.name[-6:] for j in jobs] == ["seed=0", "seed=1"]
    summaries = [json.loads((j / "summary.json").read_text()) for j in jobs]
    assert [s["sampler"] for s in summaries] == ["vllm", "vllm"]
    for job in jobs:  # the second engine samples from its own run's weights, synced in place
        rows = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()]
        mismatch = [r["sampler/logprob_mismatch"] for r in rows if "sampler/logprob_mismatch" in r]
        assert len(mismatch) == 3 and max(mismatch) < 1e-3, mismatch
    first, second = (s["mem/generate_rss_mib_max"] for s in summaries)
    assert second - first < 256, (first, second)  # the first engine's 1 GiB KV cache is gone


@pytest.mark.slow
def test_algorithm_sft_distils_and_trains_with_one_engine_at_a_time(tmp_path):
    """`algorithm=sft` with sampler=vllm: the teacher's engine (rapid.distill) is shut down before the
    student's (rapid.sft) starts, in the same process."""
    from tests.test_sft import launch

    run = tmp_path / "run"
    proc = launch(
        "rapid.train",
        [
            "+experiment=smoke",
            "algorithm=sft",
            "sampler=vllm",
            "model.dtype=float32",
            "algorithm.distill.n_prompts=16",
            "algorithm.distill.chunk=8",
            "algorithm.sft.epochs=1",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert "Traceback" not in proc.stdout
    assert json.loads((run / "distill" / "distill_summary.json").read_text())["sampler"] == "vllm"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["sampler"] == "vllm" and summary["distill"]["prompts"] == 16
