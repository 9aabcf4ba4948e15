"""Opt-in checks on a CUDA device (``pytest -m gpu``); skipped by default and without one."""

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_tiny_recipe_trains_on_the_gpu(tmp_path, algorithm):
    from empathy_gym.agents import TRAINERS, load_recipe

    config = load_recipe(
        "agents/tiny-cpu.yaml",
        [f"output_dir={tmp_path}", "total_steps=3", "progress=false", "policy.device=cuda", "policy.dtype=bfloat16"],
        algorithm=algorithm,
    )
    trainer = TRAINERS[algorithm](config)
    metrics = trainer.train()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert next(trainer.model.parameters()).device.type == "cuda"
    assert all(m["tokens/generated"] > 0 for m in metrics)


def test_transformers_user_backend_on_the_gpu():
    from empathy_gym.backends import make_backend

    backend = make_backend("transformers", model="tiny", device="cuda")
    texts = backend.generate([[{"role": "user", "content": "hi"}]] * 3, max_tokens=4, seeds=[1, 2, 1])
    assert len(texts) == 3 and texts[0] == texts[2]


def test_vllm_full_weight_sync_on_the_gpu(tiny_model_dir):
    """After ``sync`` vLLM samples from the trainer's weights: greedy tokens equal
    transformers' on the same (perturbed) weights."""
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from empathy_gym.agents.generation import TransformersGenerator, VLLMGenerator
    from empathy_gym.agents.rollout import ChatTokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).cuda()
    generator = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():
        for weight in model.parameters():
            weight.add_(torch.randn(weight.shape, generator=generator, device="cuda") * 0.05)
    prompt = ChatTokens(tokenizer).prompt([{"role": "user", "content": "hi"}])
    (expected,) = TransformersGenerator(model, tokenizer, max_new_tokens=8, temperature=0.0).generate([prompt], [1])
    vllm_generator = VLLMGenerator(
        str(tiny_model_dir),
        tokenizer,
        max_new_tokens=8,
        temperature=0.0,
        dtype="float32",
        gpu_memory_utilization=0.1,
        max_model_len=512,
    )
    (before,) = vllm_generator.generate([prompt], [1])
    vllm_generator.sync(model, step=1)
    (after,) = vllm_generator.generate([prompt], [1])
    assert after.token_ids == expected.token_ids and before.token_ids != expected.token_ids
