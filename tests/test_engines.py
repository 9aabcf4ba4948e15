"""The policy's sampler engines are one table (empathy_gym/agents/engines.py): what the
trainer, the recipe check, the memory plan and the sampler-mismatch correction know of an
engine is read from its entry, never from its name. Each test changes an entry and sees
every reader follow."""

from __future__ import annotations

import dataclasses

import pytest
from test_memory_plan import SMOLLM2  # the decoder shapes of that file's plans

from empathy_gym.agents import load_recipe
from empathy_gym.agents.config import RecipeError
from empathy_gym.agents.engines import ENGINES, policy_user_options, sampler_engine
from empathy_gym.agents.memory import DecoderShape, plan_memory
from empathy_gym.agents.mismatch import resolve_tis_cap


class OtherPolicyUser:
    @staticmethod
    def options() -> set[str]:
        return {"temperature_of_the_user"}


def test_an_unknown_engine_names_the_field_and_the_known_ones():
    with pytest.raises(ValueError, match=r"generation.engine: unknown engine 'sglang'; known: transformers, vllm"):
        sampler_engine("sglang")
    with pytest.raises(ValueError, match="unknown engine 'sglang'"):
        resolve_tis_cap(None, "sglang")


def test_the_default_tis_cap_is_the_engines(monkeypatch):
    assert resolve_tis_cap(None, "vllm") == 2.0
    monkeypatch.setitem(ENGINES, "vllm", dataclasses.replace(ENGINES["vllm"], tis_cap=1.5))
    assert resolve_tis_cap(None, "vllm") == 1.5
    assert resolve_tis_cap(3.0, "vllm") == 3.0  # the recipe's cap wins


def test_several_processes_follow_the_engines_entry(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    overrides = ["rollout_batch_size=8", "num_generations=2", "generation.engine=vllm"]
    with pytest.raises(RecipeError, match=r"several processes need generation.engine='transformers' \(vllm: one"):
        load_recipe("agents/tiny-cpu.yaml", overrides, algorithm="grpo")
    monkeypatch.setitem(ENGINES, "vllm", dataclasses.replace(ENGINES["vllm"], several_processes=True))
    assert load_recipe("agents/tiny-cpu.yaml", overrides, algorithm="grpo").generation.engine == "vllm"


def test_the_memory_plan_counts_the_kv_cache_where_the_engine_keeps_it(monkeypatch):
    config = load_recipe("agents/tiny-cpu.yaml", ["generation.engine=vllm"], algorithm="ppo")
    shape = DecoderShape.from_config(SMOLLM2)
    rows = {name for name, _, _ in plan_memory(config, shape, capacity=80 * 2**30).rows}
    assert "vLLM (its share of the device)" in rows and "generation KV cache" not in rows
    monkeypatch.setitem(ENGINES, "vllm", dataclasses.replace(ENGINES["vllm"], kv_in_process=True))
    rows = {name for name, _, _ in plan_memory(config, shape, capacity=80 * 2**30).rows}
    assert "generation KV cache" in rows and "vLLM (its share of the device)" not in rows


def test_the_policy_users_options_are_its_classes(monkeypatch):
    assert policy_user_options("vllm") == {"chat_template"}
    assert "prefix_cache_tokens" in policy_user_options("transformers")
    assert "model" not in policy_user_options("transformers")
    monkeypatch.setitem(
        ENGINES, "vllm", dataclasses.replace(ENGINES["vllm"], policy_user=f"{__name__}:OtherPolicyUser")
    )
    assert policy_user_options("vllm") == {"temperature_of_the_user"}
