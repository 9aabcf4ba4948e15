"""One ending (empathy_gym/ending.py): the typed reason every driver records, and the one
way a cut turn is closed (our rollout engine and verl's agent loop both call it)."""

from __future__ import annotations

import json

import pytest

from empathy_gym.ending import Ending, close_cut_turn, is_cut
from empathy_gym.user.protocol import RLVER_TRAINING, SAGE


def test_the_protocol_ends_with_typed_reasons_that_log_as_before():
    assert SAGE.termination(100, 3, "ok", "en") == (True, False, Ending.SUCCESS)
    assert SAGE.termination(9, 3, "ok", "en") == (True, False, Ending.FAILURE)
    assert SAGE.termination(50, 3, "Bye then.", "en") == (True, False, Ending.GOODBYE)
    assert SAGE.termination(50, 9, "ok", "en") == (False, True, Ending.MAX_TURNS)
    assert RLVER_TRAINING.termination(0, 1) == (True, False, Ending.FAILURE)
    # a str: the logs (episodes.jsonl, transcripts) and every comparison read as before
    assert Ending.SUCCESS == "success" and f"{Ending.MAX_TURNS}" == "max_turns"
    assert json.dumps({"termination": Ending.CONTEXT_LIMIT}) == '{"termination": "context_limit"}'


def test_only_the_budgets_cut_a_dialogue():
    assert [e.value for e in Ending if e.cut] == ["context_limit", "response_length", "max_assistant_turns"]
    assert is_cut("context_limit") and not is_cut("max_turns") and not is_cut(None)
    with pytest.raises(ValueError, match="'bogus' is not a valid Ending"):
        is_cut("bogus")


def test_a_cut_turn_is_closed_with_an_untrained_end_token():
    ids, mask, logprobs = [5, 6], [0, 1], [0.0, -0.5]
    assert close_cut_turn(ids, mask, logprobs, 9) == ([5, 6, 9], [0, 1, 0], [0.0, -0.5, 0.0])
    assert (ids, mask, logprobs) == ([5, 6], [0, 1], [0.0, -0.5])  # the inputs are kept
    assert close_cut_turn(ids, mask, None, 9)[2] is None  # a caller that keeps no log-probabilities
    assert close_cut_turn(ids, mask, [], 9)[2] == []


def test_the_envs_outputs_hold_the_plain_value():
    """info and Dialogue are data for any code (yaml.safe_dump refuses a str subclass, and
    its repr read <Ending.MAX_TURNS: 'max_turns'>: a newcomer's probe)."""
    from empathy_gym.env import EmpathyDialogueEnv
    from empathy_gym.user.scripted import ScriptedUser

    env = EmpathyDialogueEnv("en", user=ScriptedUser([1]), max_turns=1)
    env.reset(seed=0)
    *_, info = env.step("I hear you.")
    assert type(info["termination_reason"]) is str and info["termination_reason"] == "max_turns"
    assert type(env.dialogue.done_reason) is str and Ending(env.dialogue.done_reason).cut is False
