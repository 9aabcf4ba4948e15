"""Replay SAGE's logged dialogues through another simulated user, and measure agreement.

Every logged agent reply that SAGE appraised is shown to our simulated user with the
logged history before it and the logged emotion before it (:func:`reappraise`); the
user's proposed change, clamped by the protocol, is compared with SAGE's applied change
(:func:`agreement`): does it move the same way, how strongly do the changes correlate,
and does it rank the tested models (one log file each) as SAGE's simulator did.

The logs come from :mod:`empathy_gym.sage_logs`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from empathy_gym.sage_logs import LoggedTurn
from empathy_gym.user.base import SimulatedUser, UserRequest
from empathy_gym.user.protocol import SAGE, EmotionProtocol


def turn_request(turn: LoggedTurn, persona, seed: int = 0) -> UserRequest:
    """The :class:`~empathy_gym.user.base.UserRequest` our user gets for a logged turn:
    the logged history, reply and emotion before it."""
    return UserRequest(persona=persona, history=turn.history, utterance=turn.utterance,
                       emotion=turn.emotion_before, turn=turn.turn, seed=seed)


def reappraise(user: SimulatedUser, requests: Sequence[UserRequest], *,
               protocol: EmotionProtocol = SAGE, batch_size: int = 64,
               on_batch: Callable[[int], None] | None = None) -> list[int]:
    """Our user's change for each logged turn, clamped by ``protocol`` (SAGE: [-10, 10]).

    Args:
        user: any :class:`~empathy_gym.user.base.SimulatedUser`; only its appraisal is used.
        requests: one per logged turn (:func:`turn_request`).
        batch_size: requests per :meth:`~empathy_gym.user.base.SimulatedUser.appraise` call.
        on_batch: called with the number of requests done after each batch (progress).

    Returns:
        One int per request.

    Raises:
        SimulatorError: the user could not appraise a turn.
    """
    changes: list[int] = []
    for start in range(0, len(requests), batch_size):
        batch = requests[start:start + batch_size]
        changes += [protocol.clamp_change(a.change) for a in user.appraise(batch)]
        if on_batch is not None:
            on_batch(len(batch))
    return changes


def _sign(values: np.ndarray) -> np.ndarray:
    return np.sign(values).astype(int)


@dataclass(frozen=True)
class Agreement:
    """How a user's changes agree with the logged ones (see :func:`agreement`)."""

    turns: int
    sign_agreement: float
    sign_agreement_nonzero: float
    chance_agreement: float
    cohen_kappa: float
    spearman: float
    pearson: float
    mae: float
    confusion: dict[str, dict[str, int]]
    per_model: dict[str, dict[str, float]]
    kendall_tau: float | None

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def agreement(predicted: Sequence[float], logged: Sequence[float],
              models: Sequence[str] | None = None) -> Agreement:
    """Agreement of predicted and logged per-turn emotion changes.

    Args:
        predicted, logged: (n,) changes, one per turn (ints in [-10, 10] under SAGE).
        models: (n,) the tested model of each turn's log file; with two or more models
            the ranking of the models by mean predicted change is compared with their
            ranking by mean logged change (Kendall's tau-b).

    Returns:
        :class:`Agreement` with: ``sign_agreement`` the share of turns whose signs
        (-, 0, +) are equal; ``sign_agreement_nonzero`` the same over turns with a
        non-zero logged change; ``chance_agreement`` the agreement expected from the two
        sign marginals alone, and ``cohen_kappa`` (Cohen 1960: (p_o - p_e) / (1 - p_e),
        ``sklearn.metrics.cohen_kappa_score``'s formula); ``spearman``, ``pearson``
        (``scipy.stats``; NaN when either side is constant); ``mae`` in emotion points;
        ``confusion[logged sign][predicted sign]`` counts; ``per_model[model]`` with
        ``turns``, ``mean_predicted``, ``mean_logged`` and ``sign_agreement``;
        ``kendall_tau`` (``scipy.stats.kendalltau``; ``None`` with fewer than two models).

    Raises:
        ValueError: empty input or lengths that differ.
    """
    from scipy import stats

    predicted_a = np.asarray(predicted, dtype=float)
    logged_a = np.asarray(logged, dtype=float)
    if len(predicted_a) == 0 or len(predicted_a) != len(logged_a) or (
            models is not None and len(models) != len(logged_a)):
        raise ValueError(f"agreement needs equal, non-empty lengths: {len(predicted_a)} predicted, "
                         f"{len(logged_a)} logged" + (f", {len(models)} models" if models is not None else ""))
    p_sign, l_sign = _sign(predicted_a), _sign(logged_a)
    observed = float(np.mean(p_sign == l_sign))
    nonzero = l_sign != 0
    labels = (-1, 0, 1)
    chance = float(sum(np.mean(p_sign == s) * np.mean(l_sign == s) for s in labels))
    kappa = (observed - chance) / (1 - chance) if chance < 1 else float("nan")
    constant = np.ptp(predicted_a) == 0 or np.ptp(logged_a) == 0
    spearman = float("nan") if constant else float(stats.spearmanr(predicted_a, logged_a).statistic)
    pearson = float("nan") if constant else float(stats.pearsonr(predicted_a, logged_a).statistic)
    names = {-1: "-", 0: "0", 1: "+"}
    confusion = {names[a]: {names[b]: int(np.sum((l_sign == a) & (p_sign == b))) for b in labels}
                 for a in labels}
    per_model: dict[str, dict[str, float]] = {}
    tau = None
    if models is not None:
        models_a = np.asarray(models)
        for model in sorted(set(models_a.tolist())):
            rows = models_a == model
            per_model[model] = {"turns": int(rows.sum()), "mean_predicted": float(predicted_a[rows].mean()),
                                "mean_logged": float(logged_a[rows].mean()),
                                "sign_agreement": float(np.mean(p_sign[rows] == l_sign[rows]))}
        if len(per_model) >= 2:
            tau = float(stats.kendalltau([m["mean_predicted"] for m in per_model.values()],
                                         [m["mean_logged"] for m in per_model.values()]).statistic)
    return Agreement(turns=len(predicted_a), sign_agreement=observed,
                     sign_agreement_nonzero=float(np.mean(p_sign[nonzero] == l_sign[nonzero])) if nonzero.any()
                     else float("nan"),
                     chance_agreement=chance, cohen_kappa=float(kappa), spearman=spearman, pearson=pearson,
                     mae=float(np.mean(np.abs(predicted_a - logged_a))), confusion=confusion,
                     per_model=per_model, kendall_tau=tau)
