"""experiments/baselines/trl_grpo.py's generation backend: TRL's colocated vLLM engine on a GPU with sampler=vllm (as TRL's
users run it there), transformers generate otherwise. No GPU here: the choice and its GRPOConfig fields."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest
from omegaconf import OmegaConf

trl = pytest.importorskip("trl")

_spec = importlib.util.spec_from_file_location(
    "trl_grpo", Path(__file__).resolve().parents[1] / "experiments" / "baselines" / "trl_grpo.py"
)
_baseline = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_baseline)
generation_backend = _baseline.generation_backend

VLLM = OmegaConf.create({"name": "vllm", "gpu_memory_utilization": 0.3, "sleep_during_train": True})


def test_gpu_with_vllm_uses_trl_colocate_mode_sized_as_rapids_engine():
    options = generation_backend(VLLM, use_cpu=False, vllm_installed=True)
    assert options == {
        "use_vllm": True,
        "vllm_mode": "colocate",
        "vllm_gpu_memory_utilization": 0.3,
        "vllm_enable_sleep_mode": True,
        "vllm_importance_sampling_correction": True,
    }
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert set(options) <= fields, set(options) - fields  # TRL 1.16's names


@pytest.mark.parametrize(
    "sampler, use_cpu, installed",
    [(VLLM, True, True), (OmegaConf.create({"name": "hf"}), False, True), (VLLM, False, False)],
)
def test_cpu_hf_or_no_vllm_generates_with_transformers(sampler, use_cpu, installed):
    assert generation_backend(sampler, use_cpu, installed) == {
        "use_vllm": False,
        "vllm_importance_sampling_correction": False,
    }
