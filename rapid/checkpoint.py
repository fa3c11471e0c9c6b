"""Checkpoints: everything needed to continue a run exactly where it stopped.

<run_dir>/checkpoints/round_000012/
    model/      the policy (save_pretrained: loadable by transformers and rapid.evaluate)
    state.pt    optimizer, scheduler, round, samples, data position, RNG states (every rank's), elapsed time, config,
                the H=auto controller's state

At the end of a run the policy is also written on its own, as the model a user takes away (`export_model`):

<run_dir>/model/    config, weights and tokenizer in the dtype the model came in (a bf16 source gives a bf16
                    checkpoint, not the fp32 master weights the checkpoints keep for an exact resume):
                    `AutoModelForCausalLM.from_pretrained(<run_dir>/model)`, `vllm serve <run_dir>/model`

A checkpoint is never written from weights that hold a NaN or an infinity (`save` raises
`rapid.config.RunStopped` and leaves the checkpoints on disk as they were; rapid/nonfinite.py).

With sharded parameters (train.parallel=fsdp) every rank first joins `gather`, which collects the whole
weights and optimizer state on rank 0 (on the CPU), and rank 0 writes them in the same files, so a
checkpoint reads the same whichever way it was trained; the optimizer state is then keyed by parameter
name instead of position, and `load` converts between the two.
"""

from __future__ import annotations

import copy
import json
import shutil
import struct
import zipfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForCausalLM

from rapid.config import RunStopped, with_current_defaults
from rapid.distributed import all_gather_objects, is_sharded
from rapid.models import unwrap
from rapid.nonfinite import nonfinite_parameters
from rapid.seeding import rng_state, set_rng_state


def save(
    run_dir: Path,
    round_: int,
    model,
    tokenizer,
    optimizer,
    scheduler,
    stream,
    cfg: DictConfig,
    elapsed_s: float,
    keep: int,
    extra: dict | None = None,
    gathered: dict | None = None,
    rng_per_rank: list[dict] | None = None,
) -> Path:
    """`extra`: more of the loop's state (samples generated so far, the H=auto controller's state).
    `gathered`: `gather`'s whole weights and optimizer state of a sharded model. `rng_per_rank`: every
    rank's RNG states (`gather_rng_states`), restored rank by rank. Raises RunStopped,
    writing nothing, if a parameter is not finite."""
    if gathered is None:
        poisoned = nonfinite_parameters(unwrap(model))
    else:
        poisoned = [name for name, t in gathered["model"].items() if not bool(torch.isfinite(t).all())]
    if poisoned:
        raise RunStopped(
            f"the weights after round {round_} hold NaN or infinite values ({len(poisoned)} parameters, e.g. "
            f"{poisoned[0]}), so no checkpoint was written and the earlier ones are kept: lower optim.lr or "
            "check the reward"
        )
    root = Path(run_dir) / "checkpoints"
    path, tmp = root / f"round_{round_:06d}", root / f"round_{round_:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    unwrap(model).save_pretrained(tmp / "model", state_dict=gathered and gathered["model"])
    tokenizer.save_pretrained(tmp / "model")
    torch.save(
        {
            "round": round_,
            "optimizer": optimizer.state_dict() if gathered is None else gathered["optimizer"],
            "scheduler": scheduler.state_dict(),
            "stream": stream.state_dict(),
            "rng": rng_state(),
            "rng_per_rank": rng_per_rank or [rng_state()],
            "elapsed_s": elapsed_s,
            "config": OmegaConf.to_container(cfg, resolve=True),
            **(extra or {}),
        },
        tmp / "state.pt",
    )
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    for old in sorted(root.glob("round_??????"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old)
    return path


def source_dtype(model_cfg) -> torch.dtype:
    """The dtype the policy's weights came in, which the exported model keeps: the source checkpoint's own
    (its config.json; the packaged GGUF is converted to bf16), fp32 where it records none; a model built
    from `model.architecture` has no source, so its compute dtype `model.dtype`."""
    from transformers import AutoConfig

    from rapid.config import DTYPES
    from rapid.models import converted_gguf

    if model_cfg.get("architecture"):
        return DTYPES[model_cfg.dtype]
    source = model_cfg.get("path") or converted_gguf(**model_cfg.gguf)
    dtype = getattr(AutoConfig.from_pretrained(source), "dtype", None)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype, None)
    return dtype if isinstance(dtype, torch.dtype) and dtype.is_floating_point else torch.float32


def export_model(out: Path, model, tokenizer, dtype: torch.dtype, gathered: dict | None = None) -> Path:
    """The trained policy as a plain Hugging Face folder `out` (config.json, model.safetensors, the
    tokenizer) with its floating-point weights in `dtype`, for transformers' `from_pretrained` and
    `vllm serve`; config.json records `dtype`, so that vLLM's `dtype=auto` serves it in that dtype.
    Tied weights stay tied (one cast tensor for the shared storage). `gathered`: `gather`'s whole
    weights of a sharded model. Written to `out`.tmp, then renamed."""
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    cast: dict[tuple, torch.Tensor] = {}  # by memory: lm_head.weight is embed_tokens.weight when tied
    state = {}
    for name, t in (gathered["model"] if gathered else unwrap(model).state_dict()).items():
        key = (t.device, t.data_ptr(), tuple(t.shape), t.stride())
        if key not in cast:
            cast[key] = t.detach().to("cpu", dtype) if t.is_floating_point() else t.detach().cpu()
        state[name] = cast[key]
    plain = unwrap(model)
    plain.save_pretrained(tmp, state_dict=state)
    config = copy.deepcopy(plain.config)
    config.dtype = dtype  # save_pretrained records the fp32 master weights' dtype
    config.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def latest(run_dir: Path) -> Path | None:
    """The newest checkpoint that reads back whole; a newer one that does not (a run killed while
    writing it, a truncated copy) is passed over, saying so."""
    done = sorted(p for p in (Path(run_dir) / "checkpoints").glob("round_??????") if (p / "state.pt").exists())
    for path in reversed(done):
        problem = unreadable(path)
        if not problem:
            return path
        print(f"checkpoint {path} cannot be read ({problem}); trying the one before it", flush=True)
    return None


def unreadable(path: Path) -> str:
    """'' if the checkpoint's state and model files are complete, else what is wrong: state.pt must
    be a whole zip archive that torch can open, each safetensors file as long as its header says."""
    try:
        with zipfile.ZipFile(path / "state.pt") as z:
            if z.testzip() is not None:
                return "state.pt fails its checksum"
        torch.load(path / "state.pt", map_location="cpu", weights_only=False, mmap=True)
    except Exception as e:  # torch and zipfile raise many kinds for a damaged file
        return f"state.pt: {type(e).__name__}"
    weights = list((path / "model").glob("*.safetensors"))
    if not weights and not list((path / "model").glob("*.bin")):
        return "no model weights"
    for file in weights:
        try:
            with open(file, "rb") as f:
                n = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(n))
            end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
            if file.stat().st_size < 8 + n + end:
                return f"{file.name} is truncated"
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            return f"{file.name} is unreadable"
    return ""


def load_config(path: Path) -> DictConfig:
    return with_current_defaults(
        OmegaConf.create(torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)["config"])
    )


def gather(model, optimizer) -> dict | None:
    """A sharded model's whole weights and optimizer state (parameter-name keys) on rank 0's CPU, empty
    on the other ranks; a collective every rank joins. None for a model that is not sharded."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    if not is_sharded(model):
        return None
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    weights = get_model_state_dict(model, options=options)
    # a tied weight once, under its first name (lm_head.weight is embed_tokens.weight), as save_pretrained does
    first = {name for name, _ in unwrap(model).named_parameters()} | {name for name, _ in unwrap(model).named_buffers()}
    return {
        "model": {name: t for name, t in weights.items() if name in first},
        "optimizer": get_optimizer_state_dict(model, optimizer, options=options),
    }


def optimizer_state_layout(state: dict, names: list[str], by_name: bool) -> dict:
    """An optimizer state dict keyed by parameter position (torch's `state_dict`) or by parameter name
    (`get_optimizer_state_dict`, what a sharded run saves), converted to the layout asked for; `names`
    are the model's parameter names in `model.parameters()` order (the optimizer's)."""
    keyed_by_name = any(isinstance(k, str) for k in state["state"]) or any(
        isinstance(p, str) for g in state["param_groups"] for p in g["params"]
    )
    if keyed_by_name == by_name:
        return state
    key = {i: n for i, n in enumerate(names)} if by_name else {n: i for i, n in enumerate(names)}
    return {
        "state": {key[k]: v for k, v in state["state"].items()},
        "param_groups": [g | {"params": [key[p] for p in g["params"]]} for g in state["param_groups"]],
    }


def gather_rng_states() -> list[dict]:
    """Every rank's RNG states (python, numpy, torch, CUDA), in rank order; a collective. Each rank's
    differ: on CPU the engine samples from torch's global generator, seeded per rank."""
    return all_gather_objects(rng_state())


def load(path: Path, model, optimizer, scheduler, stream, rank: int = 0, world: int = 1) -> dict:
    """Restore all states in place; returns the raw state (round, elapsed_s, ...). The state is read
    onto the CPU: saved from GPU 0, it would otherwise land whole on cuda:0 on every rank (the optimizer
    moments are twice the model); `optimizer.load_state_dict` moves each moment to its parameter's device.
    A sharded model (train.parallel=fsdp) takes its shard of each whole tensor; a checkpoint written
    with either train.parallel resumes with either. Each rank restores its own RNG states where the
    checkpoint holds one per rank of the same world size (else rank 0's: the run continues, but not
    draw for draw)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, set_optimizer_state_dict

    path = Path(path)
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    saved = AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32)
    names = [name for name, _ in unwrap(model).named_parameters()]
    if is_sharded(model):
        options = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, saved.state_dict(), options=options)
        set_optimizer_state_dict(
            model, optimizer, optimizer_state_layout(state["optimizer"], names, True), options=options
        )
    else:
        unwrap(model).load_state_dict(saved.state_dict())
        optimizer.load_state_dict(optimizer_state_layout(state["optimizer"], names, False))
    scheduler.load_state_dict(state["scheduler"])
    stream.load_state_dict(state["stream"])
    per_rank = state.get("rng_per_rank") or []
    set_rng_state(per_rank[rank] if len(per_rank) == world else state["rng"])
    return state
