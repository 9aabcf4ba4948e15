"""The dialogue engine: the lock-step loop (`play`) that training and evaluation drive, and
the per-dialogue coroutine (`play_one`) that verl's agent loop and verifiers drive. Round
by round schedules worked out by hand."""

from __future__ import annotations

import asyncio

import pytest

from empathy_gym.engine import DialogueEngine, Driver, Start, play, play_one
from empathy_gym.personas import load_personas
from empathy_gym.user.scripted import ScriptedUser

EN = [p.id for p in load_personas("en")]


def engine_with(user, **env):
    return DialogueEngine({"env_id": "EmpathyDialogue-v0", "personas": "en", "user": user, **env})


class CutAfter(Driver[dict]):
    """Dialogue i is cut by the driver after ``lengths[i]`` turns (None: never)."""

    def __init__(self, lengths):
        self.lengths, self.batches = lengths, []

    def begin(self, index, env, info):
        return {"index": index, "env": env, "persona": env.dialogue.persona.id, "turns": 0}

    def act(self, states):
        self.batches.append([state["index"] for state in states])
        return [f"reply {state['turns'] + 1} to dialogue {state['index']}" for state in states]

    def record(self, state, env, result):
        assert env is state["env"]  # a dialogue keeps its env to the end
        state["turns"] += 1
        state["last"] = result
        return self.lengths[state["index"]] is not None and state["turns"] >= self.lengths[state["index"]]


def test_play_refills_a_free_slot_at_once_and_never_shifts_a_running_dialogue():
    user = ScriptedUser([0])
    engine = engine_with(user, max_turns=10)
    envs = [engine.new_env() for _ in range(2)]
    driver = CutAfter([1, 2, 3, 4, 5])
    starts = [Start(seed=100 + i, options={"persona": EN[i]}) for i in range(5)]

    rounds = [[state["index"] for state in ended] for ended in play(envs, starts, driver)]

    # slots 0 and 1: d0, d1 | d0 ends r1 -> d2 in slot 0 | d1 ends r2 -> d3 in slot 1 |
    # d2 ends r4 -> d4 in slot 0 | d3 ends r6 | d4 alone until r9
    assert rounds == [[0], [1], [], [2], [], [3], [], [], [4]]
    assert driver.batches == [[0, 1], [2, 1], [2, 3], [2, 3], [4, 3], [4, 3], [4], [4], [4]]
    assert user.calls == 9  # one batched user call per round for both slots
    engine.close()


def test_play_times_the_users_turns_and_not_the_policys(monkeypatch):
    import empathy_gym.engine

    clock = [0.0]
    monkeypatch.setattr(empathy_gym.engine.time, "perf_counter", lambda: clock[0])

    class SlowUser(ScriptedUser):
        def appraise(self, requests):
            clock[0] += 1.0  # one second per batched user call
            return super().appraise(requests)

    class SlowPolicy(CutAfter):
        def act(self, states):
            clock[0] += 100.0
            return super().act(states)

    engine = engine_with(SlowUser([0]), max_turns=10)
    driver = SlowPolicy([1, 2, 3, 4, 5])
    starts = [Start(seed=100 + i, options={"persona": EN[i]}) for i in range(5)]
    rounds = list(play([engine.new_env() for _ in range(2)], starts, driver))
    assert len(rounds) == 9 and driver.user_seconds == 9.0  # the 9 rounds' user calls, none of the 900 s of acting
    engine.close()


def test_play_keeps_each_start_and_reply_with_its_own_dialogue():
    engine = engine_with(ScriptedUser([0]), max_turns=10)
    envs = [engine.new_env() for _ in range(2)]
    driver = CutAfter([3, 1, 2])
    starts = [Start(seed=7, options={"persona": EN[4]}), Start(seed=8, options={"persona": EN[2]}), Start(seed=9)]
    ended = [state for states in play(envs, starts, driver) for state in states]
    by_index = {state["index"]: state for state in ended}
    assert by_index[0]["persona"] == EN[4] and by_index[1]["persona"] == EN[2]
    for index, turns in [(0, 3), (1, 1), (2, 2)]:
        info = by_index[index]["last"][4]
        assert info["utterance"] == f"reply {turns} to dialogue {index}"
        assert info["turn"] == turns


def test_the_env_ends_a_dialogue_that_the_driver_would_continue():
    engine = engine_with(ScriptedUser([0]), max_turns=3)
    envs = [engine.new_env() for _ in range(3)]
    driver = CutAfter([None, None, None])
    rounds = list(play(envs, [Start(seed=i) for i in range(3)], driver))
    assert [len(ended) for ended in rounds] == [0, 0, 3]
    assert {state["last"][4]["termination_reason"] for state in rounds[-1]} == {"max_turns"}


def test_play_refuses_a_wrong_number_of_utterances_and_no_slots():
    engine = engine_with(ScriptedUser([0]))

    class Short(CutAfter):
        def act(self, states):
            return super().act(states)[:-1]

    with pytest.raises(TypeError, match="returned 1 utterances for 2 dialogues"):
        list(play([engine.new_env(), engine.new_env()], [Start(0), Start(1)], Short([1, 1])))
    with pytest.raises(ValueError, match="at least one env"):
        list(play([], [Start(0)], CutAfter([1])))
    assert list(play([], [], CutAfter([]))) == []


def test_play_one_stops_when_the_policy_step_returns_none_or_record_says_so():
    user = ScriptedUser([0])
    engine = engine_with(user, max_turns=10)

    def run(stop_acting_at, stop_recording_at):
        env = engine.new_env()
        env.reset(seed=0, options={"persona": EN[0]})
        seen, results = [], []

        async def act(observation):
            seen.append(observation)
            return None if len(seen) == stop_acting_at else f"reply {len(seen)}"

        def record(result):
            results.append(result)
            return len(results) == stop_recording_at

        asyncio.run(play_one(engine, env, act, record))
        return seen, results

    calls = user.calls
    seen, results = run(stop_acting_at=3, stop_recording_at=None)
    assert seen[0] is None and seen[1:] == [results[0][0], results[1][0]]  # the user's replies, in order
    assert len(results) == 2 and user.calls == calls + 2  # the third act never reached the user
    seen, results = run(stop_acting_at=None, stop_recording_at=4)
    assert len(seen) == 4 and len(results) == 4


def test_a_reset_and_a_batch_of_turns_never_reach_the_user_at_once():
    """The OpenEnv server resets one session while others' turns are in a batch: both go
    through the engine's user lock (a transformers user is not safe from two threads)."""
    import threading
    import time

    class Watched(ScriptedUser):
        inside = 0
        overlapped = False
        guard = threading.Lock()

        def _enter(self):
            with self.guard:
                Watched.inside += 1
                Watched.overlapped |= Watched.inside > 1
            time.sleep(0.05)
            with self.guard:
                Watched.inside -= 1

        def opening(self, personas, seeds):
            self._enter()
            return super().opening(personas, seeds)

        def respond(self, requests, protocol):
            self._enter()
            return super().respond(requests, protocol)

    engine = engine_with(Watched([1] * 50))
    envs = [engine.new_env() for _ in range(4)]

    async def together():
        for index, env in enumerate(envs[:2]):
            await engine.reset(env, seed=index)
        steps = [engine.submit(env, "I hear you.") for env in envs[:2]]
        resets = [engine.reset(env, seed=9 + index) for index, env in enumerate(envs[2:])]
        return await asyncio.gather(*steps, *resets)

    results = asyncio.run(together())
    assert len(results) == 4 and not Watched.overlapped
    assert results[2][1]["persona_id"] == envs[2].dialogue.persona.id
