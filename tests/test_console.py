"""The console at a run's start and end: the run directory, and the config in one line (the whole resolved
config goes to <run_dir>/config.yaml, not to the console)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from hydra import compose, initialize_config_dir

from rapid.config import register_resolvers
from rapid.logger import config_summary, run_dir_line
from tests.test_train import REPO, launch


def composed(*overrides: str):
    register_resolvers()
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("config", overrides=list(overrides))


def test_config_summary_is_one_line_with_the_runs_axes(tmp_path):
    cfg = composed()
    cfg.samples = 14 * 8 * 32  # as rapid.config.run_length sets it: rounds x H x n_step
    line = config_summary(cfg, tmp_path / "run")
    assert line == (
        "algorithm=rapid H=8 n_step=32 n_group=8 task=arithmetic model=SmolLM2-135M-Instruct samples=3584 rounds=14 "
        f"seed=0 (the full config: {tmp_path / 'run' / 'config.yaml'})"
    )
    # H = auto runs to a sample budget: no round count; another task, model, seed
    cfg = composed("algorithm.H=auto", "samples=512", "rounds=null", "task=multistep", "model=tiny", "seed=3")
    line = config_summary(cfg, tmp_path)
    assert "\n" not in line and line.startswith(
        "algorithm=rapid H=auto n_step=32 n_group=8 task=multistep model=tiny-llama samples=512 seed=3 "
    )


def test_run_directory_lines(tmp_path):
    assert run_dir_line(tmp_path) == f"run directory: {tmp_path}"
    assert (
        run_dir_line(tmp_path, finished=True)
        == f"run directory: {tmp_path} (config.yaml, metrics.jsonl, summary.json, the trained model in model/)"
    )


ROUTING = """\
import logging, os, sys, warnings
from pathlib import Path
from rapid import console
logging.basicConfig(stream=sys.stdout, level=logging.INFO, format="%(name)s: %(message)s")  # a console, as Hydra's
log = Path(sys.argv[1])
console.quiet_libraries(log, verbose=sys.argv[2] == "1")
logging.getLogger("vllm.engine").warning("engine warning")
logging.getLogger("transformers.modeling_utils").warning("library warning")
logging.getLogger("vllm.engine").error("engine error")
logging.getLogger("rapid.train").info("rapid line")
warnings.warn_explicit("library future", FutureWarning, "/elsewhere/site-packages/lib.py", 1)
warnings.warn_explicit("rapid warning", UserWarning, str(console.RAPID / "config.py"), 1)
with console.engine_start(log, verbose=sys.argv[2] == "1"):
    os.write(2, b"[W] C++ warning\\n")
    print("python line", flush=True)
os.write(2, b"stderr after\\n")
"""


@pytest.mark.parametrize("verbose", [False, True])
def test_library_output_goes_to_the_log_file_unless_verbose(tmp_path, verbose):
    """rapid/console.py: a library's warnings (its loggers, its Python warnings, C++ lines on stderr while the
    engine starts) go to the log file; rapid's lines and any error stay on the console; verbose keeps all there."""
    log = tmp_path / "train.log"
    proc = subprocess.run(
        [sys.executable, "-c", ROUTING, str(log), str(int(verbose))],
        cwd=REPO,
        env=os.environ | {"PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    shown, kept = proc.stdout + proc.stderr, log.read_text() if log.exists() else ""
    library = ("engine warning", "library warning", "library future", "[W] C++ warning")
    for line in ("engine error", "rapid line", "rapid warning", "python line", "stderr after"):
        assert line in shown, line
    for line in library:
        assert (line in shown) == verbose and (line in kept) != verbose, line


@pytest.mark.slow
def test_a_run_with_the_engine_prints_only_rapids_lines(tmp_path):
    """A smoke run with the vLLM engine: the console holds the run directory, the config line, the reward
    self-test, the evaluations, the progress bar and the summary, nothing from vLLM (its start-up, the weight
    syncs), the C++ runtime or other packages' warnings; those are in <run_dir>/train.log."""
    run = tmp_path / "run"
    proc = launch(["+experiment=smoke", "sampler=vllm", "logger.progress=true", f"hydra.run.dir={run}"], tmp_path)
    lines = [line for line in proc.stdout.replace("\r", "\n").splitlines() if line.strip()]
    start, end = lines.index("{"), len(lines) - 1 - lines[::-1].index("}")  # the summary, as summary.json holds it
    assert json.loads("\n".join(lines[start : end + 1])) == json.loads((run / "summary.json").read_text())
    lines = lines[:start] + lines[end + 1 :]
    expected = lambda line: (
        line.startswith(("run directory: ", "algorithm=rapid ", "reward self-test passed", "eval @ round"))
        or "samples/s" in line  # the progress bar
    )
    assert [line for line in lines if not expected(line)] == []
    assert sum(line.startswith("eval @ round") for line in lines) == 3  # rounds 0, 2, 3
    assert lines[0] == f"run directory: {run}" and lines[-1].startswith(f"run directory: {run} (")
    log = (run / "train.log").read_text()
    assert "vllm" in log and "WARNING" in log  # the engine's start-up warnings, kept in the run's log file
