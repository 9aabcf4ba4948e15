"""GRPO for LLM policies in multi-turn dialogue (RLVER, arXiv 2507.03112, section 3).

A group is ``num_generations`` dialogues that share one env seed: the same persona and
the same opening line, different sampled replies. Advantages are the group-normalised
returns; no value function. Groups whose members all got the same return carry no
signal: they are skipped and counted.

References:
    [GRPO] Shao et al. 2024, "DeepSeekMath", arXiv 2402.03300, section 4.1 (eq. 3 the
           objective, 4.1.2 outcome supervision, 4.1.3 process supervision).
    [DAPO] Yu et al. 2025, arXiv 2503.14476 (token-level loss averaging).
    [DrGRPO] Liu et al. 2025, arXiv 2503.20783 (no std scaling).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from empathy_gym.agents.config import GRPOConfig
from empathy_gym.agents.rollout import Trajectory
from empathy_gym.agents.tokens import TokenData
from empathy_gym.agents.trainer import RLTrainer
from empathy_gym.seeding import derive_seed

#: Added to the group standard deviation (as TRL's GRPOTrainer).
STD_EPS = 1e-4


# -- advantages and loss -----------------------------------------------------------------
def group_advantages(returns: torch.Tensor, groups: torch.Tensor, scale: bool = True
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Outcome-supervised advantages [GRPO 4.1.2]: A_i = (R_i - mean_g) / (std_g + 1e-4).

    Args:
        returns: (N,) float, each rollout's episode return.
        groups: (N,) int, each rollout's group.
        scale: divide by the group's sample standard deviation (Bessel-corrected, as
            torch and TRL); False only centres [DrGRPO].

    Returns:
        ``(advantages (N,), degenerate (N,) bool)``: ``degenerate`` marks members of
        groups with zero reward variance (or a single member); their advantage is 0.
    """
    advantages = torch.zeros_like(returns, dtype=torch.float32)
    degenerate = torch.zeros(len(returns), dtype=torch.bool)
    for group in torch.unique(groups):
        members = groups == group
        values = returns[members].float()
        if len(values) < 2 or torch.all(values == values[0]):
            degenerate[members] = True
            continue
        centred = values - values.mean()
        advantages[members] = centred / (values.std() + STD_EPS) if scale else centred
    return advantages, degenerate


def reward_to_go_advantages(turn_rewards: Sequence[torch.Tensor], groups: Sequence[int],
                            scale: bool = True) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Process-supervised advantages [GRPO 4.1.3]: every turn reward of a group is
    normalised with the mean and std of all turn rewards of that group,
    r~ = (r - mean_g) / (std_g + 1e-4), and the advantage of turn k is the sum of the
    normalised rewards of turns k, k+1, ... (its reward-to-go).

    Args:
        turn_rewards: per rollout, (K_i,) float, one reward per agent turn.
        groups: per rollout, its group.

    Returns:
        ``(per-rollout (K_i,) advantages, degenerate (N,) bool)`` as in
        :func:`group_advantages`.
    """
    groups_t = torch.as_tensor(list(groups))
    advantages = [torch.zeros(len(r), dtype=torch.float32) for r in turn_rewards]
    degenerate = torch.zeros(len(turn_rewards), dtype=torch.bool)
    for group in torch.unique(groups_t):
        members = [i for i, g in enumerate(groups) if g == int(group)]
        pooled = torch.cat([turn_rewards[i].float() for i in members])
        if len(members) < 2 or torch.all(pooled == pooled[0]):
            degenerate[members] = True
            continue
        mean, std = pooled.mean(), pooled.std()
        for i in members:
            normalised = turn_rewards[i].float() - mean
            if scale:
                normalised = normalised / (std + STD_EPS)
            advantages[i] = torch.flip(torch.cumsum(torch.flip(normalised, [0]), 0), [0])
    return advantages, degenerate


def grpo_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
              epsilon: float, *, ref_logprobs: torch.Tensor | None = None, beta: float = 0.0,
              segments: torch.Tensor | None = None, loss_type: str = "token_mean"
              ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The GRPO objective [GRPO eq. 3] as a loss, over flat trainable tokens.

        ratio_t = exp(log pi - log pi_old)
        L_t     = -min(ratio_t * A_t, clip(ratio_t, 1-eps, 1+eps) * A_t)
                  + beta * (pi_ref/pi - log(pi_ref/pi) - 1)        [GRPO eq. 4, k3 KL]

    Averaging (``loss_type``): ``"token_mean"`` = sum over all tokens / their count
    [DAPO]; ``"sequence_mean"`` = mean over each rollout's tokens, then over rollouts
    [GRPO eq. 3's 1/|o_i| then 1/G].

    Args:
        logprobs, old_logprobs, advantages: (n,) float.
        epsilon: clip range.
        ref_logprobs: (n,) float, needed when ``beta`` > 0.
        segments: (n,) int64 rollout index of each token (for ``"sequence_mean"``).

    Returns:
        ``(loss, stats)`` with ``clipfrac``, ``approx_kl`` (old vs new, k3) and ``kl``
        (to the reference, k3; 0 without one).

    Raises:
        ValueError: unknown ``loss_type``, or ``beta`` > 0 without ``ref_logprobs``.
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    surrogate = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - epsilon, 1.0 + epsilon) * advantages
    per_token = -torch.min(surrogate, clipped)
    kl = torch.zeros_like(per_token)
    if beta > 0:
        if ref_logprobs is None:
            raise ValueError("beta > 0 needs ref_logprobs")
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1.0
        per_token = per_token + beta * kl
    if loss_type == "token_mean":
        loss = per_token.mean()
    elif loss_type == "sequence_mean":
        if segments is None:
            raise ValueError("loss_type='sequence_mean' needs segments")
        count = int(segments.max()) + 1
        sums = torch.zeros(count, device=per_token.device).index_add(0, segments, per_token)
        sizes = torch.zeros(count, device=per_token.device).index_add(0, segments, torch.ones_like(per_token))
        loss = (sums[sizes > 0] / sizes[sizes > 0]).mean()
    else:
        raise ValueError(f"loss_type must be 'token_mean' or 'sequence_mean', got {loss_type!r}")
    with torch.no_grad():
        stats = {"clipfrac": (clipped < surrogate).float().mean(),
                 "approx_kl": (ratio - 1.0 - log_ratio).mean(), "kl": kl.mean()}
    return loss, stats


# -- the trainer ----------------------------------------------------------------------------
class GRPOTrainer(RLTrainer):
    """GRPO against the simulated user (loop, checkpoints and Ctrl-C as
    :class:`~empathy_gym.agents.trainer.RLTrainer`).

    Each step plays ``rollout_batch_size / num_generations`` groups of
    ``num_generations`` dialogues; a group's dialogues share an env seed. With
    ``beta`` > 0 the loss adds the k3 KL to the reference (LoRA: the base model with
    adapters off).
    """

    algorithm = "grpo"
    config_class = GRPOConfig
    config: GRPOConfig

    def _build_algorithm(self) -> None:
        if self.config.beta > 0:
            self._ensure_reference()

    def env_seeds(self, step: int) -> tuple[list[int], list[int]]:
        size = self.config.num_generations
        n_groups = self.config.rollout_batch_size // size
        seeds = [derive_seed(self.config.seed, step, group) for group in range(n_groups)]
        return [s for s in seeds for _ in range(size)], [g for g in range(n_groups) for _ in range(size)]

    def token_advantages(self, trajectories: Sequence[Trajectory], data: Sequence[TokenData]
                         ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Per-rollout flat advantages (every token of a turn gets its turn's) and the
        degenerate-group mask."""
        config = self.config
        groups = [t.group for t in trajectories]
        if config.advantage == "episode":
            returns = torch.tensor([t.episode_return for t in trajectories])
            adv, degenerate = group_advantages(returns, torch.tensor(groups), config.scale_rewards)
            return [torch.full((d.num_trainable,), float(a)) for a, d in zip(adv, data)], degenerate
        per_turn, degenerate = reward_to_go_advantages(
            [torch.tensor(t.rewards, dtype=torch.float32) for t in trajectories], groups, config.scale_rewards)
        return [a[d.turn_index] for a, d in zip(per_turn, data)], degenerate

    def update(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, float]:
        config = self.config
        data = self.token_data(trajectories)
        advantages, degenerate = self.token_advantages(trajectories, data)
        keep = [i for i in range(len(data)) if not degenerate[i]]
        stats: dict[str, list[float]] = {k: [] for k in (
            "loss/policy", "policy/entropy", "policy/clipfrac", "policy/approx_kl",
            "policy/kl_to_reference", "grad_norm")}
        metrics = {"grpo/skipped_groups": float(len({trajectories[i].group for i in range(len(data))
                                                     if degenerate[i]})),
                   "grpo/groups": float(len({t.group for t in trajectories}))}
        if not keep:  # no signal this step: no update, the loss statistics are undefined
            if self.processes.world > 1:  # the other processes may have signal: join their steps
                for _ in range(config.num_ppo_epochs * config.num_mini_batches):
                    self.clip_and_step()
            return metrics | {key: float("nan") for key in stats}
        data = [data[i] for i in keep]
        advantages = [advantages[i] for i in keep]
        old_logprobs = self.policy_logprobs(data)
        ref_logprobs = self.policy_logprobs(data, reference=True) if config.beta > 0 else None

        for epoch in range(config.num_ppo_epochs):
            for minibatch in self.minibatch_order(step, epoch, len(data)):
                micro = self.micro_batches(minibatch)
                for part in micro:
                    chunk = [data[i] for i in part]
                    logprobs, entropy, _ = self.forward(self.model, chunk)
                    segments = torch.cat([torch.full((d.num_trainable,), j, dtype=torch.long)
                                          for j, d in enumerate(chunk)]).to(self.device)
                    loss, loss_stats = grpo_loss(
                        logprobs, torch.cat([old_logprobs[i] for i in part]).to(self.device),
                        torch.cat([advantages[i] for i in part]).to(self.device), config.epsilon,
                        ref_logprobs=(torch.cat([ref_logprobs[i] for i in part]).to(self.device)
                                      if ref_logprobs is not None else None),
                        beta=config.beta, segments=segments, loss_type=config.loss_type)
                    entropy_mean = entropy.mean()
                    ((loss - config.entropy_coef * entropy_mean) / len(micro)).backward()
                    stats["loss/policy"].append(float(loss.detach()))
                    stats["policy/entropy"].append(float(entropy_mean.detach()))
                    stats["policy/clipfrac"].append(float(loss_stats["clipfrac"]))
                    stats["policy/approx_kl"].append(float(loss_stats["approx_kl"]))
                    stats["policy/kl_to_reference"].append(float(loss_stats["kl"]))
                stats["grad_norm"].append(self.clip_and_step())
        metrics.update({key: float(np.mean(values)) for key, values in stats.items()})
        return metrics
