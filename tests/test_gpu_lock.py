"""The GPU machine's wheel set (experiments/gpu/lock.txt) is the closure of rapid's requirements over the
wheels' own metadata (experiments/gpu/metadata.json, committed), stopped at the image's packages
(experiments/gpu/image.txt). Offline: nothing here touches a registry."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_lock", REPO / "experiments" / "gpu" / "lock.py")
lock = importlib.util.module_from_spec(spec)
spec.loader.exec_module(lock)


@pytest.fixture(scope="module")
def committed():
    meta = json.loads(lock.METADATA.read_text())
    return lock.read_lock(), meta["packages"], lock.image_packages(), lock.roots()


def test_the_committed_lock_is_the_closure_of_the_metadata(committed):
    assert lock.problems(*committed) == []


def test_what_the_first_gpu_run_missed_is_in_the_lock_because_the_metadata_says_so(committed):
    """httpx2 / httpcore2 / truststore (openai 3.x), loguru (compressed-tensors), dill (depyf): each
    locked, and each reached through the requirer the metadata names."""
    locked, packages, image, _ = committed
    for name, requirer in [
        ("httpx2", "openai"),
        ("httpcore2", "httpx2"),
        ("truststore", "httpx2"),
        ("loguru", "compressed-tensors"),
        ("dill", "depyf"),
    ]:
        assert name in locked, name
        deps = {Requirement(r).name.lower().replace("_", "-") for r in packages[requirer]["requires_dist"]}
        assert name in deps, (name, requirer)


def test_a_missing_or_extra_or_wrong_version_is_reported(committed):
    locked, packages, image, roots = committed
    without = {k: v for k, v in locked.items() if k != "loguru"}
    assert any(
        p.startswith("loguru is required (by compressed-tensors)")
        for p in lock.problems(without, packages, image, roots)
    )
    extra = locked | {"left-pad": "1.0"}
    assert any(
        p.startswith("left-pad==1.0 is locked but nothing requires it")
        for p in lock.problems(extra, packages, image, roots)
    )
    wrong = locked | {"lark": "1.2.1"}  # vllm 0.26.0 pins lark==1.2.2
    assert any("vllm asks lark==1.2.2 but lark is 1.2.1" in p for p in lock.problems(wrong, packages, image, roots))
    # the image's torch is the one vllm pins; another would be reported
    other_torch = image | {"torch": "2.13.0"}
    assert any(
        "torch==2.11.0 but torch is 2.13.0 (in the image)" in p
        for p in lock.problems(locked, packages, other_torch, roots)
    )


def test_markers_are_evaluated_for_cpython_3_12_on_linux_x86_64():
    """A synthetic index: markers for another Python / OS are not followed, an extra's requirements only
    when some requirer asks for that extra."""
    packages = {
        "a": {
            "version": "1",
            "requires_python": ">=3.10",
            "requires_dist": [
                'b>=1; python_version >= "3.12"',
                'c; python_version < "3.12"',
                'd; sys_platform == "win32"',
                "e[fast]",
                'f; extra == "docs"',
            ],
        },
        "b": {"version": "1", "requires_python": None, "requires_dist": []},
        "e": {"version": "2", "requires_python": None, "requires_dist": ['g; extra == "fast"', 'h; extra == "slow"']},
        "g": {"version": "1", "requires_python": None, "requires_dist": []},
    }
    reached, _ = lock.closure(["a"], packages, image={})
    assert reached == {"a", "b", "e", "g"}
    reached, _ = lock.closure(["a[docs]"], packages | {"f": packages["g"]}, image={})
    assert "f" in reached
    # a package the image holds ends the walk there
    reached, _ = lock.closure(["a"], packages, image={"e": None})
    assert reached == {"a", "b"}
    # Requires-Python is checked for the target
    old = {"a": {"version": "1", "requires_python": "<3.12", "requires_dist": []}}
    assert lock.problems({"a": "1"}, old, {}, ["a"]) == ["a==1 needs Python <3.12"]


def test_pruned_packages_are_only_imported_by_backends_rapid_does_not_use(committed):
    """What the lock leaves out of vLLM's requirements: the module-level imports of each, read from the
    vllm 0.26.0 wheel when the lock was made, lie in attention / kernel backends of other models and chips."""
    meta = json.loads(lock.METADATA.read_text())
    assert set(meta["pruned"]) == set(lock.PRUNED)
    allowed = (
        "vllm/v1/attention/backends/flashinfer.py",
        "vllm/v1/attention/backends/mla/",
        "vllm/distributed/device_communicators/mnnvl",
        "vllm/cute_utils/",
        "vllm/model_executor/kernels/",
        "vllm/model_executor/layers/mamba/",
        "vllm/model_executor/layers/fused_moe/",
        "vllm/models/deepseek",
        "vllm/models/minimax",
        "vllm/third_party/fmha_sm100/",
        "vllm/third_party/tml_fa4/",
        "vllm/vllm_flash_attn/cute/",
    )
    for name, entry in meta["pruned"].items():
        for path in entry["vllm_module_level_imports"]:
            assert path.startswith(allowed), (name, path)
    assert "flashinfer-python" in meta["pruned"] and "flashinfer-python" not in committed[0]
