"""Multi-turn dialogues for TRL's ``GRPOTrainer`` (TRL >= 1.x, experimental ``rollout_func``).

:class:`EmpathyRollout` is a ``rollout_func(prompts, trainer)``: TRL hands it this
process's prompts, each repeated ``num_generations`` times consecutively (a GRPO group),
and it plays one dialogue per prompt with :class:`~empathy_gym.agents.rollout.RolloutEngine`,
token in, token out (the sampled ids are never re-tokenised, TRL issue 5224), against envs
sharing one simulated user. The prompts come from :meth:`EmpathyRollout.dataset`, which
knows each one's env seed, so a GRPO group plays one persona and opening. The fields it
returns (:func:`to_trl_fields`): docs/integrations.md; a runnable example: ``examples/trl_grpo.py``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import empathy_gym  # noqa: F401  (registers the env ids)
from empathy_gym.agents.generation import TransformersGenerator
from empathy_gym.agents.rollout import Generator, RolloutEngine, Trajectory
from empathy_gym.env import EmpathyDialogueEnv
from empathy_gym.reward import RLVER_REWARD
from empathy_gym.seeding import derive_seed
from empathy_gym.session import Session


def prompt_key(prompt: Sequence[Mapping[str, Any]] | str) -> str:
    """A dialogue prompt's identity: its messages (role and content) as canonical JSON."""
    if isinstance(prompt, str):
        return json.dumps(prompt, ensure_ascii=False)
    return json.dumps([[m["role"], m["content"]] for m in prompt], ensure_ascii=False)


class EmpathyRollout:
    """A TRL ``rollout_func`` that plays whole dialogues against an empathy-gym env.

    Args:
        env_id: a registered dialogue id; its envs share one simulated user (a
            :class:`~empathy_gym.session.Session`, closed by :meth:`close`).
        env_kwargs: ``gym.make`` keyword arguments (``user``, ``think``, ``max_turns``...).
        max_new_tokens: the most tokens per agent turn.
        max_context_tokens: a dialogue reaching this many tokens stops
            (``termination == "context_limit"``).
        seed: mixed with the trainer's global step and each dialogue's index to seed the
            policy's sampling.
        generator: a policy sampler (:class:`~empathy_gym.agents.rollout.Generator`, e.g.
            a :class:`~empathy_gym.agents.generation.VLLMGenerator`) to use instead of
            sampling from ``trainer.model`` with transformers.

    Attributes:
        last_trajectories: the :class:`~empathy_gym.agents.rollout.Trajectory` list of
            the last call (transcripts, emotions, masks), for logging.
    """

    def __init__(
        self,
        env_id: str = "EmpathyDialogue-v0",
        *,
        env_kwargs: Mapping[str, Any] | None = None,
        max_new_tokens: int = 128,
        max_context_tokens: int = 4096,
        seed: int = 0,
        generator: Generator | None = None,
    ):
        self.env_id = env_id
        self.env_kwargs = dict(env_kwargs or {})
        self.max_new_tokens = int(max_new_tokens)
        self.max_context_tokens = int(max_context_tokens)
        self.seed = int(seed)
        self.generator = generator
        self.last_trajectories: list[Trajectory] = []
        self._seeds: dict[str, int] = {}
        self._envs: list[EmpathyDialogueEnv] = []
        self._session: Session | None = None

    # -- the dataset ---------------------------------------------------------------
    def dataset(self, num_prompts: int, *, seed: int = 0) -> Any:
        """A ``datasets.Dataset`` of ``num_prompts`` distinct dialogue openings.

        Resets the env with seeds ``seed, seed + 1, ...`` and keeps each opening chat
        (the agent's system prompt and the user's first line) whose content is new, until
        there are ``num_prompts``. Columns: ``prompt`` (the chat, list of
        ``{"role", "content"}``), ``env_seed`` (int), ``persona_id`` (str).

        Raises:
            ValueError: the env's personas cannot give ``num_prompts`` distinct openings
                within ``100 * num_prompts`` seeds.
        """
        from datasets import Dataset

        env = self._ensure_envs(1)[0]
        rows = []
        for env_seed in range(seed, seed + 100 * num_prompts):
            if len(rows) == num_prompts:
                break
            _, info = env.reset(seed=env_seed)
            key = prompt_key(info["messages"])
            if key in self._seeds:
                continue
            self._seeds[key] = env_seed
            rows.append({"prompt": info["messages"], "env_seed": env_seed, "persona_id": info["persona_id"]})
        if len(rows) < num_prompts:
            raise ValueError(
                f"{self.env_id}: only {len(rows)} distinct openings in {100 * num_prompts} seeds; ask for fewer prompts"
            )
        return Dataset.from_list(rows)

    def seed_of(self, prompt: Sequence[Mapping[str, Any]] | str) -> int:
        """The env seed behind a prompt of :meth:`dataset`.

        Raises:
            KeyError: the prompt was not made by :meth:`dataset` of this object.
        """
        try:
            return self._seeds[prompt_key(prompt)]
        except KeyError:
            preview = prompt_key(prompt)[:120]
            raise KeyError(
                f"prompt {preview}... was not made by EmpathyRollout.dataset(); "
                f"build the training dataset with it (it knows {len(self._seeds)} "
                f"prompts)"
            ) from None

    # -- the rollout function ----------------------------------------------------------
    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list]:
        """Play one dialogue per prompt and return TRL's fields (:func:`to_trl_fields`).

        Args:
            prompts: this process's prompts (each a chat from :meth:`dataset`).
            trainer: the ``GRPOTrainer`` (its model, tokenizer, temperature, top_p and
                global step are read).

        Raises:
            KeyError: a prompt not made by :meth:`dataset`.
        """
        seeds = [self.seed_of(prompt) for prompt in prompts]
        generator = self.generator if self.generator is not None else self._trainer_generator(trainer)
        tokenizer = trainer.processing_class
        engine = RolloutEngine(
            self._ensure_envs(len(prompts)), generator, tokenizer, max_context_tokens=self.max_context_tokens
        )
        step = int(getattr(getattr(trainer, "state", None), "global_step", 0) or 0)
        groups = _groups(seeds)
        trajectories = engine.collect(seeds, groups=groups, sampling_seed=derive_seed(self.seed, step))
        self.last_trajectories = trajectories
        return to_trl_fields(trajectories)

    def _trainer_generator(self, trainer: Any) -> TransformersGenerator:
        model = trainer.accelerator.unwrap_model(trainer.model)
        return TransformersGenerator(
            model,
            trainer.processing_class,
            max_new_tokens=self.max_new_tokens,
            temperature=float(trainer.temperature),
            top_p=float(getattr(trainer.args, "top_p", 1.0)),
        )

    def _ensure_envs(self, n: int) -> list[EmpathyDialogueEnv]:
        if self._session is None:
            self._session = Session.of_id(self.env_id, **self.env_kwargs)
        if len(self._envs) < n:
            self._envs += self._session.envs(n - len(self._envs))
        return self._envs[:n]

    def close(self) -> None:
        """Close the simulated user (when built here); a later call builds a new one."""
        if self._session is not None:
            self._session.close()
        self._session, self._envs = None, []


def _groups(seeds: Sequence[int]) -> list[int]:
    """Group index per dialogue: dialogues with equal env seeds share a group."""
    index: dict[int, int] = {}
    return [index.setdefault(s, len(index)) for s in seeds]


def to_trl_fields(trajectories: Sequence[Trajectory]) -> dict[str, list]:
    """TRL's fields: each trajectory split at its first sampled token into ``prompt_ids`` and
    ``completion_ids`` (with ``logprobs`` and ``env_mask`` over the completion), plus
    ``episode_return``, ``final_emotion``, ``emotions``, ``termination`` and ``env_seed``.

    Raises:
        ValueError: a trajectory with no sampled token (nothing to train on).
    """
    out: dict[str, list] = {
        key: []
        for key in (
            "prompt_ids",
            "completion_ids",
            "logprobs",
            "env_mask",
            "episode_return",
            "final_emotion",
            "emotions",
            "termination",
            "env_seed",
        )
    }
    for t in trajectories:
        if 1 not in t.loss_mask:
            raise ValueError(f"dialogue {t.key} (persona {t.persona_id!r}) has no sampled token")
        start = t.loss_mask.index(1)
        out["prompt_ids"].append(t.token_ids[:start])
        out["completion_ids"].append(t.token_ids[start:])
        out["logprobs"].append(t.rollout_logprobs[start:])
        out["env_mask"].append(t.loss_mask[start:])
        out["episode_return"].append(sum(t.outcome_rewards()))
        out["final_emotion"].append(t.emotions[-1])
        out["emotions"].append(list(t.emotions))
        out["termination"].append(t.termination)
        out["env_seed"].append(t.env_seed)
    return out


def episode_return_reward(completions: Sequence[Any], episode_return: Sequence[float], **kwargs: Any) -> list[float]:
    """TRL reward function: the dialogue's return, the sum of the env's turn rewards
    ((e_T - e_0) / 100 with ``reward_mode="delta"``, minus any think-format penalties); a
    dialogue cut at the context limit is scored as if it had ended there
    (:meth:`Reward.at_end <empathy_gym.reward.Reward.at_end>`)."""
    return [float(r) for r in episode_return]


def final_emotion_reward(completions: Sequence[Any], final_emotion: Sequence[int], **kwargs: Any) -> list[float]:
    """TRL reward function: RLVER's e_T / 100, the final emotion (RLVER, section 3.1)."""
    return [RLVER_REWARD.at_end(e) for e in final_emotion]
