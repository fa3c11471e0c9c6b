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
`rapid.config.RunStopped` and leaves the checkpoints on disk as they were; rapid/nonfinite.py), and a
failed write (a full disk, a quota) leaves them as they were too: the new checkpoint is written beside
them under a temporary name, renamed into place only once whole, and removed if the write fails. A
checkpoint that does not read back whole, or whose weights are not finite, is passed over on resume.

`resume_point` is what `resume=<run_dir>` continues from: the run's newest whole checkpoint and the
config it was written under, refused in one sentence when it cannot be the continuation of that run (a
checkpoint copied from another run, a saved config that does not load), with a warning for an override
that would change the run (it does not apply).

With sharded parameters (train.parallel=fsdp) every rank first joins `gather`, which collects the whole
weights and optimizer state on rank 0 (on the CPU), and rank 0 writes them in the same files, so a
checkpoint reads the same whichever way it was trained; the optimizer state is then keyed by parameter
name instead of position, and `load` converts between the two.
"""

from __future__ import annotations

import copy
import errno
import shutil
import warnings
import zipfile
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig, OmegaConf
from transformers import AutoModelForCausalLM

from rapid.config import ConfigError, RunStopped, check_schema, with_current_defaults
from rapid.distributed import all_gather_objects, is_sharded
from rapid.models import safetensors_problem, unwrap
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
    path, tmp, old = (root / f"round_{round_:06d}{suffix}" for suffix in ("", ".tmp", ".old"))
    try:
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
        if path.exists():  # the same round saved again: the old copy stays until the new one is in place
            shutil.rmtree(old, ignore_errors=True)
            path.rename(old)
        tmp.rename(path)
    except Exception as e:  # torch.save and safetensors report a failed write in their own kinds
        shutil.rmtree(tmp, ignore_errors=True)  # what was written of it, and the room it took
        if old.exists() and not path.exists():
            old.rename(path)
        raise RunStopped(save_failed_message(run_dir, round_, e)) from None
    shutil.rmtree(old, ignore_errors=True)
    for stale in sorted(root.glob("round_??????"))[:-keep] if keep > 0 else []:
        shutil.rmtree(stale)
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


def save_failed_message(run_dir: Path, round_: int, error: Exception) -> str:
    """One sentence for a checkpoint that could not be written: why, and what still holds."""
    text = str(error).strip()
    reason = getattr(error, "strerror", None) or (text.splitlines()[-1] if text else "")
    reason = f"{type(error).__name__}: {reason}" if reason else type(error).__name__
    full = isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    try:
        full = full or shutil.disk_usage(run_dir).free < 64 * 2**20
    except OSError:
        pass
    reason += ": the disk or the quota is full" if full else ""
    earlier = sorted(p for p in (Path(run_dir) / "checkpoints").glob("round_??????") if p.name != f"round_{round_:06d}")
    kept = (
        f"the earlier checkpoint {earlier[-1].name} is kept, so make room and continue with resume={run_dir}"
        if earlier
        else "no earlier checkpoint exists (ckpt.every=<rounds> saves along the way), so make room and rerun in a "
        "new directory"
    )
    return f"could not write the checkpoint of round {round_} to {Path(run_dir) / 'checkpoints'} ({reason}); {kept}"


def bytes_needed(n_params: int, keep: int, n_checkpoints: int, export_bytes: int = 4) -> int:
    """Roughly the disk a run's checkpoints take at their peak: fp32 weights (4 bytes a parameter) and
    AdamW's two fp32 moments (8) for each checkpoint on disk at once (the `keep` kept and, while they
    are there, the one being written; all `n_checkpoints` with keep=0), the trained model exported at
    the end in the source's dtype (`export_bytes` a parameter: 2 for bf16/fp16, 4 for fp32; the
    <run_dir>/model folder), and 64 MiB for the tokenizer, metrics and rollouts."""
    held = n_checkpoints if keep <= 0 else min(n_checkpoints, keep + 1)
    return 12 * n_params * held + export_bytes * n_params + 64 * 2**20


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
        problem = safetensors_problem(file) or nonfinite_weights(file)
        if problem:
            return problem
    return ""


def nonfinite_weights(file: Path) -> str | None:
    """'<file> holds NaN or infinite values (<tensor>)' for a weights file that does, else None."""
    from safetensors import safe_open

    try:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                if t.is_floating_point() and not bool(torch.isfinite(t).all()):
                    return f"{file.name} holds NaN or infinite values ({name})"
    except Exception as e:  # safetensors raises its own error kinds for a damaged file
        return f"{file.name} is unreadable ({type(e).__name__})"
    return None


def load_config(path: Path) -> DictConfig:
    """The config a checkpoint was written under, with keys added to conf/ since at their defaults."""
    try:
        saved = torch.load(Path(path) / "state.pt", map_location="cpu", weights_only=False)["config"]
        return with_current_defaults(OmegaConf.create(saved))
    except Exception as e:  # a state.pt without a config, or one OmegaConf cannot read
        raise ConfigError(
            f"the config saved in {Path(path) / 'state.pt'} cannot be read ({type(e).__name__}): resume from an "
            "earlier checkpoint (move this one aside) or start a new run"
        ) from None


# Overrides that resume=<dir> may carry, and that apply to the resumed leg: where and how the run is
# watched and graded, not what it computes.
RESUME_OVERRIDES = ("resume", "device", "logger.progress", "logger.wandb", "logger.project", "reward.", "hydra.")
# The keys that make a run that run: a checkpoint whose config differs from its directory's config.yaml
# in one of them was written by another run.
RUN_IDENTITY = ("seed", "algorithm", "model", "task", "optim", "train", "sampler.temperature")


def resume_point(run_dir: Path, overrides: list[str] = ()) -> tuple[Path, DictConfig]:
    """(checkpoint, config) that resume=<run_dir> continues from: the newest checkpoint that reads back
    whole with finite weights, and the config it was written under (checked against the schema), with
    the RESUME_OVERRIDES among `overrides` applied. One ConfigError sentence when there is none, or when
    the checkpoint was written by another run than the one in <run_dir>/config.yaml; one warning naming
    the other overrides that would change the run, which do not apply."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ConfigError(f"resume={run_dir} is not a directory: point it at the directory of an earlier run")
    path = latest(run_dir)
    if path is None:
        raise ConfigError(
            f"resume={run_dir} holds no readable checkpoint (checkpoints/round_*/state.pt): point it at the "
            "directory of a run that saved one"
        )
    cfg = load_config(path)
    try:
        check_schema(cfg)
    except ConfigError as e:
        raise ConfigError(f"the config saved in {path / 'state.pt'} is not valid ({e})") from None
    mine = run_dir / "config.yaml"
    if mine.exists():
        try:
            own = OmegaConf.to_container(OmegaConf.load(mine), resolve=True)
        except Exception as e:
            raise ConfigError(
                f"{mine} cannot be read ({type(e).__name__}): restore it from the checkpoint's config, or start a new run"
            ) from None
        theirs = OmegaConf.to_container(cfg, resolve=True)
        for key in RUN_IDENTITY:
            a, b = OmegaConf.select(OmegaConf.create(own), key), OmegaConf.select(OmegaConf.create(theirs), key)
            if a is not None and _differs(a, b):
                raise ConfigError(
                    f"the checkpoint {path} was written under another {key} than {mine} records, so it was copied "
                    f"from another run: resume that run's own directory, or start a new run"
                )
    ignored = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key.startswith(RESUME_OVERRIDES):
            if not key.startswith(("hydra.", "resume")) and not override.startswith("~"):
                OmegaConf.update(cfg, key, _parse(value), force_add=True)  # applies to this leg
            continue
        saved = OmegaConf.select(cfg, key, default=None)
        saved = OmegaConf.to_container(saved, resolve=True) if OmegaConf.is_config(saved) else saved
        if isinstance(saved, dict):  # a group option: the same one as the run's is no change
            saved = saved.get("name")
            key = f"{key}.name"
        if override.startswith("~") or _parse(value) != saved:
            ignored.append(f"{override} (the run's {key} is {saved})")
    if ignored:
        warnings.warn(
            f"resume={run_dir} continues that run with the config it started with, so {'; '.join(ignored)} "
            "does not apply: drop it, or start a new run to change it",
            stacklevel=2,
        )
    return path, cfg


def _parse(value: str):
    """A command-line value as Hydra reads the simple ones (numbers, true/false, null, lists), else the text."""
    try:
        return yaml.safe_load(value)
    except yaml.YAMLError:
        return value


def _differs(a, b) -> bool:
    """Whether two config values differ, ignoring keys only one side has (added to conf/ since)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return any(_differs(a[k], b[k]) for k in a.keys() & b.keys())
    return a != b


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
    mine, theirs = unwrap(model).state_dict(), saved.state_dict()
    wrong = [k for k in mine if k not in theirs or tuple(theirs[k].shape) != tuple(mine[k].shape)]
    if wrong or len(state["optimizer"]["param_groups"][0]["params"]) != len(names):
        raise ConfigError(
            f"the checkpoint {path} holds the weights of another model than model.* builds (e.g. {wrong[0] if wrong else 'the optimizer state'}"
            f"{'' if not wrong or wrong[0] not in theirs else f' is {tuple(theirs[wrong[0]].shape)} there, {tuple(mine[wrong[0]].shape)} here'}): "
            "resume the run it was written by, in its own directory"
        )
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
