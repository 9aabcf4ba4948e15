"""PPO for LLM policies in multi-turn dialogue (RLVER, arXiv 2507.03112, section 3).

Reads top to bottom: the estimators and losses first (each line names its equation),
then :class:`PPOTrainer`. Token-level PPO as in Ouyang et al. 2022 / TRL / verl: every
sampled token is an action, the state is the dialogue so far; the user's turns are
part of the state, never actions (they are masked out, and GAE runs over the
trainable tokens only).

References:
    [PPO]  Schulman et al. 2017, "Proximal Policy Optimization Algorithms", arXiv 1707.06347.
    [GAE]  Schulman et al. 2016, "High-Dimensional Continuous Control Using GAE", arXiv 1506.02438.
    [KL]   Ziegler et al. 2019, "Fine-Tuning Language Models from Human Preferences", arXiv 1909.08593.
    [37]   Huang et al. 2022, "The 37 Implementation Details of PPO" (value clipping, whitening).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from empathy_gym.agents.config import PPOConfig
from empathy_gym.agents.rollout import Trajectory
from empathy_gym.agents.tokens import TokenData, pad_flat, unpad_flat
from empathy_gym.agents.trainer import RLTrainer


# -- estimators and losses ---------------------------------------------------------
def masked_gae(rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor,
               gamma: float = 1.0, lam: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over the positions where ``mask`` is True.

    Positions with ``mask`` False are skipped: the next value of a trainable token is
    the value of the next *trainable* token (0 after the last one: the episode ends).

        delta_t = r_t + gamma * V(s_next) - V(s_t)          [GAE eq. 11]
        A_t     = delta_t + gamma * lam * A_next            [GAE eq. 16, recursive form]
        R_t     = A_t + V(s_t)                              (the value target)

    Args:
        rewards, values: (B, T) float.
        mask: (B, T) bool or 0/1.
        gamma, lam: discount and GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, (B, T) float, 0 where ``mask`` is False.
    """
    mask = mask.bool()
    advantages = torch.zeros_like(values)
    next_value = torch.zeros_like(values[:, 0])
    next_advantage = torch.zeros_like(values[:, 0])
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage = delta + gamma * lam * next_advantage
        live = mask[:, t]
        advantages[:, t] = torch.where(live, advantage, torch.zeros_like(advantage))
        next_advantage = torch.where(live, advantage, next_advantage)
        next_value = torch.where(live, values[:, t], next_value)
    returns = (advantages + values) * mask
    return advantages, returns


def whiten(values: torch.Tensor, eps: float = 1e-8, mean: float | None = None,
           var: float | None = None) -> torch.Tensor:
    """(x - mean) / sqrt(var + eps) over all elements ([37], detail 7: advantage
    normalisation); population variance. ``mean`` and ``var`` default to those of
    ``values`` (several processes pass the statistics of all their advantages)."""
    mean = values.mean() if mean is None else mean
    var = values.var(unbiased=False) if var is None else var
    return (values - mean) / torch.sqrt(torch.as_tensor(var + eps, dtype=values.dtype))


def ppo_policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor,
                    cliprange: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The clipped surrogate objective, as a loss (token mean).

        ratio_t = exp(log pi(a_t|s_t) - log pi_old(a_t|s_t))                 [PPO eq. 6]
        L_t     = max(-A_t * ratio_t, -A_t * clip(ratio_t, 1-eps, 1+eps))     [PPO eq. 7, negated]

    Args:
        logprobs, old_logprobs, advantages: (n,) float over trainable tokens.
        cliprange: eps.

    Returns:
        ``(loss, stats)``: a scalar, and ``clipfrac`` (share of tokens where the clipped
        term was chosen) and ``approx_kl`` (k3 estimate of KL(old || new), Schulman 2020
        "Approximating KL divergence": mean(ratio - 1 - log ratio)).
    """
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    loss = torch.max(unclipped, clipped).mean()
    with torch.no_grad():
        stats = {"clipfrac": (clipped > unclipped).float().mean(),
                 "approx_kl": (ratio - 1.0 - log_ratio).mean()}
    return loss, stats


def ppo_value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor,
                   cliprange_value: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The clipped value loss ([37], detail 9; as in OpenAI baselines and TRL).

        V_clip = V_old + clip(V - V_old, -eps_v, eps_v)
        L_V    = 0.5 * mean(max((V - R)^2, (V_clip - R)^2))

    Returns:
        ``(loss, clipfrac)``: scalar loss and the share of tokens where clipping bound.
    """
    clipped_values = old_values + torch.clamp(values - old_values, -cliprange_value, cliprange_value)
    unclipped_error = (values - returns) ** 2
    clipped_error = (clipped_values - returns) ** 2
    loss = 0.5 * torch.max(unclipped_error, clipped_error).mean()
    return loss, (clipped_error > unclipped_error).float().mean().detach()


def explained_variance(predicted: torch.Tensor, target: torch.Tensor) -> float:
    """1 - Var(target - predicted) / Var(target) (1 is perfect, <= 0 is no better than
    the mean; NaN when the target is constant)."""
    variance = target.var(unbiased=False)
    return float("nan") if variance == 0 else float(1 - (target - predicted).var(unbiased=False) / variance)


# -- value function ------------------------------------------------------------------
class ValueHead(nn.Module):
    """A linear value head on a backbone's last hidden state: (n, H) -> (n,) float32.
    Zero-initialised, so V = 0 before training (deterministic)."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.linear = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden.float()).squeeze(-1)


def _hidden_size(model: Any) -> int:
    config = model.config
    return int(getattr(config, "hidden_size", None) or config.get_text_config().hidden_size)


# -- the trainer -------------------------------------------------------------------------
class PPOTrainer(RLTrainer):
    """PPO against the simulated user (see :class:`~empathy_gym.agents.trainer.RLTrainer`
    for the loop, checkpoints and Ctrl-C).

    The value function is a :class:`ValueHead` on the policy's own backbone
    (``critic="shared"``: its loss also trains the policy's LoRA adapters, weighted by
    ``vf_coef``) or on a separate copy of the base model with its own adapters
    (``critic="separate"``). With ``kl_coef`` > 0 the per-token reward gets
    ``-kl_coef * (log pi_old - log pi_ref)`` [KL]; RLVER uses none.

    Example:
        >>> from empathy_gym.agents import PPOConfig, PPOTrainer, load_recipe
        >>> config = load_recipe("agents/tiny-cpu.yaml", ["total_steps=2"], algorithm="ppo")
        >>> PPOTrainer(config).train()          # doctest: +SKIP
    """

    algorithm = "ppo"
    config_class = PPOConfig
    config: PPOConfig

    def _build_algorithm(self) -> None:
        config = self.config
        self.critic_model = None
        if config.critic == "separate":
            from empathy_gym.models import load_causal_lm
            backbone, _ = load_causal_lm(self.base_model_name, dtype=config.policy.dtype, device=self.device)
            self.critic_model = self._wrap_policy(backbone)
        host = self.critic_model if self.critic_model is not None else self.model
        self.value_head = ValueHead(_hidden_size(host)).to(self.device)
        if config.kl_coef > 0:
            self._ensure_reference()

    def param_groups(self) -> list[dict[str, Any]]:
        groups = super().param_groups()
        critic = list(self.value_head.parameters())
        if self.critic_model is not None:
            critic += [p for p in self.critic_model.parameters() if p.requires_grad]
        return groups + [{"params": critic, "lr": self.config.critic_learning_rate}]

    def extra_state(self) -> dict[str, Any]:
        state = {"value_head": self.value_head.state_dict()}
        if self.critic_model is not None:
            state["critic"] = {k: v for k, v in self.critic_model.state_dict().items()
                               if "lora_" in k or not self.config.policy.use_lora}
        return state

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.value_head.load_state_dict(state["value_head"])
        if self.critic_model is not None:
            self.critic_model.load_state_dict(state["critic"], strict=False)

    def _forward(self, chunk: Sequence[TokenData]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Flat (logprobs, entropy, values) of a micro-batch, with gradients."""
        shared = self.critic_model is None
        logprobs, entropy, hidden = self.forward(self.model, chunk, hidden=shared)
        if not shared:
            _, _, hidden = self.forward(self.critic_model, chunk, hidden=True)
        return logprobs, entropy, self.value_head(hidden)

    def _whiten(self, values: torch.Tensor) -> torch.Tensor:
        """:func:`whiten` with the mean and variance of every process's advantages."""
        if self.processes.world == 1:
            return whiten(values)
        total, squares, count = self.processes.sum([float(values.sum()), float((values ** 2).sum()),
                                                    float(values.numel())])
        mean = total / count
        return whiten(values, mean=mean, var=max(squares / count - mean ** 2, 0.0))

    @torch.no_grad()
    def _rollout_values(self, data: Sequence[TokenData]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Per-trajectory flat (old log-probs, old values) under the current parameters."""
        logprobs, values = [], []
        self.model.eval()
        for batch in self.micro_batches(range(len(data))):
            chunk = [data[i] for i in batch]
            lp, _, v = self._forward(chunk)
            counts = [d.num_trainable for d in chunk]
            logprobs += list(torch.split(lp.cpu(), counts))
            values += list(torch.split(v.cpu(), counts))
        self.model.train()
        return logprobs, values

    def update(self, trajectories: Sequence[Trajectory], step: int) -> dict[str, float]:
        config = self.config
        data = self.token_data(trajectories)
        old_logprobs, old_values = self._rollout_values(data)
        rewards = [d.turn_rewards.clone() for d in data]
        kl_to_reference = float("nan")
        if config.kl_coef > 0:
            ref_logprobs = self.policy_logprobs(data, reference=True)
            kls = [old - ref for old, ref in zip(old_logprobs, ref_logprobs)]
            rewards = [r - config.kl_coef * kl for r, kl in zip(rewards, kls)]       # [KL] per-token penalty
            kl_to_reference = float(torch.cat(kls).mean())

        padded_rewards, valid = pad_flat(rewards)
        padded_values, _ = pad_flat(old_values)
        advantages, returns = masked_gae(padded_rewards, padded_values, valid, config.gamma, config.lam)
        advantages, returns = unpad_flat(advantages, valid), unpad_flat(returns, valid)
        if config.whiten_advantages:
            flat = self._whiten(torch.cat(advantages))
            advantages = list(torch.split(flat, [len(a) for a in advantages]))

        stats: dict[str, list[float]] = {k: [] for k in (
            "loss/policy", "loss/value", "policy/entropy", "policy/clipfrac", "policy/approx_kl",
            "value/clipfrac", "grad_norm")}
        for epoch in range(config.num_ppo_epochs):
            for minibatch in self.minibatch_order(step, epoch, len(data)):
                micro = self.micro_batches(minibatch)
                for part in micro:
                    chunk = [data[i] for i in part]
                    logprobs, entropy, values = self._forward(chunk)
                    old_lp = torch.cat([old_logprobs[i] for i in part]).to(self.device)
                    old_v = torch.cat([old_values[i] for i in part]).to(self.device)
                    adv = torch.cat([advantages[i] for i in part]).to(self.device)
                    ret = torch.cat([returns[i] for i in part]).to(self.device)
                    pg_loss, pg_stats = ppo_policy_loss(logprobs, old_lp, adv, config.cliprange)
                    vf_loss, vf_clipfrac = ppo_value_loss(values, old_v, ret, config.cliprange_value)
                    entropy_mean = entropy.mean()
                    loss = pg_loss + config.vf_coef * vf_loss - config.entropy_coef * entropy_mean
                    (loss / len(micro)).backward()
                    stats["loss/policy"].append(float(pg_loss.detach()))
                    stats["loss/value"].append(float(vf_loss.detach()))
                    stats["policy/entropy"].append(float(entropy_mean.detach()))
                    stats["policy/clipfrac"].append(float(pg_stats["clipfrac"]))
                    stats["policy/approx_kl"].append(float(pg_stats["approx_kl"]))
                    stats["value/clipfrac"].append(float(vf_clipfrac))
                stats["grad_norm"].append(self.clip_and_step())
        metrics = {key: float(np.mean(values)) for key, values in stats.items()}
        metrics["value/explained_variance"] = explained_variance(torch.cat(old_values), torch.cat(returns))
        metrics["policy/kl_to_reference"] = kl_to_reference
        return metrics
