"""The log-prob pass without full-vocabulary logits: the output head runs only at the
trainable positions, a chunk at a time, and gives the numbers of the plain computation
(the causal LM's own logits, then log-softmax); passes without gradients compute no
entropy."""

from __future__ import annotations

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

from empathy_gym.agents.tokens import (
    TokenData,
    chunked_logprobs,
    collate,
    forward_tokens,
    split_causal_lm,
    token_logprobs,
)

VOCAB = 300


def model(lora: bool = False):
    torch.manual_seed(0)
    lm = Qwen2ForCausalLM(
        Qwen2Config(
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=VOCAB,
            tie_word_embeddings=False,
        )
    )
    if not lora:
        return lm
    peft_model = get_peft_model(lm, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.3)
    return peft_model


def batch():
    generator = torch.Generator().manual_seed(1)
    out = []
    for length in (23, 17, 30):
        ids = torch.randint(0, VOCAB, (length,), generator=generator)
        mask = torch.rand(length - 1, generator=generator) > 0.5
        n = int(mask.sum())
        out.append(TokenData(ids, mask, torch.zeros(n), torch.zeros(n, dtype=torch.long)))
    return out


def plain(m, data, temperature):
    ids, attention, targets = collate(data, 0, torch.device("cpu"))
    logits = m(input_ids=ids, attention_mask=attention).logits
    return token_logprobs(logits, ids, targets, temperature)


@pytest.mark.parametrize("lora", [False, True])
@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_log_probs_entropy_and_gradients_equal_the_plain_computation(lora, chunk):
    m, data = model(lora), batch()
    out = forward_tokens(m, data, 0, torch.device("cpu"), 0.7, chunk_tokens=chunk)
    (out.logprobs.sum() + 0.1 * out.entropy.sum()).backward()
    chunked = {n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None}
    m.zero_grad()
    logprobs, entropy = plain(m, data, 0.7)
    (logprobs.sum() + 0.1 * entropy.sum()).backward()
    assert len(out.logprobs) == sum(d.num_trainable for d in data) > 20
    assert torch.allclose(out.logprobs, logprobs, atol=1e-5)
    assert torch.allclose(out.entropy, entropy, atol=1e-5)
    assert chunked and all(
        torch.allclose(p.grad, chunked[n], atol=1e-5) for n, p in m.named_parameters() if p.grad is not None
    )


def test_the_head_sees_one_chunk_of_trainable_positions_and_the_full_logits_are_never_built(monkeypatch):
    m, data = model(lora=True), batch()
    backbone, head = split_causal_lm(m)
    rows = []
    head.register_forward_hook(lambda module, args, output: rows.append(args[0].shape[0]))
    lm = m.get_base_model()
    monkeypatch.setattr(type(lm), "forward", lambda *a, **k: pytest.fail("the causal LM's own forward ran"))
    out = forward_tokens(m, data, 0, torch.device("cpu"), 1.0, chunk_tokens=8)
    out.logprobs.sum().backward()  # the backward pass recomputes each chunk once more
    n = sum(d.num_trainable for d in data)
    assert max(rows) == 8 and sum(rows) == 2 * n


def test_without_gradients_no_entropy_is_computed():
    m, data = model(), batch()
    with torch.no_grad():
        out = forward_tokens(m, data, 0, torch.device("cpu"), 1.0, entropy=False)
    assert out.entropy is None
    with torch.no_grad():
        logprobs, _ = plain(m, data, 1.0)
    assert torch.allclose(out.logprobs, logprobs, atol=1e-5)


def test_the_trainer_asks_for_entropy_only_where_gradients_flow(tmp_path, tiny_model_dir):
    from empathy_gym.agents import GRPOTrainer, load_recipe
    from empathy_gym.agents.rollout import Trajectory
    from empathy_gym.agents.tokens import to_token_data

    config = load_recipe(
        "agents/tiny-cpu.yaml",
        [f"output_dir={tmp_path}", "rollout_batch_size=4", "progress=false", "entropy_coef=0.0"],
        algorithm="grpo",
    )
    trainer = GRPOTrainer(config)
    t = Trajectory(
        key=0,
        group=0,
        env_seed=0,
        persona_id="p",
        language="en",
        hidden_intention="x",
        character_type="passive",
        emotions=[40],
    )
    t.extend([5, 6, 7], trainable=False)
    t.extend([8, 9, 10], trainable=True, logprobs=[-1.0] * 3)
    t.turn_ends.append(5)
    t.rewards.append(0.1)
    data = [to_token_data(t)]
    with torch.no_grad():
        assert trainer.forward(trainer.model, data).entropy is None
    out = trainer.forward(trainer.model, data)
    assert out.entropy is not None and not out.entropy.requires_grad  # entropy_coef 0: a statistic only
    assert out.logprobs.requires_grad


def test_a_bad_chunk_size_is_refused():
    with pytest.raises(ValueError, match="chunk_tokens must be >= 1"):
        chunked_logprobs(torch.zeros(2, 4), torch.zeros(2, dtype=torch.long), torch.nn.Linear(4, 5), chunk_tokens=0)
