"""Two training steps of every recipe variant on the tiny model give the rollouts and
metrics pinned before a redesign (tests/pin_rollouts.py; issue 38: a redesign keeps
behaviour, byte for byte)."""

from __future__ import annotations

import dataclasses
import json

import pytest
from pin_rollouts import PINNED, VARIANTS, machine, play

pinned = json.loads(PINNED.read_text())
other_machine = pytest.mark.skipif(
    pinned["machine"] != machine(),
    reason=f"the rollouts were pinned on {pinned['machine']}, this is {machine()}: sampling on float logits differs "
    "across CPUs and library versions; pin at the commit before a change (python tests/pin_rollouts.py), then run this",
)


@other_machine
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_two_steps_give_the_pinned_rollouts_and_metrics(variant):
    played, want = play(variant), pinned["variants"][variant]
    for step, (got, expected) in enumerate(zip(played["trajectories"], want["trajectories"], strict=True)):
        differ = [index for index, (a, b) in enumerate(zip(got, expected)) if a != b]
        assert got == expected, f"{variant}, step {step}: trajectories {differ} differ (of {len(expected)})"
    for step, (got, expected) in enumerate(zip(played["metrics"], want["metrics"], strict=True)):
        assert got == expected, f"{variant}, step {step}: " + ", ".join(
            f"{key} {expected.get(key)} -> {got.get(key)}"
            for key in sorted(set(got) | set(expected))
            if got.get(key) != expected.get(key)
        )


@other_machine
def test_a_reward_one_point_off_is_caught(monkeypatch):
    from empathy_gym.user import rule_user

    appraise = rule_user.RuleUser.appraise

    def one_point_kinder(self, requests):
        return [dataclasses.replace(appraisal, change=appraisal.change + 1) for appraisal in appraise(self, requests)]

    monkeypatch.setattr(rule_user.RuleUser, "appraise", one_point_kinder)
    played = play("ppo")
    assert played["trajectories"][0] != pinned["variants"]["ppo"]["trajectories"][0]
