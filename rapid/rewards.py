"""Rewards in parallel: `score(task, completions, records, workers, timeout) -> (rewards, n_failed)`.

Each completion is graded by `task.reward(completion, record)` in a pool of `workers` processes
(spawned, so safe next to threads and inference engines). A checker that raises, kills its process
or runs past `timeout` seconds gives reward 0.0 and is counted in `n_failed`; a hung or dead worker is
killed and replaced. `workers=0` grades in this process (exceptions still count as failures; time
is then bounded only by each task's own limits). Pools are kept between calls (one per task and
size) and shut down at exit, because starting a worker costs seconds (imports).

A checker that cannot reach a verdict raises (`rapid.tasks.grading.GradingError`: math-verify out
of time, a sandbox that did not start) and is counted the same way. Each worker leads its own process
group, and a hung worker is killed with its whole group, so that what it started (the sympy checker)
dies with it; checkers that start their own sessions (the MBPP+ sandbox) end their processes when
their parent dies (bubblewrap's --die-with-parent, PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import atexit
import importlib
import multiprocessing as mp
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.connection import wait
from types import ModuleType

from rapid.config import ConfigError


def score(
    task: ModuleType | Callable, completions: list[str], records: list[dict], workers: int = 0, timeout: float = 60.0
) -> tuple[list[float], int]:
    """(reward per completion, number of checks that crashed or timed out)."""
    if len(completions) != len(records):
        raise ValueError(f"{len(completions)} completions for {len(records)} records")
    target = _target(task)
    if workers <= 0:
        rewards, failed = [], 0
        fn = _resolve(target)
        for completion, record in zip(completions, records):
            try:
                rewards.append(float(fn(completion, record)))
            except Exception:
                rewards.append(0.0)
                failed += 1
        return rewards, failed
    key = (target, workers)
    if key not in _POOLS:
        _POOLS[key] = RewardPool(target, workers)
    return _POOLS[key].map(completions, records, timeout)


def _target(task) -> tuple[str, str]:
    """(module, attribute) naming the reward function, so that a spawned worker can import it."""
    if isinstance(task, ModuleType):
        return task.__name__, "reward"
    return task.__module__, task.__qualname__


def _resolve(target: tuple[str, str]) -> Callable:
    module, name = target
    return getattr(importlib.import_module(module), name)


def _worker(conn, target) -> None:
    os.setpgid(0, 0)  # a group of its own: killed with everything it started
    fn = _resolve(target)
    conn.send("ready")
    while (job := conn.recv()) is not None:
        i, completion, record = job
        try:
            conn.send((i, float(fn(completion, record))))
        except Exception:
            conn.send((i, None))


class RewardPool:
    """`workers` spawned processes, each grading one completion at a time."""

    def __init__(self, target: tuple[str, str], workers: int):
        self.target, self.ctx = target, mp.get_context("spawn")
        self.slots = [self._start() for _ in range(workers)]

    def _start(self) -> dict:
        parent, child = self.ctx.Pipe()
        proc = self.ctx.Process(target=_worker, args=(child, self.target), daemon=True)
        proc.start()
        child.close()
        return {"proc": proc, "conn": parent, "ready": False, "job": None, "deadline": 0.0}

    @staticmethod
    def _kill(slot: dict) -> None:
        """SIGKILL to the worker's process group (pgid == pid once it has started) and to the worker."""
        for kill in (lambda: os.killpg(slot["proc"].pid, signal.SIGKILL), slot["proc"].kill):
            try:
                kill()
            except (OSError, ValueError):  # gone already, or not started
                pass
        slot["proc"].join(timeout=30)

    def _replace(self, slot: dict) -> None:
        self._kill(slot)
        slot["conn"].close()
        slot.update(self._start())

    def map(self, completions: list[str], records: list[dict], timeout: float) -> tuple[list[float], int]:
        rewards: list[float] = [0.0] * len(completions)
        todo, pending, failed, stillborn = list(range(len(completions)))[::-1], len(completions), 0, 0
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
                elif message is not None:  # (index, reward or None if it raised)
                    i, reward = message
                    rewards[i] = reward or 0.0
                    failed, pending, slot["job"] = failed + (reward is None), pending - 1, None
                elif dead or (slot["job"] is not None and time.monotonic() > slot["deadline"]):
                    if slot["job"] is not None:  # crashed or timed out: reward 0, counted
                        failed, pending = failed + 1, pending - 1
                    elif not slot["ready"]:
                        stillborn += 1
                        if stillborn > 2 * len(self.slots):
                            raise RuntimeError(f"reward workers for {'.'.join(self.target)} die while starting")
                    self._replace(slot)
        return rewards, failed

    def close(self) -> None:
        for slot in self.slots:
            try:
                slot["conn"].send(None)
            except (OSError, ValueError):
                pass
            slot["proc"].join(timeout=2)
            self._kill(slot)  # and whatever it left behind in its group


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
    rewards, _ = score(
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
            example = str(record.get("question") or record.get("problem") or record.get("task_id") or record)[:80]
            raise RewardSelfTestError(
                f"the reward self-test failed on training example {i} ('{example}'): {what}; "
                "check the task's grader and its dependencies, or set reward.self_test=0"
            )
    return f"reward self-test passed: {len(chosen)} reference answers scored 1, their corrupted twins 0"
