import pytest

from empathy_gym.user.protocol import (RLVER_TRAINING, SAGE, EmotionProtocol, emotion_band,
                                       resolve_protocol)


def test_sage_numbers():
    assert (SAGE.initial_emotion, SAGE.min_change, SAGE.max_change) == (40, -10, 10)
    assert (SAGE.success_emotion, SAGE.failure_below, SAGE.max_turns) == (100, 10, 10)


def test_rlver_training_numbers():
    assert RLVER_TRAINING.initial_emotion == 30 and RLVER_TRAINING.max_turns == 8
    assert RLVER_TRAINING.clamp_change(37) == 37  # unclamped
    # e <= 0 ends the dialogue: 1 is alive, 0 is a failure.
    assert RLVER_TRAINING.termination(1, 3) == (False, False, None)
    assert RLVER_TRAINING.termination(0, 3) == (True, False, "failure")


@pytest.mark.parametrize("emotion,change,expected", [
    (40, 25, 50),    # clamped to +10
    (40, -25, 30),   # clamped to -10
    (95, 10, 100),   # clipped at 100
    (5, -10, 0),     # clipped at 0
    (40, 5, 45),
])
def test_apply_clamps_then_clips(emotion, change, expected):
    assert SAGE.apply(emotion, change) == expected


@pytest.mark.parametrize("emotion,turn,expected", [
    (100, 3, (True, False, "success")),
    (99, 3, (False, False, None)),
    (10, 3, (False, False, None)),   # failure is strictly below 10
    (9, 3, (True, False, "failure")),
    (50, 10, (False, True, "max_turns")),
    (100, 10, (True, False, "success")),  # success wins over the turn limit
])
def test_termination_thresholds(emotion, turn, expected):
    assert SAGE.termination(emotion, turn) == expected


def test_bands():
    assert [emotion_band(e) for e in (100, 99, 70, 69, 40, 39, 10, 9, 0)] == \
        ["S", "A", "A", "B", "B", "C", "C", "F", "F"]


def test_resolve_protocol():
    assert resolve_protocol("rlver_training") is RLVER_TRAINING
    assert resolve_protocol("sage", max_turns=3).max_turns == 3
    assert resolve_protocol({"initial_emotion": 50}).initial_emotion == 50
    with pytest.raises(KeyError, match="unknown protocol"):
        resolve_protocol("nope")
    with pytest.raises(ValueError, match="initial_emotion"):
        EmotionProtocol(initial_emotion=101)
