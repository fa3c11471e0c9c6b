"""Grading never hangs or kills a run (rapid/rewards.py): a reward that hangs, spins holding the GIL,
segfaults, raises or returns NaN is a failed check, in training and in evaluation alike, with
`reward.workers=0` (a killable child) and with a pool; and a trainer killed with SIGKILL leaves no
grading process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rapid import rewards
from rapid.evaluate import evaluate
from rapid.rewards import score
from rapid.sampler import HFSampler
from tests.helpers import encode, tiny_model

REPO = Path(__file__).resolve().parents[1]

TASK = """
import ctypes, os, pathlib, time

def reward(completion, record):
    kind = record["kind"]
    if kind in ("hang", "spin") and os.environ.get("GRADING_MARKS"):  # tell the test this process grades
        (pathlib.Path(os.environ["GRADING_MARKS"]) / str(os.getpid())).touch()
    if kind == "hang":
        time.sleep(600)
    if kind == "spin":              # a pure-Python loop: holds the GIL, no signal handler runs
        while True:
            pass
    if kind == "segv":
        ctypes.string_at(0)         # reads address 0: SIGSEGV
    if kind == "raise":
        raise KeyError("a field the record lacks")
    if kind == "nan":
        return float("nan")
    return 1.0
"""
KINDS = ["ok", "hang", "ok", "segv", "raise", "spin", "nan", "ok"]


@pytest.fixture
def bad_task(tmp_path, monkeypatch):
    """A task module, importable by name (spawned workers import it), whose reward misbehaves as the
    record says."""
    (tmp_path / "misbehaving_task.py").write_text(TASK)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}{os.pathsep}{REPO}")
    monkeypatch.setattr(rewards, "_WARNED", set(), raising=False)  # each test sees the once-per-task warnings
    import misbehaving_task

    return misbehaving_task


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_an_eval_reward_that_hangs_is_timed_out(bad_task, workers):
    model, tokenizer = tiny_model()
    records = [{"kind": k} for k in KINDS]
    prompts = encode(tokenizer, [f"problem {i}" for i in range(len(records))])
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="the reward of task misbehaving_task"):
        row = evaluate(
            HFSampler(model, tokenizer), bad_task, records, prompts, max_new_tokens=4, workers=workers, timeout=2.0
        )
    # 3 of 8 score 1; hang and spin time out (2 s each), segv, raise and nan fail at once
    assert row["eval/accuracy"] == 3 / 8 and row["eval/reward_failures"] == 5 and row["eval/n"] == 8
    assert time.monotonic() - start < 60


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_a_segfaulting_reward_is_a_failed_check_not_a_crash(bad_task, workers):
    """In a subprocess, so that the old in-process grading's crash shows as a failure, not a dead pytest."""
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "import misbehaving_task\n"
        "from rapid.rewards import score\n"
        f"print(score(misbehaving_task, ['a', 'b', 'c'], [{{'kind': 'ok'}}, {{'kind': 'segv'}}, {{'kind': 'ok'}}],"
        f" workers={workers}, timeout=30))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=os.environ, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "([1.0, 0.0, 1.0], 1)"


def test_score_fails_every_kind_of_bad_check_once_each(bad_task):
    with pytest.warns(RuntimeWarning) as warned:
        got = score(bad_task, ["x"] * len(KINDS), [{"kind": k} for k in KINDS], workers=0, timeout=1.0)
    assert got == ([1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 1.0], 5)
    # one warning per kind: ran past the timeout (hang; spin is the same kind), killed (segv), raised, returned
    assert sorted(str(w.message).split(" ")[5] for w in warned) == ["killed", "raised", "ran", "returned"]
    with pytest.warns(RuntimeWarning, match="every one of the 2 reward checks of task misbehaving_task failed"):
        assert score(bad_task, ["x", "y"], [{"kind": "raise"}, {"kind": "nan"}]) == ([0.0, 0.0], 2)


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie left for a parent that does not reap it counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 2])
def test_a_killed_trainer_leaves_no_grading_process(bad_task, workers, tmp_path):
    """The trainer is killed while its grading processes are hung in a reward (each marks itself)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    code = (
        "import misbehaving_task\n"
        "from rapid.rewards import score\n"
        f"score(misbehaving_task, ['x'] * 4, [{{'kind': 'hang'}}, {{'kind': 'spin'}}] * 2, workers={workers},"
        " timeout=600)\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "GRADING_MARKS": str(marks)})
    try:
        deadline = time.monotonic() + 120
        while len(list(marks.iterdir())) < max(workers, 1) and time.monotonic() < deadline:
            time.sleep(0.2)
        graders = [int(p.name) for p in marks.iterdir()]
        assert len(graders) >= max(workers, 1), "the grading processes did not start grading"
        assert all(alive(p) for p in graders) and trainer.pid not in graders  # graded where it can be killed
        time.sleep(0.5)  # the spinning one is deep in its loop
        os.kill(trainer.pid, signal.SIGKILL)
        trainer.wait(timeout=30)
        deadline = time.monotonic() + 10
        while any(alive(p) for p in graders) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = [p for p in graders if alive(p)]
        for p in left:  # clean up after a failing check
            os.kill(p, signal.SIGKILL)
        assert not left, f"grading processes {left} outlived the killed trainer"
    finally:
        if trainer.poll() is None:
            trainer.kill()
