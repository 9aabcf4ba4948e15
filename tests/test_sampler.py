"""The policy's samplers draw from the policy: the distribution whose log-probs the
loss takes, whatever the model's own ``generation_config`` says; a turn ends at every
end-of-turn id; vLLM's LoRA sync keeps one adapter on disk.

vLLM is not installed here: its generator runs against a stand-in ``vllm`` module that
records what it is given (the real engine is covered by the opt-in ``-m vllm`` tests).
"""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from empathy_gym.agents.generation import TransformersGenerator, VLLMGenerator
from empathy_gym.agents.rollout import ChatTokens, Sample
from empathy_gym.agents.tokens import TokenData, forward_tokens


def prompt_of(tokenizer):
    words = " ".join(["sad", "lonely", "tired", "hurt", "angry", "friend", "boss", "exam", "work", "home"] * 2)
    return ChatTokens(tokenizer).prompt([{"role": "system", "content": "s"}, {"role": "user", "content": words}])


def repeat_probability(model, prompt) -> float:
    """The policy's probability that the next token repeats a prompt token."""
    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1)
    return float(probs[torch.tensor(sorted(set(prompt)))].sum())


@pytest.fixture(scope="module")
def sharp(tiny_model_dir):
    """The tiny model with its (tied) embeddings scaled until about half of the next
    token's probability sits on tokens of the prompt, so that a repetition penalty moves
    real probability, and a generation_config like a shipped instruct model's with a
    strong repetition penalty."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    prompt = prompt_of(tokenizer)
    for scale in np.arange(2.0, 8.0, 0.25):
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
        with torch.no_grad():
            model.lm_head.weight.mul_(float(scale))
        if 0.3 < repeat_probability(model, prompt) < 0.9:
            break
    else:
        pytest.fail("no scale puts 0.3 to 0.9 of the probability on prompt tokens")
    model.generation_config.repetition_penalty = 3.0
    model.generation_config.top_k = 5
    model.generation_config.do_sample = True
    return model.eval(), tokenizer


def test_samples_come_from_the_policy_not_the_models_generation_config(sharp):
    """First tokens of 600 rows, one seed each: the share that repeats a prompt token
    matches the policy's probability of doing so, p(S) from softmax(logits), within 4
    binomial standard errors. Under the model's repetition_penalty=3.0 (the old
    sampler inherited it) that share falls far below p(S)."""
    model, tokenizer = sharp
    prompt = prompt_of(tokenizer)
    with torch.no_grad():
        logits = model(torch.tensor([prompt])).logits[0, -1].float()
    probs = torch.softmax(logits, -1)
    repeated = torch.zeros_like(probs, dtype=torch.bool)
    repeated[torch.tensor(sorted(set(prompt)))] = True
    p_repeat = float(probs[repeated].sum())
    penalised = torch.where(logits > 0, logits / 3.0, logits * 3.0)
    p_penalised = float(torch.softmax(torch.where(repeated, penalised, logits), -1)[repeated].sum())
    assert p_repeat - p_penalised > 0.2, "the set-up must make the penalty matter"
    n = 600
    samples = TransformersGenerator(model, tokenizer, max_new_tokens=1, max_batch_size=n).generate(
        [prompt] * n, list(range(n))
    )
    share = np.mean([s.token_ids[0] in set(prompt) for s in samples])
    assert abs(share - p_repeat) < 4 * np.sqrt(p_repeat * (1 - p_repeat) / n)
    assert model.generation_config.repetition_penalty == 3.0  # restored after generate


def test_recorded_logprobs_equal_the_trainers(sharp):
    model, tokenizer = sharp
    prompt = prompt_of(tokenizer)
    generator = TransformersGenerator(model, tokenizer, max_new_tokens=12, temperature=0.7)
    for sample in generator.generate([prompt, prompt], [3, 4]):
        ids = torch.tensor(prompt + sample.token_ids)
        mask = torch.zeros(len(ids) - 1, dtype=torch.bool)
        mask[len(prompt) - 1 :] = True
        data = TokenData(ids, mask, torch.zeros(int(mask.sum())), torch.zeros(int(mask.sum()), dtype=torch.long))
        with torch.no_grad():
            trainer = forward_tokens(model, [data], tokenizer.pad_token_id, torch.device("cpu"), 0.7).logprobs
        assert sample.logprobs == pytest.approx(trainer.tolist(), abs=1e-4)


def test_a_peft_wrapped_policy_ignores_the_generation_config_too(sharp):
    """peft copies the base model's generation_config at each generate call; the sampler
    is its own decoding loop, so a peft policy over the sharp model with its
    repetition_penalty=3.0 still records the trainer's log-probs, and the config is untouched."""
    from peft import LoraConfig, get_peft_model

    model, tokenizer = sharp
    policy = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj"], task_type="CAUSAL_LM"))
    try:
        prompt = prompt_of(tokenizer)
        (sample,) = TransformersGenerator(policy, tokenizer, max_new_tokens=6, temperature=0.7).generate([prompt], [5])
        ids = torch.tensor(prompt + sample.token_ids)
        mask = torch.zeros(len(ids) - 1, dtype=torch.bool)
        mask[len(prompt) - 1 :] = True
        data = TokenData(ids, mask, torch.zeros(int(mask.sum())), torch.zeros(int(mask.sum()), dtype=torch.long))
        with torch.no_grad():
            trainer = forward_tokens(policy, [data], tokenizer.pad_token_id, torch.device("cpu"), 0.7).logprobs
        assert sample.logprobs == pytest.approx(trainer.tolist(), abs=1e-4)
        assert policy.get_base_model().generation_config.repetition_penalty == 3.0
    finally:
        policy.unload()


def test_training_refuses_samplers_that_are_not_the_policy(tmp_path):
    from empathy_gym.agents import RecipeError, load_recipe

    with pytest.raises(RecipeError, match=r"top_p 0.9 would sample from the truncated nucleus"):
        load_recipe("agents/tiny-cpu.yaml", ["generation.top_p=0.9"], algorithm="ppo")
    with pytest.raises(RecipeError, match=r"temperature 0 \(greedy\) does not sample from the policy"):
        load_recipe("agents/tiny-cpu.yaml", ["generation.temperature=0"], algorithm="grpo")


# -- vLLM, against a stand-in module ---------------------------------------------------------
class FakeLLM:
    """Records the engine's arguments, its generate calls and LoRA removals; generate
    answers each prompt with ``replies`` in turn."""

    replies: list[list[int]] = []

    def __init__(self, **kwargs):
        self.kwargs, self.calls, self.removed = kwargs, [], []
        self.llm_engine = types.SimpleNamespace(remove_lora=self.removed.append)

    def generate(self, inputs, params, lora_request=None, use_tqdm=False):
        self.calls.append((inputs, params, lora_request))
        outputs = []
        for ids in FakeLLM.replies[: len(inputs)]:
            logprobs = [{token: types.SimpleNamespace(logprob=-0.5)} for token in ids]
            outputs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids, logprobs=logprobs)]))
        return outputs


@pytest.fixture
def fake_vllm(monkeypatch):
    vllm = types.ModuleType("vllm")
    vllm.LLM = FakeLLM
    vllm.SamplingParams = lambda **kwargs: types.SimpleNamespace(**kwargs)
    lora, request = types.ModuleType("vllm.lora"), types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda name, int_id, path: types.SimpleNamespace(
        lora_name=name, lora_int_id=int_id, lora_path=path
    )
    for name, module in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    return vllm


def test_vllm_turns_that_end_on_any_eos_id_of_the_generation_config_are_finished(tmp_path, tiny_model_dir, fake_vllm):
    """Qwen2.5's generation_config.json lists <|im_end|> and <|endoftext|>; vLLM stops at
    both, so a turn that ends on <|endoftext|> is finished (no end token appended)."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    im_end, endoftext = tokenizer.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    model_dir = tmp_path / "model"
    GenerationConfig(eos_token_id=[im_end, endoftext]).save_pretrained(model_dir)
    generator = VLLMGenerator(str(model_dir), tokenizer, max_new_tokens=8)
    assert generator.eos_ids == sorted([im_end, endoftext])
    FakeLLM.replies = [[11, 12, endoftext], [11, 12, im_end], [11, 12, 13]]
    samples = generator.generate([[1, 2]] * 3, [1, 2, 3])
    assert [s.finished for s in samples] == [True, True, False]
    assert sorted(generator.llm.calls[0][1][0].stop_token_ids) == sorted([im_end, endoftext])
    assert samples[0] == Sample([11, 12, endoftext], [-0.5] * 3, True)
    # budget forcing's phases ask for their own limits, for this call only
    FakeLLM.replies = [[11]]
    generator.generate([[1, 2]], [4], max_new_tokens=3)
    generator.generate([[1, 2]], [4])
    assert [call[1][0].max_tokens for call in generator.llm.calls[1:]] == [3, 8]


def test_vllm_lora_sync_keeps_one_adapter_on_disk_in_bfloat16(tmp_path, tiny_model_dir, fake_vllm):
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors import safe_open

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    policy = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    generator = VLLMGenerator(str(tiny_model_dir), tokenizer, lora_rank=4, dtype="bfloat16")
    folder = Path(generator._adapter_dir)

    def disk_use() -> int:
        return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())

    sizes, requests = [], []
    for step in range(1, 6):
        with torch.no_grad():
            for name, weight in policy.named_parameters():
                if "lora_B" in name:
                    weight.add_(0.01 * step)
        generator.sync(policy, step)
        sizes.append(disk_use())
        requests.append(generator._lora_request)
    assert sizes[0] > 0 and sizes == [sizes[0]] * 5
    assert len({r.lora_path for r in requests}) == 1 and len({r.lora_int_id for r in requests}) == 5
    assert generator.llm.removed == [r.lora_int_id for r in requests[:-1]]
    path = Path(requests[-1].lora_path)
    with safe_open(str(path / "adapter_model.safetensors"), "pt") as adapter:
        assert {adapter.get_tensor(key).dtype for key in adapter.keys()}  # noqa: SIM118 (safe_open is no dict) == {torch.bfloat16}
    # what vLLM reads back is the policy's current adapter (to bfloat16's precision)
    loaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), str(path))
    current = {k: v for k, v in policy.state_dict().items() if "lora_" in k}
    for key, value in loaded.state_dict().items():
        if "lora_" in key:
            assert torch.allclose(value.float(), current[key].float(), atol=1e-2, rtol=1e-2)


def test_a_vllm_engine_that_returns_no_logprobs_is_an_error_not_zeros(tiny_model_dir, fake_vllm):
    """Zeros as the sampler's log-probs made every importance weight exp(logp_new) < 1."""
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    generator = VLLMGenerator(str(tiny_model_dir), tokenizer, max_new_tokens=8)
    FakeLLM.replies = [[11, 12, 13]]
    original = FakeLLM.generate

    def without_logprobs(self, inputs, params, **kwargs):
        outputs = original(self, inputs, params, **kwargs)
        for output in outputs:
            output.outputs[0].logprobs = None
        return outputs

    FakeLLM.generate = without_logprobs
    try:
        with pytest.raises(RuntimeError, match=r"returned 0 log-probabilities for 3 sampled tokens"):
            generator.generate([[1, 2]], [1])
    finally:
        FakeLLM.generate = original
