"""Two "nodes" on one machine: two torchrun agents, `--nnodes 2`, one process each, meeting at a c10d
rendezvous endpoint (the command of docs/multi_gpu.md, "Several machines"), gloo on CPU.

Each agent gets its own TMPDIR, as two machines would have their own /tmp, and LOCAL_RANK 0 on both
(global ranks 0 and 1), so code that keys node-local work on the global rank, or shares a temporary
file between ranks, fails here. The run equals the single process (H = 1, as in
tests/test_train.py::test_ddp_two_ranks_match_single_process), and only global rank 0 writes the run
directory's files.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.test_train import (
    REPO,
    SHAPED_LAUNCHER,
    TIMEOUT_S,
    assert_same_weights,
    env_for,
    final_weights,
    launch,
    read_rows,
    train_rows,
)

OVERRIDES = [
    "+experiment=smoke",
    "device=cpu",
    "algorithm.H=1",
    "algorithm.n_step=16",
    "train.micro_batch=4",
    "optim.lr=1e-3",
    "rounds=2",
    "eval.every=0",
    "ckpt.every=1",
    "ckpt.keep=2",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_two_nodes(tmp_path, run, overrides: list[str]) -> list[str]:
    """Two torchrun agents (nodes 0 and 1, their own TMPDIR each) running rapid.train; their outputs."""
    launcher = tmp_path / "shaped_launcher.py"  # the arithmetic task with a shaped reward (tests/test_train.py)
    launcher.write_text(SHAPED_LAUNCHER)
    port = free_port()
    agents = []
    for node in (0, 1):
        (tmp_path / f"node{node}_tmp").mkdir()
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes=2",
            f"--node-rank={node}",
            "--nproc-per-node=1",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            "--rdzv-id=rapid-two-nodes",
            str(launcher),
            *overrides,
            "reward.self_test=0",
            f"hydra.run.dir={run}",
        ]
        env = env_for(tmp_path, TMPDIR=str(tmp_path / f"node{node}_tmp"))
        agents.append(
            subprocess.Popen(argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        )
    outputs = [a.communicate(timeout=TIMEOUT_S)[0] for a in agents]
    for node, (agent, out) in enumerate(zip(agents, outputs)):
        assert agent.returncode == 0, f"node {node}:\n{out[-6000:]}"
    return outputs


@pytest.mark.slow
def test_two_node_launch_matches_single_process(tmp_path):
    run = tmp_path / "two_nodes"
    launch_two_nodes(tmp_path, run, [*OVERRIDES, "sampler=hf"])
    single = tmp_path / "single"
    launch([*OVERRIDES, f"hydra.run.dir={single}"], tmp_path, shaped=True)
    assert json.loads((run / "meta.json").read_text())["world_size"] == 2
    t1, t2 = train_rows(read_rows(single)), train_rows(read_rows(run))
    assert [r["progress/round"] for r in t2] == [1, 2]  # one metrics file, one row per round: rank 0 alone writes
    for r1, r2 in zip(t1, t2):
        assert r2["train/reward_mean"] == r1["train/reward_mean"], r1["progress/round"]
        assert r2["train/loss"] == pytest.approx(r1["train/loss"], rel=1e-4, abs=1e-5), r1["progress/round"]
    for round_ in (1, 2):
        assert_same_weights(final_weights(run, round_), final_weights(single, round_), atol=1e-5)


@pytest.mark.slow
def test_two_node_launch_with_one_vllm_engine_per_rank(tmp_path):
    """sampler=vllm: each rank's engine loads its own copy of the weights from its node's temporary
    directory and is synced every round (rapid.sampler.VLLMSampler), and the run exits cleanly."""
    run = tmp_path / "two_nodes"
    overrides = [o for o in OVERRIDES if not o.startswith("optim.lr=")]  # a key given twice is refused
    outputs = launch_two_nodes(tmp_path, run, [*overrides, "sampler=vllm", "optim.lr=1e-2"])
    assert not any("Traceback" in out for out in outputs), outputs[0][-3000:] + outputs[1][-3000:]
    train = train_rows(read_rows(run))
    assert [r["progress/round"] for r in train] == [1, 2] and max(r["train/grad_norm"] for r in train) > 0
    assert all(r["sampler/logprob_mismatch"] < 1e-3 for r in train), [r["sampler/logprob_mismatch"] for r in train]
