"""Sampling with reused key/value states (empathy_gym.backends.prefix_cache)."""

from __future__ import annotations

import pytest
import torch
from transformers import GenerationConfig

from empathy_gym.backends.models import load_causal_lm
from empathy_gym.backends.prefix_cache import PrefixKVCache, next_token_logits, sample_batch


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float32", device="cpu")
    return model.eval(), tokenizer


def chat(tokenizer, text):
    return list(
        tokenizer.apply_chat_template(
            [{"role": "system", "content": "You listen."}, {"role": "user", "content": text}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )["input_ids"]
    )


def run(model, tokenizer, prompts, cache, temperature=1.0, limit=10):
    return sample_batch(
        model,
        prompts,
        max_new_tokens=limit,
        eos_ids=[tokenizer.eos_token_id],
        pad_id=tokenizer.pad_token_id,
        temperature=temperature,
        seeds=list(range(11, 11 + len(prompts))),
        cache=cache,
    )


@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_reuse_gives_the_same_samples_over_turns_with_left_padding(tiny, temperature):
    """Three dialogues of different lengths (left padding in the batch), three turns, one of
    them ending after the first: with the cache the ids are identical and the log-probs
    equal to float noise, and from the second turn on most of each prompt is reused."""
    model, tokenizer = tiny
    texts = [
        "I lost my job.",
        "My sister stopped calling me and I do not know why at all.",
        "Work is fine I guess, but my manager blamed me in front of everyone yesterday.",
    ]
    plain, cached = [[chat(tokenizer, t) for t in texts] for _ in range(2)]
    cache = PrefixKVCache()
    for turn in range(3):
        a = run(model, tokenizer, plain, None, temperature)
        b = run(model, tokenizer, cached, cache, temperature)
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
        for x, y in zip(a, b):
            assert torch.allclose(torch.tensor(x.logprobs), torch.tensor(y.logprobs), atol=1e-4)
        answer = tokenizer.encode(f"\nuser: tell me more ({turn})\nassistant:", add_special_tokens=False)
        plain = [p + r.token_ids + answer for p, r in zip(plain, a)]
        cached = [p + r.token_ids + answer for p, r in zip(cached, b)]
        if turn == 0:  # the second dialogue ends here; the others go on
            plain, cached = [plain[0], plain[2]], [cached[0], cached[2]]
            first_turn_tokens = cache.stats.prompt_tokens
            assert cache.stats.reused_tokens == 0
    later = cache.stats.prompt_tokens - first_turn_tokens
    assert cache.stats.reused_tokens > 0.7 * later  # only the new answer (+ one token) is prefilled


def test_reused_tokens_counted_exactly(tiny):
    """One row: the stored sequence is the prompt plus the sampled tokens that were fed back
    (all but the last), so the next turn reuses exactly len(prompt) + len(sample) - 1."""
    model, tokenizer = tiny
    cache = PrefixKVCache()
    prompt = chat(tokenizer, "Nobody listens to me at home.")
    (first,) = run(model, tokenizer, [prompt], cache)
    assert cache.stats.reused_tokens == 0 and cache.stats.prefilled_tokens == len(prompt)
    following = prompt + first.token_ids + tokenizer.encode("\nuser: yes\n", add_special_tokens=False)
    run(model, tokenizer, [following], cache)
    assert cache.stats.reused_tokens == len(prompt) + len(first.token_ids) - 1
    assert cache.stats.prefilled_tokens == len(prompt) + len(following) - cache.stats.reused_tokens


def test_greedy_equals_transformers_generate(tiny):
    model, tokenizer = tiny
    prompts = [chat(tokenizer, "Hello there."), chat(tokenizer, "I feel awful about what happened at work today.")]
    rows = run(model, tokenizer, prompts, PrefixKVCache(), temperature=0.0, limit=8)
    for prompt, row in zip(prompts, rows):
        out = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            generation_config=GenerationConfig(
                max_new_tokens=8,
                do_sample=False,
                eos_token_id=[tokenizer.eos_token_id],
                pad_token_id=tokenizer.pad_token_id,
            ),
        )
        assert out[0, len(prompt) :].tolist()[: len(row.token_ids)] == row.token_ids


def test_next_token_logits_with_and_without_reuse(tiny):
    model, tokenizer = tiny
    cache = PrefixKVCache()
    base = chat(tokenizer, "My brother borrowed money and never paid it back.")
    first = next_token_logits(model, [base], pad_id=tokenizer.pad_token_id, cache=cache)
    longer = [base + tokenizer.encode(" A", add_special_tokens=False), base[:-3]]
    with_reuse = next_token_logits(model, longer, pad_id=tokenizer.pad_token_id, cache=cache)
    without = next_token_logits(model, longer, pad_id=tokenizer.pad_token_id)
    assert first.shape == (1, model.config.vocab_size)
    assert torch.allclose(with_reuse, without, atol=1e-4)
    assert cache.stats.reused_tokens == len(base) + len(base) - 4


def test_cache_keeps_the_most_recent_within_its_budget():
    def layers(n):
        return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2))]

    cache = PrefixKVCache(max_tokens=10)
    cache.add([1, 2, 3], layers(3))
    cache.add([1, 2, 3, 4, 5], layers(5))  # covers [1, 2, 3]: that entry goes
    assert cache.tokens == 5 and len(cache.entries) == 1
    cache.add([7, 8, 9, 10], layers(4))
    assert cache.lookup([1, 2, 3, 4, 9])[0] == 4
    cache.add([20, 21, 22], layers(3))  # 12 tokens > 10: the least recently used goes ([7..10])
    assert cache.tokens == 8 and cache.lookup([7, 8, 9, 10, 11])[0] == 0
    assert cache.lookup([1, 2])[0] == 1  # the last prompt token is always computed
    with pytest.raises(ValueError, match="max_tokens"):
        PrefixKVCache(max_tokens=-1)


def test_bad_arguments(tiny):
    model, tokenizer = tiny
    with pytest.raises(ValueError, match="at least one token"):
        sample_batch(model, [[]], max_new_tokens=2, eos_ids=[0], pad_id=0, temperature=0.0)
    with pytest.raises(ValueError, match="one seed per row"):
        sample_batch(model, [[1, 2]], max_new_tokens=2, eos_ids=[0], pad_id=0, temperature=1.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sample_batch(model, [[1, 2]], max_new_tokens=0, eos_ids=[0], pad_id=0, temperature=0.0)
