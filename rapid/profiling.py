"""Where a round's time and memory go: wall time and peak memory per phase.

    clock = PhaseClock(device)
    with clock.phase("generate"):
        ...
    clock.row()   # {"time/generate_s": ..., "mem/generate_rss_mib": ..., ...}

Peak memory is measured per phase, not per process: on CPU the kernel's resident-set high-water
mark (VmHWM) of this process is reset when a phase starts (`/proc/self/clear_refs`, Linux) and read
when it ends; on CUDA, `torch.cuda.max_memory_allocated` / `max_memory_reserved` after
`reset_peak_memory_stats`, and the device memory in use at the phase's end (`mem_get_info`: vLLM's
pools, which torch's counters do not see, included). Child processes (reward workers) are not counted. Where the high-water
mark cannot be reset, the RSS reading is the process's peak so far (`mem/peak_is_process`).
A phase entered several times in a round (dynamic sampling) adds its times and keeps its largest peak.
CUDA work is synchronised at phase boundaries so that asynchronous kernels count where they ran.
"""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch

MIB = 2**20
_CLEAR_REFS = Path("/proc/self/clear_refs")
_STATUS = Path("/proc/self/status")


def _reset_rss_peak() -> bool:
    try:
        _CLEAR_REFS.write_text("5")  # "5" resets the peak RSS (VmHWM) to the current RSS
        return True
    except OSError:
        return False


def rss_peak_mib() -> float | None:
    """This process's resident-set high-water mark (VmHWM), MiB; None off Linux."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class PhaseClock:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds: dict[str, float] = defaultdict(float)
        self.memory: dict[str, float] = {}
        self.peak_is_process = False

    @contextmanager
    def phase(self, name: str):
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        self.peak_is_process |= not _reset_rss_peak()
        t0 = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.seconds[name] += time.perf_counter() - t0
            peaks = {"rss_mib": rss_peak_mib()}
            if self.cuda:
                free, total = torch.cuda.mem_get_info()
                peaks |= {
                    "cuda_alloc_mib": torch.cuda.max_memory_allocated() / MIB,
                    "cuda_reserved_mib": torch.cuda.max_memory_reserved() / MIB,
                    # the device as the driver sees it at the phase's end: the engine's own pools too
                    "cuda_device_used_mib": (total - free) / MIB,
                }
            for key, value in peaks.items():
                if value is not None:
                    self.memory[f"mem/{name}_{key}"] = max(value, self.memory.get(f"mem/{name}_{key}", 0.0))

    def row(self) -> dict:
        row = {f"time/{name}_s": s for name, s in self.seconds.items()} | self.memory
        if self.peak_is_process:
            row["mem/peak_is_process"] = True
        return row


VECTOR_FLAGS = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "asimd",
    "sve",
)


def cpu_info() -> tuple[str, set[str]]:
    """The CPU's model name and its feature flags, from /proc/cpuinfo where it exists (else the
    platform's name and no flags)."""
    import platform

    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model, flags


def cpu_description() -> str:
    """The CPU model, its core count and its vector extensions (from /proc/cpuinfo where it exists), for
    every results file: timings differ several-fold between CPUs of the same kind."""
    import os

    model, flags = cpu_info()
    vector = [f for f in VECTOR_FLAGS if f in flags]
    return f"{model}, {os.cpu_count()} cores, vector extensions: {' '.join(vector) or 'unknown'}"


def slow_cpu_bf16(flags: set[str]) -> bool:
    """True on an x86 CPU with AVX2 but no AVX-512: there oneDNN has no bf16 matrix kernel and a bf16
    product runs ~50x slower than in fp32 (3 against 196 GFLOP/s with oneDNN held to AVX2 on an AVX-512
    EPYC: tools/bench_matmul.py, experiments/results/bench_matmul_cpu.md)."""
    return "avx2" in flags and "avx512f" not in flags


def calibrate(reps: int = 5) -> dict[str, float]:
    """How fast this machine runs a fixed piece of work right now, so that a reader of a run's times can
    tell a slow run from a busy machine: `reps` times each, on one thread (whatever the run set), 40
    products of two fixed 256 x 256 fp32 matrices (`matmul_s`, ~0.03 s on one AVX-512 EPYC core) and a
    fixed pure-Python loop of 10^6 additions (`python_s`, ~0.035 s), the median of each (a rep that another
    process interrupted does not move it; a machine busy throughout does), and the 1-minute load average
    (`loadavg_1m`; None where the OS has none). rapid.train records it as `calibration` at a run's start
    (meta.json) and end (summary.json); tools/stats.py flags runs whose calibration is off the others'.
    About 0.35 s."""
    import os
    import statistics

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.linspace(-1, 1, 256 * 256).reshape(256, 256)
        matmul, python = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(40):
                torch.mm(a, a)
            matmul.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            total = 0
            for i in range(1_000_000):
                total += i
            python.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = None
    return {
        "matmul_s": statistics.median(matmul),
        "python_s": statistics.median(python),
        "loadavg_1m": load,
    }
