"""GRPO for LLM policies in multi-turn dialogue (RLVER, arXiv 2507.03112, section 3).

A group is ``num_generations`` dialogues that share one env seed (persona and opening
line); advantages are normalised within it, and groups without spread are skipped.
See docs/training.md.

References:
    [GRPO] Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300, section 4.1 (eq. 3 the
           objective, 4.1.2 outcome supervision, 4.1.3 process supervision).
    [DAPO] Yu et al. 2025, arXiv 2503.14476 (section 3.1 clip-higher, 3.2 dynamic
           sampling, 3.3 token-level loss averaging).
    [DrGRPO] Liu et al. 2025, arXiv 2503.20783 (section 3.1: no std scaling, a constant
           normaliser instead of each response's length).
    [TIS]  Yao et al. 2025, truncated importance sampling (:mod:`~empathy_gym.agents.mismatch`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from empathy_gym.agents.config import GRPOConfig, RecipeError
from empathy_gym.agents.rollout import Trajectory
from empathy_gym.agents.tokens import TokenData
from empathy_gym.agents.trainer import MinibatchSize, RLTrainer, describe
from empathy_gym.reward import Reward
from empathy_gym.seeding import derive_seed

#: Added to the group standard deviation (as TRL's GRPOTrainer).
STD_EPS = 1e-4
#: Returns closer than this count as equal. Rewards are emotion points / 100 (0.01
#: steps) and format penalties of 0.1, so real differences are >= 0.01; sums of them
#: differ from each other by float noise (0.1 + 0.2 - 0.3 = 5.6e-17), which a plain
#: ``==`` took for a difference.
RETURN_ATOL = 1e-6


def _no_spread(values: torch.Tensor) -> bool:
    """True when ``values`` are equal up to :data:`RETURN_ATOL` (no signal to compare)."""
    return bool(values.max() - values.min() <= RETURN_ATOL)


# -- advantages and loss -----------------------------------------------------------------
def group_advantages(
    returns: torch.Tensor, groups: torch.Tensor, scale: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome-supervised advantages [GRPO 4.1.2]: A_i = (R_i - mean_g) / (std_g + 1e-4).

    Args:
        returns: (N,) float, each rollout's episode return.
        groups: (N,) int, each rollout's group.
        scale: divide by the group's sample standard deviation (Bessel-corrected, as
            torch and TRL); False only centres [DrGRPO].

    Returns:
        ``(advantages (N,), degenerate (N,) bool)``: ``degenerate`` marks members of
        groups whose returns are all equal (within :data:`RETURN_ATOL`) or that have a
        single member; their advantage is 0.
    """
    advantages = torch.zeros_like(returns, dtype=torch.float32)
    degenerate = torch.zeros(len(returns), dtype=torch.bool)
    for group in torch.unique(groups):
        members = groups == group
        values = returns[members].double()
        if len(values) < 2 or _no_spread(values):
            degenerate[members] = True
            continue
        centred = values - values.mean()
        advantages[members] = (centred / (values.std() + STD_EPS) if scale else centred).float()
    return advantages, degenerate


def reward_to_go_advantages(
    turn_rewards: Sequence[torch.Tensor], groups: Sequence[int], scale: bool = True
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Turn-level advantages: each turn's return-to-go, normalised across the group's
    rollouts j that have a turn k.

        G_k^i = r_k^i + r_{k+1}^i + ...                  (rollout i's return from turn k)
        A_k^i = (G_k^i - mean_j G_k^j) / (std_j G_k^j + 1e-4)

    The per-step baseline of process supervision [GRPO 4.1.3], but compared between
    rollouts at the same turn rather than over the group's pooled rewards: pooling would
    subtract the mean reward once per turn, so every turn of a long dialogue would pay it
    again. A turn index that fewer than two rollouts reach, or without spread (within
    :data:`RETURN_ATOL`), gets advantage 0.

    Args:
        turn_rewards: per rollout, (K_i,) float, one reward per agent turn.
        groups: per rollout, its group.
        scale: divide by the standard deviation (False: only centre [DrGRPO]).

    Returns:
        ``(per-rollout (K_i,) float32 advantages, degenerate (N,) bool)``: degenerate
        marks the members of groups where no turn index carries a signal.
    """
    to_go = [torch.flip(torch.cumsum(torch.flip(r.double(), [0]), 0), [0]) for r in turn_rewards]
    advantages = [torch.zeros(len(r), dtype=torch.float32) for r in turn_rewards]
    degenerate = torch.zeros(len(turn_rewards), dtype=torch.bool)
    for group in dict.fromkeys(groups):
        members = [i for i, g in enumerate(groups) if g == group]
        signal = False
        for k in range(max(len(to_go[i]) for i in members)):
            alive = [i for i in members if len(to_go[i]) > k]
            values = torch.stack([to_go[i][k] for i in alive])
            if len(alive) < 2 or _no_spread(values):
                continue
            signal = True
            centred = values - values.mean()
            normalised = centred / (values.std() + STD_EPS) if scale else centred
            for i, a in zip(alive, normalised):
                advantages[i][k] = float(a)
        degenerate[members] = not signal
    return advantages, degenerate


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    epsilon: float,
    *,
    epsilon_high: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective [GRPO eq. 3] as a loss per token, over flat trainable tokens.

        ratio_t = exp(log pi - log pi_old)
        L_t     = -w_t * min(ratio_t * A_t, clip(ratio_t, 1-eps_low, 1+eps_high) * A_t)
                  + beta * (pi_ref/pi - log(pi_ref/pi) - 1)        [GRPO eq. 4, k3 KL]

    The caller averages with :func:`aggregate`.

    Args:
        logprobs, old_logprobs, advantages: (n,) float.
        epsilon: lower clip range eps_low.
        epsilon_high: upper clip range eps_high, DAPO's clip-higher [DAPO eq. 10]: a
            higher upper bound lets unlikely tokens gain probability (``None``: ``epsilon``).
        ref_logprobs: (n,) float, needed when ``beta`` > 0.
        weights: (n,) float truncated importance weights w_t [TIS], from
            :func:`~empathy_gym.agents.mismatch.tis_weights` (``None``: 1).

    Returns:
        ``(L, stats)``: (n,) float, and per-token (n,) ``clipfrac`` (1 where the clipped
        term was chosen), ``approx_kl`` (old vs new, k3) and ``kl`` (to the reference,
        k3; 0 without one).

    Raises:
        ValueError: ``beta`` > 0 without ``ref_logprobs``.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    high = epsilon if epsilon_high is None else epsilon_high
    surrogate = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + high) * advantages
    per_token = -torch.min(surrogate, clipped)
    if weights is not None:
        per_token = per_token * weights
    kl = torch.zeros_like(per_token)
    if beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + beta * kl
    with torch.no_grad():
        stats = {"clipfrac": (clipped < surrogate).float(), "approx_kl": ratio - 1.0 - log_ratio, "kl": kl.detach()}
    return per_token, stats


LOSS_TYPES = ("token_mean", "sequence_mean", "dr_grpo")


def aggregate(
    per_token: torch.Tensor,
    segments: torch.Tensor,
    loss_type: str,
    tokens: float,
    sequences: float,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """This micro-batch's share of a mini-batch's loss (the shares of all micro-batches
    and processes sum to it).

    ``"token_mean"``: sum_t L_t / tokens, every trainable token weighs the same [DAPO].
    ``"sequence_mean"``: sum_i (mean of rollout i's L_t) / sequences, each rollout weighs
    the same [GRPO eq. 3's 1/|o_i| then 1/G]. ``"dr_grpo"``: sum_t L_t / (sequences *
    max_tokens), a constant independent of the rollouts' lengths [DrGRPO section 3.1;
    TRL divides by ``max_completion_length``], so a long wrong answer is not penalised
    less per token than a short one.

    Args:
        per_token: (n,) float, this micro-batch's per-token losses.
        segments: (n,) int64, the rollout (0-based within the micro-batch) of each token.
        loss_type: one of :data:`LOSS_TYPES`.
        tokens, sequences: the mini-batch's trainable tokens and rollouts, counted over
            every micro-batch and process.
        max_tokens: the constant of ``"dr_grpo"``: a dialogue's token budget (the
            trainer's ``dialogue_token_budget``).

    Raises:
        ValueError: unknown ``loss_type``, or ``"dr_grpo"`` without ``max_tokens``.
    """
    if loss_type == "token_mean":
        return per_token.sum() / tokens
    if loss_type == "dr_grpo":
        if not max_tokens:
            raise ValueError("loss_type 'dr_grpo' needs max_tokens (the constant normaliser)")
        return per_token.sum() / (sequences * max_tokens)
    if loss_type == "sequence_mean":
        count = int(segments.max()) + 1 if len(segments) else 0
        sums = torch.zeros(count, device=per_token.device).index_add(0, segments, per_token)
        sizes = torch.zeros(count, device=per_token.device).index_add(0, segments, torch.ones_like(per_token))
        return (sums[sizes > 0] / sizes[sizes > 0]).sum() / sequences
    raise ValueError(f"loss_type must be one of {list(LOSS_TYPES)}, got {loss_type!r}")


def _advantages(
    trajectories: Sequence[Trajectory], advantage: str, scale: bool = True
) -> tuple[torch.Tensor | list[torch.Tensor], torch.Tensor]:
    """:func:`group_advantages` (``advantage="episode"``) or :func:`reward_to_go_advantages`
    of the trajectories' outcome rewards."""
    groups = [t.group for t in trajectories]
    rewards = [t.outcome_rewards() for t in trajectories]
    if advantage == "episode":
        returns = torch.tensor([sum(r) for r in rewards], dtype=torch.float64)
        return group_advantages(returns, torch.tensor(groups), scale)
    return reward_to_go_advantages([torch.tensor(r, dtype=torch.float64) for r in rewards], groups, scale)


def degenerate_groups(trajectories: Sequence[Trajectory], advantage: str = "episode") -> set[int]:
    """The groups of ``trajectories`` that carry no signal under ``advantage``."""
    if not trajectories:
        return set()
    _, degenerate = _advantages(trajectories, advantage)
    return {t.group for t, d in zip(trajectories, degenerate.tolist()) if d}


# -- the trainer ----------------------------------------------------------------------------
@dataclass
class GRPOBatch:
    """The rollouts of a step that carry signal, flat per trajectory over its trainable
    tokens; ``ref_logprobs`` only with ``beta`` > 0, ``weights`` only with TIS."""

    data: list[TokenData]
    old_logprobs: list[torch.Tensor]
    advantages: list[torch.Tensor]
    ref_logprobs: list[torch.Tensor] | None = None
    weights: list[torch.Tensor] | None = None


class GRPOTrainer(RLTrainer):
    """GRPO against the simulated user (loop, checkpoints and Ctrl-C as
    :class:`~empathy_gym.agents.trainer.RLTrainer`).

    Each step plays ``rollout_batch_size / num_generations`` groups. A dialogue cut at
    the context limit is scored as if it had ended there
    (:meth:`~empathy_gym.agents.rollout.Trajectory.outcome_rewards`). With dynamic
    sampling (:meth:`refill`) the rollout statistics stay those of the step's first
    round, an unbiased sample of the policy.
    """

    algorithm = "grpo"
    config_class = GRPOConfig
    config: GRPOConfig
    loss_metrics = ("loss/policy", "policy/entropy", "policy/clipfrac", "policy/approx_kl", "policy/kl_to_reference_k3")
    #: group counts, each process's own (see :meth:`prepare` and :meth:`refill`)
    summed_metrics = (
        *RLTrainer.summed_metrics,
        "grpo/groups",
        "grpo/skipped_groups",
        "grpo/refill_groups",
        "grpo/refill_skipped_groups",
    )

    def _build_algorithm(self) -> None:
        if self.config.beta > 0:
            self._ensure_reference()

    def check_envs(self, envs: Sequence[Any]) -> None:
        """``advantage="reward_to_go"`` needs an env reward with per-turn credit
        (:meth:`Reward.check_advantage <empathy_gym.reward.Reward.check_advantage>`).

        Raises:
            RecipeError: an env whose reward pays only at the end.
        """
        for env in envs:
            try:
                getattr(env, "reward", Reward()).check_advantage(self.config.advantage)
            except ValueError as error:
                raise RecipeError(str(error)) from None

    def env_seeds(self, step: int) -> tuple[list[int], list[int]]:
        size = self.config.num_generations
        n_groups = self.config.rollout_batch_size // size
        seeds = [derive_seed(self.config.seed, step, group) for group in range(n_groups)]
        return [s for s in seeds for _ in range(size)], [g for g in range(n_groups) for _ in range(size)]

    def token_advantages(
        self, trajectories: Sequence[Trajectory], data: Sequence[TokenData]
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Per-rollout flat advantages (every token of a turn gets its turn's) and the
        degenerate-group mask."""
        advantages, degenerate = _advantages(trajectories, self.config.advantage, self.config.scale_rewards)
        if self.config.advantage == "episode":
            return [torch.full((d.num_trainable,), float(a)) for a, d in zip(advantages, data)], degenerate
        return [a[d.turn_index] for a, d in zip(advantages, data)], degenerate

    def refill(
        self, trajectories: list[Trajectory], step: int, collect: Any
    ) -> tuple[list[Trajectory], dict[str, float]]:
        """Dynamic sampling [DAPO 3.2]: play fresh groups in place of the groups without
        signal, round by round, until none is left to replace or
        ``dynamic_sampling_budget`` extra groups (shared evenly by the processes) were
        played.

        Args:
            trajectories: the step's first round.
            step: the step (seeds the new groups: ``(seed, step, rank, round, group)``).
            collect: ``collect(env_seeds, groups)`` plays dialogues (the trainer's rollout).

        Returns:
            ``(trajectories followed by every refill round's, metrics)``:
            ``grpo/refill_groups`` and ``grpo/refill_rounds`` (none when it is off).
        """
        config = self.config
        budget = config.dynamic_sampling_budget // self.processes.world
        if budget <= 0:
            return trajectories, {}
        size = config.num_generations
        capacity = len(self.envs) // size  # groups one round can play
        first_groups = config.rollout_batch_size // size
        missing = len(degenerate_groups(trajectories, config.advantage))
        played, round_, extra = list(trajectories), 0, 0
        while missing > 0 and budget > 0:
            round_ += 1
            n = min(missing, budget, capacity)
            # group ids unique over rounds and processes, after the first round's
            base = first_groups + ((round_ - 1) * self.processes.world + self.processes.rank) * capacity
            seeds = [derive_seed(config.seed, step, self.processes.rank, round_, g) for g in range(n)]
            new = collect([s for s in seeds for _ in range(size)], [base + g for g in range(n) for _ in range(size)])
            budget -= n
            extra += n
            missing -= n - len(degenerate_groups(new, config.advantage))
            played += new
        return played, {"grpo/refill_groups": float(extra), "grpo/refill_rounds": float(round_)}

    def prepare(self, trajectories: Sequence[Trajectory]) -> tuple[GRPOBatch, dict[str, float]]:
        """Advantages; the groups without signal left out; old (and reference) log-probs;
        the sampler mismatch over the kept tokens (and TIS weights). Returns the batch and
        its statistics: group counts, mismatch, and ``describe`` of the kept advantages."""
        data = self.token_data(trajectories)
        advantages, degenerate = self.token_advantages(trajectories, data)
        keep = [i for i in range(len(data)) if not degenerate[i]]

        def count(first_round: bool, skipped: bool) -> float:
            groups = {
                t.group
                for i, t in enumerate(trajectories)
                if (t.round == 0) == first_round and (degenerate[i] or not skipped)
            }
            return float(len(groups))

        stats = {"grpo/groups": count(True, False), "grpo/skipped_groups": count(True, True)}
        if self.config.dynamic_sampling_budget > 0:
            stats["grpo/refill_skipped_groups"] = count(False, True)
        data = [data[i] for i in keep]
        batch = GRPOBatch(data, self.policy_logprobs(data) if data else [], [advantages[i] for i in keep])
        mismatch, batch.weights = self.sampler_correction(data, batch.old_logprobs)
        stats |= mismatch | describe("advantage", batch.advantages)
        if self.config.beta > 0 and data:
            batch.ref_logprobs = self.policy_logprobs(data, reference=True)
        return batch, stats

    def micro_loss(
        self, batch: GRPOBatch, indices: Sequence[int], size: MinibatchSize
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """One micro-batch's share of the mini-batch's loss, L = aggregate(L_t -
        entropy_coef * H_t) with :func:`grpo_loss`'s L_t and H the entropy, counted over
        the whole mini-batch and every process (``size``).

        Returns:
            ``(L, sums)``: a 0-dim float tensor, and the micro-batch's sums of
            :attr:`loss_metrics`: ``loss/policy`` its share of the objective as aggregated
            (without the entropy term), the others sums over its tokens.
        """
        config = self.config
        flat = partial(self.flat_tokens, indices=indices)
        chunk = [batch.data[i] for i in indices]
        out = self.forward(self.model, chunk)
        per_token, stats = grpo_loss(
            out.logprobs,
            flat(batch.old_logprobs),
            flat(batch.advantages),
            config.epsilon,
            epsilon_high=config.epsilon_high,
            beta=config.beta,
            ref_logprobs=flat(batch.ref_logprobs) if batch.ref_logprobs else None,
            weights=flat(batch.weights) if batch.weights else None,
        )
        segments = torch.cat([torch.full((d.num_trainable,), j, dtype=torch.long) for j, d in enumerate(chunk)]).to(
            self.device
        )
        share = partial(
            aggregate,
            segments=segments,
            loss_type=config.loss_type,
            tokens=size.tokens,
            sequences=size.sequences,
            max_tokens=self.dialogue_token_budget if config.loss_type == "dr_grpo" else None,
        )
        token_stats = {
            "policy/entropy": out.entropy,
            "policy/clipfrac": stats["clipfrac"],
            "policy/approx_kl": stats["approx_kl"],
            "policy/kl_to_reference_k3": stats["kl"],
        }
        sums = {"loss/policy": float(share(per_token.detach()))}  # the objective, as aggregated
        sums |= {key: float(value.detach().sum()) for key, value in token_stats.items()}
        return share(per_token - config.entropy_coef * out.entropy), sums

    def minibatch_metrics(self, sums: dict[str, float], size: MinibatchSize) -> dict[str, float]:
        """Token means, but ``loss/policy``: its sum is already the mini-batch's objective
        as :func:`aggregate` weighs it."""
        return {key: total if key == "loss/policy" else total / size.tokens for key, total in sums.items()}

    def update_metrics(
        self, batch: GRPOBatch, prepared: dict[str, float], trained: dict[str, float]
    ) -> dict[str, float]:
        """:meth:`prepare`'s statistics, then the optimiser steps' means: NaN when no
        group had signal in any process (no step); no ``policy/kl_to_reference_k3`` with
        ``beta`` 0 (no reference, nothing measured)."""
        if not trained:
            names = (*self.loss_metrics, *(f"{group}/grad_norm" for group in self.gradient_groups))
            trained = dict.fromkeys(names, float("nan"))
        if self.config.beta == 0:
            trained.pop("policy/kl_to_reference_k3", None)
        return prepared | trained
