"""The verl plumbing that needs no verl: the dataset builder, ``compute_score``, and the
shared simulated user and micro-batcher that the agent loop plays its dialogues through
(:mod:`empathy_gym.integrations.dialogues`). The agent loop itself, against verl 0.9.1's
own classes: ``tests/test_integration_verl_agent_loop.py``.
"""

from __future__ import annotations

import asyncio

import gymnasium as gym
import pytest

import empathy_gym  # noqa: F401
from empathy_gym.batching import MicroBatcher
from empathy_gym.integrations import verl as ev
from empathy_gym.integrations.dialogues import close_shared, shared, start_env
from empathy_gym.personas import load_personas
from empathy_gym.user.scripted import ScriptedUser

EN = [p.id for p in load_personas("en")]


@pytest.fixture(autouse=True)
def _fresh_users():
    yield
    close_shared()


def run(coro):
    return asyncio.run(coro)


def scripted_config(user, **extra):
    return {
        "name": "empathy",
        "env_id": "EmpathyDialogue-v0",
        "personas": "en",
        "protocol": "rlver_training",
        "user": user,
        **extra,
    }


def started(session, persona_id, seed=0, opening="Hi."):
    """An env of ``session`` with a dialogue started as a dataset row starts it."""
    env = session.new_env()
    start_env(env, {"persona_id": persona_id, "seed": seed, "opening": opening})
    return env


# -- equivalence with gym.make ---------------------------------------------------------
ACTIONS = [
    "That sounds exhausting. What happened?",
    "It makes sense that you feel hurt; you did your part and still got blamed.",
    "You're not at fault here. What would help most right now?",
]


def test_three_turns_match_gym_make_with_the_rule_user():
    seed, persona = 7, EN[5]
    reference = gym.make("EmpathyDialogue-v0", protocol="rlver_training")
    opening, info = reference.reset(seed=seed, options={"persona": persona})
    expected = [reference.step(action) for action in ACTIONS]

    session = shared({"name": "empathy", "env_id": "EmpathyDialogue-v0", "protocol": "rlver_training"})
    env = started(session, persona, seed=seed, opening=opening)
    assert env.dialogue.messages == info["messages"]

    async def dialogue():
        return [await session.submit(env, action) for action in ACTIONS]

    for (obs, reward, term, trunc, step_info), (r_obs, r, r_term, r_trunc, r_info) in zip(run(dialogue()), expected):
        assert obs == r_obs
        assert reward == pytest.approx(r)
        assert (term, trunc) == (r_term, r_trunc)
        assert step_info["emotion"] == r_info["emotion"]
        assert step_info["appraisal"] == r_info["appraisal"]


# -- concurrency and batching ----------------------------------------------------------
def test_concurrent_dialogues_never_mix():
    # Persona EN[0] rises by 10 a turn, EN[1] falls by 20: it fails at turn 2 while the
    # other goes on. Replies carry the emotion, so a mix-up would show.
    user = ScriptedUser(change_fn=lambda request: 10 if request.persona.id == EN[0] else -20)
    session = shared(scripted_config(user))

    async def dialogue(name, persona, turns):
        env = started(session, persona, seed=1, opening=f"opening of {name}")
        out = []
        for turn in range(turns):
            out.append(await session.submit(env, f"{name} says {turn}"))
            if out[-1][2] or out[-1][3]:
                break
        return env, out

    async def both():
        return await asyncio.gather(dialogue("up", EN[0], 3), dialogue("down", EN[1], 3))

    (up_env, up), (down_env, down) = run(both())
    assert [o[0] for o in up] == ["reply 1 (emotion 40)", "reply 2 (emotion 50)", "reply 3 (emotion 60)"]
    assert [o[0] for o in down] == ["reply 1 (emotion 10)", "reply 2 (emotion 0)"]
    assert down[-1][2] is True and not (up[-1][2] or up[-1][3])
    for name, env, turns in (("up", up_env, 3), ("down", down_env, 2)):
        history = env.dialogue.history
        assert history[0] == ("user", f"opening of {name}")
        assert [text for role, text in history if role == "agent"] == [f"{name} says {t}" for t in range(turns)]


def _four_concurrent_turns(**options):
    user = ScriptedUser([5])
    session = shared(scripted_config(user, **options))

    async def main():
        envs = [started(session, EN[i], seed=i) for i in range(4)]
        return await asyncio.gather(*(session.submit(env, f"a{i}") for i, env in enumerate(envs)))

    results = run(main())
    assert [r[0] for r in results] == ["reply 1 (emotion 35)"] * 4
    return user.calls, list(session.batcher.batch_sizes)


def test_micro_batcher_sends_concurrent_turns_as_one_user_call():
    assert _four_concurrent_turns() == (1, [4])


def test_micro_batcher_respects_max_batch_size():
    assert _four_concurrent_turns(max_batch_size=3) == (2, [3, 1])


def test_micro_batcher_off_gives_one_user_call_per_turn():
    assert _four_concurrent_turns(max_batch_size=1, batch_window_ms=0) == (4, [1, 1, 1, 1])


def test_batcher_hands_a_failure_to_every_caller_and_survives_a_new_loop():
    def fail_on_three(items):
        if 3 in items:
            raise ValueError("three")
        return [item * 10 for item in items]

    batcher = MicroBatcher(fail_on_three, window_s=0.002, max_batch=2)

    async def main():
        return await asyncio.gather(*(batcher.submit(i) for i in (1, 2, 3, 4)), return_exceptions=True)

    first, second, third, fourth = run(main())
    assert (first, second) == (10, 20)
    assert isinstance(third, ValueError) and isinstance(fourth, ValueError)
    assert run(main())[:2] == [10, 20]  # a second asyncio.run: a new event loop
    with pytest.raises(ValueError, match="max_batch"):
        MicroBatcher(fail_on_three, max_batch=0)


# -- shared users and errors -----------------------------------------------------------
def test_equal_configs_share_one_user():
    # verl builds one agent loop per sample: loops with equal configs must share the user.
    config = {"env_id": "EmpathyDialogue-v0", "protocol": "rlver_training"}
    a = shared({**config, "name": "empathy"})
    b = shared({**config, "name": "other"})
    c = shared({**config, "name": "empathy", "protocol": "sage"})
    assert a is b and a.user is b.user
    assert c is not a and c.user is not a.user
    assert a.env_kwargs == {"protocol": "rlver_training"}


def test_bad_dialogue_starts_raise_errors_that_name_the_field():
    env = shared(scripted_config(ScriptedUser([0]))).new_env()
    with pytest.raises(KeyError, match="'seed'"):
        start_env(env, {"persona_id": EN[0], "opening": "Hi."})
    with pytest.raises(TypeError, match="'opening'"):
        start_env(env, {"persona_id": EN[0], "seed": 0, "opening": 3})
    with pytest.raises(KeyError, match="unknown persona id"):
        start_env(env, {"persona_id": "nobody", "seed": 0, "opening": "Hi."})


def test_compute_score_sums_the_turn_scores():
    assert ev.compute_score("empathy_gym/x", "...", EN[0], {"turn_scores": [0.1, -0.05, 0.2]}) == pytest.approx(0.25)
    assert ev.compute_score("s", "", "", {"turn_scores": []}) == 0.0
    with pytest.raises(KeyError, match="turn_scores"):
        ev.compute_score("s", "", "", {"index": 0})


# -- the dataset -----------------------------------------------------------------------
def test_rows_reproduce_the_env_reset_and_start_env_recreates_them():
    config = {"name": "empathy", "env_id": "EmpathyDialogue-v0", "protocol": "rlver_training", "think": True}
    rows = ev.build_rows(config, persona_ids=[EN[3], EN[4]], seed=10)
    assert len(rows) == 2
    for index, row in enumerate(rows):
        reference = gym.make("EmpathyDialogue-v0", protocol="rlver_training", think=True)
        opening, info = reference.reset(seed=10 + index, options={"persona": row["extra_info"]["persona_id"]})
        assert row["prompt"] == info["messages"]
        assert row["prompt"][0]["role"] == "system" and "<think>" in row["prompt"][0]["content"]
        assert row["extra_info"]["interaction_kwargs"] == {
            "name": "empathy",
            "persona_id": [EN[3], EN[4]][index],
            "seed": 10 + index,
            "opening": opening,
        }
        assert row["extra_info"]["index"] == index and row["extra_info"]["split"] == "train"
        assert row["reward_model"] == {"style": "rule", "ground_truth": [EN[3], EN[4]][index]}
        assert row["data_source"] == "empathy_gym/EmpathyDialogue-v0"

    env = shared(config).new_env()
    start_env(env, rows[0]["extra_info"]["interaction_kwargs"])
    assert env.dialogue.messages == rows[0]["prompt"]


def test_parquet_files_round_trip_and_the_cli_writes_them(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    config = {"env_id": "EmpathyDialogue-v0", "personas": "en"}
    paths = ev.prepare_dataset(tmp_path / "a", config, seed=1, val_size=4)
    train = pq.read_table(paths["train"]).to_pylist()
    val = pq.read_table(paths["val"]).to_pylist()
    assert (len(train), len(val)) == (44, 4)
    assert {r["extra_info"]["persona_id"] for r in train + val} == set(EN)
    train_ids = [r["extra_info"]["persona_id"] for r in train]
    assert train == ev.build_rows(config, persona_ids=train_ids, seed=1)
    assert {r["extra_info"]["split"] for r in val} == {"val"}

    ev.main(
        [
            "prepare",
            "--personas",
            "en",
            "--env-id",
            "EmpathyDialogue-v0",
            "--out",
            str(tmp_path / "b"),
            "--seed",
            "1",
            "--val-size",
            "0",
        ]
    )
    assert not (tmp_path / "b" / "val.parquet").exists()
    assert len(pq.read_table(tmp_path / "b" / "train.parquet").to_pylist()) == 48
    with pytest.raises(ValueError, match="val_size"):
        ev.prepare_dataset(tmp_path / "c", config, val_size=48)
