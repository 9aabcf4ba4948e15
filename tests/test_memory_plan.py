"""The memory plan (empathy_gym.agents.memory), checked against parameter counts worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from empathy_gym.agents import load_recipe
from empathy_gym.agents.memory import GIB, DecoderShape, MemoryPlanError, plan_memory

# Qwen2.5-7B-Instruct's config.json: hidden 3584, intermediate 18944, 28 layers, 28 heads,
# 4 key/value heads, vocab 152064, untied embeddings, q/k/v biases.
QWEN7B = SimpleNamespace(model_type="qwen2", hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                         num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                         tie_word_embeddings=False)
SMOLLM2 = SimpleNamespace(model_type="llama", hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                          num_attention_heads=9, num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True)
H200 = 141 * GIB


def test_parameter_counts_by_hand():
    qwen = DecoderShape.from_config(QWEN7B)
    # per layer: q 3584^2+3584, k and v 3584*512+512 each, o 3584^2, MLP 3*3584*18944, 2 norms
    per_layer = (3584 ** 2 + 3584) + 2 * (3584 * 512 + 512) + 3584 ** 2 + 3 * 3584 * 18944 + 2 * 3584
    assert per_layer == 233_057_792
    assert qwen.parameters() == 28 * per_layer + 2 * 152064 * 3584 + 3584 == 7_615_616_512   # the published 7.62 B
    # LoRA r=64 on every projection: 64 * (in + out) summed over q,k,v,o,gate,up,down = 64 * 90112 per layer
    assert qwen.lora_parameters(64) == 28 * 64 * 90112 == 161_480_704          # 0.65 GB in float32
    assert qwen.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 57_344
    smol = DecoderShape.from_config(SMOLLM2)
    assert smol.parameters() == 134_515_008                                     # SmolLM2-135M
    assert smol.kv_bytes_per_token(4) == 46_080
    assert smol.lora_parameters(8, ["q_proj", "v_proj"]) == 30 * 8 * ((576 + 576) + (576 + 192))


def test_the_qwen_lora_recipe_fits_one_h200_and_full_fine_tuning_does_not():
    config = load_recipe("agents/qwen2.5-7b-ppo.yaml", algorithm="ppo")
    shape = DecoderShape.from_config(QWEN7B)
    plan = plan_memory(config, shape, capacity=H200, device="cuda:0", logprob_chunk_tokens=1024)
    rows = {name: size for name, size, _ in plan.rows}
    assert rows["policy weights (frozen)"] == 7_615_616_512 * 2
    assert rows["LoRA adapters + grads + AdamW"] == 161_480_704 * 16
    plan.check()
    assert "headroom" in plan.table()
    full = load_recipe("agents/qwen2.5-7b-ppo.yaml", ["policy.use_lora=false"], algorithm="ppo")
    with pytest.raises(MemoryPlanError, match="policy.use_lora=true"):
        plan_memory(full, shape, capacity=H200, device="cuda:0").check()


def test_a_config_without_sizes_is_a_clear_error():
    with pytest.raises(ValueError, match="hidden_size"):
        DecoderShape.from_config(SimpleNamespace(num_attention_heads=2))
