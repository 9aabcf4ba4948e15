"""Opt-in checks on a CUDA device (``pytest -m gpu``); skipped by default and without one."""

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")]


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_tiny_recipe_trains_on_the_gpu(tmp_path, algorithm):
    from empathy_gym.agents import TRAINERS, load_recipe
    config = load_recipe("agents/tiny-cpu.yaml", [f"output_dir={tmp_path}", "total_steps=3", "progress=false",
                                                  "policy.device=cuda", "policy.dtype=bfloat16"],
                         algorithm=algorithm)
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
