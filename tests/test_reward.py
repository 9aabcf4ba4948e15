"""The one reward (empathy_gym/reward.py) and every place that reads it: the env, the
trainer's cut dialogues, the recipe check, GRPO's env check and TRL's fields. Values by
hand from the emotions; the verl agent loop's cut dialogues: tests/layered/verl_agent_loop_checks.py."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from empathy_gym.agents.config import RecipeError, load_recipe
from empathy_gym.agents.rollout import Trajectory
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.integrations.trl import final_emotion_reward, to_trl_fields
from empathy_gym.personas import load_personas
from empathy_gym.reward import RLVER_REWARD, Reward
from empathy_gym.user.scripted import ScriptedUser

EMOTIONS = [40, 45, 35, 60]  # e_0 .. e_3


def turns(reward, emotions=EMOTIONS):
    last = len(emotions) - 1
    return [reward.turn(emotions[t - 1], emotions[t], t == last) for t in range(1, last + 1)]


def test_turn_rewards_by_hand():
    assert turns(Reward("delta")) == pytest.approx([0.05, -0.10, 0.25])
    assert turns(Reward("final")) == pytest.approx([0.0, 0.0, 0.60])
    # shaping 0.5: half of each change, and e_T / 100 at the end
    assert turns(Reward("final", 0.5)) == pytest.approx([0.025, -0.05, 0.125 + 0.60])
    assert Reward("final", 0.5).episode(EMOTIONS) == pytest.approx(1.5 * 0.60 - 0.5 * 0.40)
    assert Reward("delta").episode(EMOTIONS) == pytest.approx(0.20)
    assert RLVER_REWARD.episode(EMOTIONS) == pytest.approx(0.60)


def test_a_cut_dialogue_adds_what_the_end_would_have_paid():
    assert Reward("final").at_end(35) == pytest.approx(0.35)
    assert Reward("final", 0.5).at_end(35) == pytest.approx(0.35)
    assert Reward("delta").at_end(35) == 0.0


def test_reward_to_go_needs_per_turn_credit():
    assert Reward("delta").per_turn and Reward("final", 0.1).per_turn and not Reward("final").per_turn
    with pytest.raises(ValueError, match="advantage 'reward_to_go' with env reward_mode 'final'"):
        Reward("final").check_advantage("reward_to_go")
    Reward("final").check_advantage("episode")
    Reward("final", 0.1).check_advantage("reward_to_go")


@pytest.mark.parametrize(
    "mode,shaping,message",
    [
        ("sparse", 0.0, "reward_mode must be 'delta' or 'final', got 'sparse'"),
        ("final", -0.1, "reward_shaping must be a finite number >= 0, got -0.1"),
        ("final", float("inf"), "reward_shaping must be a finite number >= 0, got inf"),
        ("final", "0.1", "reward_shaping must be a finite number >= 0, got '0.1'"),
        ("final", True, "reward_shaping must be a finite number >= 0, got True"),
        ("final", 10**400, "reward_shaping must be a finite number >= 0, got 1000"),  # was an OverflowError
        ("delta", 0.1, "reward_shaping=0.1 needs reward_mode 'final'"),
    ],
)
def test_a_bad_reward_names_its_keyword(mode, shaping, message):
    with pytest.raises(ValueError, match=message):
        Reward(mode, shaping)


def test_the_env_pays_the_shaped_final_reward():
    env = EmpathyDialogueEnv(
        "en", user=ScriptedUser([5, -10, 10]), max_turns=3, reward_mode="final", reward_shaping=0.5
    )
    env.reset(seed=0)
    rewards = [env.step("I hear you.")[1] for _ in range(3)]
    assert env.dialogue.emotions == [40, 45, 35, 45]
    assert rewards == pytest.approx([0.025, -0.05, 0.05 + 0.45])
    assert env.reward == Reward("final", 0.5) and env.reward_mode == "final"
    with pytest.raises(ValueError, match="reward_shaping=0.2 needs reward_mode 'final'") as refused:
        EmpathyDialogueEnv("en", reward_shaping=0.2)
    # was: said nothing of where 'delta' came from when the caller had not named a mode
    assert "reward_mode is 'delta', the default when none is given" in str(refused.value)
    assert "set reward_mode='final' beside it" in str(refused.value)


def test_a_recipe_may_use_reward_to_go_with_a_shaped_final_reward_only():
    final = ["advantage=reward_to_go", "env.kwargs.reward_mode=final"]
    with pytest.raises(RecipeError, match="advantage 'reward_to_go' with env reward_mode 'final'"):
        load_recipe("agents/tiny-cpu.yaml", final, algorithm="grpo")
    config = load_recipe("agents/tiny-cpu.yaml", [*final, "env.kwargs.reward_shaping=0.1"], algorithm="grpo")
    assert config.env.kwargs["reward_shaping"] == 0.1
    with pytest.raises(RecipeError, match=r"field 'env.kwargs.reward_shaping': reward_shaping=0.1 needs"):
        load_recipe("agents/tiny-cpu.yaml", ["env.kwargs.reward_shaping=0.1"], algorithm="grpo")


def test_grpo_refuses_envs_whose_reward_pays_only_at_the_end():
    from empathy_gym.agents.grpo import GRPOTrainer

    check = GRPOTrainer.check_envs
    trainer = SimpleNamespace(config=SimpleNamespace(advantage="reward_to_go"))
    with pytest.raises(RecipeError, match="advantage 'reward_to_go'"):
        check(trainer, [SimpleNamespace(reward=Reward("delta")), SimpleNamespace(reward=Reward("final"))])
    check(trainer, [SimpleNamespace(reward=Reward("final", 0.2))])


def cut_trajectory(reward):
    persona = load_personas("en")[0]
    return Trajectory(
        key=0,
        group=0,
        env_seed=0,
        persona_id=persona.id,
        language="en",
        hidden_intention=persona.hidden_intention,
        character_type=persona.character_type,
        token_ids=[1, 2, 3, 4],
        loss_mask=[0, 1, 0, 1],
        rollout_logprobs=[0.0] * 4,
        rewards=turns(reward, [30, 40, 35])[:1] + [reward.turn(40, 35, False)],
        emotions=[30, 40, 35],
        termination="context_limit",
        reward_mode=reward.mode,
        reward_shaping=reward.shaping,
    )


def test_a_dialogue_cut_at_the_context_limit_is_scored_as_ended_for_grpo_and_trl():
    final = cut_trajectory(Reward("final"))
    assert final.rewards == [0.0, 0.0]
    assert final.outcome_rewards() == pytest.approx([0.0, 0.35])
    # before: TRL's episode_return summed the env's rewards only, 0 for every cut dialogue
    assert to_trl_fields([final])["episode_return"] == pytest.approx([0.35])
    delta = cut_trajectory(Reward("delta"))
    assert delta.outcome_rewards() == pytest.approx([0.10, -0.05])
    assert to_trl_fields([delta])["episode_return"] == pytest.approx([0.05])
    assert final.record()["reward_mode"] == "final" and final.record()["reward_shaping"] == 0.0
    assert final_emotion_reward(["a"], final_emotion=[35]) == pytest.approx([0.35])
