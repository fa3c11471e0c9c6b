"""The start-up check of `python -m rapid.train`: before Hydra makes a run directory and before any model,
engine or data loads, the command line is parsed, expanded and composed as Hydra will do it, every job
of a sweep included, and each job's config is checked. A problem ends the program with one sentence on
stderr and exit status 2, and nothing is left on disk.

What is checked, in order:
  - the command line: Hydra's override grammar, a key given twice, --config-dir / --config-name /
    --config-path that are not there, hydra.searchpath entries that name no folder or package;
  - a sweep (-m): a range or glob that expands to no value, the same value twice, two jobs that would
    share one run directory (e.g. values of keys left out of directory names); without -m, a sweep
    value is refused rather than read as a string;
  - composition: a config file Hydra or YAML cannot read (tabs, a duplicate key), a missing group
    option, a group given as a number, a key that is not there, an interpolation or ${oc.env:VAR} that
    does not resolve, a ??? left unset;
  - each job's config: the schema and the cross-key checks of rapid/config.py (`validate`), unknown keys,
    loss settings the chosen loss ignores; the model (rapid/models.py: a folder without weights, a
    truncated weights file, no tokenizer, an unknown architecture) and what the vLLM engine would refuse
    only once started (block size, head size, a KV cache too small for one sequence); the task module
    (imports, and its functions take rapid's call); with resume=<dir>, the checkpoint and its config
    (rapid/checkpoint.py `resume_point`);
  - the run directory: not an earlier run's, its parent writable, and roughly the disk its checkpoints
    will take free (rapid/checkpoint.py `bytes_needed`);
  - the environment: WORLD_SIZE, RANK and MASTER_ADDR as torchrun sets them; logger.wandb=true with W&B
    installed and logged in (or WANDB_MODE=offline).

The run itself then checks its config again (`validate`), so a config given to `train` directly is held
to the same rules; warnings are left to the run, which says each once.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import json
import netrc
import os
import shutil
import sys
import tempfile
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from rapid import estimators
from rapid.config import (
    CONF,
    EXIT_CONFIG_ERROR,
    ConfigError,
    check_engine,
    check_known_keys,
    check_loss_keys,
    check_new_run_dir,
    check_schema,
    register_resolvers,
    run_length,
    validate,
)

SHOW_ONLY = ("help", "hydra_help", "cfg", "info", "shell_completion", "experimental_rerun")  # flags that run nothing


@dataclass
class Job:
    overrides: list[str]
    cfg: DictConfig  # the job's config, resolved, without hydra.*
    run_dir: Path
    bytes: int = 0  # roughly what its checkpoints will take on disk


def checked(config_name: str) -> Callable:
    """Decorator for a Hydra entry point (outermost, above @hydra.main): the command line is checked by
    `check_command_line` first; a ConfigError ends the program with its one sentence on stderr and exit
    status 2. Called with arguments (a config given directly), the entry point runs unchecked."""

    def decorate(entry: Callable) -> Callable:
        @functools.wraps(entry)
        def wrapper(*args, **kwargs):
            if not args and not kwargs:
                try:
                    check_command_line(sys.argv[1:], config_name)
                except ConfigError as e:
                    print(f"rapid: {e}", file=sys.stderr, flush=True)
                    sys.exit(EXIT_CONFIG_ERROR)
            return entry(*args, **kwargs)

        return wrapper

    return decorate


def check_command_line(
    argv: list[str], config_name: str = "config", conf: Path = CONF, environ: Mapping[str, str] | None = None
) -> list[Job]:
    """Every job the command line `argv` would run, each checked (module docstring); raises ConfigError."""
    from hydra._internal.utils import get_args_parser

    environ = os.environ if environ is None else environ
    parser = get_args_parser()

    def refuse(message: str):
        raise ConfigError(f"the command line cannot be read ({message}): see python -m rapid.train --help")

    parser.error = refuse  # argparse would print its usage and exit
    args = parser.parse_args(argv)
    if any(getattr(args, flag, None) for flag in SHOW_ONLY):
        return []
    register_resolvers()
    from hydra.core.utils import setup_globals

    setup_globals()  # Hydra's ${now:...} and friends
    world = check_environment(environ)
    loader = config_loader(args, conf)
    config_name = args.config_name or config_name
    overrides = list(args.overrides)
    check_repeated(parse_overrides(overrides, loader))
    if not args.multirun:
        sweeps = [o.input_line for o in parse_overrides(overrides, loader) if o.is_sweep_override()]
        if sweeps:
            raise ConfigError(
                f"{sweeps[0]} sweeps over values: add -m (--multirun) to run one job per value, or write a list "
                "as key=[a,b] or a string as key='a,b'"
            )
    master = compose(loader, config_name, overrides, multirun=args.multirun)
    check_search_path(master)
    jobs_overrides = [overrides]
    if args.multirun:  # as Hydra's basic sweeper: hydra.sweeper.params first, then the command line's
        params = OmegaConf.select(master, "hydra.sweeper.params", default=None) or {}
        jobs_overrides = expand_sweep(parse_overrides([f"{k}={v}" for k, v in params.items()] + overrides, loader))
    jobs = []
    for num, job_overrides in enumerate(jobs_overrides):
        cfg = compose(loader, config_name, job_overrides, multirun=False) if args.multirun else master
        with open_dict(cfg):  # as Hydra's launcher numbers the jobs (a run directory may be named by it)
            cfg.hydra.job.num = cfg.hydra.job.id = num
        jobs.append(check_job(cfg, job_overrides, world, args.multirun, environ))
    check_run_dirs(jobs, disk=int(environ.get("RANK", 0)) == 0)
    return jobs


# ----------------------------------------------------------------------------- the command line


def config_loader(args, conf: Path):
    """Hydra's config loader over the search path Hydra would build: the package's conf/ (or
    --config-path), then --config-dir in front of it."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path

    primary = Path(conf)
    if args.config_path is not None:
        if args.config_path.startswith("pkg://"):
            primary = None
            location = args.config_path
        else:
            primary = Path(args.config_path).expanduser()
            primary = primary if primary.is_absolute() else (Path(__file__).parent / primary).resolve()
    if primary is not None:
        if not primary.is_dir():
            raise ConfigError(f"--config-path={args.config_path} is not a folder: point it at a folder of configs")
        location = f"file://{primary}"
    search_path = create_config_search_path(location)
    if args.config_dir is not None:
        extra = Path(args.config_dir).expanduser().resolve()
        if not extra.is_dir():
            raise ConfigError(
                f"--config-dir={args.config_dir} is not a folder: point it at the folder that holds your configs"
            )
        search_path.prepend(provider="command-line", path=f"file://{extra}")
    return ConfigLoaderImpl(config_search_path=search_path)


def parse_overrides(overrides: list[str], loader) -> list:
    """Hydra's parse of each override; a grammar error names the override and how to quote."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    parser = OverridesParser.create(config_loader=loader)
    parsed = []
    for override in overrides:
        try:
            parsed += parser.parse_overrides([override])
        except HydraException as e:
            reason = str(e).strip().splitlines()[0]
            if "=" not in override:
                reason = "it has no '=': write key=value, +key=value to add a key, or ~key to delete one"
            raise ConfigError(
                f"the override {override!r} is not valid Hydra syntax ({reason.rstrip('.')}): quote a value with "
                "spaces or special characters as key='a b' (https://hydra.cc/docs/advanced/override_grammar/basic)"
            ) from None
    return parsed


def check_repeated(parsed: list) -> None:
    """The same key twice on the command line is refused (Hydra would keep one without saying)."""
    seen: dict[str, str] = {}
    for override in parsed:
        key = override.get_key_element().lstrip("+~")
        if key in seen:
            raise ConfigError(f"{key} is given twice ({seen[key]} and {override.input_line}): keep one")
        seen[key] = override.input_line


def expand_sweep(parsed: list) -> list[list[str]]:
    """The jobs of a sweep, one override list each, as Hydra's basic sweeper expands them; a sweep over
    no value or over the same value twice is refused."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    for override in parsed:
        if override.is_sweep_override() and override.is_discrete_sweep():
            values = list(override.sweep_string_iterator())
            if not values:
                raise ConfigError(
                    f"{override.input_line} expands to no value, so the sweep would launch no job: widen the range "
                    "or glob (range(a,b) stops before b; glob(*) matches the options of a config group)"
                )
            repeated = sorted({v for v in values if values.count(v) > 1})
            if repeated:
                raise ConfigError(
                    f"{override.input_line} sweeps over {override.get_key_element()}={repeated[0]} twice, so two jobs "
                    "would be the same run in the same directory: list each value once (a second seed is seed=0,1)"
                )
    try:
        return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]
    except Exception as e:  # a sweep kind the basic sweeper does not expand (interval)
        raise ConfigError(f"the sweep cannot be expanded ({e}): use lists, range() or glob()") from None


def compose(loader, config_name: str, overrides: list[str], multirun: bool) -> DictConfig:
    """The composed config (hydra.* included) of one job; Hydra's and YAML's errors as one sentence."""
    from hydra.types import RunMode

    mode = RunMode.MULTIRUN if multirun else RunMode.RUN
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Hydra's own deprecation notes: the run says them
            return loader.load_configuration(config_name, list(overrides), run_mode=mode)
    except Exception as e:
        raise ConfigError(composition_message(e, config_name, overrides)) from None


def composition_message(error: Exception, config_name: str, overrides: list[str]) -> str:
    import yaml
    from hydra.errors import MissingConfigException

    text = str(error).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if isinstance(error, yaml.YAMLError):
        mark = getattr(error, "problem_mark", None)
        where = f"{mark.name}:{mark.line + 1}" if mark else "a config file"
        problem = getattr(error, "problem", None) or lines[0]
        hint = "indent with spaces, not tabs" if "\\t" in problem else "fix the file"
        return f"{where} is not valid YAML ({problem}): {hint}"
    if isinstance(error, MissingConfigException):
        if text.startswith("Cannot find primary config"):
            return (
                f"there is no config named {config_name} (--config-name) in the config search path: give the name of "
                "a .yaml file in conf/ or in --config-dir, without .yaml"
            )
        options = [line for line in text.splitlines() if line.startswith("\t") and "provider=" not in line]
        options = [o.strip() for o in options]
        return f"{lines[0].rstrip('.')}" + (f": choose one of {', '.join(options)}" if options else "")
    if isinstance(error, ValueError) and "Config group override must be a string" in text:
        group = next((o.split("=")[0] for o in overrides if o.split("=", 1)[-1].strip("'\"").isdigit()), "a group")
        value = next((o.split("=", 1)[1] for o in overrides if o.split("=")[0].lstrip("+") == group), "a number")
        return f"{group} is a config group, so it takes the name of one of its files (conf/{group}/), not {value}"
    if text.startswith("Could not append to config. An item is already at"):
        key = text.split("'")[1]
        return f"{key} is already in the config, so +{key}=... cannot add it: set it with {key}=... (or ++{key}=...)"
    cause = error.__cause__
    if text.startswith("Could not override") and cause is not None:
        key = text.split("'")[1]
        return (
            f"{key} is not a key of the config, so {key}=... cannot set it: fix its name (every key is in conf/), or "
            f"add a new one with +{key}=..."
        )
    return " ".join(lines).rstrip(".")


def check_search_path(cfg: DictConfig) -> None:
    """Each hydra.searchpath entry names a folder (file:// or no scheme) or an importable package (pkg://)."""
    for entry in OmegaConf.select(cfg, "hydra.searchpath", default=[]) or []:
        scheme, _, where = entry.rpartition("://")
        if scheme == "pkg":
            try:
                found = importlib.util.find_spec(where.replace("/", ".").split(".")[0]) is not None
            except (ImportError, ValueError):
                found = False
            if not found:
                raise ConfigError(f"hydra.searchpath entry {entry} names no importable package: fix the name")
        elif scheme in ("file", "") and not Path(where).expanduser().is_dir():
            bare = (
                "" if scheme else " (an entry without a scheme is read as a folder: file://<folder> or pkg://<package>)"
            )
            raise ConfigError(f"hydra.searchpath entry {entry} is not a folder{bare}: point it at your config folder")
        elif scheme not in ("file", "pkg", ""):
            raise ConfigError(f"hydra.searchpath entry {entry} has the scheme {scheme}://: use file:// or pkg://")


# ----------------------------------------------------------------------------- one job


def one_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return (lines[0] if lines else type(error).__name__).rstrip(".")


def job_config(cfg: DictConfig) -> DictConfig:
    """The job's config without hydra.*, every interpolation resolved; one sentence for one that fails."""
    from omegaconf.errors import MissingMandatoryValue, OmegaConfBaseException

    plain = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    try:
        return OmegaConf.create(OmegaConf.to_container(plain, resolve=True, throw_on_missing=True))
    except MissingMandatoryValue as e:
        key = e.full_key
        return_msg = f"{key} must be set (it is ??? in the config): give it on the command line, {key}=<value>"
        raise ConfigError(return_msg) from None
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "a config value"
        message = str(e).strip().splitlines()[0]
        if "Environment variable" in message:
            var = message.split("'")[1]
            raise ConfigError(
                f"{key} reads the environment variable {var}, which is not set: export {var}=..., or give a "
                f"default as ${{oc.env:{var},<default>}}"
            ) from None
        raise ConfigError(
            f"{key} cannot be resolved ({message.rstrip('.')}): an interpolation ${{...}} names a key or resolver "
            "that is not there"
        ) from None


def check_job(cfg: DictConfig, overrides: list[str], world: int, multirun: bool, environ) -> Job:
    """One job's config checked (module docstring): returns it with its run directory."""
    from rapid import checkpoint, tasks

    hydra_cfg = cfg.hydra
    cfg = job_config(cfg)
    if cfg.get("resume"):
        run_dir = Path(cfg.resume)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the run names the overrides it ignores, once
            _, cfg = checkpoint.resume_point(run_dir, [o for o in overrides if not o.startswith("resume=")])
        new = False
    else:
        try:
            run_dir = Path(os.path.join(hydra_cfg.sweep.dir, hydra_cfg.sweep.subdir) if multirun else hydra_cfg.run.dir)
        except Exception as e:
            key = "hydra.sweep.dir / hydra.sweep.subdir" if multirun else "hydra.run.dir"
            raise ConfigError(f"{key} cannot be resolved ({one_line(e)}): fix the interpolations in it") from None
        new = True
        with open_dict(cfg):
            estimators.upgrade_settings(cfg.algorithm)  # earlier key names as today's (the run says so, once)
        check_known_keys(cfg)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the run warns, once, when it checks again
        if cfg.algorithm.get("loss") == "sft":
            check_schema(cfg)
        else:
            validate(cfg, world)
    check_loss_keys(cfg, overrides)
    n_params, model_config = cached_model_facts(json.dumps(OmegaConf.to_container(cfg.model), sort_keys=True))
    check_engine(cfg, model_config)
    task = tasks.get_task(cfg.task.name, cfg.task.module)
    check_task_signatures(task, cfg.task)
    if cfg.logger.get("wandb"):
        check_wandb(environ)
    if int(environ.get("RANK", 0)) == 0:  # under torchrun, rank 0 owns the directory (the others may find its files)
        if new:
            check_new_run_dir(run_dir)
        check_writable(run_dir)
    return Job(list(overrides), cfg, run_dir, estimate_bytes(cfg, n_params))


@functools.lru_cache(maxsize=16)
def cached_model_facts(model_json: str):
    """rapid.models.model_facts of a `model` config, once per distinct config (the jobs of a sweep share them)."""
    from rapid.models import model_facts

    return model_facts(OmegaConf.create(json.loads(model_json)))


def check_task_signatures(task, task_cfg) -> None:
    """The task's load and build_prompts can take rapid's calls (every task.* key as a keyword)."""
    from rapid.tasks import SIGNATURES

    cfg = dict(task_cfg)
    for name, args in (("load", ("train",)), ("build_prompts", ([], None))):
        try:
            inspect.signature(getattr(task, name)).bind(*args, **cfg)
        except TypeError as e:
            raise ConfigError(
                f"{task.__name__}.{name} cannot be called as rapid calls it ({e}): a task's {SIGNATURES[name]} "
                "(every task.* key arrives as a keyword, so end the parameters with **cfg)"
            ) from None
        except ValueError:
            pass


def estimate_bytes(cfg: DictConfig, n_params: int | None) -> int:
    """Roughly the disk the job's checkpoints will take (0 when the model's size is not known yet)."""
    from rapid.checkpoint import bytes_needed

    if not n_params:
        return 0
    rounds = cfg.get("rounds")
    if rounds is None and cfg.get("samples") and cfg.algorithm.get("H") != "auto":
        rounds = run_length(cfg, 1)[0]
    every = cfg.ckpt.every
    saves = (rounds // every + 1) if (rounds and every) else (cfg.ckpt.keep or 1) if every else 1
    return bytes_needed(n_params, cfg.ckpt.keep, saves)  # the exported model counted at fp32, its largest


# ----------------------------------------------------------------------------- run directories


def first_existing(path: Path) -> Path:
    path = Path(os.path.abspath(path))
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_writable(run_dir: Path) -> None:
    """The run directory is a directory this user can write, or can be created under one."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise ConfigError(f"the run directory {run_dir} is a file: choose another hydra.run.dir")
    base = first_existing(run_dir)
    if not base.is_dir():
        raise ConfigError(f"the run directory {run_dir} lies under the file {base}: choose another hydra.run.dir")
    try:  # a real write: os.access says yes to root on a read-only file system
        os.rmdir(tempfile.mkdtemp(prefix=".rapid-write-check-", dir=base))
    except OSError as e:
        what = "the run directory" if base == Path(os.path.abspath(run_dir)) else f"its parent {base}"
        raise ConfigError(
            f"cannot write the run directory {run_dir}: {what} is not writable ({e.strerror}); choose a writable "
            "hydra.run.dir (or hydra.sweep.dir for -m)"
        ) from None


def check_run_dirs(jobs: list[Job], disk: bool = True) -> None:
    """No two jobs share a run directory; the disk under them holds roughly what their checkpoints need
    (when `disk`: on rank 0, which writes the checkpoints)."""
    seen: dict[str, Job] = {}
    shown = lambda job: " ".join(o for o in job.overrides if not o.startswith("hydra.")) or "(no overrides)"
    for job in jobs:
        key = os.path.abspath(job.run_dir)
        if key in seen and not job.cfg.get("resume"):
            raise ConfigError(
                f"the jobs {shown(seen[key])} and {shown(job)} would "
                f"both write to {job.run_dir} (their values differ only in keys left out of run directory names, "
                "hydra.job.config.override_dirname.exclude_keys): sweep over keys that name the run, or set "
                "hydra.sweep.subdir"
            )
        seen[key] = job
    needs: dict[int, tuple[Path, int]] = {}
    for job in jobs if disk else []:
        base = first_existing(job.run_dir)
        device = base.stat().st_dev
        needs[device] = (base, needs.get(device, (base, 0))[1] + job.bytes)
    for base, need in needs.values():
        free = shutil.disk_usage(base).free
        if need > free:
            raise ConfigError(
                f"the disk under {base} has {free / 2**30:.1f} GiB free, but the run's checkpoints will take about "
                f"{need / 2**30:.1f} GiB (12 bytes a parameter each: weights and AdamW moments): make room, keep "
                "fewer checkpoints (ckpt.keep), or choose a run directory on a larger disk"
            )


# ----------------------------------------------------------------------------- the environment


def check_environment(environ: Mapping[str, str]) -> int:
    """The world size, from the variables torchrun sets; a partial or malformed set is refused."""
    values = {}
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        value = environ.get(name)
        if value is None:
            continue
        try:
            values[name] = int(value)
        except ValueError:
            raise ConfigError(
                f"{name}={value!r} is not a number: launch with torchrun (it sets WORLD_SIZE, RANK, LOCAL_RANK, "
                f"MASTER_ADDR and MASTER_PORT), or unset {name}"
            ) from None
    world = values.get("WORLD_SIZE", 1)
    if world < 1:
        raise ConfigError(f"WORLD_SIZE={world} must be at least 1: launch with torchrun, or unset it")
    if world > 1:
        missing = [n for n in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not environ.get(n)]
        if missing:
            raise ConfigError(
                f"WORLD_SIZE={world} is set without {', '.join(missing)}: launch with torchrun "
                "--nproc_per_node=<n> -m rapid.train, which sets them all, or unset WORLD_SIZE"
            )
        if not 0 <= values["RANK"] < world:
            raise ConfigError(f"RANK={values['RANK']} must lie in 0..WORLD_SIZE-1 = {world - 1}: launch with torchrun")
    return world


def check_wandb(environ: Mapping[str, str]) -> None:
    """logger.wandb=true needs wandb installed, and a login unless W&B logs offline or is disabled."""
    if importlib.util.find_spec("wandb") is None:
        raise ConfigError("logger.wandb=true needs the wandb package: pip install wandb, or set logger.wandb=false")
    if environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or environ.get("WANDB_API_KEY"):
        return
    host = environ.get("WANDB_BASE_URL", "https://api.wandb.ai").split("://")[-1].split("/")[0]
    try:
        found = netrc.netrc(environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        found = False
    if not found:
        raise ConfigError(
            "logger.wandb=true, but this machine is not logged in to Weights & Biases: run `wandb login`, set "
            "WANDB_API_KEY, or set WANDB_MODE=offline to log locally (wandb sync uploads it later)"
        )
