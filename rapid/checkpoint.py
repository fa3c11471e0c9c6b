"""Checkpoints: everything needed to continue a run exactly where it stopped.

<run_dir>/checkpoints/round_000012/
    model/      the policy (save_pretrained: loadable by transformers and rapid.evaluate)
    state.pt    optimizer, scheduler, round, samples, data position, RNG states, elapsed time, config,
                the H=auto controller's state

A checkpoint is never written from weights that hold a NaN or an infinity (`save` raises
`rapid.config.RunStopped` and leaves the checkpoints on disk as they were; rapid/nonfinite.py).
"""

from __future__ import annotations

import json
import shutil
import struct
import zipfile
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForCausalLM

from rapid.config import RunStopped, with_current_defaults
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
) -> Path:
    """`extra`: more of the loop's state (samples generated so far, the H=auto controller's state).
    Raises RunStopped, writing nothing, if a parameter is not finite."""
    poisoned = nonfinite_parameters(unwrap(model))
    if poisoned:
        raise RunStopped(
            f"the weights after round {round_} hold NaN or infinite values ({len(poisoned)} parameters, e.g. "
            f"{poisoned[0]}), so no checkpoint was written and the earlier ones are kept: lower optim.lr or "
            "check the reward"
        )
    root = Path(run_dir) / "checkpoints"
    path, tmp = root / f"round_{round_:06d}", root / f"round_{round_:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    unwrap(model).save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    torch.save(
        {
            "round": round_,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "stream": stream.state_dict(),
            "rng": rng_state(),
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


def load(path: Path, model, optimizer, scheduler, stream) -> dict:
    """Restore all states in place; returns the raw state (round, elapsed_s, ...). The state is read
    onto the CPU: saved from GPU 0, it would otherwise land whole on cuda:0 on every rank (the optimizer
    moments are twice the model); `optimizer.load_state_dict` moves each moment to its parameter's device."""
    path = Path(path)
    state = torch.load(path / "state.pt", map_location="cpu", weights_only=False)
    saved = AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32)
    unwrap(model).load_state_dict(saved.state_dict())
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    stream.load_state_dict(state["stream"])
    set_rng_state(state["rng"])
    return state
