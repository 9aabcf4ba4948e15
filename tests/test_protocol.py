import pytest

from empathy_gym.user.protocol import (
    RLVER_TRAINING,
    SAGE,
    EmotionProtocol,
    emotion_band,
    protocol_name,
    resolve_protocol,
    says_goodbye,
)


def test_sage_numbers():
    assert (SAGE.initial_emotion, SAGE.min_change, SAGE.max_change) == (40, -10, 10)
    # SAGE takes 10 agent replies and never appraises the 10th: 9 steps (test_npc.py 88-115)
    assert (SAGE.success_emotion, SAGE.failure_below, SAGE.max_turns, SAGE.goodbye) == (100, 10, 9, True)


def test_rlver_training_numbers():
    # RLVER's rollout checks turn_count > max_turns=8 after the user's answer: 9 turns
    assert RLVER_TRAINING.initial_emotion == 30 and RLVER_TRAINING.max_turns == 9
    assert RLVER_TRAINING.clamp_change(37) == 37  # unclamped
    # e <= 0 ends the dialogue: 1 is alive, 0 is a failure.
    assert RLVER_TRAINING.termination(1, 3) == (False, False, None)
    assert RLVER_TRAINING.termination(0, 3) == (True, False, "failure")
    # no stop at 100: the user keeps talking until it says goodbye
    assert RLVER_TRAINING.termination(100, 3) == (False, False, None)
    assert RLVER_TRAINING.termination(100, 3, "谢谢你，拜拜", "zh") == (True, False, "goodbye")
    assert RLVER_TRAINING.termination(60, 9) == (False, True, "max_turns")


@pytest.mark.parametrize(
    "text,language,expected",
    [
        ("好的，谢谢你，再见。", "zh", True),
        ("那我先走了，拜拜~", "zh", True),
        ("我们下周再见面吧", "zh", True),  # SAGE's substring rule fires here too
        ("谢谢你听我说", "zh", False),
        ("Thanks. Goodbye.", "en", True),
        ("ok, bye for now", "en", True),
        ("Good-bye, then.", "en", True),
        ("I waved bye-bye to him", "en", True),
        ("He stood by the byelaw", "en", False),  # "bye" only as a word
        ("Maybe. I'm not sure.", "en", False),
        ("Goodbye", "zh", False),  # the rule of the persona's language
    ],
)
def test_goodbye_rule(text, language, expected):
    assert says_goodbye(text, language) is expected


def test_goodbye_ends_before_the_turn_limit_but_after_the_thresholds():
    assert SAGE.termination(50, 3, "好吧，再见") == (True, False, "goodbye")
    assert SAGE.termination(50, 9, "好吧，再见", "zh") == (True, False, "goodbye")
    assert SAGE.termination(100, 3, "谢谢，再见", "zh") == (True, False, "success")
    assert SAGE.termination(5, 3, "算了，再见", "zh") == (True, False, "failure")
    assert EmotionProtocol(goodbye=False).termination(50, 3, "bye", "en") == (False, False, None)


def test_protocol_name():
    assert protocol_name(SAGE) == "sage" and protocol_name(resolve_protocol("rlver_training")) == "rlver_training"
    assert protocol_name(resolve_protocol("sage", max_turns=3)) is None


@pytest.mark.parametrize(
    "emotion,change,expected",
    [
        (40, 25, 50),  # clamped to +10
        (40, -25, 30),  # clamped to -10
        (95, 10, 100),  # clipped at 100
        (5, -10, 0),  # clipped at 0
        (40, 5, 45),
    ],
)
def test_apply_clamps_then_clips(emotion, change, expected):
    assert SAGE.apply(emotion, change) == expected


@pytest.mark.parametrize(
    "emotion,turn,expected",
    [
        (100, 3, (True, False, "success")),
        (99, 3, (False, False, None)),
        (10, 3, (False, False, None)),  # failure is strictly below 10
        (9, 3, (True, False, "failure")),
        (50, 9, (False, True, "max_turns")),
        (50, 8, (False, False, None)),
        (100, 9, (True, False, "success")),  # success wins over the turn limit
    ],
)
def test_termination_thresholds(emotion, turn, expected):
    assert SAGE.termination(emotion, turn) == expected


def test_bands():
    assert [emotion_band(e) for e in (100, 99, 70, 69, 40, 39, 10, 9, 0)] == [
        "S",
        "A",
        "A",
        "B",
        "B",
        "C",
        "C",
        "F",
        "F",
    ]


def test_resolve_protocol():
    assert resolve_protocol("rlver_training") is RLVER_TRAINING
    assert resolve_protocol("sage", max_turns=3).max_turns == 3
    assert resolve_protocol({"initial_emotion": 50}).initial_emotion == 50
    with pytest.raises(KeyError, match="unknown protocol"):
        resolve_protocol("nope")
    with pytest.raises(ValueError, match="initial_emotion"):
        EmotionProtocol(initial_emotion=101)
    with pytest.raises(TypeError, match="goodbye must be a bool"):
        EmotionProtocol(goodbye="yes")
    assert EmotionProtocol(success_emotion=None).termination(100, 1) == (False, False, None)
