"""The simulated user on the policy's own weights (backend='policy'): its calls never see
the LoRA adapters, the policy's always do."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model

from empathy_gym.backends import make_backend
from empathy_gym.backends.policy_backend import PolicyUserBackend
from empathy_gym.backends.transformers_backend import TransformersBackend
from empathy_gym.models import load_causal_lm

CONVERSATIONS = [[{"role": "system", "content": "You are Maya."}, {"role": "user", "content": "How do you feel?"}],
                 [{"role": "user", "content": "Rate this reply: 'I hear you.'"}]]


@pytest.fixture
def policy(tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float32", device="cpu")
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=64, target_modules="all-linear"))
    with torch.no_grad():   # peft starts B at zero (adapters a no-op): make them matter
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return peft_model.train(), tokenizer


def test_the_user_is_the_base_model_and_the_policy_keeps_its_adapters(policy, tiny_model_dir):
    peft_model, tokenizer = policy
    base, base_tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float32", device="cpu")
    plain = TransformersBackend(base, base_tokenizer)
    user = PolicyUserBackend(peft_model, tokenizer)
    ids = tokenizer.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True, return_tensors="pt",
                                        return_dict=True)["input_ids"]
    with torch.no_grad():
        adapted_before = peft_model(input_ids=ids).logits
    for _ in range(2):   # the second time from the prefix cache
        assert user.generate(CONVERSATIONS, max_tokens=12, temperature=0.0) == \
            plain.generate(CONVERSATIONS, max_tokens=12, temperature=0.0)
        assert torch.allclose(torch.tensor(user.choice_logprobs(CONVERSATIONS, ["A", "B"])),
                              torch.tensor(plain.choice_logprobs(CONVERSATIONS, ["A", "B"])), atol=1e-5)
    with torch.no_grad():
        adapted_after = peft_model(input_ids=ids).logits
        base_logits = base(input_ids=ids).logits
    assert torch.equal(adapted_before, adapted_after)             # adapters back on after every user call
    assert (adapted_after - base_logits).abs().max() > 1e-2        # and they do change the policy
    assert peft_model.training                                     # the trainer's mode is restored
    assert user.prefix_cache.stats.reused_tokens > 0


def test_policy_backend_needs_adapters_and_a_trainer(tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="policy.use_lora=true"):
        PolicyUserBackend(model, tokenizer)
    with pytest.raises(ValueError, match="PolicyUserBackend"):
        make_backend("policy")
