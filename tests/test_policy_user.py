"""The simulated user on the policy's own weights (backend='policy'): its calls never see
the LoRA adapters, the policy's always do."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from peft import LoraConfig, get_peft_model

from empathy_gym.backends import make_backend
from empathy_gym.backends.models import load_causal_lm
from empathy_gym.backends.policy_backend import PolicyUserBackend
from empathy_gym.backends.transformers_backend import TransformersBackend

CONVERSATIONS = [
    [{"role": "system", "content": "You are Maya."}, {"role": "user", "content": "How do you feel?"}],
    [{"role": "user", "content": "Rate this reply: 'I hear you.'"}],
]


@pytest.fixture
def policy(tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float32", device="cpu")
    peft_model = get_peft_model(model, LoraConfig(r=8, lora_alpha=64, target_modules="all-linear"))
    with torch.no_grad():  # peft starts B at zero (adapters a no-op): make them matter
        for name, parameter in peft_model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5, generator=torch.Generator().manual_seed(len(name)))
    return peft_model.train(), tokenizer


def test_the_user_is_the_base_model_and_the_policy_keeps_its_adapters(policy, tiny_model_dir):
    peft_model, tokenizer = policy
    base, base_tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float32", device="cpu")
    plain = TransformersBackend(base, base_tokenizer)
    user = PolicyUserBackend(peft_model, tokenizer)
    ids = tokenizer.apply_chat_template(
        CONVERSATIONS[0], add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    with torch.no_grad():
        adapted_before = peft_model(input_ids=ids).logits
    for _ in range(2):  # the second time from the prefix cache
        assert user.generate(CONVERSATIONS, max_tokens=12, temperature=0.0) == plain.generate(
            CONVERSATIONS, max_tokens=12, temperature=0.0
        )
        assert torch.allclose(
            torch.tensor(user.choice_logprobs(CONVERSATIONS, ["A", "B"])),
            torch.tensor(plain.choice_logprobs(CONVERSATIONS, ["A", "B"])),
            atol=1e-5,
        )
    with torch.no_grad():
        adapted_after = peft_model(input_ids=ids).logits
        base_logits = base(input_ids=ids).logits
    assert torch.equal(adapted_before, adapted_after)  # adapters back on after every user call
    assert (adapted_after - base_logits).abs().max() > 1e-2  # and they do change the policy
    assert peft_model.training  # the trainer's mode is restored
    assert user.prefix_cache.stats.reused_tokens > 0


def test_policy_backend_needs_adapters_and_a_trainer(tiny_model_dir):
    model, tokenizer = load_causal_lm(str(tiny_model_dir), dtype="float32", device="cpu")
    with pytest.raises(ValueError, match="policy.use_lora=true"):
        PolicyUserBackend(model, tokenizer)
    with pytest.raises(ValueError, match="PolicyUserBackend") as refused:
        make_backend("policy")
    assert "recipe env.kwargs.user: policy" in str(refused.value)  # the recipe key that exists


# -- the trainer builds the user from its own policy (recipe env.kwargs.user: policy) ----
USER_OVERRIDES = [
    "policy.use_lora=true",
    "policy.lora_r=4",
    "rollout_batch_size=2",
    "total_steps=1",
    "progress=false",
    "env.kwargs.user.backend=policy",
    "env.kwargs.user.appraisal_mode=choice",
    "env.kwargs.user.user_kwargs.max_tokens=6",
    "env.kwargs.user.user_kwargs.reply_plan=false",
]


def test_a_policy_users_backend_options_are_checked_when_the_recipe_loads(tmp_path):
    """A typo reached TransformersBackend as a bare TypeError after the model had loaded
    (a newcomer's probe); now the recipe is refused, naming the field and what it takes."""
    from empathy_gym.agents.config import RecipeError, load_recipe

    base = [f"output_dir={tmp_path}", *USER_OVERRIDES]
    load_recipe("agents/tiny-cpu.yaml", [*base, "env.kwargs.user.backend_kwargs.max_batch_size=4"], algorithm="ppo")
    with pytest.raises(
        RecipeError,
        match=r"env.kwargs.user: unknown option\(s\) \['bogus'\]; the policy user's backend takes "
        r"chat_template, max_batch_size, prefix_cache_tokens with generation.engine transformers",
    ):
        load_recipe("agents/tiny-cpu.yaml", [*base, "env.kwargs.user.backend_kwargs.bogus=1"], algorithm="ppo")


def watch_adapters(trainer, user_methods):
    """Record, at every forward of one LoRA layer, who called (the user, the policy's
    sampler, or the update) and whether the adapters were off."""
    from peft.tuners.lora import LoraLayer

    layer = next(m for m in trainer.model.modules() if isinstance(m, LoraLayer))
    caller, seen = [], []
    layer.register_forward_pre_hook(
        lambda module, args: seen.append((caller[-1] if caller else "update", module.disable_adapters))
    )

    def tagged(owner, name, tag):
        method = getattr(owner, name)

        def call(*args, **kwargs):
            caller.append(tag)
            try:
                return method(*args, **kwargs)
            finally:
                caller.pop()

        setattr(owner, name, call)

    tagged(trainer.generator, "generate", "policy")
    for name in user_methods:
        tagged(trainer.envs[0].user.backend, name, "user")
    return seen


def check_user_never_sees_the_adapters(seen):
    assert {who for who, _ in seen} == {"user", "policy", "update"}
    assert {off for who, off in seen if who == "user"} == {True}
    assert {off for who, off in seen if who != "user"} == {False}


def run_policy_user(tmp_path, model, extra=()):
    from empathy_gym.agents import PPOTrainer, load_recipe

    config = load_recipe(
        "agents/tiny-cpu.yaml",
        [f"output_dir={tmp_path}", f"policy.model={model}", *USER_OVERRIDES, *extra],
        algorithm="ppo",
    )
    trainer = PPOTrainer(config)
    user = trainer.envs[0].user.backend
    assert isinstance(user, PolicyUserBackend) and user.model is trainer.model
    assert all(env.user is trainer.envs[0].user for env in trainer.envs)  # one user for the batch
    seen = watch_adapters(trainer, ["generate", "choice_logprobs"])
    (metrics,) = trainer.train()
    check_user_never_sees_the_adapters(seen)
    return trainer, metrics


def test_the_trainer_plays_against_its_own_base_model(tmp_path):
    trainer, metrics = run_policy_user(tmp_path, "tiny")
    assert metrics["episode/turns_mean"] > 0 and metrics["time/user"] > 0


@pytest.mark.slow
def test_smollm2_plays_the_user_on_its_own_base_weights(tmp_path):
    """SmolLM2-135M-Instruct trains with LoRA and plays the user with its adapters off
    (about a minute on two cores)."""
    trainer, metrics = run_policy_user(tmp_path, "smollm2", ["env.kwargs.personas=en", "generation.max_new_tokens=8"])
    assert metrics["episode/turns_mean"] > 0


def test_backend_policy_needs_lora_and_no_model_of_its_own():
    from empathy_gym.agents import RecipeError, load_recipe

    with pytest.raises(RecipeError, match="needs policy.use_lora=true"):
        load_recipe("agents/tiny-cpu.yaml", ["env.kwargs.user=policy"], algorithm="ppo")
    with pytest.raises(
        RecipeError, match="env.kwargs.user.model: backend 'policy' is served by the policy's own model"
    ):
        load_recipe(
            "agents/tiny-cpu.yaml",
            ["env.kwargs.user.backend=policy", "policy.use_lora=true", "env.kwargs.user.model=tiny"],
            algorithm="ppo",
        )


# -- vLLM: the user's requests go to the policy's engine without a LoRA request ------------
class FakeLLM:
    """A stand-in ``vllm.LLM`` (vLLM is not installed here). ``generate`` takes token
    prompts from both sides and records each call's LoRA request: the policy's sampling
    parameters ask for ``stop_token_ids``; the user's answer with a short text and, for
    choice scoring, log-probs of the allowed option tokens."""

    def __init__(self, model, **kwargs):
        from transformers import AutoTokenizer

        self.kwargs, self.requests, self.prompts = kwargs, [], []
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.llm_engine = types.SimpleNamespace(remove_lora=lambda lora_id: None)

    def get_tokenizer(self):
        return self.tokenizer

    def generate(self, inputs, params, lora_request=None, use_tqdm=False):
        self.prompts += [list(i["prompt_token_ids"]) for i in inputs]
        if hasattr(params[0], "stop_token_ids"):
            self.requests.append(("policy", lora_request))
            ids = self.tokenizer("I hear you.", add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            completion = types.SimpleNamespace(
                token_ids=ids, logprobs=[{t: types.SimpleNamespace(logprob=-1.0)} for t in ids]
            )
            return [types.SimpleNamespace(outputs=[completion]) for _ in inputs]
        self.requests.append(("user", lora_request))
        outputs = []
        for param in params:
            allowed = getattr(param, "allowed_token_ids", None) or []
            logprobs = [{t: types.SimpleNamespace(logprob=-1.0 - i) for i, t in enumerate(allowed)}]
            outputs.append(
                types.SimpleNamespace(outputs=[types.SimpleNamespace(text="Thanks, that helps.", logprobs=logprobs)])
            )
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


def test_with_vllm_the_user_shares_the_policys_engine_without_the_adapter(tmp_path, fake_vllm):
    from empathy_gym.agents import PPOTrainer, load_recipe
    from empathy_gym.backends.policy_backend import VLLMPolicyUserBackend

    config = load_recipe(
        "agents/tiny-cpu.yaml",
        [f"output_dir={tmp_path}", *USER_OVERRIDES, "generation.engine=vllm", "total_steps=2"],
        algorithm="ppo",
    )
    trainer = PPOTrainer(config)
    user = trainer.envs[0].user.backend
    assert isinstance(user, VLLMPolicyUserBackend) and user.llm is trainer.generator.llm  # one engine
    metrics = trainer.train()
    requests = trainer.generator.llm.requests
    assert {who for who, _ in requests} == {"policy", "user"}
    assert all(lora is None for who, lora in requests if who == "user")
    adapters = [lora for who, lora in requests if who == "policy"]
    assert all(lora is not None for lora in adapters) and {lora.lora_int_id for lora in adapters} == {2, 3}
    # vLLM rollouts: truncated importance sampling is on (cap 2); the stand-in's log-probs (-1)
    # are not the trainer's, and the mismatch shows it
    assert trainer.tis_cap == 2.0 and metrics[0]["sampler/kl"] > 0.01
    user.close()
    assert trainer.generator.llm is user.llm  # the engine is the generator's to close


def test_a_vllm_user_needs_a_lora_engine(fake_vllm):
    from empathy_gym.backends.policy_backend import VLLMPolicyUserBackend

    with pytest.raises(ValueError, match="needs a LoRA policy"):
        VLLMPolicyUserBackend(types.SimpleNamespace(lora_rank=0, llm=None))
