"""Bad command lines, config files, sweeps, environments and logger settings: each is refused by the
start-up check (rapid/preflight.py) with one sentence naming what is wrong and how to fix it, before
Hydra makes a directory or anything loads. In-process through `check_command_line`; a few cases go
through `python -m rapid.train` end to end (exit status 2, the sentence on stderr, no run directory)."""

import subprocess
import sys
from pathlib import Path

import pytest

from rapid.config import ConfigError
from rapid.preflight import check_command_line, check_environment, check_wandb
from tests.test_train import env_for

REPO = Path(__file__).resolve().parents[1]
SMOKE = ["+experiment=smoke"]
QUIET = {"WANDB_MODE": "disabled"}


def refused(argv: list[str], environ=QUIET) -> str:
    with pytest.raises(ConfigError) as e:
        check_command_line(argv, environ=environ)
    message = str(e.value)
    assert "\n" not in message and message.strip() == message
    return message


def test_the_smoke_config_and_a_sweep_of_it_pass(tmp_path):
    jobs = check_command_line([*SMOKE, f"hydra.run.dir={tmp_path / 'run'}"], environ=QUIET)
    assert [j.run_dir for j in jobs] == [tmp_path / "run"] and jobs[0].cfg.algorithm.H == 2
    # the tiny model's 80,512 parameters, 12 bytes each (weights, 2 AdamW moments), in 2 checkpoints at once
    # (rounds=3, ckpt.every=2, keep=1: round 2's is on disk while round 3's is written), the exported model
    # at its largest (fp32, 4 bytes each), + 64 MiB
    assert jobs[0].bytes == 12 * 80_512 * 2 + 4 * 80_512 + 64 * 2**20
    jobs = check_command_line(
        ["-m", *SMOKE, "seed=0,1", "algorithm.H=1,2", f"hydra.sweep.dir={tmp_path}"], environ=QUIET
    )
    assert sorted((j.cfg.seed, j.cfg.algorithm.H) for j in jobs) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert len({j.run_dir for j in jobs}) == 4
    assert not list(tmp_path.iterdir())  # the check writes nothing
    assert check_command_line(["--help"], environ=QUIET) == []  # flags that only show something are left to Hydra


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.skip_zero_advantage=flase", "train.skip_zero_advantage='flase' must be true or false"),
        ("algorithm.leave_one_out=maybe", "algorithm.leave_one_out='maybe' must be true or false"),
        ("eval.at_start=1", "eval.at_start=1 must be true or false"),
        ("sampler.temperature=inf", "sampler.temperature=inf must be a finite number"),
        ("sampler.temperature=nan", "sampler.temperature=nan must be a finite number"),
        ("optim.lr=inf", "optim.lr=inf must be a finite number > 0"),
        ("algorithm.n_step=8.0", "algorithm.n_step=8.0 must be an integer >= 1"),
        ("sampler.top_p=1.5", "sampler.top_p=1.5 must be a finite number > 0 and <= 1"),
        ("optim.betas=[0.9]", "optim.betas=[0.9] must be two numbers in [0, 1)"),
        ("task.low=a", "task.low='a' must be an integer"),
        ("model.dtype=float16", "model.dtype='float16' must be one of float32, bfloat16"),
        ("sampler.max_model_len=big", "sampler.max_model_len='big' must be auto or an integer"),
        ("samples=0", "samples=0 must be an integer >= 1 (or null: rounds or epochs decide)"),
        ("~optim.lr", "optim.lr is missing from the config (deleted with a ~ override"),
        ("+algorithm.beta=0.1", "algorithm.beta=0.1 is ignored by algorithm.loss=iw_grpg"),
        (
            "algorithm.kl_coef=0.1",
            "algorithm.beta=0.1 is ignored by algorithm.loss=iw_grpg",
        ),  # an earlier name, read as beta
        ("+algorithm.etaa=2", "unknown config key algorithm.etaa (did you mean algorithm.eta?)"),
    ],
)
def test_values_are_typed_and_ranged(tmp_path, override, words):
    assert refused([*SMOKE, override, f"hydra.run.dir={tmp_path}/r"]).startswith(words)


def test_a_setting_the_loss_ignores_is_refused_when_given():
    message = refused([*SMOKE, "algorithm=grpo", "algorithm.eta=3"])
    assert message.startswith("algorithm.eta=3 is ignored by algorithm.loss=grpo, which reads algorithm.aggregation")
    assert "algorithm.loss=iw_grpg or rapid_mask" in message
    check_command_line([*SMOKE, "algorithm=grpo", "algorithm.beta=0.1"], environ=QUIET)  # grpo reads it


@pytest.mark.parametrize(
    "args, words",
    [
        (["algorithm.H=[1"], "the override 'algorithm.H=[1' is not valid Hydra syntax"),
        (["seed"], "the override 'seed' is not valid Hydra syntax (it has no '='"),
        (["--config-nme=x"], "the command line cannot be read (unrecognized arguments: --config-nme=x)"),
        (["seed=1", "seed=2"], "seed is given twice (seed=1 and seed=2): keep one"),
        (["seed=0,1"], "seed=0,1 sweeps over values: add -m (--multirun)"),
        (["model=nope"], "In 'config': Could not find 'model/nope': choose one of gemma3_1b"),
        (["model=3"], "model is a config group, so it takes the name of one of its files (conf/model/), not 3"),
        (["nokey=1"], "nokey is not a key of the config"),
        (["+seed=1"], "seed is already in the config, so +seed=... cannot add it"),
        (["seed=${oc.env:RAPID_TEST_UNSET_VAR}"], "seed reads the environment variable RAPID_TEST_UNSET_VAR"),
        (["+extra=???"], "extra must be set (it is ??? in the config)"),
        (["seed=${nothere}"], "seed cannot be resolved (Interpolation key 'nothere' not found)"),
        (["--config-name=nope"], "there is no config named nope (--config-name)"),
        (["--config-dir=/nonexistent/conf"], "--config-dir=/nonexistent/conf is not a folder"),
        (["hydra.searchpath=[nowhere]"], "hydra.searchpath entry nowhere is not a folder (an entry without a scheme"),
        (["hydra.searchpath=[pkg://no_such_package_x]"], "hydra.searchpath entry pkg://no_such_package_x names no"),
    ],
)
def test_command_line_mistakes_are_one_sentence(args, words):
    assert refused([*SMOKE, *args]).startswith(words)


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "seed:\t3\n",
            "tabs.yaml:4 is not valid YAML (found character '\\t' that cannot start any token): indent with",
        ),
        ("seed: 1\nseed: 2\n", "tabs.yaml:5 is not valid YAML (found duplicate key seed)"),
        ("algorithm: 5\n", "algorithm.name is missing from the config"),
    ],
)
def test_config_files_are_checked(tmp_path, text, words):
    (tmp_path / "tabs.yaml").write_text("defaults:\n  - config\n  - _self_\n" + text)
    message = refused([f"--config-dir={tmp_path}", "--config-name=tabs", "+experiment=smoke"])
    assert message.replace(str(tmp_path) + "/", "").startswith(words), message


@pytest.mark.parametrize(
    "args, words",
    [
        (["seed=0,0"], "seed=0,0 sweeps over seed=0 twice"),
        (["seed=range(1,1)"], "seed=range(1,1) expands to no value, so the sweep would launch no job"),
        (["model=glob(zzz*)"], "model=glob(zzz*) expands to no value"),
        (["seed=0,1", "algorithm.eta=1,0.5"], "algorithm.eta=0.5 must be a finite number >= 1"),  # a later job
        (["device=cpu,auto"], "the jobs +experiment=smoke device=cpu and +experiment=smoke device=auto would both"),
    ],
)
def test_sweeps_are_checked_whole_before_the_first_job(tmp_path, args, words):
    assert refused(["-m", *SMOKE, *args, f"hydra.sweep.dir={tmp_path}"]).startswith(words)


def test_the_disk_estimate_counts_the_checkpoints_on_disk_at_once():
    from rapid.checkpoint import bytes_needed

    mib = 64 * 2**20
    # 12 bytes a parameter per checkpoint held, plus the exported model (4 bytes a parameter in fp32)
    assert bytes_needed(1000, keep=1, n_checkpoints=1) == 12_000 + 4_000 + mib  # one save, at the end
    assert bytes_needed(1000, keep=1, n_checkpoints=5) == 24_000 + 4_000 + mib  # the kept one and the one being written
    assert bytes_needed(1000, keep=3, n_checkpoints=2) == 24_000 + 4_000 + mib
    assert bytes_needed(1000, keep=0, n_checkpoints=5) == 60_000 + 4_000 + mib  # keep=0 keeps them all
    assert bytes_needed(1000, keep=1, n_checkpoints=1, export_bytes=2) == 12_000 + 2_000 + mib  # a bf16 export


def test_run_directories_named_by_job_number_and_broken_ones(tmp_path):
    jobs = check_command_line(
        ["-m", *SMOKE, "seed=0,1", f"hydra.sweep.dir={tmp_path}", "hydra.sweep.subdir=${hydra.job.num}"], environ=QUIET
    )
    assert [j.run_dir for j in jobs] == [tmp_path / "0", tmp_path / "1"]
    assert refused([*SMOKE, f"hydra.run.dir={tmp_path}/${{nokey}}"]).startswith(
        "hydra.run.dir cannot be resolved (Interpolation key 'nokey' not found)"
    )


def test_run_directories_are_checked(tmp_path):
    earlier = tmp_path / "earlier"
    earlier.mkdir()
    (earlier / "metrics.jsonl").write_text("{}\n")
    assert f"resume={earlier}" in refused([*SMOKE, f"hydra.run.dir={earlier}"])
    # under torchrun the directory is rank 0's: rank 1 may find the files rank 0 has begun to write
    torchrun = {"WORLD_SIZE": "2", "MASTER_ADDR": "localhost", "MASTER_PORT": "29500", **QUIET}
    check_command_line([*SMOKE, f"hydra.run.dir={earlier}"], environ={**torchrun, "RANK": "1"})
    assert f"resume={earlier}" in refused([*SMOKE, f"hydra.run.dir={earlier}"], {**torchrun, "RANK": "0"})
    (tmp_path / "file").write_text("")
    assert refused([*SMOKE, f"hydra.run.dir={tmp_path / 'file'}"]).endswith("is a file: choose another hydra.run.dir")
    assert refused([*SMOKE, f"hydra.run.dir={tmp_path / 'file' / 'run'}"]).startswith("the run directory")
    # /proc takes no new directories, whoever asks (a chmod-ed folder would not stop root)
    assert refused([*SMOKE, "hydra.run.dir=/proc/rapid_run"]).startswith(
        "cannot write the run directory /proc/rapid_run: its parent /proc is not writable"
    )


def test_a_run_that_needs_more_disk_than_there_is_is_refused(tmp_path):
    # a model of ~1.2e11 parameters would need ~2.8 TB for 2 checkpoints: more than the test disk holds
    big = ["model.architecture.hidden_size=8192", "model.architecture.intermediate_size=65536"]
    big += ["model.architecture.num_hidden_layers=60", "model.architecture.num_attention_heads=64"]
    big += ["model.architecture.head_dim=128", "model.architecture.num_key_value_heads=8"]
    message = refused([*SMOKE, *big, f"hydra.run.dir={tmp_path}/r"])
    assert message.startswith(f"the disk under {tmp_path} has") and "ckpt.keep" in message


@pytest.mark.parametrize(
    "args, words",
    [
        (["sampler.block_size=20"], "sampler.block_size=20 must be a multiple of 32 for the vLLM engine on the CPU"),
        (["sampler.kv_cache_memory_bytes=1000"], "sampler.kv_cache_memory_bytes=1000 holds 1 tokens"),
        (["model.architecture.head_dim=48"], "the model's attention head size is 48, which the CPU vLLM engine"),
        (["+model.architecture.model_type=llamaX"], "model.architecture.model_type=llamaX is not an architecture"),
        (["model.architecture.hidden_size=63"], "model.architecture does not describe a model transformers can build"),
    ],
)
def test_engine_and_model_settings_the_engine_would_refuse_late(args, words):
    assert refused([*SMOKE, "device=cpu", *args]).startswith(words)


def test_environment_of_a_distributed_launch():
    assert check_environment({}) == 1
    assert check_environment({"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "h", "MASTER_PORT": "1"}) == 2
    for env, words in [
        ({"WORLD_SIZE": "two"}, "WORLD_SIZE='two' is not a number: launch with torchrun"),
        ({"WORLD_SIZE": "2"}, "WORLD_SIZE=2 is set without RANK, MASTER_ADDR, MASTER_PORT"),
        ({"WORLD_SIZE": "2", "RANK": "0", "MASTER_PORT": "1"}, "WORLD_SIZE=2 is set without MASTER_ADDR"),
        (
            {"WORLD_SIZE": "2", "RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"},
            "RANK=2 must lie in 0..WORLD_SIZE-1 = 1",
        ),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE=0 must be at least 1"),
    ]:
        with pytest.raises(ConfigError, match="^" + words.replace("(", r"\(").replace(".", r"\.")):
            check_environment(env)


def test_wandb_without_a_login_is_refused(tmp_path):
    netrc = tmp_path / "netrc"
    netrc.write_text("machine example.org login x password y\n")
    with pytest.raises(ConfigError, match="^logger.wandb=true, but this machine is not logged in"):
        check_wandb({"NETRC": str(netrc)})
    for ok in ({"WANDB_MODE": "offline"}, {"WANDB_API_KEY": "k"}):
        check_wandb({"NETRC": str(netrc), **ok})
    netrc.write_text("machine api.wandb.ai login user password k\n")
    netrc.chmod(0o600)
    check_wandb({"NETRC": str(netrc)})
    assert refused([*SMOKE, "logger.wandb=true"], {"NETRC": str(tmp_path / "none")}).startswith("logger.wandb=true")


@pytest.mark.slow
def test_refusals_end_to_end(tmp_path):
    """`python -m rapid.train` itself: exit status 2, one `rapid:` sentence on stderr and nothing else
    from rapid, no traceback, no directory; a sweep whose second job is bad runs no job; a start the
    engine's own checks refuse takes back the files it had written."""
    cases = {
        "flase": ([*SMOKE, "train.skip_zero_advantage=flase"], "train.skip_zero_advantage='flase' must be true"),
        "grammar": ([*SMOKE, "algorithm.H=[1"], "not valid Hydra syntax"),
        "sweep": (["-m", *SMOKE, "algorithm.eta=2,0.5"], "algorithm.eta=0.5 must be a finite number >= 1"),
        "empty sweep": (["-m", *SMOKE, "seed=range(3,3)"], "expands to no value"),
        "world": ([*SMOKE], "WORLD_SIZE=2 is set without"),
        # refused inside the run, after config.yaml, meta.json and split.json were written: they go too
        "late": ([*SMOKE, "sampler.max_model_len=10"], "sampler.max_model_len=10 is shorter than the longest prompt"),
    }
    procs = {}
    for name, (args, _) in cases.items():
        run = tmp_path / name.replace(" ", "_")
        env = env_for(tmp_path, **({"WORLD_SIZE": "2"} if name == "world" else {}))
        procs[name] = (run, subprocess.Popen(
            [sys.executable, "-m", "rapid.train", *args, f"hydra.run.dir={run}", f"hydra.sweep.dir={run}"],
            cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        ))  # fmt: skip
    for name, (run, proc) in procs.items():
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 2, f"{name}: {proc.returncode}\n{out[-2000:]}\n{err[-2000:]}"
        lines = [line for line in err.splitlines() if line.startswith("rapid:")]
        assert len(lines) == 1 and cases[name][1] in lines[0], err[-2000:]
        assert "Traceback" not in out + err and "rapid:" not in out
        assert not run.exists(), name


def test_a_sweep_set_in_a_config_file_is_checked_too(tmp_path):
    """hydra.sweeper.params of a config file are swept before the command line's, as Hydra does."""
    head = "defaults:\n  - config\n  - _self_\nhydra:\n  sweeper:\n    params:\n      seed: 0,1\n"
    (tmp_path / "sweep.yaml").write_text(head)
    (tmp_path / "bad_sweep.yaml").write_text(head + "      algorithm.eta: 2,0.5\n")
    args = ["-m", f"--config-dir={tmp_path}", *SMOKE, f"hydra.sweep.dir={tmp_path / 'runs'}"]
    jobs = check_command_line(["--config-name=sweep", *args, "algorithm.H=1,2"], environ=QUIET)
    assert sorted((j.cfg.seed, j.cfg.algorithm.H) for j in jobs) == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert refused(["--config-name=bad_sweep", *args]).startswith("algorithm.eta=0.5 must be a finite number >= 1")
