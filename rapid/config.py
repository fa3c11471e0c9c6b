"""Config checks that stop a run at start-up with one sentence; the resolver `mul`, which derives
`algorithm.n_inference = H * n_step` (one home for each number; `auto` when H is chosen each round,
rapid/adaptive_h.py); the run's length in rounds and samples; and the resolution of `algorithm.behavior_logprobs: auto`."""

from __future__ import annotations

import difflib
import functools
import json
import math
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
    """Entry-point decorator: a ConfigError ends the program with its one sentence and exit status 2
    (removing the run directory Hydra made for it if nothing was written there), a RunStopped with its
    one sentence and exit status 3; never a traceback."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except ConfigError as e:
            print(f"rapid: {e}", flush=True)
            remove_empty_run_dir()
            sys.exit(EXIT_CONFIG_ERROR)
        except RunStopped as e:
            print(f"rapid: {e}", flush=True)
            sys.exit(EXIT_RUN_STOPPED)

    return wrapper


def remove_empty_run_dir() -> None:
    """Hydra creates the run directory before `main` runs: a start refused before anything was written
    leaves none behind (a directory that holds anything, e.g. an earlier run's, is left alone)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        run_dir = Path(HydraConfig.get().runtime.output_dir)
    except Exception:  # not under Hydra
        return
    try:
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
    ("seed", int, None, False, None),
    ("rounds", int, 1, False, "epochs decide"),
    ("epochs", float, 0, True, None),
    ("algorithm.H", int, 1, False, None),
    ("algorithm.n_step", int, 1, False, None),
    ("algorithm.n_group", int, 1, False, None),
    ("algorithm.n_inference", int, 1, False, None),
    ("algorithm.eta", float, 1, False, "no truncation"),
    ("sampler.temperature", float, None, False, None),
    ("optim.lr", float, 0, True, None),
    ("optim.weight_decay", float, 0, False, None),
    ("optim.grad_clip", float, 0, True, None),
    ("optim.warmup_steps", int, 0, False, None),
    ("optim.max_nonfinite_steps", int, 1, False, None),
    ("reward.workers", int, 0, False, None),
    ("reward.timeout_s", float, 0, True, None),
    ("train.micro_batch", int, 1, False, None),
    ("task.max_new_tokens", int, 1, False, None),
    ("eval.n", int, 1, False, "the whole test split"),
    ("eval.every", int, 0, False, None),
    ("eval.temperature", float, 0, False, None),
    ("eval.n_samples", int, 1, False, None),
    ("ckpt.every", int, 0, False, None),
    ("ckpt.keep", int, 0, False, None),
]
CHOICES = {"optim.schedule": ("constant", "linear", "cosine"), "train.parallel": ("ddp", "fsdp")}
AUTO_KEYS = ("algorithm.H", "algorithm.n_inference")  # may also be `auto` (rapid/adaptive_h.py)
_ABSENT = object()


def check_numbers(cfg: DictConfig) -> None:
    """Each key of NUMBERS present in `cfg` holds a number of its kind within range, each key of
    CHOICES one of its words; else one ConfigError sentence naming the key and what it must be."""
    for key, kind, low, strict, null in NUMBERS:
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT or (value is None and null) or (key in AUTO_KEYS and value == "auto"):
            continue
        is_kind = type(value) is int or (kind is float and type(value) is float and value == value)
        if not is_kind or (low is not None and (value <= low if strict else value < low)):
            what = "an integer" if kind is int else "a number"
            bound = "" if low is None else f" {'>' if strict else '>='} {low}"
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


def validate(cfg: DictConfig, world: int) -> None:
    """Resolve `algorithm.behavior_logprobs: auto` in place (the saved config shows the choice), then
    check; a user-fixable problem raises ConfigError with one sentence."""
    check_numbers(cfg)
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
    for path in CONF.rglob("*.yaml"):
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
