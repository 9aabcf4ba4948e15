"""One owner for a simulated user and the envs that share it (empathy_gym/session.py):
the user is built once, shared, and closed once, by whoever built it."""

from __future__ import annotations

import gymnasium as gym
import pytest

from empathy_gym.env import EmpathyDialogueEnv, step_many
from empathy_gym.session import Session
from empathy_gym.user.rule_user import RuleUser
from empathy_gym.user.scripted import ScriptedUser


@pytest.fixture
def closes(monkeypatch):
    """Every RuleUser.close call, by user."""
    calls: list[int] = []
    monkeypatch.setattr(RuleUser, "close", lambda self: calls.append(id(self)))
    return calls


def test_a_session_builds_one_user_shares_it_and_closes_it_once(closes):
    session = Session(EmpathyDialogueEnv, personas="en")
    envs = session.envs(3)
    assert len({id(env) for env in envs}) == 3 and all(env.user is session.user for env in envs)
    assert isinstance(session.user, RuleUser) and session.owns_user
    for env in envs:
        env.close()  # was: closing the first env closed the user under the others
    assert closes == []
    for index, env in enumerate(envs):
        env.reset(seed=index)
    assert len(step_many(envs, ["That sounds hard."] * 3)) == 3  # the user still plays
    session.close()
    session.close()
    assert closes == [id(session.user)]
    with pytest.raises(RuntimeError, match="this session is closed"):
        session.new_env()


def test_a_ready_user_stays_the_callers(closes):
    user = RuleUser()
    with Session(EmpathyDialogueEnv, personas="en", user=user) as session:
        assert session.user is user and not session.owns_user
        session.envs(2)
    assert closes == []


def test_of_id_uses_the_registered_settings_and_refuses_another_env():
    import empathy_gym  # noqa: F401

    with Session.of_id("EmpathyDialogue-v0", user=ScriptedUser([5])) as session:
        env = session.new_env()
        assert env.personas == gym.make("EmpathyDialogue-v0").unwrapped.personas
        assert session.personas == env.personas and session.protocol is env.protocol
    with pytest.raises(TypeError, match="a session needs EmpathyDialogueEnv envs, got CartPoleEnv"):
        Session(lambda: gym.make("CartPole-v1").unwrapped)


def test_the_vector_env_closes_its_user_once(closes):
    from empathy_gym.vector import EmpathyDialogueVectorEnv

    envs = EmpathyDialogueVectorEnv(3, personas="en")
    envs.reset(seed=0)
    envs.close()
    assert closes == [id(envs.session.user)]


def test_the_trainer_closes_the_users_it_built(tmp_path, closes):
    """Was: the training user and the second judge's were never closed (a served user's
    connections, a model user's memory stayed until the process ended)."""
    from empathy_gym.agents import GRPOTrainer, load_recipe

    overrides = [f"output_dir={tmp_path}", "rollout_batch_size=4", "progress=false", "heldout.user=rule"]
    trainer = GRPOTrainer(load_recipe("agents/tiny-cpu.yaml", overrides, algorithm="grpo"))
    judge = next(callback for callback in trainer.callbacks if hasattr(callback, "session"))
    trainer.close()
    trainer.close()
    assert sorted(closes) == sorted([id(trainer.session.user), id(judge.session.user)])
