"""Rewards, graded where they can be killed: `score(task, completions, records, workers, timeout) -> (rewards, n_failed)`.

A check fails (reward 0.0, counted in `n_failed`, i.e. train/reward_failures) when the task's
`reward(completion, record)` raises anything (a parser, math-verify out of time: `GradingError`, a
sandbox that did not start), returns no finite number (NaN, inf, or what `float()` refuses, such as
None), kills its process (a segfault, `os._exit`) or runs past `timeout` seconds. This holds for
every task, plugin tasks included; the first failure of each kind per task is warned about once,
naming the task, and so is a call in which every check failed (a grader broken by the environment).
A non-finite reward is a failed check rather than a stop of the run: one odd completion should not
end a long run, and a NaN that reached the advantages would turn every parameter into NaN.

Where grading runs:
- `workers > 0`: a pool of spawned processes (safe next to threads and inference engines), kept
  between calls (one per task and size; starting a worker costs seconds of imports) and shut down at
  exit. A worker imports the task's reward by name, so the task must be importable.
- `workers = 0` (the default): one child forked from this process for the call. It sees the reward
  exactly as this process does (plugin modules, functions replaced at run time), yet a hang, a crash
  or a GIL-holding loop is killed at `timeout` like a pool worker's, and the call goes on in a fresh
  child. The fork's cost grows with this process's resident memory (docs/safety_run.md: 256 checks
  took 0.02-0.1 s at 0.2 GB and 0.3-0.45 s at 1.8 GB, once per round and evaluation), and a task
  that keeps a helper process (MATH's sympy checker) starts it again in every call's child: with a
  large trainer or such a task, `reward.workers >= 1` is cheaper. The child runs only the reward: it
  must not use torch's thread pools.
The timeout is per completion. Training, the reward self-test and evaluation all grade through here.

Every grading process leads its own process group and asks the kernel to kill it when the process
that started it dies (PR_SET_PDEATHSIG, SIGKILL): a trainer killed with SIGKILL leaves no worker
behind. A hung worker is killed with its whole group, so that what it started dies with it; helper
processes that a checker starts in a session of their own (the MBPP+ sandbox, MATH's sympy checker)
end with their parent too (bubblewrap's --die-with-parent, PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import ctypes
import faulthandler
import importlib
import math
import multiprocessing as mp
import os
import signal
import time
import warnings
from collections.abc import Callable
from multiprocessing.connection import wait
from types import ModuleType

from rapid.config import ConfigError

PR_SET_PDEATHSIG = 1


def score(
    task: ModuleType | Callable, completions: list[str], records: list[dict], workers: int = 0, timeout: float = 60.0
) -> tuple[list[float], int]:
    """(reward per completion, number of checks that failed: raised, not a finite number, crashed or
    timed out; each scores 0)."""
    rewards, problems = grade_all(task, completions, records, workers, timeout)
    return rewards, len(problems)


def grade_all(
    task: ModuleType | Callable, completions: list[str], records: list[dict], workers: int = 0, timeout: float = 60.0
) -> tuple[list[float], dict[int, str]]:
    """(reward per completion, {index: what went wrong} for the failed checks), warning once per
    task and kind of failure."""
    if len(completions) != len(records):
        raise ValueError(f"{len(completions)} completions for {len(records)} records")
    target = _target(task)
    if not completions:
        return [], {}
    if workers <= 0:
        rewards, problems = _grade_in_child(_resolve(target), completions, records, timeout)
    else:
        key = (target, workers)
        if key not in _POOLS:
            _POOLS[key] = RewardPool(target, workers)
        rewards, problems = _POOLS[key].map(completions, records, timeout)
    _warn(target, problems, len(completions))
    return rewards, problems


def grade(fn: Callable, completion: str, record: dict) -> tuple[float, str | None]:
    """(reward, None), or (0.0, what went wrong) when `fn` raises or returns no finite number."""
    try:
        value = fn(completion, record)
        reward = float(value)
    except Exception as e:  # any exception in any task's reward is a failed check
        return 0.0, f"raised {type(e).__name__}: {str(e)[:120]}"
    if not math.isfinite(reward):
        return 0.0, f"returned the non-finite value {reward}"
    return reward, None


_WARNED: set[tuple[str, str]] = set()


def _warn(target: tuple[str, str], problems: dict[int, str], n: int) -> None:
    """One warning per task and kind of failure (the first one's text), and one when a call failed
    every check."""
    name = target[0] if target[1] == "reward" else ".".join(target)
    for i, problem in sorted(problems.items()):
        kind = problem.split(" ", 1)[0]  # raised, returned, ran (past the timeout), killed
        if (name, kind) not in _WARNED:
            _WARNED.add((name, kind))
            warnings.warn(
                f"the reward of task {name} {problem} (completion {i}): such checks score 0 and are counted "
                "in train/reward_failures (warned once per task)",
                RuntimeWarning,
                stacklevel=3,
            )
    if n and len(problems) == n and (name, "all") not in _WARNED:
        _WARNED.add((name, "all"))
        warnings.warn(
            f"every one of the {n} reward checks of task {name} failed (the first {problems[min(problems)]}): "
            "its grader is broken here, so nothing can be learned; check the task's reward and its dependencies",
            RuntimeWarning,
            stacklevel=3,
        )


def _target(task) -> tuple[str, str]:
    """(module, attribute) naming the reward function, so that a spawned worker can import it."""
    if isinstance(task, ModuleType):
        return task.__name__, "reward"
    return task.__module__, task.__qualname__


def _resolve(target: tuple[str, str]) -> Callable:
    module, name = target
    return getattr(importlib.import_module(module), name)


def _detach(parent_pid: int) -> None:
    """In a new grading process: lead a process group of its own (killed with everything it starts)
    and die with the process that started it."""
    os.setpgid(0, 0)
    faulthandler.disable()  # a crash here is a failed check, reported by the parent, not a traceback dump
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: timeouts and close() still kill it
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _grade_in_child(
    fn: Callable, completions: list[str], records: list[dict], timeout: float
) -> tuple[list[float], dict[int, str]]:
    """Grade in a forked child, one completion at a time; a child that dies or overruns is killed,
    its completion fails, and a new child goes on from the next one."""
    ctx = mp.get_context("fork")
    rewards, problems, start = [0.0] * len(completions), {}, 0
    while start < len(completions):
        receive, send = ctx.Pipe(duplex=False)
        proc = ctx.Process(target=_child, args=(send, fn, completions, records, start, os.getpid()), daemon=True)
        proc.start()
        send.close()
        i, deadline = start, time.monotonic() + timeout
        while i < len(completions):
            if not receive.poll(max(0.0, deadline - time.monotonic())):
                problems[i] = f"ran past reward.timeout_s={timeout:g} s"
                break
            try:
                j, reward, problem = receive.recv()
            except (EOFError, OSError):
                proc.join(timeout=5)
                problems[i] = f"killed its grading process (exit code {proc.exitcode})"
                break
            rewards[j] = reward
            if problem:
                problems[j] = problem
            i, deadline = j + 1, time.monotonic() + timeout
        _kill(proc, wait=False)
        receive.close()
        start = i + 1 if i < len(completions) else i
    return rewards, problems


def _child(conn, fn, completions, records, start, parent_pid) -> None:
    _detach(parent_pid)
    for j in range(start, len(completions)):
        conn.send((j, *grade(fn, completions[j], records[j])))
    conn.close()


def _kill(proc, wait: bool = True) -> None:
    """SIGKILL to a grading process's group (pgid == pid once it has started) and to the process;
    `wait=False` leaves the reaping to multiprocessing (its next start), so that the caller does not
    wait while the kernel tears down a large forked address space."""
    for kill in (lambda: os.killpg(proc.pid, signal.SIGKILL), proc.kill):
        try:
            kill()
        except (OSError, ValueError, AttributeError):  # gone already, or not started
            pass
    if wait:
        proc.join(timeout=30)


def _worker(conn, target, parent_pid) -> None:
    _detach(parent_pid)
    fn = _resolve(target)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        i, completion, record = job
        conn.send((i, *grade(fn, completion, record)))


class RewardPool:
    """`workers` spawned processes, each grading one completion at a time."""

    def __init__(self, target: tuple[str, str], workers: int):
        self.target, self.ctx = target, mp.get_context("spawn")
        self.slots = [self._start() for _ in range(workers)]

    def _start(self) -> dict:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.target, os.getpid()), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "ready": False, "job": None, "deadline": 0.0}

    def _replace(self, slot: dict) -> None:
        _kill(slot["proc"])
        slot["conn"].close()
        slot.update(self._start())

    def map(self, completions: list[str], records: list[dict], timeout: float) -> tuple[list[float], dict[int, str]]:
        rewards: list[float] = [0.0] * len(completions)
        problems: dict[int, str] = {}
        todo, pending, stillborn = list(range(len(completions)))[::-1], len(completions), 0
        while pending:
            for slot in self.slots:  # hand out work to idle workers
                if slot["ready"] and slot["job"] is None and todo:
                    i = todo.pop()
                    slot["conn"].send((i, completions[i], records[i]))
                    slot["job"], slot["deadline"] = i, time.monotonic() + timeout
            busy = [s["deadline"] for s in self.slots if s["job"] is not None]
            wait([s["conn"] for s in self.slots], timeout=max(0.0, min(busy) - time.monotonic()) if busy else 1.0)
            for slot in self.slots:
                try:
                    message, dead = (slot["conn"].recv() if slot["conn"].poll() else None), False
                except (EOFError, OSError):
                    message, dead = None, True
                if message == "ready":
                    slot["ready"] = True
                elif message is not None:  # (index, reward, None or what went wrong)
                    i, reward, problem = message
                    rewards[i] = reward
                    if problem:
                        problems[i] = problem
                    pending, slot["job"] = pending - 1, None
                elif dead or (slot["job"] is not None and time.monotonic() > slot["deadline"]):
                    if slot["job"] is not None:  # crashed or timed out: reward 0, counted
                        slot["proc"].join(timeout=1 if dead else 0)
                        problems[slot["job"]] = (
                            f"ran past reward.timeout_s={timeout:g} s"
                            if not dead
                            else f"killed its grading process (exit code {slot['proc'].exitcode})"
                        )
                        pending -= 1
                    elif not slot["ready"]:
                        stillborn += 1
                        if stillborn > 2 * len(self.slots):
                            raise RuntimeError(f"reward workers for {'.'.join(self.target)} die while starting")
                    self._replace(slot)
        return rewards, problems

    def close(self) -> None:
        for slot in self.slots:
            try:
                slot["conn"].send(None)
            except (OSError, ValueError):
                pass
            slot["proc"].join(timeout=2)
            _kill(slot["proc"])  # and whatever it left behind in its group


_POOLS: dict[tuple, RewardPool] = {}


@atexit.register
def close_pools() -> None:
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()


class RewardSelfTestError(ConfigError):
    """The task's reward failed its start-up self-test (see `self_test`)."""


def self_test(task: ModuleType, records: list[dict], n: int, workers: int = 0, timeout: float = 60.0) -> str:
    """Grade, before training, the reference completions of the first `n` records: each must score 1
    and its corrupted twin 0 (the task's `reference(record) -> (right, wrong)`). A grader broken by the
    environment (a missing package, a sandbox that cannot start, a parser that changed) then stops the
    run at once instead of scoring every sample 0. Returns a one-line summary; raises
    RewardSelfTestError naming the first failing example."""
    reference = getattr(task, "reference", None)
    if reference is None or n <= 0 or not records:
        return f"reward self-test skipped ({'off' if n <= 0 else 'the task has no reference answers'})"
    chosen = records[:n]
    pairs = [reference(r) for r in chosen]
    rewards, problems = grade_all(
        task,
        [c for pair in pairs for c in pair],
        [r for r in chosen for _ in range(2)],
        workers=workers,
        timeout=timeout,
    )
    for i, record in enumerate(chosen):
        right, wrong = rewards[2 * i], rewards[2 * i + 1]
        if right != 1.0 or wrong != 0.0:
            what = f"its reference answer scored {right}" if right != 1.0 else f"a wrong answer scored {wrong}"
            why = problems.get(2 * i if right != 1.0 else 2 * i + 1)
            example = str(record.get("question") or record.get("problem") or record.get("task_id") or record)[:80]
            raise RewardSelfTestError(
                f"the reward self-test failed on training example {i} ('{example}'): {what}"
                + (f" (its check {why})" if why else "")
                + "; check the task's grader and its dependencies, or set reward.self_test=0"
            )
    return f"reward self-test passed: {len(chosen)} reference answers scored 1, their corrupted twins 0"
