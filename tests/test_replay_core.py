"""empathy_gym.evaluation.replay's core: re-appraising logged turns and the agreement statistics."""

from __future__ import annotations

from pathlib import Path

import pytest

from empathy_gym.evaluation.replay import agreement, reappraise, turn_request
from empathy_gym.evaluation.sage_logs import read_sage_log
from empathy_gym.user.base import Appraisal, SimulatedUser

LOG = Path(__file__).parent / "data" / "sage_logs" / "gpt-4o-2024-0806_based_simulator" / "gpt-4o-0806_result.jsonl"


def test_agreement_by_hand():
    result = agreement([5, -5, 0, 10], [5, 5, -5, 10], models=["a", "a", "b", "b"])
    # signs: predicted + - 0 +, logged + + - +: 2 of 4 agree
    assert result.sign_agreement == 0.5 and result.sign_agreement_nonzero == 0.5
    # chance from the marginals: P(-)=.25*.25 + P(0)=.25*0 + P(+)=.5*.75 = .4375
    assert result.chance_agreement == pytest.approx(0.4375)
    assert result.cohen_kappa == pytest.approx((0.5 - 0.4375) / (1 - 0.4375))
    assert result.mae == pytest.approx(15 / 4)
    # Spearman: ranks (3,1,2,4) and (2.5,2.5,1,4): cov 3 / sqrt(5 * 4.5)
    assert result.spearman == pytest.approx(3 / (5 * 4.5) ** 0.5)
    assert result.pearson == pytest.approx(62.5 / (125 * 118.75) ** 0.5)
    assert result.confusion["+"] == {"-": 1, "0": 0, "+": 2} and result.confusion["-"] == {"-": 0, "0": 1, "+": 0}
    # model a: predicted mean 0, logged 5; model b: 5 vs 2.5 -> opposite rankings
    assert result.per_model["a"]["mean_logged"] == 5 and result.per_model["b"]["mean_predicted"] == 5
    assert result.kendall_tau == pytest.approx(-1.0)


def test_agreement_rejects_bad_lengths():
    with pytest.raises(ValueError, match="equal, non-empty"):
        agreement([1, 2], [1])
    with pytest.raises(ValueError):
        agreement([], [])


class Recorder(SimulatedUser):
    deterministic = True

    def __init__(self):
        self.seen = []

    def opening(self, personas, seeds):
        return ["" for _ in personas]

    def appraise(self, requests):
        self.seen += list(requests)
        return [Appraisal(change=25) for _ in requests]

    def reply(self, requests, appraisals, emotions):
        return ["" for _ in requests]


def test_reappraise_sends_the_logged_state_and_clamps():
    dialogue = read_sage_log(LOG, limit=1)[0]
    turns = [t for t in dialogue.turns if t.scored]
    user = Recorder()
    done = []
    changes = reappraise(user, [turn_request(t, dialogue.persona) for t in turns], batch_size=4, on_batch=done.append)
    assert changes == [10] * len(turns)  # +25 clamped to SAGE's [-10, 10]
    assert done == [4, 4, 1]  # 9 scored turns in batches of 4
    third = user.seen[2]
    assert third.emotion == 55 and third.turn == 3 and len(third.history) == 5
    assert third.utterance == turns[2].utterance
