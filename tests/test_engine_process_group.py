"""An in-process vLLM engine leaves a default process group of world size 1 in the process (NCCL on a GPU,
which cannot reduce CPU tensors: "No backend type associated with device type cpu"). rapid's collectives
must never take it for its own ranks. The engine's group is imitated by a world-1 group whose backend,
like NCCL, serves CUDA tensors only: any collective rapid ran on it over CPU tensors would raise."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from rapid import distributed
from rapid.buffer import Rollout
from rapid.config import ConfigError
from rapid.policy import CompletionLogprobs, accumulate_gradients
from tests.helpers import tiny_model
from tests.test_span_ranks import LOSSES, PAD, loss_fn_for, records, train


def _cuda_only_group(store, rank, size, timeout):
    return dist.ProcessGroupGloo(store, rank, size, timeout)


COLLECTIVES = ("all_reduce", "all_gather", "all_gather_object", "broadcast", "barrier", "destroy_process_group")


@pytest.fixture
def engine_like_group(tmp_path, monkeypatch):
    """A world-1 default group rapid must leave alone: a CUDA-only one made here, or, where an engine of an
    earlier test in this process left its own, that one. Either way every collective raises if called."""
    own = not dist.is_initialized()
    if own:
        if "cudaonly" not in dist.Backend.backend_list:
            dist.Backend.register_backend("cudaonly", _cuda_only_group, devices=["cuda"])
        dist.init_process_group("cudaonly", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            dist.all_reduce(torch.ones(1))  # the group really refuses CPU tensors: the test can fail
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    for name in COLLECTIVES:

        def refuse(*args, _name=name, **kwargs):
            raise AssertionError(f"rapid called torch.distributed.{_name} on a group that is not its own")

        monkeypatch.setattr(dist, name, refuse)
    try:
        yield
    finally:
        distributed.shutdown()
        monkeypatch.undo()
        if own and dist.is_initialized():
            dist.destroy_process_group()


def test_rapid_does_not_take_an_engines_world_1_group_for_its_ranks(engine_like_group):
    rank, world, device = distributed.init("cpu")
    assert (rank, world, device.type) == (0, 1, "cpu")
    assert distributed.is_main()
    assert distributed.all_reduce_sum([1.0, 2.5], device) == [1.0, 2.5]
    assert distributed.all_reduce_sum_dict({"b": 2.0, "a": 1.0}, device) == {"a": 1.0, "b": 2.0}
    assert distributed.all_reduce_max(3.0, device) == 3.0
    assert distributed.all_gather_objects({"x": 1}) == [{"x": 1}]
    rollouts = [Rollout([1], [2], [0.0], 1.0, g, False) for g in (1, 0)]
    assert distributed.gather_round(rollouts, world) == rollouts
    distributed.print0("rank 0 prints")
    distributed.shutdown()
    assert dist.is_initialized()  # the engine's group is the engine's: rapid leaves it alone


def test_training_steps_beside_an_engines_group(engine_like_group):
    """A minibatch's gradient (skipping an all-zero group) and the multi-step helper of
    tests/test_span_ranks.py, whose own check of the default group failed on the GPU machine."""
    distributed.init("cpu")
    model, tok = tiny_model()
    minibatches = records(model, tok)
    stats = accumulate_gradients(
        CompletionLogprobs(model, 1.0),
        minibatches[2],  # the all-zero group: no forward, gradient zeros
        loss_fn_for("iw_grpg"),
        micro_batch=4,
        pad_id=PAD,
        device=torch.device("cpu"),
        compute_dtype=torch.float32,
        skip_groups=LOSSES["iw_grpg"][2],
    )
    assert stats == {"trained_frac": 0.0, "loss": 0.0}
    _, ess = train("iw_grpg", CompletionLogprobs(model, 1.0), model, minibatches, spanning=False)
    assert [s for s, _ in ess] == [1, 2]


def test_torchrun_ranks_beside_a_group_of_another_size_are_refused(engine_like_group, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match="already holds a process group of 1"):
        distributed.init("cpu")
