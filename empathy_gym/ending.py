"""How a dialogue ends: one typed reason for the protocol's endings and the budgets' cuts,
and the one way a turn that a length limit cut is closed in the policy's tokens."""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum


class Ending(str, Enum):
    """Why a dialogue stopped. A ``str``: each member equals (and serialises as) its value,
    as the logs have always written it; the env's ``info["termination_reason"]`` and
    ``Dialogue.done_reason`` hold the plain value (``Ending(value)`` reads it back).

    The protocol's (:meth:`~empathy_gym.user.EmotionProtocol.termination`): ``SUCCESS``,
    ``FAILURE`` and ``GOODBYE`` (the user ended it: ``terminated``), ``MAX_TURNS`` (the
    task's turn limit: ``truncated``, nothing is bootstrapped there). A rollout's budgets
    (:attr:`cut`): ``CONTEXT_LIMIT`` (our rollout engine: the next turn would not fit),
    ``RESPONSE_LENGTH`` and ``MAX_ASSISTANT_TURNS`` (verl's agent loop) stop a dialogue
    the protocol has not ended; it is scored as if it had ended there
    (:meth:`Reward.at_end <empathy_gym.reward.Reward.at_end>`).
    """

    SUCCESS = "success"
    FAILURE = "failure"
    GOODBYE = "goodbye"
    MAX_TURNS = "max_turns"
    CONTEXT_LIMIT = "context_limit"
    RESPONSE_LENGTH = "response_length"
    MAX_ASSISTANT_TURNS = "max_assistant_turns"

    def __str__(self) -> str:
        return self.value

    @property
    def cut(self) -> bool:
        """A budget stopped the dialogue before the protocol ended it (a truncation)."""
        return self in (Ending.CONTEXT_LIMIT, Ending.RESPONSE_LENGTH, Ending.MAX_ASSISTANT_TURNS)


def is_cut(reason: str | None) -> bool:
    """Whether a recorded ``termination`` (an :class:`Ending` value, or ``None`` while the
    dialogue runs) is a budget's cut."""
    return reason is not None and Ending(reason).cut


def close_cut_turn(
    token_ids: Sequence[int], mask: Sequence[int], logprobs: Sequence[float] | None, end_id: int
) -> tuple[list[int], list[int], list[float] | None]:
    """Close an agent turn that a length limit cut before its end-of-turn token, so the
    next turn starts where the chat template expects: ``end_id`` is appended with mask 0
    (the policy did not sample it: no loss on it) and log-probability 0.0.

    Args:
        token_ids: the dialogue's token ids so far (ints), ending with the cut turn.
        mask: one 0/1 per token (1: sampled by the policy).
        logprobs: one float per token, or ``None``/empty when the caller keeps none (none
            is added then).
        end_id: the assistant's end-of-turn token id (ChatML: ``<|im_end|>``).

    Returns:
        New lists ``(token_ids, mask, logprobs)``, each one longer (``logprobs`` itself
        when it was ``None`` or empty); the inputs are not changed.
    """
    if logprobs:
        logprobs = [*logprobs, 0.0]
    return [*token_ids, end_id], [*mask, 0], logprobs
