"""PhaseClock: times add up per phase, and the peak memory of a phase is that phase's own."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from rapid.profiling import PhaseClock, rss_peak_mib


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
