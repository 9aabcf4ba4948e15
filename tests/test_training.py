"""The trainer loop: resume gives the same parameters, Ctrl-C keeps everything finished."""

import json
import os
import re
import signal
import socket
from pathlib import Path

import pytest
import torch

from empathy_gym.agents import GRPOTrainer, PPOTrainer, load_recipe
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.personas import load_personas
from empathy_gym.user.scripted import ScriptedUser

OVERRIDES = [
    "rollout_batch_size=4",
    "generation.max_new_tokens=6",
    "progress=false",
    "save_steps=2",
    "num_ppo_epochs=2",
    "num_mini_batches=2",
    "learning_rate=1e-2",
]


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
    config = load_recipe(
        "agents/tiny-cpu.yaml",
        OVERRIDES + [f"output_dir={tmp_path / name}", f"total_steps={total}", *extra],
        algorithm=algorithm,
    )
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
    read = lambda name: [
        (r["step"], r["persona_id"], r["rewards"])
        for r in map(json.loads, (tmp_path / name / "episodes.jsonl").read_text().splitlines())
    ]
    assert read("straight") == read("halves")
    metrics = [json.loads(line) for line in (tmp_path / "halves" / "metrics.jsonl").read_text().splitlines()]
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

    run = trainer(tmp_path, "ppo", "run", 10, user=word_user(hook=interrupt_in_step_3), extra=("save_steps=0",))
    run.train()
    assert run.step == 2
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-000002"
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    # steps 1 and 2 complete; step 3's dialogues that had ended before the stop are on disk too
    assert steps.count(1) == 4 and steps.count(2) == 4 and set(steps) <= {1, 2, 3}
    resumed = trainer(tmp_path, "ppo", "run", 4)
    resumed.train(resume=True)
    assert resumed.step == 4
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    assert steps == [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4  # step 3's partial episodes were replaced


def test_sigterm_mid_rollout_saves_like_ctrl_c_and_the_handlers_are_restored(tmp_path):
    """A scheduler's SIGTERM (Slurm, Kubernetes) before its kill: before, it killed the run at
    once, keeping nothing since the last save_steps checkpoint (here none); now it stops like
    Ctrl-C and checkpoints the last completed step."""
    calls = {"n": 0}

    def terminate_in_step_2(request):
        calls["n"] += 1
        if calls["n"] == 9:  # 4 dialogues x 2 turns a step: call 9 is in step 2
            os.kill(os.getpid(), signal.SIGTERM)

    before = signal.getsignal(signal.SIGTERM)
    run = trainer(tmp_path, "ppo", "run", 10, user=word_user(hook=terminate_in_step_2), extra=("save_steps=0",))
    run.train()
    assert run.step == 1
    assert (tmp_path / "run" / "checkpoints" / "latest").read_text().strip() == "step-000001"
    assert signal.getsignal(signal.SIGTERM) is before


def test_fresh_run_refuses_a_used_output_dir(tmp_path):
    trainer(tmp_path, "ppo", "used", 1).train()
    with pytest.raises(FileExistsError, match="--resume"):
        trainer(tmp_path, "ppo", "used", 1).train()


def test_separate_critic_lora_kl_and_gradient_checkpointing(tmp_path):
    run = trainer(
        tmp_path,
        "ppo",
        "critic",
        2,
        extra=(
            "policy.use_lora=true",
            "policy.lora_r=4",
            "critic=separate",
            "kl_coef=0.1",
            "policy.gradient_checkpointing=true",
            "critic_learning_rate=1e-2",
        ),
    )
    critic_before = {k: v.clone() for k, v in run.critic_model.named_parameters() if v.requires_grad}
    base_before = {k: v.clone() for k, v in run.model.named_parameters() if not v.requires_grad}
    metrics = run.train()
    # Step 1: LoRA's B matrices start at zero, so the policy equals the reference exactly.
    assert metrics[0]["policy/kl_to_reference_k1"] == 0.0
    assert metrics[1]["policy/kl_to_reference_k1"] != 0.0
    # The reference is the base with adapters off: no copy, and the base never moves.
    assert run.reference is None
    assert all(torch.equal(v, base_before[k]) for k, v in run.model.named_parameters() if not v.requires_grad)
    # The separate critic trained its own adapters.
    assert any(not torch.equal(v, critic_before[k]) for k, v in run.critic_model.named_parameters() if v.requires_grad)
    # and the checkpoint holds them
    resumed = trainer(
        tmp_path,
        "ppo",
        "critic",
        2,
        extra=(
            "policy.use_lora=true",
            "policy.lora_r=4",
            "critic=separate",
            "kl_coef=0.1",
            "policy.gradient_checkpointing=true",
            "critic_learning_rate=1e-2",
        ),
    )
    resumed.load(tmp_path / "critic" / "checkpoints" / "step-000002")
    assert all(
        torch.equal(a, b)
        for (_, a), (_, b) in zip(run.critic_model.named_parameters(), resumed.critic_model.named_parameters())
    )


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_no_kl_to_reference_without_a_reference(tmp_path, algorithm):
    """Without a KL term (RLVER's kl_coef 0, beta 0) no reference pass runs: the metric is
    left out (PPO wrote NaN, GRPO 0), not reported as a measurement."""
    extra = ("num_generations=4",) if algorithm == "grpo" else ()
    metrics = trainer(tmp_path, algorithm, f"nokl-{algorithm}", 1, extra=extra).train()
    assert not any(key.startswith("policy/kl_to_reference") for key in metrics[0])
    assert "policy/approx_kl" in metrics[0]


def test_full_fine_tuning_reference_is_a_frozen_copy(tmp_path):
    run = trainer(tmp_path, "grpo", "fullkl", 3, extra=("num_generations=4", "beta=0.1"))
    initial = {k: v.clone() for k, v in run.model.state_dict().items()}
    metrics = run.train()
    kls = [m["policy/kl_to_reference_k3"] for m in metrics if m["grpo/skipped_groups"] == 0]
    assert kls and all(kl >= 0.0 for kl in kls) and max(kls) > 0.0  # k3 is never negative
    assert all(torch.equal(v, initial[k]) for k, v in run.reference.state_dict().items())
    assert any(not torch.equal(v, initial[k]) for k, v in run.model.state_dict().items())
    assert not any(p.requires_grad for p in run.reference.parameters())


def test_bfloat16_full_fine_tuning_trains_float32_master_weights(tmp_path):
    """Adam's first step moves a weight by lr * g / (|g| + eps) (Kingma & Ba 2015, Alg. 1):
    by lr = 1e-6 wherever |g| >> eps = 1e-8, never more. Stored in bfloat16 such a step
    rounds away (the spacing near 0.02 is 2^-13 ~ 1.2e-4); the trainer keeps float32
    master weights and computes in bfloat16 under autocast."""
    run = trainer(
        tmp_path,
        "ppo",
        "bf16",
        1,
        extra=(
            "policy.dtype=bfloat16",
            "policy.use_lora=false",
            "learning_rate=1e-6",
            "critic_learning_rate=1e-6",
            "num_ppo_epochs=1",
            "num_mini_batches=1",
        ),
    )
    assert run.compute_dtype == torch.bfloat16
    assert {p.dtype for p in run.model.parameters()} == {torch.float32}
    before = {k: v.detach().clone() for k, v in run.model.named_parameters()}
    run.train()
    delta = torch.cat([(p.detach() - before[k]).abs().flatten() for k, p in run.model.named_parameters()])
    rounding = torch.cat([v.abs().flatten() for v in before.values()]) * torch.finfo(torch.float32).eps
    assert bool((delta <= 1e-6 + rounding).all())  # rounding: float32's own spacing at |w|
    assert (delta > 0.5e-6).float().mean() > 0.5


def test_bfloat16_lora_keeps_the_base_in_bfloat16_and_the_adapters_in_float32(tmp_path):
    run = trainer(
        tmp_path,
        "grpo",
        "bf16lora",
        1,
        extra=("policy.dtype=bfloat16", "policy.use_lora=true", "policy.lora_r=4", "num_generations=2"),
    )
    trainable = {p.dtype for p in run.model.parameters() if p.requires_grad}
    frozen = {p.dtype for p in run.model.parameters() if not p.requires_grad}
    assert trainable == {torch.float32} and frozen == {torch.bfloat16}
    adapters = {k: v.detach().clone() for k, v in run.model.named_parameters() if v.requires_grad}
    run.train()
    assert any(not torch.equal(v, adapters[k]) for k, v in run.model.named_parameters() if v.requires_grad)


def test_configs_built_in_python_are_checked_too(tmp_path):
    from empathy_gym.agents import GRPOConfig, PPOConfig, RecipeError
    from empathy_gym.backends.models import load_causal_lm

    model, tokenizer = load_causal_lm("tiny")
    with pytest.raises(RecipeError, match=r"learning_rate must be > 0, got -1.0"):
        GRPOTrainer(args=GRPOConfig(learning_rate=-1.0), model=model, processing_class=tokenizer)
    with pytest.raises(TypeError, match=r"GRPOTrainer needs a GRPOConfig, got a PPOConfig"):
        GRPOTrainer(args=PPOConfig(), model=model, processing_class=tokenizer)


def test_a_bad_env_value_is_a_recipe_error(tmp_path):
    from empathy_gym.agents import RecipeError

    with pytest.raises(RecipeError, match=r"command-line override: field 'env.kwargs.reward_mode': reward_mode must"):
        load_recipe("agents/tiny-cpu.yaml", [f"output_dir={tmp_path}", "env.kwargs.reward_mode=bogus"], algorithm="ppo")
    config = load_recipe("agents/tiny-cpu.yaml", [f"output_dir={tmp_path}"], algorithm="ppo")
    config.env.kwargs["reward_mode"] = "bogus"  # a config built in Python is checked when the envs are built
    with pytest.raises(
        RecipeError,
        match=r"field 'env' \(EmpathyDialogue-v0 with kwargs .*\): reward_mode must be "
        r"'delta' or 'final', got 'bogus'",
    ):
        PPOTrainer(config)


def test_float16_is_refused_with_the_reason(tmp_path):
    with pytest.raises(ValueError, match="float16 would need loss scaling"):
        trainer(tmp_path, "ppo", "fp16", 1, extra=("policy.dtype=float16",))


def test_trl_argument_names_work_too(tmp_path):
    from empathy_gym.backends.models import load_causal_lm

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
    assert "except the learning rate and its schedule, which continue as saved" in caplog.text  # which value wins
    with pytest.raises(CheckpointError, match="is a ppo checkpoint, this is grpo"):
        trainer(tmp_path, "grpo", "run", 4, extra=("num_generations=2",)).train(resume=True)
    code = train_main(
        "grpo",
        [
            "--recipe",
            "agents/tiny-cpu.yaml",
            "--resume",
            *OVERRIDES,
            f"output_dir={tmp_path / 'run'}",
            "num_generations=2",
        ],
    )
    assert code == 1 and "is a ppo checkpoint, this is grpo" in capsys.readouterr().err


def test_a_training_run_keeps_its_personas_so_replay_needs_no_bank(tmp_path):
    """Was: replay of a training folder asked for --personas, and a run on the env's default
    bank (English and Chinese together) had no bank name to give."""
    from empathy_gym.agents.run_log import RunLog
    from empathy_gym.evaluation.replay import replay_logs

    trainer(tmp_path, "ppo", "run", 1).train()
    played = load_personas(tmp_path / "run" / "personas.jsonl")
    assert played == load_personas("en")[:6]
    result = replay_logs([tmp_path / "run"], "rule")  # no personas=
    assert result.report["config"]["logs"] == [str(tmp_path / "run" / "episodes.jsonl")]
    assert sum(len(log.dialogues) for log in result.logs) == 4
    # resumed with another bank: both are kept, the newer copy of a shared id wins
    log = RunLog(tmp_path / "run", tensorboard=False, resume_step=1)
    log.record_personas(load_personas("en")[4:8])
    log.close()
    assert [p.id for p in load_personas(tmp_path / "run" / "personas.jsonl")] == [p.id for p in load_personas("en")[:8]]


def test_a_callbacks_metrics_must_be_numbers(tmp_path):
    """Was: {"x": "not a number"} written to metrics.jsonl as a string."""
    import numpy as np

    from empathy_gym.agents.callbacks import TrainerCallback

    class Metrics(TrainerCallback):
        def __init__(self, value):
            self.value = value

        def on_step_end(self, state, step, trajectories):
            return {"custom/x": self.value}

    good = trainer(tmp_path, "ppo", "good", 1)
    good.callbacks.append(Metrics(np.float32(0.5)))
    good.train()
    assert json.loads((tmp_path / "good" / "metrics.jsonl").read_text())["custom/x"] == 0.5
    bad = trainer(tmp_path, "ppo", "bad", 1)
    bad.callbacks.append(Metrics("not a number"))
    with pytest.raises(TypeError, match=r"Metrics.on_step_end: metric 'custom/x' must be a number, got 'not a number'"):
        bad.train()


def test_callbacks_are_given_the_runs_state_not_the_trainer(tmp_path):
    """Was: every hook got the trainer itself (callbacks reached into its fields). Now a
    :class:`TrainingState`: the config, the steps done, the session, a sampler of the
    current policy and the tokenizer."""
    from empathy_gym.agents.callbacks import TrainerCallback, TrainingState
    from empathy_gym.agents.generation import TransformersGenerator

    seen = []

    class Record(TrainerCallback):
        def on_train_begin(self, state):
            seen.append(("begin", state.step))

        def on_step_end(self, state, step, trajectories):
            seen.append(("step", step, state.step, isinstance(state, TrainingState)))
            assert isinstance(state.sampler(max_batch_size=1), TransformersGenerator)

        def on_train_end(self, state):
            seen.append(("end", state.step, state.config.total_steps, state.rank, state.world))

    run = trainer(tmp_path, "grpo", "state", 2)
    run.callbacks.append(Record())
    run.train()
    assert seen == [("begin", 0), ("step", 1, 1, True), ("step", 2, 2, True), ("end", 2, 2, 0, 1)]
    state = run.training_state()
    assert state.tokenizer is run.tokenizer and state.session is None  # envs given: the caller's user
    assert state.model is run.model and not hasattr(state, "optimizer")  # the policy module, not the trainer
    assert run.heldout_report is None


def test_a_user_server_that_is_not_there_stops_training_with_its_message_not_a_traceback(tmp_path, capsys):
    """Was: a 93-line traceback ending in the BackendError (eval printed one line)."""
    from empathy_gym.agents.cli import train_main

    port = socket.socket()
    port.bind(("127.0.0.1", 0))  # bound, never listening: the connection is refused
    url = f"http://127.0.0.1:{port.getsockname()[1]}/v1"
    argv = ["--recipe", "agents/tiny-cpu.yaml", *OVERRIDES, f"output_dir={tmp_path / 'run'}"]
    code = train_main("ppo", [*argv, f"env.kwargs.user=openai:m@{url},max_retries=0"])
    port.close()
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    # the first request is the context probe at the server's root (issue 37: its refusal is the error)
    probe = url.removesuffix("/v1")
    assert f"error: POST {probe}/tokenize (model 'm'): gave up after 1 attempt; last error: ConnectError" in err
    assert f"is a server running at {url}?" in err and "stopped at step 0" in err


def test_resume_with_another_models_recipe_is_refused_before_loading_and_keeps_the_run(tmp_path, capsys, monkeypatch):
    """Was: the newest checkpoint failed to load (no adapter file), the older ones too,
    and the run started over at step 0 in the folder, moving its logs to *.superseded."""
    from empathy_gym.agents import trainer as trainer_module
    from empathy_gym.agents.cli import train_main

    trainer(tmp_path, "ppo", "run", 2).train()
    metrics = (tmp_path / "run" / "metrics.jsonl").read_text()

    def never(*args, **kwargs):
        raise AssertionError("a model loaded")

    monkeypatch.setattr(trainer_module.RLTrainer, "__init__", never)
    argv = ["--recipe", "agents/tiny-cpu.yaml", "--resume", *OVERRIDES, f"output_dir={tmp_path / 'run'}"]
    assert train_main("ppo", [*argv, "policy.use_lora=true"]) == 1
    message = " ".join(capsys.readouterr().err.split())
    assert "step-000002 holds another policy's weights (policy.use_lora: False -> True)" in message
    assert (tmp_path / "run" / "metrics.jsonl").read_text() == metrics
    assert not list((tmp_path / "run").glob("*.superseded*"))


def test_resume_with_another_lora_shape_or_past_total_steps_is_refused_from_the_checkpoints_json():
    """Was: the model loaded, each checkpoint failed in torch's load_state_dict (size
    mismatch), and the error showed only its first line, without the cause."""
    from empathy_gym.agents.checkpoint import CheckpointError, check_resumable

    lora = {"model": "m", "use_lora": True, "lora_r": 16, "lora_target_modules": "all-linear", "lora_alpha": 32}
    state = {"algorithm": "grpo", "config": {"policy": lora}}
    for change, said in [
        ({"lora_r": 8}, "policy.lora_r: 16 -> 8"),
        ({"lora_target_modules": ["q_proj"]}, "policy.lora_target_modules: 'all-linear' -> ['q_proj']"),
    ]:
        with pytest.raises(CheckpointError, match=re.escape(said)):
            check_resumable(Path("ckpt"), state, "grpo", {"policy": {**lora, **change}})
    check_resumable(Path("ckpt"), state, "grpo", {"policy": {**lora, "lora_alpha": 64}})  # the same shapes
    # past total_steps (was: "GRPO: 4/2 steps", the held-out evaluation after training run again)
    with pytest.raises(CheckpointError, match=re.escape("ckpt is at step 4, past total_steps=2")):
        check_resumable(Path("ckpt"), {**state, "step": 4}, "grpo", {"policy": lora, "total_steps": 2})
    check_resumable(Path("ckpt"), {**state, "step": 4}, "grpo", {"policy": lora, "total_steps": 4})
    full = {"model": "m", "use_lora": False, "lora_r": 16}
    check_resumable(
        Path("c"), {"algorithm": "grpo", "config": {"policy": full}}, "grpo", {"policy": {**full, "lora_r": 8}}
    )


def test_resume_where_no_checkpoint_loads_is_refused_not_restarted(tmp_path):
    from empathy_gym.agents.checkpoint import CheckpointError

    trainer(tmp_path, "ppo", "run", 2).train()
    (tmp_path / "run" / "checkpoints" / "step-000002" / "modules.pt").unlink()  # the only checkpoint, damaged
    with pytest.raises(
        CheckpointError, match=r"none of the 1 checkpoints in .* loads \(step-000002: FileNotFoundError"
    ):
        trainer(tmp_path, "ppo", "run", 3).train(resume=True)
    assert not list((tmp_path / "run").glob("*.superseded*"))


def test_resume_without_a_checkpoint_says_so(tmp_path, caplog):
    with caplog.at_level("WARNING"):
        trainer(tmp_path, "ppo", "fresh", 1).train(resume=True)
    assert "no checkpoint in" in caplog.text and "starting at step 0" in caplog.text


# -- truncation, clipping, modes, metrics, resume, console (issue 8) --------------------------
def cut_and_ended(tokenizer):
    """Two one-turn dialogues with a reward of 0.05 on the turn: one ended by the user,
    one cut at the context limit (with the user's reply after it)."""
    from empathy_gym.agents.rollout import Trajectory

    out = []
    for key, termination in enumerate(("max_turns", "context_limit")):
        t = Trajectory(
            key=key,
            group=0,
            env_seed=0,
            persona_id="p",
            language="en",
            hidden_intention="deep_empathy",
            character_type="passive",
            emotions=[40, 45],
            reward_mode="final",
        )
        t.extend([5, 6, 7], trainable=False)
        t.extend([8 + key, 9, tokenizer.eos_token_id], trainable=True, logprobs=[-1.0] * 3)
        t.turn_ends.append(len(t.token_ids) - 1)
        t.rewards.append(0.05)
        if termination == "context_limit":
            t.extend([10, 11, 12], trainable=False)
        t.termination = termination
        out.append(t)
    return out


def test_ppo_bootstraps_a_cut_dialogue_from_the_value_of_its_last_state(tmp_path):
    """With V = 0.5 everywhere (a value head with only a bias) and gamma = lambda = 1,
    the return of every token of the ended dialogue is its reward, 0.05; that of the cut
    one is 0.05 + V(s_T) = 0.55. (The old code bootstrapped 0 for both.)"""
    run = trainer(tmp_path, "ppo", "bootstrap", 1, extra=("whiten_advantages=false",))
    with torch.no_grad():
        run.value_head.linear.bias.fill_(0.5)
    batch, _ = run.prepare(cut_and_ended(run.tokenizer))
    assert batch.returns[0].tolist() == pytest.approx([0.05] * 3)
    assert batch.returns[1].tolist() == pytest.approx([0.55] * 3)
    assert batch.advantages[1].tolist() == pytest.approx([0.05] * 3)


def test_grpo_scores_a_cut_dialogue_in_final_mode_by_the_emotion_it_reached(tmp_path):
    """Final rewards: the env paid the ended dialogue e_T / 100 = 0.45 and the cut one
    nothing; the cut one is scored as if it had ended at e_T = 45 too, so the two tie."""
    run = trainer(tmp_path, "grpo", "cut", 1, extra=("num_generations=2",))
    ended, cut = cut_and_ended(run.tokenizer)
    ended.rewards, cut.rewards = [0.45], [0.0]
    _, degenerate = run.token_advantages([ended, cut], run.token_data([ended, cut]))
    assert degenerate.tolist() == [True, True]


def test_actor_and_critic_gradients_are_clipped_apart(tmp_path):
    """A critic gradient of norm 100 must not shrink the actor's gradient of norm 0.5
    (the old code clipped their joint norm, scaling the actor's by 1/100)."""
    run = trainer(tmp_path, "ppo", "clip", 1)
    policy = [p for p in run.model.parameters() if p.requires_grad]
    critic = list(run.value_head.parameters())
    sizes = lambda params: sum(p.numel() for p in params)
    for params, norm in ((policy, 0.5), (critic, 100.0)):
        for p in params:
            p.grad = torch.full_like(p, norm / sizes(params) ** 0.5)
    expected = {id(p): p.detach() - p.grad for p in policy}  # untouched by clipping
    expected.update({id(p): p.detach() - p.grad / 100.0 for p in critic})  # clipped to norm 1
    run.optimizer = torch.optim.SGD([{"params": policy}, {"params": critic}], lr=1.0)
    norms = run.clip_and_step()
    assert norms == pytest.approx({"policy/grad_norm": 0.5, "value/grad_norm": 100.0}, rel=1e-4)
    assert all(torch.allclose(p.detach(), expected[id(p)], atol=1e-6) for p in policy + critic)


def test_the_separate_critic_trains_in_train_mode_and_scores_in_eval_mode(tmp_path):
    run = trainer(
        tmp_path,
        "ppo",
        "modes",
        1,
        extra=("policy.use_lora=true", "policy.lora_r=4", "policy.lora_dropout=0.1", "critic=separate"),
    )
    seen = []
    run.critic_model.register_forward_pre_hook(
        lambda module, args: seen.append((torch.is_grad_enabled(), module.training))
    )
    run.train()
    assert {training for grad, training in seen if grad} == {True}
    assert {training for grad, training in seen if not grad} == {False}


def test_a_step_without_signal_writes_strict_json(tmp_path):
    """Every GRPO group without reward spread: no update, the loss statistics are
    undefined; metrics.jsonl says null (json.dumps would write NaN, which is not JSON)."""
    run = trainer(
        tmp_path, "grpo", "flat", 1, user=ScriptedUser(change_fn=lambda request: 0), extra=("num_generations=2",)
    )
    run.train()
    line = (tmp_path / "flat" / "metrics.jsonl").read_text().splitlines()[0]

    def no_nan(token):
        raise ValueError(f"not JSON: {token}")

    record = json.loads(line, parse_constant=no_nan)
    assert record["grpo/skipped_groups"] == 2 and record["loss/policy"] is None


@pytest.mark.parametrize("damage", ["modules", "pointer"])
def test_resume_falls_back_to_the_newest_complete_checkpoint(tmp_path, damage):
    straight = trainer(tmp_path, "ppo", "run", 4)
    straight.train()
    root = tmp_path / "run" / "checkpoints"
    assert sorted(p.name for p in root.glob("step-*")) == ["step-000002", "step-000004"]
    if damage == "modules":
        (root / "step-000004" / "modules.pt").write_bytes(b"")  # e.g. a power loss before the data hit the disk
    else:
        (root / "latest").write_text("step-000006\n")  # names a checkpoint that is not there
        import shutil

        shutil.rmtree(root / "step-000004")
    resumed = trainer(tmp_path, "ppo", "run", 4)
    resumed._resume(root)
    assert resumed.step == 2
    resumed.train(resume=True)
    assert resumed.step == 4
    a, b = parameters(straight), parameters(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)  # steps 3 and 4 done again, identically
    metrics = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics == [1, 2, 3, 4]  # steps 1 and 2 kept: only later steps were redone
    superseded = (tmp_path / "run" / "metrics.superseded.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in superseded] == [3, 4]  # nothing lost


def test_a_checkpoint_is_on_disk_before_it_is_named(tmp_path, monkeypatch):
    """Every file of a checkpoint is fsynced before the folder is renamed into place, and
    the ``latest`` pointer's new file before it replaces the old one."""
    from empathy_gym.agents import checkpoint

    synced, checked = set(), []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(descriptor):
        synced.add(os.readlink(f"/proc/self/fd/{descriptor}"))
        return real_fsync(descriptor)

    def replace(source, target):
        if os.path.basename(str(source)).startswith(".tmp-step-"):
            files = [str(p) for p in __import__("pathlib").Path(source).rglob("*") if p.is_file()]
            checked.append(files and all(f in synced for f in files))
        if os.path.basename(str(target)) == checkpoint.POINTER:
            checked.append(str(source) in synced)
        return real_replace(source, target)

    monkeypatch.setattr(checkpoint.os, "fsync", fsync)
    monkeypatch.setattr(checkpoint.os, "replace", replace)
    trainer(tmp_path, "ppo", "sync", 1, extra=("save_steps=1",)).train()
    assert checked == [True, True]  # the folder's files, then the pointer


def test_the_scripts_need_a_recipe(capsys):
    from empathy_gym.agents.cli import train_main

    for algorithm in ("ppo", "grpo"):
        with pytest.raises(SystemExit) as stopped:
            train_main(algorithm, ["total_steps=1"])
        assert stopped.value.code == 2
    assert "the following arguments are required: --recipe" in capsys.readouterr().err


def test_ctrl_c_with_the_console_gone_still_saves_the_checkpoint(tmp_path):
    """``python examples/train_ppo.py ... 2>&1 | tee log``, then Ctrl-C: the terminal sends
    SIGINT to both, tee dies first, and every later write of the trainer to the pipe
    fails (BrokenPipeError). The run must still save its last completed step and exit
    130 (the old code lost the checkpoint and exited 1 without a message)."""
    import subprocess
    import sys
    import time

    out = tmp_path / "piped"
    child = subprocess.Popen(
        [
            sys.executable,
            "examples/train_ppo.py",
            "--recipe",
            "agents/tiny-cpu.yaml",
            f"output_dir={out}",
            "total_steps=400",
            "save_steps=0",
            "rollout_batch_size=4",
            "generation.max_new_tokens=4",
            "progress=true",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    try:
        deadline = time.monotonic() + 600
        metrics = out / "metrics.jsonl"
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert child.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.5)
        child.stdout.close()  # tee is gone
        child.send_signal(signal.SIGINT)  # and the Ctrl-C reaches the trainer
        code = child.wait(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
    assert code == 130
    saved = (out / "checkpoints" / "latest").read_text().strip()
    steps = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert saved == f"step-{steps[-1]:06d}"
    assert "Ctrl-C" in (out / "train.log").read_text()


@pytest.mark.parametrize("lora", [True, False])
def test_the_separate_critic_has_no_lm_head_and_loads_checkpoints_of_the_old_causal_lm_critic(tmp_path, lora):
    """The critic is the backbone alone (no vocabulary projection); a checkpoint written
    when it was a whole causal LM (keys ``base_model.model.model.*`` with LoRA,
    ``model.*`` and ``lm_head.weight`` without) still loads, tensor for tensor, and one
    that does not fit is refused instead of loading nothing."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from empathy_gym.agents.checkpoint import CheckpointError
    from empathy_gym.backends.models import resolve_model

    extra = ("policy.use_lora=true", "policy.lora_r=4") if lora else ()
    run = trainer(tmp_path, "ppo", "critic-head", 1, extra=(*extra, "critic=separate"))
    backbone = run.critic_model.get_base_model() if lora else run.critic_model
    assert backbone.get_output_embeddings() is None and not hasattr(backbone, "lm_head")
    old = AutoModelForCausalLM.from_pretrained(resolve_model("tiny")[0])
    if lora:
        old = get_peft_model(old, LoraConfig(r=4, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM"))
    with torch.no_grad():
        for parameter in old.parameters():
            parameter.normal_(0, 0.1)
    saved = {k: v for k, v in old.state_dict().items() if "lora_" in k or not lora}
    assert any(k.startswith("base_model.model.model." if lora else "lm_head.") for k in saved)
    run.load_extra_state({"value_head": run.value_head.state_dict(), "critic": saved})
    now = run.critic_model.state_dict()
    for key, value in saved.items():
        if key.startswith("lm_head."):
            continue
        new_key = key.replace("base_model.model.model.", "base_model.model.", 1) if lora else key[len("model.") :]
        assert torch.equal(now[new_key], value)
    with pytest.raises(CheckpointError, match="does not fit this critic"):
        run.load_extra_state(
            {
                "value_head": run.value_head.state_dict(),
                "critic": {"base_model.model.elsewhere.lora_A.default.weight": torch.zeros(1)},
            }
        )


@pytest.mark.parametrize(
    "algorithm,extra", [("ppo", ("critic=separate",)), ("grpo", ("num_generations=2", "dynamic_sampling_budget=2"))]
)
def test_the_step_statistics_are_in_metrics_jsonl_and_tensorboard(tmp_path, algorithm, extra):
    """Value and advantage statistics, the share of turns cut by length, thinking and
    reply tokens and the sampler mismatch: present, finite, consistent with the episodes
    (turns cut, tokens per turn) and written to TensorBoard too."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    varied = ScriptedUser(change_fn=lambda request: sum(map(ord, request.utterance)) % 11 - 5)  # groups vary
    trainer(tmp_path, algorithm, "run", 2, user=varied, extra=(*extra, "report_to=tensorboard")).train()
    metrics = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    episodes = [json.loads(line) for line in (tmp_path / "run" / "episodes.jsonl").read_text().splitlines()]
    stats = ["advantage/mean", "advantage/std", "advantage/min", "advantage/max"]
    if algorithm == "ppo":
        stats += [f"value/{s}" for s in ("mean", "std", "min", "max")]
        stats += [f"value/target/{s}" for s in ("mean", "std", "min", "max")]
    always = ["episode/turn_cut_rate", "tokens/thinking_per_turn", "tokens/reply_per_turn"]
    stats += ["sampler/kl", "sampler/max_ratio", "sampler/min_ratio"]  # GRPO: over the trained groups' tokens
    for m in metrics:
        trained = algorithm == "ppo" or m["grpo/skipped_groups"] < m["grpo/groups"]
        for key in always + (stats if trained else []):
            assert isinstance(m[key], float) and m[key] == m[key] and abs(m[key]) < float("inf"), (key, m[key])
        if trained:
            assert m["advantage/min"] <= m["advantage/mean"] <= m["advantage/max"] and m["advantage/std"] >= 0
        mine = [e for e in episodes if e["step"] == m["step"]][:4]  # the first round (GRPO refills after)
        turns = sum(e["turns"] for e in mine)
        assert m["episode/turn_cut_rate"] == pytest.approx(sum(e["cut_turns"] for e in mine) / turns)
        assert m["tokens/thinking_per_turn"] == 0.0  # not think mode: every token is reply
        assert m["tokens/reply_per_turn"] * turns == pytest.approx(m["tokens/generated"])
        if trained:  # the same model code: they agree
            assert m["sampler/kl"] < 1e-6 and m["sampler/max_ratio"] == pytest.approx(1.0, abs=1e-3)
    assert any(algorithm == "ppo" or m["grpo/skipped_groups"] < m["grpo/groups"] for m in metrics)
    events = EventAccumulator(str(tmp_path / "run" / "tb")).Reload()
    assert set(always + stats) <= set(events.Tags()["scalars"])


def test_dr_grpo_divides_by_a_dialogues_budget_and_loss_policy_is_the_objective(tmp_path, monkeypatch):
    """max_turns=2 (the envs) x max_new_tokens=6 = 12 tokens a dialogue, below the context:
    the dr_grpo constant is 12, not the per-turn 6; and loss/policy is what aggregate
    computes for the policy term, summed over the mini-batch (num_mini_batches=1 here), not
    the token mean that was logged whatever the loss type."""
    from empathy_gym.agents import grpo

    shares = []
    real = grpo.aggregate

    def recorded(per_token, segments, loss_type, tokens, sequences, max_tokens=None):
        assert max_tokens == 12
        value = real(per_token, segments, loss_type, tokens, sequences, max_tokens)
        if not per_token.requires_grad:
            shares.append(float(value))
        return value

    monkeypatch.setattr(grpo, "aggregate", recorded)
    run = trainer(
        tmp_path,
        "grpo",
        "drgrpo",
        1,
        extra=(
            "num_generations=4",
            "loss_type=dr_grpo",
            "scale_rewards=false",
            "num_mini_batches=1",
            "num_ppo_epochs=1",
        ),
    )
    assert run.dialogue_token_budget == 12
    (metrics,) = run.train()
    assert shares and metrics["loss/policy"] == pytest.approx(sum(shares))


def test_warm_up_then_constant_as_verl_and_resume_keeps_the_rates(tmp_path):
    """total_steps=4: warmup_ratio 0.5 is int(2.0) = 2 warm-up steps for the policy,
    critic_warmup_ratio 0.25 one for the critic; verl's constant schedule then gives the
    multipliers 0, 1/2, 1, 1 and 0, 1, 1, 1 (step / warm-up steps, the first step at 0).
    A run stopped after 2 steps and resumed gives the same rates for steps 3 and 4."""
    extra = ("warmup_ratio=0.5", "critic_warmup_ratio=0.25", "learning_rate=1e-2", "critic_learning_rate=1e-3")
    metrics = trainer(tmp_path, "ppo", "warm", 4, extra=extra).train()
    assert [m["policy/lr"] for m in metrics] == pytest.approx([0.0, 5e-3, 1e-2, 1e-2])
    assert [m["value/lr"] for m in metrics] == pytest.approx([0.0, 1e-3, 1e-3, 1e-3])
    import shutil

    checkpoints = tmp_path / "resumed" / "checkpoints"  # the same run, stopped after step 2
    shutil.copytree(tmp_path / "warm" / "checkpoints" / "step-000002", checkpoints / "step-000002")
    (checkpoints / "latest").write_text("step-000002\n")
    resumed = trainer(tmp_path, "ppo", "resumed", 4, extra=extra).train(resume=True)
    later = [m for m in resumed if m["step"] > 2]
    assert [m["policy/lr"] for m in later] == pytest.approx([1e-2, 1e-2])
    assert [m["value/lr"] for m in later] == pytest.approx([1e-3, 1e-3])


def test_the_cosine_schedule_after_the_warm_up():
    """1 warm-up step of 5, floor 0.1: 0, then 0.1 + 0.9 (1 + cos(pi k / 4)) / 2 for k = 0..3."""
    import math

    from empathy_gym.agents.schedule import multiplier

    factor = multiplier("cosine", 1, 5, 0.1)
    expected = [0.0] + [0.1 + 0.9 * (1 + math.cos(math.pi * k / 4)) / 2 for k in range(4)]
    assert [factor(step) for step in range(5)] == pytest.approx(expected)
    assert factor(1) == 1.0 and factor(3) == pytest.approx(0.55)
    with pytest.raises(ValueError, match="lr_schedule must be one of"):
        multiplier("linear", 0, 5)


def test_refill_rounds_are_counted_apart_and_marked_in_the_episodes(tmp_path):
    """A user that always proposes +1: no group has spread, so dynamic sampling plays its
    whole budget (3 groups, in rounds of at most 2 = 4 envs / 2). The first round's 2
    groups are grpo/groups and grpo/skipped_groups; the 3 refill groups are counted
    apart; each episode says its round."""
    run = trainer(
        tmp_path,
        "grpo",
        "refill",
        1,
        user=ScriptedUser(change_fn=lambda r: 1),
        extra=("num_generations=2", "dynamic_sampling_budget=3"),
    )
    (metrics,) = run.train()
    assert (metrics["grpo/groups"], metrics["grpo/skipped_groups"]) == (2.0, 2.0)
    assert (metrics["grpo/refill_groups"], metrics["grpo/refill_skipped_groups"]) == (3.0, 3.0)
    episodes = [json.loads(line) for line in (tmp_path / "refill" / "episodes.jsonl").read_text().splitlines()]
    assert [e["round"] for e in episodes] == [0] * 4 + [1] * 4 + [2] * 2


def test_resume_keeps_episode_lines_whose_reply_holds_a_line_separator(tmp_path):
    """JSON Lines are split on "\\n" only: a reply of a tiny random model held U+2028, which
    str.splitlines also splits on, so resume moved that episode to *.superseded.jsonl."""
    from empathy_gym.agents.run_log import _keep_steps_upto

    path = tmp_path / "episodes.jsonl"
    lines = [json.dumps({"step": 1, "reply": "a\u2028b\x85c"}, ensure_ascii=False), json.dumps({"step": 2})]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    _keep_steps_upto(path, 1)
    assert path.read_text(encoding="utf-8") == lines[0] + "\n"
    superseded = (tmp_path / "episodes.superseded.jsonl").read_text(encoding="utf-8")
    assert superseded == lines[1] + "\n"
