"""Checkpoints: everything needed to continue a run exactly where it stopped.

    <run_dir>/checkpoints/round_000012/
        model/      the policy (save_pretrained: loadable by transformers and rapid.evaluate)
        state.pt    optimizer, scheduler, round, samples, data position, RNG states, elapsed time, config,
                    the H=auto controller's state
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForCausalLM

from rapid.models import unwrap
from rapid.seeding import rng_state, set_rng_state


def save(run_dir: Path, round_: int, model, tokenizer, optimizer, scheduler, stream, cfg: DictConfig,
         elapsed_s: float, keep: int, extra: dict | None = None) -> Path:
    """`extra`: more of the loop's state (samples generated so far, the H=auto controller's state)."""
    root = Path(run_dir) / "checkpoints"
    path, tmp = root / f"round_{round_:06d}", root / f"round_{round_:06d}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    unwrap(model).save_pretrained(tmp / "model")
    tokenizer.save_pretrained(tmp / "model")
    torch.save({"round": round_, "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                "stream": stream.state_dict(), "rng": rng_state(), "elapsed_s": elapsed_s,
                "config": OmegaConf.to_container(cfg, resolve=True), **(extra or {})}, tmp / "state.pt")
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    for old in sorted(root.glob("round_??????"))[:-keep] if keep > 0 else []:
        shutil.rmtree(old)
    return path


def latest(run_dir: Path) -> Path | None:
    done = sorted(p for p in (Path(run_dir) / "checkpoints").glob("round_??????") if (p / "state.pt").exists())
    return done[-1] if done else None


def load_config(path: Path) -> DictConfig:
    return OmegaConf.create(torch.load(Path(path) / "state.pt", weights_only=False)["config"])


def load(path: Path, model, optimizer, scheduler, stream) -> dict:
    """Restore all states in place; returns the raw state (round, elapsed_s, ...)."""
    path = Path(path)
    state = torch.load(path / "state.pt", weights_only=False)
    saved = AutoModelForCausalLM.from_pretrained(path / "model", dtype=torch.float32)
    unwrap(model).load_state_dict(saved.state_dict())
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    stream.load_state_dict(state["stream"])
    set_rng_state(state["rng"])
    return state
