"""The memory plan (empathy_gym.agents.memory), checked against parameter counts worked out by hand."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from empathy_gym.agents import load_recipe
from empathy_gym.agents.memory import GIB, DecoderShape, MemoryPlanError, plan_memory

# Qwen2.5-7B-Instruct's config.json: hidden 3584, intermediate 18944, 28 layers, 28 heads,
# 4 key/value heads, vocab 152064, untied embeddings, q/k/v biases.
QWEN7B = SimpleNamespace(
    model_type="qwen2",
    hidden_size=3584,
    intermediate_size=18944,
    num_hidden_layers=28,
    num_attention_heads=28,
    num_key_value_heads=4,
    vocab_size=152064,
    tie_word_embeddings=False,
)
SMOLLM2 = SimpleNamespace(
    model_type="llama",
    hidden_size=576,
    intermediate_size=1536,
    num_hidden_layers=30,
    num_attention_heads=9,
    num_key_value_heads=3,
    vocab_size=49152,
    tie_word_embeddings=True,
)
H200 = 141 * GIB


def test_parameter_counts_by_hand():
    qwen = DecoderShape.from_config(QWEN7B)
    # per layer: q 3584^2+3584, k and v 3584*512+512 each, o 3584^2, MLP 3*3584*18944, 2 norms
    per_layer = (3584**2 + 3584) + 2 * (3584 * 512 + 512) + 3584**2 + 3 * 3584 * 18944 + 2 * 3584
    assert per_layer == 233_057_792
    assert qwen.parameters() == 28 * per_layer + 2 * 152064 * 3584 + 3584 == 7_615_616_512  # the published 7.62 B
    # LoRA r=64 on every projection: 64 * (in + out) summed over q,k,v,o,gate,up,down = 64 * 90112 per layer
    assert qwen.lora_parameters(64) == 28 * 64 * 90112 == 161_480_704  # 0.65 GB in float32
    assert qwen.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 57_344
    smol = DecoderShape.from_config(SMOLLM2)
    assert smol.parameters() == 134_515_008  # SmolLM2-135M
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
    assert "(CUDA context, fragmentation, workspaces)" in plan.table()
    on_cpu = plan_memory(config, shape, capacity=H200, device="cpu", logprob_chunk_tokens=1024).table()
    assert "headroom" in on_cpu and "CUDA" not in on_cpu  # a newcomer's CPU plan spoke of a CUDA context
    full = load_recipe("agents/qwen2.5-7b-ppo.yaml", ["policy.use_lora=false"], algorithm="ppo")
    with pytest.raises(MemoryPlanError, match="policy.use_lora=true"):
        plan_memory(full, shape, capacity=H200, device="cuda:0").check()


def test_a_config_without_sizes_is_a_clear_error():
    with pytest.raises(ValueError, match="hidden_size"):
        DecoderShape.from_config(SimpleNamespace(num_attention_heads=2))


def saved_bytes_per_token_and_layer(checkpointing: bool) -> float:
    """What autograd keeps for one Qwen2 layer per token (bf16 weights, LoRA, autocast),
    measured: saved tensors of a 2-layer minus a 1-layer model, parameters excluded."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def saved(layers: int) -> int:
        torch.manual_seed(0)
        model = Qwen2ForCausalLM(Qwen2Config(**SMALL, num_hidden_layers=layers)).to(torch.bfloat16)
        model = get_peft_model(model, LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM"))
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            model.enable_input_require_grads()
        model.train()
        storages: dict[int, int] = {}

        def pack(tensor):
            storage = tensor.untyped_storage()
            storages[storage.data_ptr()] = max(storages.get(storage.data_ptr(), 0), storage.nbytes())
            return tensor

        with (
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
            torch.autocast("cpu", dtype=torch.bfloat16),
        ):
            model.get_base_model().model(input_ids=torch.randint(0, 512, (1, TOKENS)), use_cache=False)
        weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
        return sum(size for pointer, size in storages.items() if pointer not in weights)

    return (saved(2) - saved(1)) / TOKENS


# Qwen2.5-7B's proportions at a small width: head_dim 64, 8:1 query to key/value heads'
# ratio kept at 4:2 here, intermediate / hidden = 5.29 as 18944 / 3584
SMALL = dict(
    hidden_size=256,
    intermediate_size=1354,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    attn_implementation="sdpa",
)
TOKENS = 256


def test_the_activation_count_matches_what_autograd_saves():
    """The plan's per-token count of a layer's activations against the bytes autograd
    keeps, measured on a small Qwen2 in bfloat16 with LoRA (the old plan used a GPT
    layer's 34h bytes, 8,704 here, about half of what is measured)."""
    from empathy_gym.agents.memory import activation_bytes_per_token

    shape = DecoderShape.from_config(SimpleNamespace(model_type="qwen2", num_hidden_layers=1, **SMALL))
    planned = activation_bytes_per_token(shape, 2)
    measured = saved_bytes_per_token_and_layer(checkpointing=False)
    assert planned == 17_488
    assert measured == pytest.approx(planned, rel=0.15)
    # with checkpointing each layer keeps only its bf16 input, 2h bytes
    assert saved_bytes_per_token_and_layer(checkpointing=True) == pytest.approx(2 * 256, rel=0.05)


def test_the_transformers_engine_rows_by_hand():
    """16 dialogues x 4 turns, 128-token replies on the transformers engine with the
    user on the policy's weights (the GPU check's recipe)."""
    config = load_recipe(
        "agents/qwen2.5-7b-ppo.yaml",
        [
            "rollout_batch_size=16",
            "generation.engine=transformers",
            "generation.max_new_tokens=128",
            "generation.max_context_tokens=4096",
        ],
        algorithm="ppo",
    )
    # set whole: overrides would merge into the recipe's openai user, whose max_concurrency
    # the policy user does not take (refused at load since stop 45; it was a TypeError in the trainer)
    config.env.kwargs["user"] = {
        "backend": "policy",
        "backend_kwargs": {"prefix_cache_tokens": 8192, "max_batch_size": 16},
    }
    rows = {name: size for name, size, _ in plan_memory(config, DecoderShape.from_config(QWEN7B)).rows}
    assert rows["generation KV cache"] == 16 * 4096 * 57_344
    assert rows["generation logits kept"] == 16 * 128 * 152064 * 4 * 2
    assert rows["simulated user (policy's base weights)"] == (8192 + 16 * 4096) * 57_344
    assert rows["log-prob pass over the vocabulary"] == 1024 * 152064 * 14


def test_the_trainer_prints_the_plan_and_refuses_before_loading(tmp_path, monkeypatch, caplog):
    import empathy_gym.agents.trainer as trainer_module
    import empathy_gym.backends.models
    from empathy_gym.agents import PPOTrainer

    def no_loading(*args, **kwargs):
        raise AssertionError("the weights were loaded before the plan was checked")

    monkeypatch.setattr(trainer_module, "device_capacity", lambda device, processes=1: (50 * 2**20, "small"))
    monkeypatch.setattr(empathy_gym.backends.models, "load_causal_lm", no_loading)
    config = load_recipe("agents/tiny-cpu.yaml", [f"output_dir={tmp_path}"], algorithm="ppo")
    with caplog.at_level("INFO"), pytest.raises(MemoryPlanError, match=r"needs about .* GiB but small has 0.0 GiB"):
        PPOTrainer(config)
    assert "memory plan (small)" in caplog.text and "generation KV cache" in caplog.text
    monkeypatch.undo()
    monkeypatch.setattr(trainer_module, "device_capacity", lambda device, processes=1: (50 * 2**20, "small"))
    run = PPOTrainer(
        load_recipe(
            "agents/tiny-cpu.yaml",
            [f"output_dir={tmp_path}", "policy.check_memory=false", "total_steps=0"],
            algorithm="ppo",
        )
    )
    run.train()
    assert "memory plan (small)" in (tmp_path / "memory_plan.txt").read_text()


def test_the_cli_reports_a_plan_that_does_not_fit(tmp_path, monkeypatch, capsys):
    import empathy_gym.agents.memory as memory
    from empathy_gym.agents.cli import train_main

    real = memory.device_capacity
    monkeypatch.setattr(memory, "device_capacity", lambda device, processes=1: (2**20, "tiny device"))
    import empathy_gym.agents.trainer as trainer_module

    monkeypatch.setattr(trainer_module, "device_capacity", memory.device_capacity)
    assert train_main("ppo", ["--recipe", "agents/tiny-cpu.yaml", f"output_dir={tmp_path}"]) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert "tiny device" in err
    # the remedies name max_new_tokens (was: max_new_tokens=100000 was refused without naming it)
    assert "a smaller rollout_batch_size, generation.max_new_tokens or generation.max_context_tokens" in err
    assert real("cpu")[0] > 2**30
