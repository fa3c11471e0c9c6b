"""Config checks that stop a run at start-up with one sentence, and the `mul` resolver that
derives `algorithm.n_inference = H * n_step` (one home for each number)."""
from __future__ import annotations

import functools
import sys
from typing import Callable

import torch
from omegaconf import DictConfig, OmegaConf

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class ConfigError(ValueError):
    """Something the user can fix (a config value, a missing model, data file or tool); the message
    is one sentence saying how."""


def exit_on_config_error(main: Callable) -> Callable:
    """Entry-point decorator: a ConfigError ends the program with its one sentence, not a traceback."""
    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except ConfigError as e:
            print(f"rapid: {e}", flush=True)
            sys.exit(2)
    return wrapper


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("mul"):
        OmegaConf.register_new_resolver("mul", lambda *xs: __import__("math").prod(int(x) for x in xs))


# (key, kind, lowest value, whether the lowest is excluded, what null means or None if null is wrong)
NUMBERS = [
    ("seed", int, None, False, None), ("rounds", int, 1, False, "epochs decide"), ("epochs", float, 0, True, None),
    ("algorithm.H", int, 1, False, None), ("algorithm.n_step", int, 1, False, None),
    ("algorithm.n_group", int, 1, False, None), ("algorithm.n_inference", int, 1, False, None),
    ("algorithm.eta", float, 1, False, "no truncation"), ("sampler.temperature", float, None, False, None),
    ("optim.lr", float, 0, True, None), ("optim.weight_decay", float, 0, False, None),
    ("optim.grad_clip", float, 0, True, None), ("optim.warmup_steps", int, 0, False, None),
    ("reward.workers", int, 0, False, None), ("reward.timeout_s", float, 0, True, None),
    ("train.micro_batch", int, 1, False, None), ("task.max_new_tokens", int, 1, False, None),
    ("eval.n", int, 1, False, "the whole test split"), ("eval.every", int, 0, False, None),
    ("eval.temperature", float, 0, False, None), ("eval.n_samples", int, 1, False, None),
    ("ckpt.every", int, 0, False, None), ("ckpt.keep", int, 0, False, None),
]
CHOICES = {"optim.schedule": ("constant", "linear", "cosine")}
_ABSENT = object()


def check_numbers(cfg: DictConfig) -> None:
    """Each key of NUMBERS present in `cfg` holds a number of its kind within range, each key of
    CHOICES one of its words; else one ConfigError sentence naming the key and what it must be."""
    for key, kind, low, strict, null in NUMBERS:
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT or (value is None and null):
            continue
        is_kind = type(value) is int or (kind is float and type(value) is float and value == value)
        if not is_kind or (low is not None and (value <= low if strict else value < low)):
            what = "an integer" if kind is int else "a number"
            bound = "" if low is None else f" {'>' if strict else '>='} {low}"
            raise ConfigError(f"{key}={value!r} must be {what}{bound}" + (f" (or null: {null})" if null else ""))
    for key, words in CHOICES.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is not _ABSENT and value not in words:
            raise ConfigError(f"{key}={value!r} must be one of {', '.join(words)}")
    ks = OmegaConf.select(cfg, "eval.ks", default=[1])
    if not OmegaConf.is_list(ks) and not isinstance(ks, list) or not all(type(k) is int and k >= 1 for k in ks):
        raise ConfigError(f"eval.ks={ks} must be a list of integers >= 1 (the k of pass@k)")


def validate(cfg: DictConfig, world: int) -> None:
    check_numbers(cfg)
    a = cfg.algorithm
    checks = [
        (a.H >= 1, f"algorithm.H={a.H} must be at least 1"),
        (a.n_group >= 2 or not a.leave_one_out, "algorithm.leave_one_out needs algorithm.n_group >= 2"),
        (a.n_group >= 1, f"algorithm.n_group={a.n_group} must be at least 1"),
        (a.n_step % a.n_group == 0,
         f"algorithm.n_step={a.n_step} must be a multiple of algorithm.n_group={a.n_group}, so that a "
         "minibatch holds whole groups"),
        (a.n_inference == a.H * a.n_step,
         f"algorithm.n_inference={a.n_inference} must equal H * n_step = {a.H * a.n_step}: set algorithm.H "
         "and algorithm.n_step, not n_inference"),
        (a.n_step % (a.n_group * world) == 0,
         f"algorithm.n_step={a.n_step} must split into whole groups of {a.n_group} over {world} ranks "
         f"(a multiple of n_group * world_size = {a.n_group * world})"),
        (a.eta is None or a.eta >= 1.0, f"algorithm.eta={a.eta} must be >= 1 (or null for no truncation)"),
        (cfg.train.micro_batch % a.n_group == 0,
         f"train.micro_batch={cfg.train.micro_batch} must be a multiple of algorithm.n_group={a.n_group}"),
        (cfg.model.dtype in DTYPES, f"model.dtype={cfg.model.dtype} must be one of {', '.join(DTYPES)}"),
        (cfg.sampler.temperature > 0, f"sampler.temperature={cfg.sampler.temperature} must be > 0 for RL "
         "(log-probs are taken at the sampling temperature)"),
        (a.loss in ("iw_grpg", "grpo", "dapo"), f"algorithm.loss={a.loss} must be iw_grpg, grpo, dapo or sft"),
        (a.behavior_logprobs in ("sampler", "recompute"),
         f"algorithm.behavior_logprobs={a.behavior_logprobs} must be sampler or recompute"),
        (cfg.rounds is None or cfg.rounds >= 1, f"rounds={cfg.rounds} must be at least 1 (or null: epochs)"),
        (cfg.rounds is not None or cfg.epochs > 0, "set rounds, or leave it null and set epochs > 0"),
        (cfg.device in ("auto", "cpu", "cuda"), f"device={cfg.device} must be auto, cpu or cuda"),
        (cfg.device != "cuda" or torch.cuda.is_available(),
         "device=cuda was asked for but no CUDA GPU is visible: run on a GPU machine or set device=cpu"),
    ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
