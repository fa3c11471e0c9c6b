"""tools/iw_bf16.py: its statistics by hand, and a run on the tiny model through the real vLLM engine."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import torch

from tests.test_train import REPO, env_for
from tools import iw_bf16


def test_summarize_by_hand():
    delta = torch.tensor([[0.1, -0.1, 0.2, 0.0], [1.0, 0.5, -0.2, 0.5]], dtype=torch.float64)
    s = iw_bf16.summarize(delta, delta.sum(-1), eta=2.0, L=4)  # log w = 0.2, 1.8
    assert s["token_gap_abs_mean"] == pytest.approx(2.6 / 8, abs=1e-12)
    assert s["token_gap_mean"] == pytest.approx(2.0 / 8, abs=1e-12)
    assert s["log_w_mean"] == pytest.approx(1.0, abs=1e-12)
    assert s["log_w_std"] == pytest.approx(math.sqrt(2 * 0.8**2), abs=1e-12)  # unbiased, n = 2
    assert s["log_w_std_if_independent"] == pytest.approx(delta.std().item() * 2, abs=1e-12)
    assert s["frac_w_above_eta"] == 0.5 and s["frac_w_below_inv_eta"] == 0.0  # e^1.8 > 2
    assert s["staleness"] == pytest.approx((0.2 + math.log(2)) / 2, abs=1e-12)


@pytest.mark.slow
def test_tool_runs_on_tiny_model(tmp_path):
    pytest.importorskip("vllm", reason="the measurement needs the vLLM engine")
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "iw_bf16.py"),
            "--lengths",
            "8",
            "16",
            "--prompts",
            "2",
            "--n-step",
            "8",
            "--micro-batch",
            "4",
            "--out",
            str(out),
            "model=tiny",
        ],
        cwd=REPO,
        env=env_for(tmp_path, OMP_NUM_THREADS="2"),
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-4000:]
    result = json.loads((out / "bfloat16.json").read_text())
    assert [r["length"] for r in result["rows"]] == [8, 16] and all(r["n"] == 8 for r in result["rows"])
    assert "--out" not in result["meta"]["command"] and result["meta"]["cpu"]
    for r in result["rows"]:
        # micro-batches of one group: the recompute is the same computation as the first step's forward
        assert r["recompute"]["token_gap_abs_mean"] < 1e-6 < r["sampler"]["token_gap_abs_mean"]
        assert len(result["log_w"][f"{r['length']}/sampler"]) == 8 and "recompute_unaligned" in r
    table = (out / "iw_bf16.md").read_text()
    assert "| bfloat16 | 16 | recompute |" in table and "CPU:" in table
