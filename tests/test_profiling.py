"""PhaseClock: times add up per phase, and the peak memory of a phase is that phase's own; bf16 on an
AVX2-only CPU is flagged."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest
import torch

from rapid.config import resolve_dtype
from rapid.profiling import PhaseClock, rss_peak_mib, slow_cpu_bf16


def test_phase_times_accumulate():
    clock = PhaseClock(torch.device("cpu"))
    for _ in range(2):
        with clock.phase("generate"):
            time.sleep(0.05)
    with clock.phase("train"):
        time.sleep(0.02)
    row = clock.row()
    assert row["time/generate_s"] == pytest.approx(0.10, abs=0.03)
    assert row["time/train_s"] == pytest.approx(0.02, abs=0.015)


@pytest.mark.skipif(rss_peak_mib() is None, reason="needs Linux /proc (VmHWM)")
def test_peak_rss_is_per_phase():
    """A 400 MiB allocation freed inside `big` raises big's peak by about 400 MiB; `small`, run after it,
    does not inherit that peak (the high-water mark is reset when a phase starts)."""
    clock = PhaseClock(torch.device("cpu"))
    with clock.phase("before"):
        pass
    with clock.phase("big"):
        a = np.ones(400 * 2**20 // 8)
        del a
    with clock.phase("small"):
        b = np.ones(2**20 // 8)
        del b
    row = clock.row()
    if row.get("mem/peak_is_process"):
        pytest.skip("/proc/self/clear_refs is not writable here: peaks are process-wide")
    assert row["mem/big_rss_mib"] - row["mem/before_rss_mib"] == pytest.approx(400, abs=40)
    assert row["mem/small_rss_mib"] < row["mem/big_rss_mib"] - 300


@pytest.mark.parametrize(
    ("flags", "slow"),
    [
        ({"sse4_2", "avx", "avx2", "fma"}, True),  # AVX2-only x86 (e.g. an EPYC before Zen 4)
        ({"avx2", "avx512f", "avx512bw"}, False),  # AVX-512 without avx512_bf16: oneDNN emulates bf16 fast enough
        ({"avx2", "avx512f", "avx512_bf16", "amx_bf16"}, False),
        ({"asimd", "sve"}, False),  # not x86: no verdict
        (set(), False),  # flags unknown
    ],
)
def test_slow_cpu_bf16(flags, slow):
    assert slow_cpu_bf16(flags) is slow


def test_bf16_on_an_avx2_only_cpu_warns(monkeypatch):
    import rapid.profiling

    monkeypatch.setattr(rapid.profiling, "cpu_info", lambda: ("an AVX2 CPU", {"avx", "avx2", "fma"}))
    with pytest.warns(UserWarning, match="model.dtype=float32"):
        assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # fp32 there, and bf16 on a GPU, pass silently
        assert resolve_dtype("float32", torch.device("cpu")) == torch.float32
        assert resolve_dtype("bfloat16", torch.device("cuda")) == torch.bfloat16
    monkeypatch.setattr(rapid.profiling, "cpu_info", lambda: ("an AVX-512 CPU", {"avx2", "avx512f"}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16


def test_calibration_is_short_single_threaded_and_recorded_in_meta(tmp_path):
    """calibrate() times its fixed work on one thread and gives the caller's thread count back; every run's
    meta.json carries it (write_run_files), so that tools/stats.py can flag a run made on a busy machine."""
    import json
    import os

    import torch
    from omegaconf import OmegaConf

    from rapid.logger import write_run_files
    from rapid.profiling import calibrate

    threads = torch.get_num_threads()
    c = calibrate(reps=3)
    assert set(c) == {"matmul_s", "python_s", "loadavg_1m"}
    assert 0 < c["matmul_s"] < 5 and 0 < c["python_s"] < 5
    assert c["loadavg_1m"] == pytest.approx(os.getloadavg()[0], abs=5.0)
    assert torch.get_num_threads() == threads
    write_run_files(tmp_path, OmegaConf.create({"seed": 0}), "cpu")
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert set(meta["calibration"]) == set(c) and meta["calibration"]["matmul_s"] > 0
