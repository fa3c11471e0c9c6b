import math

import torch

from rapid.buffer import Rollout, collate
from rapid.policy import CompletionLogprobs, completion_logprobs
from rapid.sampler import HFSampler
from tests.helpers import encode, tiny_model

PROMPTS = ["What is 2 + 3?", "Hello", "Say something long and random:"]


def test_generate_shapes_finish_reasons_and_logprobs_match_trainer():
    model, tok = tiny_model()
    sampler = HFSampler(model, tok, batch_size=5)
    prompts = encode(tok, PROMPTS)
    out = sampler.generate(prompts, n=4, max_new_tokens=40, temperature=1.0, seeds=[1, 2, 3])
    assert [len(g) for g in out] == [4, 4, 4]
    eos = tok.eos_token_id
    reasons = set()
    for group in out:
        for c in group:
            assert len(c.logprobs) == len(c.token_ids) > 0
            assert all(lp <= 0 for lp in c.logprobs)
            reasons.add(c.finish_reason)
            if c.finish_reason == "stop":
                assert c.token_ids[-1] == eos and eos not in c.token_ids[:-1]
            else:
                assert len(c.token_ids) == 40 and eos not in c.token_ids
            assert c.text == tok.decode(c.token_ids, skip_special_tokens=True)
    # the trainer's log-probs of the same tokens equal the sampler's (fp32)
    records = [
        Rollout(p, c.token_ids, c.logprobs, 0.0, i, False) for i, (p, g) in enumerate(zip(prompts, out)) for c in g
    ]
    batch = collate(records, tok.pad_token_id)
    with torch.no_grad():
        trainer = completion_logprobs(CompletionLogprobs(model, 1.0), batch)
    diff = (trainer - batch.logp_mu).abs()[batch.completion_mask]
    assert diff.max() < 1e-4


def test_samples_depend_on_seed_not_on_batching():
    model, tok = tiny_model()
    prompts = encode(tok, PROMPTS)
    a = HFSampler(model, tok, batch_size=1).generate(prompts, n=3, max_new_tokens=10, temperature=1.0, seeds=[7, 8, 9])
    b = HFSampler(model, tok, batch_size=64).generate(prompts, n=3, max_new_tokens=10, temperature=1.0, seeds=[7, 8, 9])
    c = HFSampler(model, tok, batch_size=64).generate(
        prompts, n=3, max_new_tokens=10, temperature=1.0, seeds=[7, 8, 10]
    )
    ids = lambda out: [[x.token_ids for x in g] for g in out]
    assert ids(a) == ids(b)
    assert ids(a)[:2] == ids(c)[:2] and ids(a)[2] != ids(c)[2]
    assert len({tuple(x) for x in ids(a)[0]}) > 1  # the n samples of a prompt differ


def test_first_token_distribution_is_softmax_at_temperature():
    """Monte Carlo: frequencies of the first sampled token match softmax(logits / T)."""
    model, tok = tiny_model()
    prompt = encode(tok, ["Hi"])[0]
    T, n = 0.8, 4000
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].double() / T, -1)
    out = HFSampler(model, tok, batch_size=1000).generate([prompt], n=n, max_new_tokens=1, temperature=T, seeds=[0])
    counts = torch.bincount(torch.tensor([c.token_ids[0] for c in out[0]]), minlength=len(probs)).double()
    top = probs.argsort(descending=True)[:5]
    for k in top:
        se = math.sqrt(probs[k] * (1 - probs[k]) / n)
        assert abs(counts[k] / n - probs[k]) < 4 * se + 1e-9, (k, counts[k] / n, probs[k])
    # the recorded log-prob is log softmax(logits / T) of the chosen token
    first = out[0][0]
    assert abs(first.logprobs[0] - math.log(probs[first.token_ids[0]])) < 1e-5


def test_greedy_is_argmax():
    model, tok = tiny_model()
    prompt = encode(tok, ["Hello"])[0]
    out = HFSampler(model, tok).generate([prompt], n=1, max_new_tokens=5, temperature=0.0)[0][0]
    ids = list(prompt)
    with torch.no_grad():
        for t in out.token_ids:
            nxt = int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax())
            assert t == nxt
            ids.append(t)


def test_top_p_samples_only_from_the_nucleus():
    """With top_p, every sampled token lies in the smallest set holding top_p of the mass, and its
    recorded log-prob is that of the renormalised nucleus."""
    model, tok = tiny_model()
    prompt = encode(tok, ["Hi"])[0]
    T = 1.0
    with torch.no_grad():
        probs = torch.softmax(model(input_ids=torch.tensor([prompt])).logits[0, -1].double() / T, -1)
    sorted_p, order = probs.sort(descending=True)
    top_p = float(sorted_p[:3].sum()) - 1e-4  # a nucleus of exactly 3 tokens
    size = int((sorted_p.cumsum(0) - sorted_p < top_p).sum())  # tokens needed to reach top_p
    assert size == 3
    nucleus = set(order[:size].tolist())
    mass = float(sorted_p[:size].sum())
    out = HFSampler(model, tok, batch_size=500).generate(
        [prompt], n=500, max_new_tokens=1, temperature=T, seeds=[3], top_p=top_p
    )[0]
    firsts = [c.token_ids[0] for c in out]
    assert set(firsts) <= nucleus and len(set(firsts)) > 1
    for c in out[:20]:
        assert abs(c.logprobs[0] - math.log(probs[c.token_ids[0]] / mass)) < 1e-5


def test_checkpoint_generation_config_does_not_change_the_sampled_distribution():
    """Instruct checkpoints ship a generation_config (repetition_penalty, top_k, top_p, ...). The
    sampler must draw from exactly softmax(logits / T) and record its log-probs, ignoring all of it:
    otherwise log μ is the processed distribution while log π_θ is not."""
    model, tok = tiny_model()
    model.generation_config.update(
        do_sample=True, temperature=0.6, repetition_penalty=1.3, top_k=5, top_p=0.5, no_repeat_ngram_size=2
    )
    prompts = encode(tok, PROMPTS)
    out = HFSampler(model, tok, batch_size=16).generate(
        prompts, n=4, max_new_tokens=30, temperature=1.0, seeds=[1, 2, 3]
    )
    records = [
        Rollout(p, c.token_ids, c.logprobs, 0.0, i, False) for i, (p, g) in enumerate(zip(prompts, out)) for c in g
    ]
    batch = collate(records, tok.pad_token_id)
    with torch.no_grad():
        trainer = completion_logprobs(CompletionLogprobs(model, 1.0), batch)
    diff = (trainer - batch.logp_mu).abs()[batch.completion_mask]
    assert diff.max() < 1e-4, diff.max()
    # top_k = 5 would forbid tokens ranked 5th or lower at their position; exact sampling draws some
    ranks = []
    with torch.no_grad():
        for r in records:
            logits = model(input_ids=torch.tensor([r.prompt_ids + r.completion_ids])).logits[
                0, len(r.prompt_ids) - 1 : -1
            ]
            ranks += (logits > logits.gather(-1, torch.tensor(r.completion_ids)[:, None])).sum(-1).tolist()
    assert max(ranks) >= 5, max(ranks)


def test_engine_max_model_len_is_derived_from_the_longest_prompt_plus_max_new_tokens():
    import pytest

    from rapid.config import ConfigError
    from rapid.sampler import engine_max_model_len, sequence_budget

    # MATH at paper settings: a 300-token prompt + 2048 new tokens = 2348 > the old fixed 2048
    needed = sequence_budget([[1] * 120, [1] * 300, [1] * 7], 2048)
    assert needed == 2348
    assert engine_max_model_len("auto", needed, 32768) == 2348
    assert engine_max_model_len(None, needed, 32768) == 2348
    assert engine_max_model_len(4096, needed, 32768) == 4096  # more room than needed is kept
    assert engine_max_model_len(4096, None, 512) == 512  # never beyond the model's context
    assert engine_max_model_len("auto", None, 512) == 512  # nothing known: min(2048, context)
    assert engine_max_model_len("auto", None, 32768) == 2048
    with pytest.raises(ConfigError, match="sampler.max_model_len=2048 is shorter .*2348 tokens"):
        engine_max_model_len(2048, needed, 32768)  # the old default would have cut completions short
    with pytest.raises(ConfigError, match="more than the model's context of 2048"):
        engine_max_model_len("auto", needed, 2048)
    with pytest.raises(ConfigError, match="must be auto or a positive number"):
        engine_max_model_len("long", needed, 32768)


def test_enforce_eager_only_on_cpu_unless_forced():
    import pytest

    from rapid.config import ConfigError
    from rapid.sampler import use_enforce_eager

    assert use_enforce_eager("auto", cuda=True) is False  # CUDA graphs on a GPU
    assert use_enforce_eager("auto", cuda=False) is True  # vLLM's CPU engine runs eagerly
    assert use_enforce_eager(True, cuda=True) is True and use_enforce_eager(False, cuda=False) is False
    with pytest.raises(ConfigError, match="sampler.enforce_eager='sometimes' must be auto, true or false"):
        use_enforce_eager("sometimes", cuda=True)


def test_a_multiprocessing_engine_is_refused_in_one_sentence():
    """VLLM_ENABLE_V1_MULTIPROCESSING=1 puts the engine in another process, where the in-place weight
    reload cannot reach it: refused before an engine starts, rather than overridden silently."""
    import pytest

    from rapid.config import ConfigError
    from rapid.sampler import check_in_process_engine

    with pytest.raises(ConfigError, match="VLLM_ENABLE_V1_MULTIPROCESSING=1 runs the vLLM engine in a separate"):
        check_in_process_engine({"VLLM_ENABLE_V1_MULTIPROCESSING": "1"})
    check_in_process_engine({})  # unset: rapid sets 0
    check_in_process_engine({"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
