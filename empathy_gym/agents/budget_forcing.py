"""Budget forcing for think-then-say: every agent turn thinks, then replies.

s1 (Muennighoff et al. 2025, arXiv 2501.19393, section 3.1) caps how long a model thinks
by appending the end-of-thinking delimiter for it once a token budget is spent (its other
half, appending "Wait" to make a model think longer, is not done here). Here
each turn's generation starts inside ``<think>`` (the tag is given, not sampled) and, when
the policy has not closed the block within ``think_budget`` sampled tokens, or ends its turn
before closing it, ``</think>`` is appended for it and the policy goes on to write the reply
in at most ``max_new_tokens - think_budget`` more tokens. So a model that never learned the
format (SmolLM2-135M never opens ``<think>`` on its own) still thinks before each reply, and
the env's format penalty measures nothing it could not help.

The tags added here were not sampled: each :class:`~empathy_gym.agents.rollout.Sample`
marks them in ``forced``, the rollout keeps them out of the loss, and their log-probs are
0.0 placeholders.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from empathy_gym.agents.rollout import Sample
from empathy_gym.seeding import derive_seed
from empathy_gym.think import CLOSE, OPEN

OPENING, CLOSING = OPEN + "\n", "\n" + CLOSE + "\n\n"


class BudgetForcing:
    """A generator whose every turn is ``<think>`` thinking ``</think>`` reply.

    Args:
        generator: the policy's sampler; its ``generate(prompts, seeds, max_new_tokens=N)``
            must take a per-call token limit (both of :mod:`empathy_gym.agents.generation`'s
            generators do).
        tokenizer: the policy's tokenizer (encodes the two tags).
        think_budget: sampled thinking tokens a turn may write before ``</think>`` is
            forced (int, 1 <= think_budget < max_new_tokens).
        max_new_tokens: sampled tokens of the whole turn, thinking and reply (the tags
            not counted).

    Attributes:
        forced_tokens: the tokens a turn holds beyond those sampled (the two tags), which
            a dialogue must have room for.

    Raises:
        ValueError: ``think_budget`` outside [1, max_new_tokens).
    """

    def __init__(self, generator: Any, tokenizer: Any, *, think_budget: int, max_new_tokens: int):
        if not 1 <= think_budget < max_new_tokens:
            raise ValueError(
                f"generation.think_budget must be in [1, generation.max_new_tokens={max_new_tokens}), "
                f"got {think_budget} (the reply needs tokens of its own)"
            )
        self.generator, self.tokenizer = generator, tokenizer
        self.think_budget, self.max_new_tokens = think_budget, max_new_tokens
        self.opening = tokenizer.encode(OPENING, add_special_tokens=False)
        self.closing = tokenizer.encode(CLOSING, add_special_tokens=False)
        self.forced_tokens = len(self.opening) + len(self.closing)

    def generate(
        self, prompts: Sequence[Sequence[int]], seeds: Sequence[int], max_new_tokens: int | None = None
    ) -> list[Sample]:
        """One turn per prompt: ``<think>`` (forced), the sampled thinking, ``</think>``
        (forced unless the policy wrote it) and the sampled reply, as one
        :class:`~empathy_gym.agents.rollout.Sample` whose ``forced`` marks the tags added
        here. The reply is sampled with a seed derived from the row's ``seeds`` entry, so
        the same seeds give the same turns.

        Args:
            prompts: token prompts, each ending where the agent's turn begins.
            seeds: one sampling seed per prompt.
            max_new_tokens: the whole turn's sampled tokens (>= 2; default: the
                constructor's): the thinking ``min(think_budget, max_new_tokens - 1)`` at
                most, the reply the rest.
        """
        total = self.max_new_tokens if max_new_tokens is None else max_new_tokens
        thinking = min(self.think_budget, total - 1)
        opened = [list(prompt) + self.opening for prompt in prompts]
        thoughts = self.generator.generate(opened, list(seeds), max_new_tokens=thinking)
        turns = [self._closed(thought, prompt) for thought, prompt in zip(thoughts, opened)]
        pending = [i for i, turn in enumerate(turns) if not turn.finished]
        if pending:
            replies = self.generator.generate(
                [opened[i] + turns[i].token_ids for i in pending],
                [derive_seed(seeds[i], "reply") for i in pending],
                max_new_tokens=total - thinking,
            )
            for i, reply in zip(pending, replies):
                turn = turns[i]
                turns[i] = Sample(
                    turn.token_ids + reply.token_ids,
                    turn.logprobs + reply.logprobs,
                    reply.finished,
                    turn.forced + [False] * len(reply.token_ids),
                )
        return [
            Sample(
                self.opening + t.token_ids,
                [0.0] * len(self.opening) + t.logprobs,
                t.finished,
                _tag(self.opening) + t.forced,
            )
            for t in turns
        ]

    def _closed(self, thought: Sample, prompt: list[int]) -> Sample:
        """The thinking part of a turn, closed: as sampled when the policy wrote
        ``</think>`` itself (``finished`` when it also ended its turn), else with its
        end-of-turn token dropped and ``</think>`` appended (never ``finished``). A
        generator's cached key/value states of ``prompt`` and a dropped end token are
        discarded: no later prompt extends them."""
        if CLOSE in self.tokenizer.decode(thought.token_ids):
            return Sample(thought.token_ids, thought.logprobs, thought.finished, [False] * len(thought.token_ids))
        kept = len(thought.token_ids) - int(thought.finished)
        cache = getattr(self.generator, "prefix_cache", None)
        if thought.finished and cache is not None:
            cache.discard(prompt + thought.token_ids)
        return Sample(
            thought.token_ids[:kept] + self.closing,
            thought.logprobs[:kept] + [0.0] * len(self.closing),
            False,
            [False] * kept + _tag(self.closing),
        )


def _tag(ids: Sequence[int]) -> list[bool]:
    return [True] * len(ids)


def with_think_budget(generator: Any, tokenizer: Any, generation: Any) -> Any:
    """``generator`` under :class:`BudgetForcing` when the recipe's ``generation`` (a
    :class:`~empathy_gym.agents.config.GenerationConfig`) sets ``think_budget`` (it needs
    ``think``), else ``generator`` itself."""
    if generation.think_budget is None:
        return generator
    return BudgetForcing(
        generator, tokenizer, think_budget=generation.think_budget, max_new_tokens=generation.max_new_tokens
    )
