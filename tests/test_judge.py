"""The second judge during training: the divergence rule by hand, and the re-judged
replies of a step against the changes the training user paid."""

from __future__ import annotations

import logging

import gymnasium as gym
import pytest

import empathy_gym  # noqa: F401
from empathy_gym.agents.config import load_recipe
from empathy_gym.agents.judge import WINDOW, TrainingJudge, diverging

RISE = [(0.0, 0.0)] * 5 + [(1.0, -1.0)] * 5  # training +1 point per reply, judge -1


def test_diverging_needs_a_rise_and_a_fall_over_the_window():
    assert diverging(RISE)
    assert not diverging(RISE[1:])  # fewer than WINDOW steps
    assert not diverging([(0.0, 0.0)] * 5 + [(1.0, 0.0)] * 5)  # the judge held
    assert not diverging([(0.0, 0.0)] * 5 + [(1.0, 1.0)] * 5)  # both rose
    assert not diverging([(0.0, 0.0)] * 5 + [(0.4, -1.0)] * 5)  # a rise under MIN_MOVE
    assert diverging([(5.0, 5.0)] * 20 + RISE)  # only the last WINDOW steps count


class Played:
    """A dialogue played with the training user, as a trajectory records it."""

    def __init__(self, key, env, seed, replies):
        _, info = env.reset(seed=seed)
        emotions = [info["emotion"]]
        for reply in replies:
            _, _, terminated, truncated, info = env.step(reply)
            emotions.append(info["emotion"])
            if terminated or truncated:
                break
        self.key = key
        self._record = {
            "persona_id": env.unwrapped.dialogue.persona.id,
            "emotions": emotions,
            "messages": info["messages"],
        }

    def record(self):
        return self._record


REPLIES = ["That sounds exhausting. What happened?", "You did your part and still got blamed; that hurts."]


@pytest.mark.parametrize("judge", ["rule", "rule,difficulty=challenging"])
def test_the_judge_re_judges_each_reply_in_the_dialogue_the_training_user_shaped(judge, caplog):
    config = load_recipe("agents/tiny-cpu.yaml", [f"heldout.user={judge}", "env.kwargs.max_turns=2"], algorithm="grpo")
    env = gym.make(config.env.id, **config.env.kwargs)
    played = [Played(key, env, seed, REPLIES) for key, seed in enumerate([3, 4, 5])]
    paid = [b - a for p in played for a, b in zip(p.record()["emotions"], p.record()["emotions"][1:])]
    callback = TrainingJudge(config)
    metrics = callback.on_step_end(None, 1, played)
    assert metrics["judge/train_change_mean"] == pytest.approx(sum(paid) / len(paid))
    if judge == "rule":  # the training user itself: it pays again exactly what it paid
        assert metrics["judge/change_mean"] == metrics["judge/train_change_mean"]
    else:  # a stricter judge pays less for the same replies
        assert metrics["judge/change_mean"] < metrics["judge/train_change_mean"]
    assert metrics["judge/gap"] == pytest.approx(metrics["judge/train_change_mean"] - metrics["judge/change_mean"])
    now = (metrics["judge/train_change_mean"], metrics["judge/change_mean"])  # the same replies: the same again
    for before, fires in [((now[0] - 10, now[1] + 10), True), (now, False)]:
        callback.history = [before] * (WINDOW // 2) + [now] * (WINDOW // 2 - 1)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            metrics = callback.on_step_end(None, 2, played)
        assert metrics["judge/diverging"] == float(fires)
        assert ("judge/diverging" in caplog.text) == fires
    callback.on_train_end(None)
