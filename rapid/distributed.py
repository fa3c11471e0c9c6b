"""torchrun / DDP plumbing: one process per rank, gloo on CPU, nccl on GPU."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

_owned = False  # whether this module created the process group (a vLLM engine may create its own)


def init(device: str = "auto") -> tuple[int, int, torch.device]:
    """(rank, world_size, device). Single process when not launched by torchrun.
    `device`: "auto" (a GPU when one is visible), "cuda" or "cpu"."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    if device != "cpu" and torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    global _owned
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        _owned = True
    return rank, world, device


def is_main() -> bool:
    return not _owned or dist.get_rank() == 0


def print0(*args, **kwargs) -> None:
    if is_main():
        print(*args, **kwargs, flush=True)


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a list of floats over ranks (identity in a single process)."""
    if not _owned:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_sum_dict(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Sum each named value over ranks; every rank passes the same keys (in any order)."""
    keys = sorted(values)
    return dict(zip(keys, all_reduce_sum([float(values[k]) for k in keys], device)))


def all_reduce_max(value: float, device: torch.device) -> float:
    if not _owned:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def all_gather_objects(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] (a one-element list in a single process)."""
    if not _owned:
        return [obj]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, obj)
    return gathered


def gather_round(rollouts: list, world: int) -> list:
    """Every rank's records of the round on every rank, in group-id order (a round's group ids are its
    prompt positions, so this is the order one process would hold them in): for groups that span ranks,
    where each rank trains a slice of minibatches drawn from the whole round."""
    if world == 1:
        return list(rollouts)
    return sorted((r for part in all_gather_objects(rollouts) for r in part), key=lambda r: r.group_id)


def shutdown() -> None:
    """Destroy the process group this module created. A vLLM engine running inside it (sampler=vllm
    under torchrun) tears the group down itself at exit, so it is left to do so."""
    global _owned
    if _owned and dist.is_initialized() and "vllm" not in sys.modules:
        dist.destroy_process_group()
    _owned = False
