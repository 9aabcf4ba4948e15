"""The trainer loop: resume gives the same parameters, Ctrl-C keeps everything finished."""

import json
import os
import signal

import pytest
import torch

from empathy_gym.agents import GRPOTrainer, PPOTrainer, load_recipe
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.personas import load_personas
from empathy_gym.user.scripted import ScriptedUser

OVERRIDES = ["rollout_batch_size=4", "generation.max_new_tokens=6", "progress=false", "save_steps=2",
             "num_ppo_epochs=2", "num_mini_batches=2", "learning_rate=1e-2"]


def word_user(**hooks):
    """Change = (number of letters 'e' in the reply, at most 10) - 3: deterministic, varied
    across samples (so GRPO groups have variance) and learnable."""
    def change(request):
        for hook in hooks.values():
            hook(request)
        return min(10, request.utterance.count("e")) - 3
    return ScriptedUser(change_fn=change)


def envs(user, n=4):
    bank = load_personas("en")[:6]
    return [EmpathyDialogueEnv(bank, user=user, max_turns=2) for _ in range(n)]


def trainer(tmp_path, algorithm, name, total, user=None, extra=()):
    config = load_recipe("agents/tiny-cpu.yaml", OVERRIDES + [f"output_dir={tmp_path / name}",
                                                               f"total_steps={total}", *extra],
                         algorithm=algorithm)
    cls = PPOTrainer if algorithm == "ppo" else GRPOTrainer
    return cls(config, envs=envs(user or word_user()))


def parameters(t):
    state = {f"policy.{k}": v.detach().clone() for k, v in t.model.state_dict().items()}
    if hasattr(t, "value_head"):
        state.update({f"value.{k}": v.detach().clone() for k, v in t.value_head.state_dict().items()})
    return state


@pytest.mark.parametrize("algorithm,extra", [("ppo", ()), ("grpo", ("num_generations=2",))])
def test_resume_gives_the_same_parameters_as_an_uninterrupted_run(tmp_path, algorithm, extra):
    straight = trainer(tmp_path, algorithm, "straight", 4, extra=extra)
    straight.train()
    first_half = trainer(tmp_path, algorithm, "halves", 2, extra=extra)
    first_half.train()
    assert (tmp_path / "halves" / "checkpoints" / "latest").read_text().strip() == "step-000002"
    second_half = trainer(tmp_path, algorithm, "halves", 4, extra=extra)
    second_half.train(resume=True)
    a, b = parameters(straight), parameters(second_half)
    assert a.keys() == b.keys()
    changed = [k for k in a if not torch.equal(a[k], b[k])]
    assert changed == []
    # the run really trained: parameters moved away from the initial ones
    initial = parameters(trainer(tmp_path, algorithm, "fresh", 1, extra=extra))
    assert any(not torch.equal(a[k], initial[k]) for k in a)
    read = lambda name: [(r["step"], r["persona_id"], r["rewards"]) for r in map(
        json.loads, (tmp_path / name / "episodes.jsonl").read_text().splitlines())]
    assert read("straight") == read("halves")
    metrics = [json.loads(l) for l in (tmp_path / "halves" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert (tmp_path / "halves" / "curves.png").stat().st_size > 0
    assert len(list((tmp_path / "halves" / "transcripts").glob("step-*.txt"))) == 4


def test_ctrl_c_mid_rollout_keeps_finished_episodes_and_the_last_checkpoint(tmp_path):
    calls = {"n": 0}

    def interrupt_in_step_3(request):
        calls["n"] += 1
        # steps have 4 dialogues x 2 turns = 8 user calls; call 17 is in step 3
        if calls["n"] == 17:
            os.kill(os.getpid(), signal.SIGINT)

    run = trainer(tmp_path, "ppo", "run", 10, user=word_user(hook=interrupt_in_step_3),
                  extra=("save_steps=0",))
    run.train()
    assert run.step == 2
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-000002"
    steps = [json.loads(l)["step"] for l in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    # steps 1 and 2 complete; step 3's dialogues that had ended before the stop are on disk too
    assert steps.count(1) == 4 and steps.count(2) == 4 and set(steps) <= {1, 2, 3}
    resumed = trainer(tmp_path, "ppo", "run", 4)
    resumed.train(resume=True)
    assert resumed.step == 4
    steps = [json.loads(l)["step"] for l in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert steps == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4   # step 3's partial episodes were replaced


def test_fresh_run_refuses_a_used_output_dir(tmp_path):
    trainer(tmp_path, "ppo", "used", 1).train()
    with pytest.raises(FileExistsError, match="--resume"):
        trainer(tmp_path, "ppo", "used", 1).train()


def test_separate_critic_lora_kl_and_gradient_checkpointing(tmp_path):
    run = trainer(tmp_path, "ppo", "critic", 2, extra=(
        "policy.use_lora=true", "policy.lora_r=4", "critic=separate", "kl_coef=0.1",
        "policy.gradient_checkpointing=true", "critic_learning_rate=1e-2"))
    critic_before = {k: v.clone() for k, v in run.critic_model.named_parameters() if v.requires_grad}
    base_before = {k: v.clone() for k, v in run.model.named_parameters() if not v.requires_grad}
    metrics = run.train()
    # Step 1: LoRA's B matrices start at zero, so the policy equals the reference exactly.
    assert metrics[0]["policy/kl_to_reference"] == 0.0
    assert metrics[1]["policy/kl_to_reference"] != 0.0
    # The reference is the base with adapters off: no copy, and the base never moves.
    assert run.reference is None
    assert all(torch.equal(v, base_before[k]) for k, v in run.model.named_parameters() if not v.requires_grad)
    # The separate critic trained its own adapters.
    assert any(not torch.equal(v, critic_before[k]) for k, v in run.critic_model.named_parameters()
               if v.requires_grad)
    # and the checkpoint holds them
    resumed = trainer(tmp_path, "ppo", "critic", 2, extra=(
        "policy.use_lora=true", "policy.lora_r=4", "critic=separate", "kl_coef=0.1",
        "policy.gradient_checkpointing=true", "critic_learning_rate=1e-2"))
    resumed.load(tmp_path / "critic" / "checkpoints" / "step-000002")
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(run.critic_model.named_parameters(),
                                                           resumed.critic_model.named_parameters()))


def test_full_fine_tuning_reference_is_a_frozen_copy(tmp_path):
    run = trainer(tmp_path, "grpo", "fullkl", 3, extra=("num_generations=4", "beta=0.1"))
    initial = {k: v.clone() for k, v in run.model.state_dict().items()}
    metrics = run.train()
    kls = [m["policy/kl_to_reference"] for m in metrics if m["grpo/skipped_groups"] == 0]
    assert kls and all(kl >= 0.0 for kl in kls) and max(kls) > 0.0   # k3 is never negative
    assert all(torch.equal(v, initial[k]) for k, v in run.reference.state_dict().items())
    assert any(not torch.equal(v, initial[k]) for k, v in run.model.state_dict().items())
    assert not any(p.requires_grad for p in run.reference.parameters())


def test_bfloat16_full_fine_tuning_trains_float32_master_weights(tmp_path):
    """Adam's first step moves a weight by lr * g / (|g| + eps) (Kingma & Ba 2015, Alg. 1):
    by lr = 1e-6 wherever |g| >> eps = 1e-8, never more. Stored in bfloat16 such a step
    rounds away (the spacing near 0.02 is 2^-13 ~ 1.2e-4); the trainer keeps float32
    master weights and computes in bfloat16 under autocast."""
    run = trainer(tmp_path, "ppo", "bf16", 1, extra=(
        "policy.dtype=bfloat16", "policy.use_lora=false", "learning_rate=1e-6",
        "critic_learning_rate=1e-6", "num_ppo_epochs=1", "num_mini_batches=1"))
    assert run.compute_dtype == torch.bfloat16
    assert {p.dtype for p in run.model.parameters()} == {torch.float32}
    before = {k: v.detach().clone() for k, v in run.model.named_parameters()}
    run.train()
    delta = torch.cat([(p.detach() - before[k]).abs().flatten() for k, p in run.model.named_parameters()])
    rounding = torch.cat([v.abs().flatten() for v in before.values()]) * torch.finfo(torch.float32).eps
    assert bool((delta <= 1e-6 + rounding).all())  # rounding: float32's own spacing at |w|
    assert (delta > 0.5e-6).float().mean() > 0.5


def test_bfloat16_lora_keeps_the_base_in_bfloat16_and_the_adapters_in_float32(tmp_path):
    run = trainer(tmp_path, "grpo", "bf16lora", 1, extra=(
        "policy.dtype=bfloat16", "policy.use_lora=true", "policy.lora_r=4", "num_generations=2"))
    trainable = {p.dtype for p in run.model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in run.model.parameters() if not p.requires_grad}
    assert trainable == {torch.float32} and frozen == {torch.bfloat16}
    adapters = {k: v.detach().clone() for k, v in run.model.named_parameters() if v.requires_grad}
    run.train()
    assert any(not torch.equal(v, adapters[k]) for k, v in run.model.named_parameters() if v.requires_grad)


def test_configs_built_in_python_are_checked_too(tmp_path):
    from empathy_gym.agents import GRPOConfig, PPOConfig, RecipeError
    from empathy_gym.models import load_causal_lm
    model, tokenizer = load_causal_lm("tiny")
    with pytest.raises(RecipeError, match=r"learning_rate must be > 0, got -1.0"):
        GRPOTrainer(args=GRPOConfig(learning_rate=-1.0), model=model, processing_class=tokenizer)
    with pytest.raises(TypeError, match=r"GRPOTrainer needs a GRPOConfig, got a PPOConfig"):
        GRPOTrainer(args=PPOConfig(), model=model, processing_class=tokenizer)


def test_a_bad_env_value_is_a_recipe_error(tmp_path):
    from empathy_gym.agents import RecipeError
    config = load_recipe("agents/tiny-cpu.yaml", [f"output_dir={tmp_path}", "env.kwargs.reward_mode=bogus"],
                         algorithm="ppo")
    with pytest.raises(RecipeError, match=r"field 'env' \(EmpathyDialogue-v0 with kwargs .*\): reward_mode must be "
                                          r"'delta' or 'final', got 'bogus'"):
        PPOTrainer(config)


def test_float16_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="float16 would need loss scaling"):
        trainer(tmp_path, "ppo", "fp16", 1, extra=("policy.dtype=float16",))


def test_trl_argument_names_work_too(tmp_path):
    from empathy_gym.models import load_causal_lm
    config = load_recipe("agents/tiny-cpu.yaml", OVERRIDES + [f"output_dir={tmp_path}"], algorithm="grpo")
    model, tokenizer = load_causal_lm("tiny")
    run = GRPOTrainer(args=config, model=model, processing_class=tokenizer, envs=envs(word_user()))
    assert run.config is config and run.tokenizer is tokenizer
    with pytest.raises(TypeError, match="pass the config once"):
        GRPOTrainer(config, args=config)
    with pytest.raises(ValueError, match="pass the tokenizer together with the model"):
        GRPOTrainer(args=config, model=model)


def test_resume_warns_of_changed_settings_and_refuses_another_algorithms_checkpoint(tmp_path, caplog, capsys):
    from empathy_gym.agents.checkpoint import CheckpointError
    from empathy_gym.agents.cli import train_main
    trainer(tmp_path, "ppo", "run", 2).train()
    again = trainer(tmp_path, "ppo", "run", 3, extra=("learning_rate=0.3",))
    with caplog.at_level("WARNING"):
        again.train(resume=True)
    assert "learning_rate: 0.01 -> 0.3" in caplog.text and "total_steps: 2 -> 3" in caplog.text
    with pytest.raises(CheckpointError, match="is a ppo checkpoint, this is grpo"):
        trainer(tmp_path, "grpo", "run", 4, extra=("num_generations=2",)).train(resume=True)
    code = train_main("grpo", ["--recipe", "agents/tiny-cpu.yaml", "--resume", *OVERRIDES,
                               f"output_dir={tmp_path / 'run'}", "num_generations=2"])
    assert code == 1 and "is a ppo checkpoint, this is grpo" in capsys.readouterr().err


def test_resume_without_a_checkpoint_says_so(tmp_path, caplog):
    with caplog.at_level("WARNING"):
        trainer(tmp_path, "ppo", "fresh", 1).train(resume=True)
    assert "no checkpoint in" in caplog.text and "starting at step 0" in caplog.text
