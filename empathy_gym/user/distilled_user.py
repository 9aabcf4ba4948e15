"""The distilled simulated user (``--user distilled``, ``distilled:PATH``): the appraisal of a
distilled appraiser (:mod:`empathy_gym.user.appraiser`), a small language model trained to
judge as SAGE's LLM simulators do; the opening and the replies of the rule user's story
(:mod:`empathy_gym.user.rule_user`), chosen to fit the change (a reply never reads as
disappointment after a gain, or as relief after a loss). No LLM server; deterministic.

One appraisal: the appraiser's distribution over :data:`~empathy_gym.user.appraiser.BINS`
and its mean ``m`` (emotion points); a reply that trips one of the rule user's voiding
guards (:data:`~empathy_gym.user.rule_user.VOIDING`: injection, gibberish, the wrong
language, repetition, parroting, too short) or one of the appraiser's reply checks
(:func:`~empathy_gym.user.appraiser.reply_checks`: a word run, in English a repeated
bigram or mostly non-words) gains nothing (``m`` above 0 becomes 0), and so does one
without a cue of the hidden intention under a difficulty with ``intention_required``; a
positive ``m`` is multiplied by the difficulty's ``gain_scale``, a negative one by its
``loss_scale``; the change is that, rounded half away from zero and clipped to [-10, 10].
The appraiser learnt those replies are bad (they are among its training negatives); the
floor keeps a policy from finding where it learnt it too weakly.

``pessimistic=True`` (``--user distilled,pessimistic=true``) pays the lower of that change
and the rule user's change for the same reply at the same difficulty: worst-case
optimisation over an ensemble of two reward models (Coste et al., "Reward Model Ensembles
Help Mitigate Overoptimization", ICLR 2024, the WCO objective). A policy trained against it
gains only with a reply that both judges pay, so a hole in one of them (the rule user pays
salads of the user's words, the appraiser learnt some content-free English too weakly) is
not enough. It judges as a trainer's reward, not as an agreement measure: the rule user's
share makes it agree less with the LLM simulators.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from empathy_gym.personas import Persona
from empathy_gym.user.appraiser import BINS, Appraiser, expected_change
from empathy_gym.user.base import Appraisal, SimulatedUser, UserRequest
from empathy_gym.user.difficulty import Difficulty
from empathy_gym.user.rule_user import MAX_CHANGE, VOIDING, RuleUser, round_half_away


class DistilledUser(SimulatedUser):
    """A simulated user that appraises with a distilled appraiser and replies with the rule
    user's story.

    Args:
        difficulty: a preset name, path, dict or :class:`~empathy_gym.user.difficulty.Difficulty`
            (``gain_scale``, ``loss_scale``, ``intention_required``; the replies use
            ``hint_below_band`` as the rule user does).
        appraiser: an :class:`~empathy_gym.user.appraiser.Appraiser`, the folder of one
            (``empathy-gym distill --out FOLDER``), or ``None``: the shipped one.
        device: where the appraiser's base model runs (``"cpu"``, ``"cuda"``).
        batch_size: requests per forward pass of the base model.
        pessimistic: pay the lower of the appraiser's change and the rule user's (module
            docstring).

    Raises:
        AppraiserError: ``appraiser`` is not an appraiser folder (file and field named).
        FileNotFoundError, OSError: its base model cannot be found or loaded.
        KeyError, ValueError: an unknown or invalid difficulty.
    """

    deterministic = True

    def __init__(
        self,
        difficulty: str | os.PathLike | Mapping[str, Any] | Difficulty = "moderate",
        *,
        appraiser: Appraiser | str | os.PathLike | None = None,
        device: str = "cpu",
        batch_size: int = 16,
        pessimistic: bool = False,
    ):
        if not isinstance(pessimistic, bool):
            raise ValueError(f"user.pessimistic: true or false, got {pessimistic!r}")
        self.pessimistic = pessimistic
        self.rules = RuleUser(difficulty)
        self.difficulty = self.rules.difficulty
        if isinstance(appraiser, Appraiser):
            self.appraiser = appraiser
        else:
            folder = Path(appraiser).expanduser() if appraiser is not None else None
            self.appraiser = Appraiser.load(folder, device=device, batch_size=batch_size)

    def opening(self, personas: Sequence[Persona], seeds: Sequence[int]) -> list[str]:
        """The rule user's opening (:meth:`RuleUser.opening`)."""
        return self.rules.opening(personas, seeds)

    def appraise(self, requests: Sequence[UserRequest]) -> list[Appraisal]:
        """One appraisal per request (module docstring). ``features``: ``p<bin>`` the
        appraiser's probabilities, ``expected`` its mean change, and the rule user's
        negative contributions (the replies react to the worst of them); with
        ``pessimistic``, also ``distilled`` and ``rule``, the two changes it took the lower of.

        Raises:
            ValueError: a persona with an unknown language or character type.
        """
        if not requests:
            return []
        named = [self.appraiser.named_features(request) for request in requests]
        distributions = self.appraiser.distribution(requests, named)
        rule = self.rules.appraise(requests)
        return [self._appraisal(*parts) for parts in zip(requests, distributions, named, rule)]

    def _appraisal(
        self, request: UserRequest, distribution: np.ndarray, named: Mapping[str, float], by_rule: Appraisal
    ) -> Appraisal:
        mean = float(expected_change(distribution[None])[0])
        floored = any(
            name.startswith("check:") or (name.startswith("guard:") and name[6:] in VOIDING) for name in named
        )
        voided = mean > 0 and (floored or (self.difficulty.intention_required and not named["cue"]))
        points = 0.0 if voided else mean
        points *= self.difficulty.gain_scale if points > 0 else self.difficulty.loss_scale
        change = max(-MAX_CHANGE, min(MAX_CHANGE, round_half_away(points)))
        both = {"distilled": change, "rule": by_rule.change} if self.pessimistic else {}
        change = min(both.values(), default=change)
        complaints = {
            name: value
            for name, value in by_rule.features.items()
            if value < 0 and name not in ("mood", "voided", "difficulty")
        }
        features = {
            **{f"p{value:+d}": round(float(p), 4) for value, p in zip(BINS, distribution)},
            "expected": round(mean, 3),
            **({"voided": -round(mean, 3)} if voided else {}),
            **both,
            **complaints,
        }
        thoughts = self.rules.thought(request, by_rule.features, change)
        return Appraisal(change=change, thoughts=thoughts, features=features)

    def reply(
        self, requests: Sequence[UserRequest], appraisals: Sequence[Appraisal], emotions: Sequence[int]
    ) -> list[str]:
        """The rule user's reply for the change and the new emotion (:meth:`RuleUser.reply`)."""
        return self.rules.reply(requests, appraisals, emotions)

    def close(self) -> None:
        """Drop the appraiser's cached key/value states."""
        self.appraiser.cache.clear()
